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
the chunks stream in (``scalemb.io.edges.PairSet``), so memory follows the distinct pairs, not the rows.

Self-loops are dropped; an unordered pair listed several times (duplicates or both directions, as SNAP does
for undirected graphs) is one edge whose weight is the largest listed; nodes with no remaining edge are
removed.  Original node ids are kept (``node_ids[k]`` is the id of index ``k``, sorted ascending: numerically
for integers, by code point for strings).
"""
import gzip
import io
import warnings
from itertools import islice
from pathlib import Path

import numpy as np

from ..errors import InputError
from .arrow_edges import arrow_chunks
from .edges import (_EDGE, _INT64_MAX, MAX_WEIGHT, MIN_WEIGHT, Edges, Graph, PairSet, expansion_error,
                    expansion_limit)
from .nodeids import FORBIDDEN_RE2, MAX_ID_CHARS_ENV, check_case_collision, id_problem, max_id_chars

_PAIR = np.dtype([("src", "<i8"), ("dst", "<i8")])
ARROW_SUFFIXES = (".parquet", ".arrow", ".feather")
HEADER_NAMES = frozenset({"src", "dst", "source", "target", "from", "to", "node1", "node2", "head", "tail",
                          "id1", "id2", "source_id", "target_id", "from_id", "to_id", "fromnodeid", "tonodeid",
                          "node_a", "node_b", "src_id", "dst_id", "weight"})


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
        yield from arrow_chunks(path, chunk_lines)
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
    for edges in arrow_chunks(path, 1 << 20, check=False):
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
