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
that differ only in case (``Alice``, ``alice``) are refused, naming both and their lines; empty ids are refused.

Self-loops are dropped; an unordered pair listed several times (duplicates or both directions, as SNAP does
for undirected graphs) is one edge whose weight is the largest listed; nodes with no remaining edge are
removed.  Original node ids are kept (``node_ids[k]`` is the id of index ``k``, sorted ascending: numerically
for integers, by code point for strings).
"""
import gzip
import warnings
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from ..errors import InputError
from .nodeids import check_case_collision, is_string_ids

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
    """Raw edges of a chunk: ``src``/``dst`` ids (int64, or ``<U`` strings), ``weight`` float64."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray

    @property
    def size(self) -> int:
        return int(self.src.size)

    @property
    def string_ids(self) -> bool:
        return is_string_ids(self.src)

    @classmethod
    def empty(cls) -> "Edges":
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))

    @classmethod
    def concat(cls, chunks) -> "Edges":
        chunks = [c for c in chunks if c.size]
        if not chunks:
            return cls.empty()
        return cls(*(np.concatenate([getattr(c, name) for c in chunks]) for name in ("src", "dst", "weight")))


def _open_text(path: Path):
    """UTF-8 text (a leading byte-order mark is dropped, as pyarrow's CSV reader drops it)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="strict")
    return open(path, "rt", encoding="utf-8-sig", errors="strict")


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
    """Parse line by line (the exact rules); raises ``InputError`` at the first bad line."""
    src, dst, weight = [], [], []
    for line_no, line in enumerate(lines, start=first_line):
        if _is_comment_or_blank(line):
            continue
        fields = _fields(line, sep)
        if len(fields) not in (2, 3):
            raise InputError(path, f"expected 'src dst [weight]', got {len(fields)} fields", line_no)
        a, b = _parse_id(fields[0], path, line_no), _parse_id(fields[1], path, line_no)
        kind.check(isinstance(a, str), a, line_no)
        kind.check(isinstance(b, str), b, line_no)
        src.append(a)
        dst.append(b)
        weight.append(_parse_weight(fields[2], path, line_no) if len(fields) == 3 else 1.0)
    if not src:
        return Edges.empty()
    id_type = str if kind.string else np.int64
    return Edges(np.array(src, dtype=id_type), np.array(dst, dtype=id_type), np.array(weight, dtype=np.float64))


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
        for line_no, line in enumerate(handle, start=1):
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
    faster, ``benchmarks/results/parse.md``) and accepted only if every value passes the checks the exact reader
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
    with _open_text(path) as handle:
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


def _csv_ids(column, sep, first: bool):
    """A pyarrow id column as int64 or ``<U``, or None if the exact reader must decide (values it would read
    differently or refuse).  String columns are checked and converted through their dictionary (each distinct id
    once)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        return None
    if pa.types.is_int64(column.type):
        ids = column.to_numpy()
        return ids if not ids.size or ids.min() >= 0 else None
    if not pa.types.is_string(column.type):
        return None
    encoded = pc.dictionary_encode(column)
    names = encoded.dictionary
    odd = (r"\s" if sep is None else r"^\s|\s$") + ("|^#" if first else "") + "|" + _INTEGER_LIKE
    if pc.any(pc.equal(pc.utf8_length(names), 0)).as_py() or pc.any(pc.match_substring_regex(names, odd)).as_py():
        return None
    return np.asarray(names.to_numpy(zero_copy_only=False), dtype=str)[encoded.indices.to_numpy()]


def _csv_edges(batch, sep) -> Edges | None:
    """``Edges`` of a pyarrow record batch, or None if the exact reader must read it."""
    import pyarrow as pa

    if batch.num_columns not in (2, 3):
        return None
    src, dst = _csv_ids(batch.column(0), sep, True), _csv_ids(batch.column(1), sep, False)
    if src is None or dst is None or is_string_ids(src) != is_string_ids(dst):
        return None
    if batch.num_columns == 2:
        return Edges(src, dst, np.ones(src.size))
    column = batch.column(2)
    if column.null_count or not (pa.types.is_int64(column.type) or pa.types.is_float64(column.type)):
        return None
    weight = column.to_numpy().astype(np.float64)
    if not np.all((weight >= MIN_WEIGHT) & (weight <= MAX_WEIGHT)):
        return None
    return Edges(src, dst, weight)


def _csv_chunks(path: Path, chunk_lines: int, sep, data_line: int, header, kind: _IdKind, done: list):
    """Read with pyarrow's CSV reader (no quoting, no null or boolean values, empty lines skipped), yielding the
    blocks that pass the exact reader's checks (``done[0]``: the rows yielded); stops at the first that does not.
    Returns True if it read the whole file, else the caller resumes with the exact reader after ``done[0]`` rows."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    if sep is None:
        with _open_text(path) as handle:
            first = next(line for k, line in enumerate(handle, start=1) if k == data_line)
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
        reader = pcsv.open_csv(pa.input_stream(str(path)), read_options=read, parse_options=parse,
                               convert_options=convert)
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
            kind.check(edges.string_ids, edges.src[0], data_line)
            pending.append(edges)
            n_pending += edges.size
        if n_pending >= chunk_lines:  # blocks of at most 1 MB (pyarrow reads ahead in parallel), chunks of rows
            done[0] += n_pending
            yield Edges.concat(pending)
            pending, n_pending = [], 0
    if pending:
        done[0] += n_pending
        yield Edges.concat(pending)
    return complete


def first_lines(path, ids, column: int | None = None) -> list:
    """The line (row) of the first occurrence of each id in ``ids`` in edge list ``path`` (None if absent), in
    either endpoint column or only in ``column`` (0 or 1): only for error messages, re-reads the file."""
    columns = (0, 1) if column is None else (column,)
    path, wanted = Path(path), {str(i): None for i in ids}
    if path.suffix.lower() in ARROW_SUFFIXES:
        row = 0
        for edges in _arrow_chunks(path, 1 << 20, check=False):
            for k in range(edges.size):
                for value in [(edges.src[k], edges.dst[k])[c] for c in columns]:
                    if str(value) in wanted and wanted[str(value)] is None:
                        wanted[str(value)] = row + k + 1
            row += edges.size
        return list(wanted.values())
    sep, header, _ = _sniff(path)
    with _open_text(path) as handle:
        for line_no, line in enumerate(handle, start=1):
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
    edges = Edges.concat(parse_edge_chunks(path))
    if edges.size == 0:
        raise InputError(path, "no edges (file is empty or only comments)")
    graph = graph_from_edges(edges.src, edges.dst, edges.weight, source=str(path))
    check_ids(graph.node_ids, path)
    return graph


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
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((-weight, hi, lo))  # per pair, largest weight first
    lo, hi, weight = lo[order], hi[order], weight[order]
    first = np.ones(lo.size, dtype=bool)
    first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    return Graph(node_ids if string else node_ids.astype(np.int64), lo[first], hi[first], weight[first], source)


# --- Parquet / Arrow IPC / Feather -----------------------------------------------------------------------------

def _require_pyarrow(path: Path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError(path, f"reading {path.suffix} edge lists needs pyarrow: pip install 'scalemb[arrow]'") \
            from None
    return pyarrow


def _arrow_batches(path: Path, chunk_rows: int):
    """``(schema, iterator of record batches)`` of a Parquet, Arrow IPC (file or stream) or Feather file."""
    pa = _require_pyarrow(path)
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            reader = pq.ParquetFile(path)
            return reader.schema_arrow, reader.iter_batches(batch_size=chunk_rows)
        import pyarrow.ipc as ipc

        try:
            reader = ipc.open_file(path)
            return reader.schema, (reader.get_batch(k) for k in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            reader = ipc.open_stream(path)
            return reader.schema, iter(reader)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, f"cannot read as a {path.suffix[1:]} table ({exc.__class__.__name__}: {exc})") \
            from None


def _arrow_columns(path: Path, schema) -> list:
    names = list(schema.names)
    if "src" in names and "dst" in names:
        return ["src", "dst"] + (["weight"] if "weight" in names else [])
    if len(names) not in (2, 3):
        raise InputError(path, f"columns {names}: expected 'src', 'dst' [, 'weight'] columns, or two or three "
                               "columns (endpoints, then the weight)")
    return names


def _arrow_ids(path: Path, name: str, column, row0: int, check: bool) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if check and column.null_count:
        row = int(pc.index(pc.is_null(column), True).as_py())
        raise InputError(path, f"column {name!r} has a null node id at row {row0 + row + 1}")
    if pa.types.is_integer(column.type):
        ids = column.to_numpy(zero_copy_only=False)
        if check and ids.size and (ids.min() < 0 or (ids.dtype == np.uint64 and ids.max() > _INT64_MAX)):
            row = int(np.flatnonzero((ids < 0) | (ids > _INT64_MAX))[0])
            raise InputError(path, f"column {name!r}: node id {ids[row]} at row {row0 + row + 1} is outside "
                                   f"0..{_INT64_MAX}")
        return ids.astype(np.int64)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or \
            pa.types.is_string_view(column.type):
        ids = np.asarray(column.to_numpy(zero_copy_only=False), dtype=str)
        if check and ids.size and not np.all(np.char.str_len(ids)):
            row = int(np.flatnonzero(np.char.str_len(ids) == 0)[0])
            raise InputError(path, f"column {name!r} has an empty node id at row {row0 + row + 1}")
        return ids
    raise InputError(path, f"column {name!r} has type {column.type}: node ids must be integers or strings")


def _arrow_weights(path: Path, name: str, column, row0: int) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

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
    """``Edges`` of the record batches of a Parquet / Arrow / Feather file; errors name the column and row."""
    schema, batches = _arrow_batches(path, chunk_rows)
    columns = _arrow_columns(path, schema)
    row0 = 0
    for batch in batches:
        src, dst = (_arrow_ids(path, name, batch.column(name), row0, check) for name in columns[:2])
        if check and is_string_ids(src) != is_string_ids(dst):
            raise InputError(path, f"column {columns[0]!r} holds {('integer', 'string')[is_string_ids(src)]} ids and "
                                   f"{columns[1]!r} {('integer', 'string')[is_string_ids(dst)]} ids: ids must be all "
                                   "integers or all strings")
        weight = _arrow_weights(path, columns[2], batch.column(columns[2]), row0) if len(columns) == 3 \
            else np.ones(src.size)
        row0 += src.size
        yield Edges(src, dst, weight)
