"""Edge lists: ``src dst [weight]`` per row, one reader (``parse_edge_chunks``) for every command, in-memory
(``read_edge_list``) and streaming (``scalemb.affinity.ingest``).

Text files (SNAP style): ``#`` comments and blank lines skipped; tab/space separated, or CSV if the first data
line holds a ``,``; optionally gzipped (``.gz``).  The first data line is a header, and skipped, if its first
field is not a number and: its first two fields are column names such as ``src dst``, ``source,target``,
``from to``, ``node1 node2`` (``HEADER_NAMES``, any case), or its third field is not a number while the next
line's is (a weight column's name), or the next data line's first field is an integer (``FromNodeId,ToNodeId``
over integer ids).  A string-id file whose header is none of these has its header read as an edge.  No CSV
quoting: a field is the text between separators, stripped of surrounding blanks.

Parquet and Arrow IPC / Feather files (``.parquet``, ``.arrow``, ``.feather``; need pyarrow, the ``arrow``
extra): the columns named ``src``, ``dst`` (and ``weight``) if present, else the first two columns and an
optional third as the weight.  Ids are an integer or a string column; the weight numeric; no nulls.

Node ids are all integers (0 .. 2**63 - 1) or all strings (any text without the separator, such as names or
accessions).  The kind is set by the file's first id: a file whose ids are partly integers and partly strings
is refused, naming the line of the first id of the other kind and the line that set the kind (an integer-looking
token among names is usually a data error; to keep it, make every id a string, e.g. ``n1`` for ``1``).  String ids
pass one validator (``scalemb.io.nodeids``): ids that differ only in case or Unicode form (``Alice``/``alice``,
``straße``/``STRASSE``, ``Alİce``/``Alice``, NFC/NFD spellings) are refused, naming both and their lines; so are
empty ids, ids longer than ``SCALEMB_MAX_ID_CHARS`` (256) characters and ids holding control, line-break or
bidirectional-formatting characters (NUL, newline, U+202E ...).

Limits, so that a small file cannot take gigabytes: a ``.gz`` file may expand to ``SCALEMB_MAX_GZIP_RATIO`` (100)
times its size (at least 1 MiB), a Parquet / Arrow file decode to as many bytes at 16 per row; a line is at most
``2 SCALEMB_MAX_ID_CHARS + 1024`` characters (longer comment lines are skipped).  Repeated pairs are merged as
the chunks stream in (``PairSet``), so memory follows the distinct pairs, not the rows.

Self-loops are dropped; an unordered pair listed several times (duplicates or both directions, as SNAP does
for undirected graphs) is one edge whose weight is the largest listed; nodes with no remaining edge are
removed.  Original node ids are kept (``node_ids[k]`` is the id of index ``k``, sorted ascending: numerically
for integers, by code point for strings).
"""
import gzip
import io
import warnings
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from ..errors import InputError
from .nodeids import (FORBIDDEN_RE2, MAX_ID_CHARS_ENV, check_case_collision, env_limit, id_problem, is_string_ids,
                      max_id_chars)

_INT64_MAX = np.iinfo(np.int64).max
_EDGE = np.dtype([("src", "<i8"), ("dst", "<i8"), ("weight", "<f8")])
_PAIR = np.dtype([("src", "<i8"), ("dst", "<i8")])
ARROW_SUFFIXES = (".parquet", ".arrow", ".feather")
HEADER_NAMES = frozenset({"src", "dst", "source", "target", "from", "to", "node1", "node2", "head", "tail",
                          "id1", "id2", "source_id", "target_id", "from_id", "to_id", "fromnodeid", "tonodeid",
                          "node_a", "node_b", "src_id", "dst_id", "weight"})


@dataclass
class Graph:
    """An undirected weighted graph on contiguous indices ``0..n-1``, each edge once with ``src < dst``."""

    node_ids: np.ndarray  # int64 or <U (strings), (n,)
    src: np.ndarray  # int64, (m,)
    dst: np.ndarray  # int64, (m,)
    weight: np.ndarray  # float64, (m,)
    source: str

    @property
    def n_nodes(self) -> int:
        return int(self.node_ids.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.src.shape[0])


@dataclass
class Edges:
    """Raw edges of a chunk: ``src``/``dst`` int64 ids, or for string ids int64 codes into ``names`` (the
    chunk's distinct ids, a list of str: a row costs 16 bytes whatever the length of its ids, where a ``<U``
    array would cost 4 bytes per character of the chunk's longest id per row); ``weight`` float64.
    ``materialized()``: the ids themselves (``<U`` for strings)."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    names: list | None = None

    @property
    def size(self) -> int:
        return int(self.src.size)

    @property
    def string_ids(self) -> bool:
        return self.names is not None or is_string_ids(self.src)

    def id_at(self, row: int, column: int = 0):
        """The id in row ``row`` of column ``column`` (0: src, 1: dst)."""
        value = (self.src, self.dst)[column][row]
        return self.names[int(value)] if self.names is not None else value

    def materialized(self) -> "Edges":
        """These edges with the ids themselves in ``src``/``dst`` (``<U`` arrays for string ids)."""
        if self.names is None:
            return self
        names = np.array(self.names, dtype=str) if self.names else np.empty(0, dtype="<U1")
        return Edges(names[self.src], names[self.dst], self.weight)

    @classmethod
    def empty(cls) -> "Edges":
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))

    @classmethod
    def join(cls, chunks) -> "Edges":
        """One ``Edges`` of ``chunks`` of one id kind, string ids kept as codes (into the union of the names)."""
        chunks = [c for c in chunks if c.size]
        if not chunks:
            return cls.empty()
        weight = np.concatenate([c.weight for c in chunks])
        if chunks[0].names is None:
            return cls(np.concatenate([c.src for c in chunks]), np.concatenate([c.dst for c in chunks]), weight)
        code_of, src, dst = {}, [], []
        for c in chunks:
            table = np.fromiter((code_of.setdefault(name, len(code_of)) for name in c.names), dtype=np.int64,
                                count=len(c.names))
            src.append(table[c.src])
            dst.append(table[c.dst])
        return cls(np.concatenate(src), np.concatenate(dst), weight, list(code_of))

    @classmethod
    def concat(cls, chunks) -> "Edges":
        """One ``Edges`` of the ids themselves (``materialized``) of all ``chunks``."""
        chunks = [c.materialized() for c in chunks if c.size]
        if not chunks:
            return cls.empty()
        return cls(*(np.concatenate([getattr(c, name) for c in chunks]) for name in ("src", "dst", "weight")))


class IdCodes:
    """Integer codes of the string ids of a streamed edge list, given in order of first use: each chunk's
    ``names`` map to them once per distinct id (a dict: memory follows the distinct ids, not the rows)."""

    def __init__(self):
        self.code_of = {}

    def table(self, names: list, used: np.ndarray) -> np.ndarray:
        """The codes of ``names[k]`` for the chunk codes ``k`` in ``used`` (an int64 table over the chunk codes;
        entries not in ``used`` are -1: ids that occur only in dropped rows never get a code)."""
        code_of = self.code_of
        table = np.full(len(names), -1, dtype=np.int64)
        table[used] = np.fromiter((code_of.setdefault(names[k], len(code_of)) for k in used.tolist()),
                                  dtype=np.int64, count=used.size)
        return table

    def sorted_ids(self):
        """``(ids sorted by code point as <U, rank)``: ``rank[code]`` is the sorted position of a code's id (sorted
        as Python strings, the order of ``np.sort`` on ``<U``, so that only the result is a fixed-width array)."""
        names = list(self.code_of)
        order = sorted(range(len(names)), key=names.__getitem__)
        rank = np.empty(len(names), dtype=np.int64)
        rank[order] = np.arange(len(names), dtype=np.int64)
        ids = np.array([names[k] for k in order], dtype=str) if names else np.empty(0, dtype="<U1")
        return ids, rank


# --- limits on what a small file may cost ----------------------------------------------------------------------

# A gzip file may decompress to at most this many times its own size.  Text edge lists compress 3-5x (GrQc 3.2x,
# a dense sorted list of consecutive integers 4.6x); DEFLATE's limit is ~1032x, which a file of one repeated line
# reaches (98 KB -> 100 MB).  Set SCALEMB_MAX_GZIP_RATIO to read a file that expands more.
DEFAULT_MAX_GZIP_RATIO = 100.0
MAX_GZIP_RATIO_ENV = "SCALEMB_MAX_GZIP_RATIO"
# Parquet / Arrow files: decoded rows cost 16 bytes (two int64 ids or codes) and may total at most this ratio
# times the file's size too (run-length encoding stores a billion equal rows in a few bytes).
_DECODED_ROW_BYTES = 16


def max_gzip_ratio() -> float:
    """How many times its own size a compressed input may expand to: ``SCALEMB_MAX_GZIP_RATIO`` or
    ``DEFAULT_MAX_GZIP_RATIO``."""
    return env_limit(MAX_GZIP_RATIO_ENV, DEFAULT_MAX_GZIP_RATIO, float, 1.0, "a number >= 1")


def expansion_limit(path: Path) -> int:
    """The most bytes ``path`` may decode to: ``max_gzip_ratio()`` times its size (at least 1 MiB)."""
    return int(max(max_gzip_ratio() * path.stat().st_size, 1 << 20))


def expansion_error(path: Path, what: str) -> InputError:
    return InputError(path, f"{what} more than {expansion_limit(path):,} bytes (the limit: {max_gzip_ratio():g} "
                            f"times the file's {path.stat().st_size:,} bytes, at least 1 MiB; set "
                            f"{MAX_GZIP_RATIO_ENV} higher to read it)")


class _CappedGzip(io.RawIOBase):
    """The decompressed bytes of a gzip file, refused (``InputError``) past ``expansion_limit``."""

    def __init__(self, path: Path):
        super().__init__()
        self.path, self.limit, self.count = path, expansion_limit(path), 0
        self.raw = gzip.open(path, "rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        self.count += n
        if self.count > self.limit:
            raise expansion_error(self.path, "gzip data decompresses to")
        return n

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
        super().close()


def _open_binary(path: Path):
    """The bytes of ``path``, decompressed (within ``expansion_limit``) if it ends in ``.gz``."""
    if path.suffix == ".gz":
        return io.BufferedReader(_CappedGzip(path), 1 << 16)
    return open(path, "rb")


def _max_line_chars() -> int:
    """The longest line read: two ids of ``max_id_chars()``, a weight, separators and blanks."""
    return 2 * max_id_chars() + 1024


def _lines(handle, path: Path):
    """The lines of text ``handle``, none longer than ``_max_line_chars()`` is held: a longer comment line is read
    in pieces and yielded as an empty comment, any other longer line refused (an id would exceed the limit)."""
    limit, line_no = _max_line_chars(), 0
    while line := handle.readline(limit):
        line_no += 1
        if len(line) == limit and not line.endswith("\n"):
            if not line.lstrip().startswith("#"):
                raise InputError(path, f"line is longer than {limit} characters: node ids are at most "
                                       f"{max_id_chars()} characters ({MAX_ID_CHARS_ENV})", line_no)
            while (rest := handle.readline(limit)) and not rest.endswith("\n"):
                pass
            line = "#\n"
        yield line


def _open_text(path: Path):
    """UTF-8 text (a leading byte-order mark is dropped, as pyarrow's CSV reader drops it); read its lines with
    ``_lines``."""
    return io.TextIOWrapper(_open_binary(path), encoding="utf-8-sig", errors="strict")


def _parse_id(token: str, path: Path, line_no: int) -> int | str:
    """An integer id (int), or the string id ``token`` (str) if it is not an integer."""
    if not token:
        raise InputError(path, "empty node id", line_no)
    try:
        value = int(token)
    except ValueError:
        return token
    if value < 0 or value > _INT64_MAX:
        raise InputError(path, f"node id {token} is outside 0..{_INT64_MAX}", line_no)
    return value


MIN_WEIGHT = float(np.finfo(np.float64).tiny)  # smallest normal float64
MAX_WEIGHT = 1e300


def _parse_weight(token: str, path: Path, line_no: int) -> float:
    try:
        value = float(token)
    except ValueError:
        raise InputError(path, f"weight {token!r} is not a number", line_no) from None
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:  # subnormal or huge weights make P underflow/overflow to NaN
        raise InputError(path, f"weight {token} must be a finite positive number in [{MIN_WEIGHT:.3g}, "
                               f"{MAX_WEIGHT:.3g}]", line_no)
    return value


def _is_comment_or_blank(line: str) -> bool:
    stripped = line.lstrip()
    return not stripped or stripped.startswith("#")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _is_integer(token: str) -> bool:
    try:
        int(token)
    except ValueError:
        return False
    return True


def _fields(line: str, sep) -> list:
    return [field.strip() for field in line.split(sep)] if sep else line.split()


class _IdKind:
    """The id kind of a file (integer or string), set by its first id; refuses ids of the other kind."""

    def __init__(self, path: Path):
        self.path, self.string, self.token, self.line = path, None, None, None

    def check(self, string: bool, token, line_no: int) -> None:
        if self.string is None:
            self.string, self.token, self.line = string, token, line_no
        elif string != self.string:
            def kind(value, string):
                return ("a string (a number, not an integer)" if _is_number(value) else "a string") if string \
                    else "an integer"

            raise InputError(self.path, f"node id {str(token)!r} is {kind(token, string)} but node id "
                                        f"{str(self.token)!r} on line {self.line} is {kind(self.token, self.string)}: "
                                        "ids must be all integers or all strings (to keep both, make every id a "
                                        "string, e.g. 'n1' for 1)", line_no)


def _parse_lines_slowly(lines, first_line, path, sep, kind: _IdKind) -> Edges:
    """Parse line by line (the exact rules); raises ``InputError`` at the first bad line.  String ids come back
    as codes into the chunk's distinct ids, each checked by ``id_problem`` where it first occurs."""
    src, dst, weight, codes, limit = [], [], [], {}, max_id_chars()
    for line_no, line in enumerate(lines, start=first_line):
        if _is_comment_or_blank(line):
            continue
        fields = _fields(line, sep)
        if len(fields) not in (2, 3):
            raise InputError(path, f"expected 'src dst [weight]', got {len(fields)} fields", line_no)
        a, b = _parse_id(fields[0], path, line_no), _parse_id(fields[1], path, line_no)
        kind.check(isinstance(a, str), a, line_no)
        kind.check(isinstance(b, str), b, line_no)
        if kind.string:
            for token in (a, b):
                if token not in codes:
                    problem = id_problem(token, limit)
                    if problem is not None:
                        raise InputError(path, problem, line_no)
                    codes[token] = len(codes)
            a, b = codes[a], codes[b]
        src.append(a)
        dst.append(b)
        weight.append(_parse_weight(fields[2], path, line_no) if len(fields) == 3 else 1.0)
    if not src:
        return Edges.empty()
    return Edges(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(weight, dtype=np.float64),
                 list(codes) if kind.string else None)


def _parse_lines(lines, first_line, path, sep, kind: _IdKind) -> Edges:
    """Edges of ``lines`` (numbered from ``first_line``) with numpy's C parser when every data line has the
    same number of valid integer fields (and the file's ids are integers), otherwise line by line."""
    start = next((k for k, line in enumerate(lines) if not _is_comment_or_blank(line)), None)
    if start is None:
        return Edges.empty()
    data = lines[start:]
    if "#" in "".join(data):
        data = [line for line in data if not _is_comment_or_blank(line)]
    n_fields = len(data[0].split(sep))
    if n_fields in (2, 3) and kind.string is not True:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                parsed = np.loadtxt(data, dtype=_EDGE if n_fields == 3 else _PAIR, delimiter=sep, comments=None,
                                    ndmin=1)
        except (ValueError, Warning):
            parsed = None
        if parsed is not None and parsed["src"].min() >= 0 and parsed["dst"].min() >= 0:
            weight = parsed["weight"] if n_fields == 3 else np.ones(parsed.size)
            if np.all((weight >= MIN_WEIGHT) & (weight <= MAX_WEIGHT)):
                kind.check(False, int(parsed["src"][0]), first_line + start)
                return Edges(np.ascontiguousarray(parsed["src"]), np.ascontiguousarray(parsed["dst"]),
                             np.ascontiguousarray(weight, dtype=np.float64))
    return _parse_lines_slowly(lines, first_line, path, sep, kind)


def _is_header(first: list, second: list | None) -> bool:
    """Whether the first data line (``first``'s fields; ``second``: the next data line's) is a header: its first
    field is not a number and its two first fields are column names, or its third field is a name over a
    numeric weight, or integer ids follow."""
    if len(first) < 2 or _is_number(first[0]):
        return False
    if first[0].lower() in HEADER_NAMES and first[1].lower() in HEADER_NAMES:
        return True
    if second is None or len(second) < 2:
        return False
    named_weight = len(first) == 3 and len(second) == 3 and not _is_number(first[2]) and _is_number(second[2])
    return named_weight or _is_integer(second[0])


def _sniff(path: Path):
    """``(sep, header line or None, line of the first data row or None)`` from the first two data lines: ``,``
    if the first holds one, else whitespace."""
    data = []
    with _open_text(path) as handle:
        for line_no, line in enumerate(_lines(handle, path), start=1):
            if not _is_comment_or_blank(line):
                data.append((line_no, line))
                if len(data) == 2:
                    break
    if not data:
        return None, None, None
    sep = "," if "," in data[0][1] else None
    first = _fields(data[0][1], sep)
    second = _fields(data[1][1], sep) if len(data) > 1 else None
    if _is_header(first, second):
        return sep, data[0][0], (data[1][0] if len(data) > 1 else None)
    return sep, None, data[0][0]


def _has_pyarrow() -> bool:
    try:
        import pyarrow.csv  # noqa: F401
    except ImportError:
        return False
    return True


def parse_edge_chunks(path, chunk_lines: int = 1_000_000, reader: str = "auto"):
    """Yield the ``Edges`` of consecutive parts of edge list ``path`` (about ``chunk_lines`` rows each), the one
    reader of edge lists (``read_edge_list`` and the streaming ``scalemb.affinity.ingest``); ``InputError``
    naming the file and line (row) of the first bad one.

    Text files are read by pyarrow's CSV reader when pyarrow is installed (``reader="auto"``; several times
    faster, docs/design/inputs.md) and accepted only if every value passes the checks the exact reader
    applies; from the first block that does not (a malformed line, a comment after the data, a mixed id ...)
    on, the exact reader (NumPy's parser per chunk, line by line for a chunk with a bad line) takes over at that
    block's first line, so every error names the file and line as it always did.  ``reader="exact"`` uses the
    exact reader throughout (``"arrow"``: pyarrow required)."""
    path = Path(path)
    if path.suffix.lower() in ARROW_SUFFIXES:
        yield from _arrow_chunks(path, chunk_lines)
        return
    if reader not in ("auto", "arrow", "exact"):
        raise ValueError(f"reader must be 'auto', 'arrow' or 'exact', got {reader!r}")
    kind = _IdKind(path)
    try:
        sep, header, data_line = _sniff(path)
        done = [0]
        if data_line is not None and reader != "exact" and (reader == "arrow" or _has_pyarrow()):
            if (yield from _csv_chunks(path, chunk_lines, sep, data_line, header, kind, done)):
                return
        yield from _exact_chunks(path, chunk_lines, sep, header, kind, done[0])
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise InputError(path, f"cannot read as text edge list ({exc.__class__.__name__}: {exc})") from None


def _exact_chunks(path: Path, chunk_lines: int, sep, header, kind: _IdKind, skip_rows: int = 0):
    """The exact reader: ``Edges`` per ``chunk_lines`` lines, after the first ``skip_rows`` data rows."""
    line_no = 1
    with _open_text(path) as text:
        handle = _lines(text, path)
        if skip_rows:
            for line in handle:
                if line_no != header and not _is_comment_or_blank(line):
                    skip_rows -= 1
                line_no += 1
                if skip_rows == 0:
                    break
        while lines := list(islice(handle, chunk_lines)):
            if header is not None and line_no <= header < line_no + len(lines):
                lines[header - line_no] = "\n"
            yield _parse_lines(lines, line_no, path, sep, kind)
            line_no += len(lines)


_INTEGER_LIKE = r"^\s*[+-]?[\p{Nd}_]+\s*$"  # what int() might accept: the exact reader decides


def _csv_string_ids(src, dst, sep):
    """``(src codes, dst codes, names)`` of two pyarrow string columns through one dictionary (each distinct id
    checked once), or None if the exact reader must decide: values it would read differently (blanks, integer-
    like text, a comment line among the data) or refuse (an empty id or one ``id_problem`` refuses)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(pa.concat_arrays([src, dst]))
    names = encoded.dictionary
    odd = (r"\s" if sep is None else r"^\s|\s$") + "|" + _INTEGER_LIKE + "|" + FORBIDDEN_RE2
    lengths = pc.utf8_length(names)
    if pc.any(pc.starts_with(src, "#")).as_py() or pc.min(lengths).as_py() == 0 or \
            pc.max(lengths).as_py() > max_id_chars() or pc.any(pc.match_substring_regex(names, odd)).as_py():
        return None
    codes = encoded.indices.to_numpy().astype(np.int64)
    return codes[:len(src)], codes[len(src):], names.to_pylist()


def _csv_edges(batch, sep) -> Edges | None:
    """``Edges`` of a pyarrow record batch, or None if the exact reader must read it."""
    import pyarrow as pa

    if batch.num_columns not in (2, 3):
        return None
    src, dst = batch.column(0), batch.column(1)
    if src.null_count or dst.null_count:
        return None
    if pa.types.is_int64(src.type) and pa.types.is_int64(dst.type):
        src, dst, names = src.to_numpy(), dst.to_numpy(), None
        if src.size and (src.min() < 0 or dst.min() < 0):
            return None
    elif pa.types.is_string(src.type) and pa.types.is_string(dst.type):
        ids = _csv_string_ids(src, dst, sep)
        if ids is None:
            return None
        src, dst, names = ids
    else:
        return None
    if batch.num_columns == 2:
        return Edges(src, dst, np.ones(src.size), names)
    column = batch.column(2)
    if column.null_count or not (pa.types.is_int64(column.type) or pa.types.is_float64(column.type)):
        return None
    weight = column.to_numpy().astype(np.float64)
    if not np.all((weight >= MIN_WEIGHT) & (weight <= MAX_WEIGHT)):
        return None
    return Edges(src, dst, weight, names)


def _csv_chunks(path: Path, chunk_lines: int, sep, data_line: int, header, kind: _IdKind, done: list):
    """Read with pyarrow's CSV reader (no quoting, no null or boolean values, empty lines skipped), yielding the
    blocks that pass the exact reader's checks (``done[0]``: the rows yielded); stops at the first that does not.
    Returns True if it read the whole file, else the caller resumes with the exact reader after ``done[0]`` rows."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    if sep is None:
        with _open_text(path) as handle:
            first = next(line for k, line in enumerate(_lines(handle, path), start=1) if k == data_line)
        sep_char = "\t" if "\t" in first else " "
    else:
        sep_char = sep
    read = pcsv.ReadOptions(skip_rows=(header or data_line - 1), autogenerate_column_names=True,
                            block_size=int(min(max(chunk_lines * 24, 1 << 12), 1 << 20)))
    parse = pcsv.ParseOptions(delimiter=sep_char, quote_char=False, double_quote=False, escape_char=False,
                              ignore_empty_lines=True)
    convert = pcsv.ConvertOptions(null_values=[], true_values=[], false_values=[], strings_can_be_null=False,
                                  quoted_strings_can_be_null=False, timestamp_parsers=[],
                                  column_types={"f2": pa.float64()})  # integer weights first, decimals later
    try:
        source = pa.PythonFile(_open_binary(path), mode="r") if path.suffix == ".gz" else \
            pa.input_stream(str(path), compression=None)  # as the exact reader: only .gz is decompressed
        reader = pcsv.open_csv(source, read_options=read, parse_options=parse, convert_options=convert)
    except pa.ArrowException:  # whatever pyarrow refuses, the exact reader reads or reports
        return False
    pending, n_pending, complete = [], 0, True
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowException:  # whatever pyarrow refuses, the exact reader reads or reports
            complete = False
            break
        edges = _csv_edges(batch, sep)
        if edges is None or (edges.size and kind.string not in (None, edges.string_ids)):
            complete = False
            break
        if edges.size:
            kind.check(edges.string_ids, edges.id_at(0), data_line)
            pending.append(edges)
            n_pending += edges.size
        if n_pending >= chunk_lines:  # blocks of at most 1 MB (pyarrow reads ahead in parallel), chunks of rows
            done[0] += n_pending
            yield Edges.join(pending)
            pending, n_pending = [], 0
    if pending:
        done[0] += n_pending
        yield Edges.join(pending)
    return complete


def first_lines(path, ids, column: int | None = None) -> list:
    """The line (row) of the first occurrence of each id in ``ids`` in edge list ``path`` (None if absent), in
    either endpoint column or only in ``column`` (0 or 1): only for error messages, re-reads the file."""
    columns = (0, 1) if column is None else (column,)
    path, wanted = Path(path), {str(i): None for i in ids}
    if path.suffix.lower() in ARROW_SUFFIXES:
        return _first_rows(path, wanted, columns)
    sep, header, _ = _sniff(path)
    with _open_text(path) as handle:
        for line_no, line in enumerate(_lines(handle, path), start=1):
            if _is_comment_or_blank(line) or line_no == header:
                continue
            fields = _fields(line, sep)
            for token in [fields[c] for c in columns if c < len(fields)]:
                token = str(int(token)) if _is_integer(token) else token
                if token in wanted and wanted[token] is None:
                    wanted[token] = line_no
            if None not in wanted.values():
                break
    return list(wanted.values())


def _first_rows(path: Path, wanted: dict, columns: tuple) -> list:
    """``first_lines`` of a columnar (Arrow, Parquet) edge list: rows counted from 1."""
    row = 0
    for edges in _arrow_chunks(path, 1 << 20, check=False):
        edges = edges.materialized()
        for k in range(edges.size):
            for value in [(edges.src[k], edges.dst[k])[c] for c in columns]:
                if str(value) in wanted and wanted[str(value)] is None:
                    wanted[str(value)] = row + k + 1
        row += edges.size
    return list(wanted.values())


def check_ids(node_ids: np.ndarray, path) -> None:
    """The checks on a file's whole set of (unique) ids: string ids differing only in case are refused."""
    unit = "rows" if Path(path).suffix.lower() in ARROW_SUFFIXES else "lines"
    check_case_collision(node_ids, path, lambda a, b: first_lines(path, (a, b)), unit)


def read_edge_list(path) -> Graph:
    """Parse an edge list file into a ``Graph``; raises ``InputError`` naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file")
    if not path.is_file():
        raise InputError(path, "not a regular file")
    pairs = PairSet()
    for edges in parse_edge_chunks(path):
        pairs.add(edges)
    if pairs.n_read == 0:
        raise InputError(path, "no edges (file is empty or only comments)")
    graph = pairs.graph(source=str(path))
    check_ids(graph.node_ids, path)
    return graph


def unique_pairs(lo: np.ndarray, hi: np.ndarray, weight: np.ndarray):
    """``(lo, hi, weight)`` sorted by ``(lo, hi)``, each pair once with its largest weight (``0 <= lo <= hi``).
    Pairs of ids below 2^31 are sorted as one int64 key ``lo * 2^32 + hi``, by value alone when every weight is
    equal (several times faster than the three-key sort)."""
    if lo.size and int(hi.max()) < 2 ** 31:
        key = (lo << 32) | hi
        if weight.min() == weight.max():
            key = np.sort(key)
            first = np.concatenate([[True], key[1:] != key[:-1]])
            key = key[first]
            return key >> 32, key & 0xFFFFFFFF, np.full(key.size, weight[0])
        order = np.lexsort((-weight, key))
        key, weight = key[order], weight[order]
        first = np.concatenate([[True], key[1:] != key[:-1]])
        return key[first] >> 32, key[first] & 0xFFFFFFFF, weight[first]
    order = np.lexsort((-weight, hi, lo))  # per pair, largest weight first
    lo, hi, weight = lo[order], hi[order], weight[order]
    first = np.ones(lo.size, dtype=bool)
    first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    return lo[first], hi[first], weight[first]


class PairSet:
    """The distinct unordered pairs of a streamed edge list, each with its largest weight: chunks are
    de-duplicated as they arrive and merged when the pending ones outnumber the merged pairs, so memory follows
    the distinct pairs (and ids), not the rows: a file repeating one line a hundred million times holds one pair.

    Integer ids are kept as they are (``lo < hi`` by value), string ids as ``IdCodes`` codes; ``graph`` numbers
    the nodes by sorted id, as ``graph_from_edges`` does, with the same result."""

    def __init__(self):
        self.ids, self.n_read = None, 0
        empty = np.empty(0, dtype=np.int64)
        self.merged, self.pending, self.n_pending = (empty, empty, np.empty(0)), [], 0

    def add(self, edges: Edges) -> None:
        self.n_read += edges.size
        keep = edges.src != edges.dst
        src, dst = edges.src[keep], edges.dst[keep]
        if edges.names is not None:
            self.ids = self.ids or IdCodes()
            table = self.ids.table(edges.names, np.unique(np.concatenate([src, dst])))
            src, dst = table[src], table[dst]
        if not src.size:
            return
        self.pending.append(unique_pairs(np.minimum(src, dst), np.maximum(src, dst), edges.weight[keep]))
        self.n_pending += self.pending[-1][0].size
        if self.n_pending >= max(self.merged[0].size, 1 << 16):  # amortised: each merge at least doubles it
            self._merge()

    def _merge(self) -> None:
        if self.pending:
            parts = [self.merged, *self.pending]
            self.merged = unique_pairs(*(np.concatenate([part[k] for part in parts]) for k in range(3)))
            self.pending, self.n_pending = [], 0

    def graph(self, source: str) -> Graph:
        self._merge()
        lo, hi, weight = self.merged
        if lo.size == 0:
            raise InputError(source, "graph has no edges once self-loops are removed")
        if self.ids is None:
            node_ids = np.unique(np.concatenate([lo, hi]))
            return Graph(node_ids, np.searchsorted(node_ids, lo), np.searchsorted(node_ids, hi), weight, source)
        node_ids, rank = self.ids.sorted_ids()  # every code is used: codes are given to ids of kept rows only
        a, b = rank[lo], rank[hi]
        lo, hi, weight = unique_pairs(np.minimum(a, b), np.maximum(a, b), weight)
        return Graph(node_ids, lo, hi, weight, source)


def graph_from_edges(src, dst, weight, source: str) -> Graph:
    """Build a ``Graph`` from raw id arrays (non-negative integers, or strings): drop self-loops, merge repeated
    pairs (max weight), drop isolated nodes."""
    string = is_string_ids(src) or is_string_ids(dst)
    id_type = str if string else np.uint64
    src = np.asarray(src, dtype=id_type)
    dst = np.asarray(dst, dtype=id_type)
    weight = np.asarray(weight, dtype=np.float64)
    keep = src != dst
    src, dst, weight = src[keep], dst[keep], weight[keep]
    if src.size == 0:
        raise InputError(source, "graph has no edges once self-loops are removed")
    node_ids, inverse = np.unique(np.concatenate([src, dst]), return_inverse=True)
    m = src.size
    a, b = inverse[:m].astype(np.int64), inverse[m:].astype(np.int64)
    lo, hi, weight = unique_pairs(np.minimum(a, b), np.maximum(a, b), weight)
    return Graph(node_ids if string else node_ids.astype(np.int64), lo, hi, weight, source)


# --- Parquet / Arrow IPC / Feather -----------------------------------------------------------------------------

def _require_pyarrow(path: Path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError(path, f"reading {path.suffix} edge lists needs pyarrow: pip install 'scalemb[arrow]'") \
            from None
    return pyarrow


def _arrow_batches(path: Path, chunk_rows: int):
    """``(columns, iterator of record batches)`` of a Parquet, Arrow IPC (file or stream) or Feather file: the
    columns read (``_arrow_columns``), string id columns dictionary-encoded as stored (a batch's rows then cost
    their codes, not copies of their ids).  A Parquet file whose rows or pages decode to more than
    ``expansion_limit`` is refused from its footer, before anything is decoded."""
    pa = _require_pyarrow(path)
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path)
            columns = _arrow_columns(path, meta.schema_arrow)
            limit, rows = expansion_limit(path), meta.metadata.num_rows
            decoded = sum(meta.metadata.row_group(k).total_byte_size for k in range(meta.metadata.num_row_groups))
            if rows * _DECODED_ROW_BYTES > limit or decoded > limit:
                raise expansion_error(path, f"{rows:,} rows ({decoded:,} bytes of pages) decode to")
            strings = [name for name in columns[:2] if _is_text(meta.schema_arrow.field(name).type)]
            reader = pq.ParquetFile(path, read_dictionary=strings)
            return columns, reader.iter_batches(batch_size=chunk_rows, columns=columns)
        import pyarrow.ipc as ipc

        try:
            reader = ipc.open_file(path)
            batches = (reader.get_batch(k) for k in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            reader = ipc.open_stream(path)
            batches = iter(reader)
        return _arrow_columns(path, reader.schema), batches
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, f"cannot read as a {path.suffix[1:]} table ({exc.__class__.__name__}: {exc})") \
            from None


def _is_text(kind) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _arrow_columns(path: Path, schema) -> list:
    names = list(schema.names)
    if "src" in names and "dst" in names:
        columns = ["src", "dst"] + (["weight"] if "weight" in names else [])
    elif len(names) not in (2, 3):
        raise InputError(path, f"columns {names}: expected 'src', 'dst' [, 'weight'] columns, or two or three "
                               "columns (endpoints, then the weight)")
    else:
        columns = names
    for name in columns:
        if names.count(name) > 1:
            raise InputError(path, f"column name {name!r} occurs {names.count(name)} times (columns {names}): "
                                   "rename the columns so that each is named once")
    return columns


def _arrow_integer_ids(path: Path, name: str, column, row0: int, check: bool) -> np.ndarray:
    ids = column.to_numpy(zero_copy_only=False)
    if check and ids.size and (ids.min() < 0 or (ids.dtype == np.uint64 and ids.max() > _INT64_MAX)):
        row = int(np.flatnonzero((ids < 0) | (ids > _INT64_MAX))[0])
        raise InputError(path, f"column {name!r}: node id {ids[row]} at row {row0 + row + 1} is outside "
                               f"0..{_INT64_MAX}")
    return ids.astype(np.int64)


def _dictionary(column):
    """``(dictionary as large_string, indices as int64)`` of a string or dictionary-of-strings column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    return column.dictionary.cast(pa.large_string()), column.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _arrow_string_ids(path: Path, columns: list, src, dst, row0: int, check: bool):
    """``(src codes, dst codes, names)`` of two string id columns through one dictionary; with ``check``, each
    distinct id of the batch passes ``id_problem`` (else ``InputError`` naming the column and row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    (d0, i0), (d1, i1) = _dictionary(src), _dictionary(dst)
    unified = pc.dictionary_encode(pa.concat_arrays([d0, d1]))
    table = unified.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    codes = (table[:len(d0)][i0], table[len(d0):][i1])
    # only the ids this batch uses (a Parquet dictionary is its row group's, every batch of it shares it)
    used = np.unique(np.concatenate(codes))
    codes = tuple(np.searchsorted(used, c) for c in codes)
    names = unified.dictionary.take(pa.array(used))
    if check:
        lengths, limit = pc.utf8_length(names), max_id_chars()
        if pc.min(lengths).as_py() == 0 or pc.max(lengths).as_py() > limit or \
                pc.any(pc.match_substring_regex(names, FORBIDDEN_RE2)).as_py():
            code, name = next((k, name) for k, name in enumerate(names.to_pylist()) if id_problem(name, limit))
            row, column = min((int(np.flatnonzero(ids == code)[0]), column)
                              for column, ids in zip(columns, codes) if (ids == code).any())
            raise InputError(path, f"column {column!r} has an empty node id at row {row0 + row + 1}" if not name
                             else f"column {column!r}, row {row0 + row + 1}: {id_problem(name, limit)}")
    return codes[0], codes[1], names.to_pylist()


def _arrow_ids(path: Path, columns: list, batch, row0: int, check: bool):
    """``(src, dst, names)`` of a batch: int64 ids and None, or string ids as codes into ``names``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    src, dst = (batch.column(name) for name in columns[:2])
    for name, column in zip(columns, (src, dst)):
        if check and column.null_count:
            row = int(pc.index(pc.is_null(column), True).as_py())
            raise InputError(path, f"column {name!r} has a null node id at row {row0 + row + 1}")
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        if not (pa.types.is_integer(kind) or _is_text(kind)):
            raise InputError(path, f"column {name!r} has type {column.type}: node ids must be integers or strings")
    text = [_is_text(column.type) for column in (src, dst)]
    if text[0] != text[1]:
        if not check:  # (first_lines of a file the checked reading accepted: never mixed)
            return src.to_numpy(zero_copy_only=False), dst.to_numpy(zero_copy_only=False), None
        raise InputError(path, f"column {columns[0]!r} holds {('integer', 'string')[text[0]]} ids and "
                               f"{columns[1]!r} {('integer', 'string')[text[1]]} ids: ids must be all integers or all "
                               "strings")
    if text[0]:
        return _arrow_string_ids(path, columns, src, dst, row0, check)
    src, dst = (c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in (src, dst))
    return _arrow_integer_ids(path, columns[0], src, row0, check), \
        _arrow_integer_ids(path, columns[1], dst, row0, check), None


def _arrow_weights(path: Path, name: str, column, row0: int) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise InputError(path, f"column {name!r} has type {column.type}: the weight must be a number")
    if column.null_count:
        row = int(pc.index(pc.is_null(column), True).as_py())
        raise InputError(path, f"column {name!r} has a null weight at row {row0 + row + 1}")
    weight = column.to_numpy(zero_copy_only=False).astype(np.float64)
    bad = ~((weight >= MIN_WEIGHT) & (weight <= MAX_WEIGHT))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InputError(path, f"weight {weight[row]} at row {row0 + row + 1} must be a finite positive number in "
                               f"[{MIN_WEIGHT:.3g}, {MAX_WEIGHT:.3g}]")
    return weight


def _arrow_chunks(path: Path, chunk_rows: int, check: bool = True):
    """``Edges`` of the record batches of a Parquet / Arrow / Feather file; errors name the column and row.  The
    rows read may decode to at most ``expansion_limit`` bytes (16 per row), checked batch by batch."""
    columns, batches = _arrow_batches(path, chunk_rows)
    row0, limit = 0, expansion_limit(path)
    for batch in batches:
        if check and (row0 + batch.num_rows) * _DECODED_ROW_BYTES > limit:
            raise expansion_error(path, f"its first {row0 + batch.num_rows:,} rows decode to")
        src, dst, names = _arrow_ids(path, columns, batch, row0, check)
        weight = _arrow_weights(path, columns[2], batch.column(columns[2]), row0) if len(columns) == 3 \
            else np.ones(len(src))
        row0 += len(src)
        yield Edges(src, dst, weight, names)
