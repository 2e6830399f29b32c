"""SNAP-style edge lists: ``src dst [weight]`` per line, ``#`` comments, tab/space separated or CSV (a first
data line with a non-numeric first field is a header), optionally gzipped; one parser (``parse_edge_chunks``)
for every command, in-memory and streaming.

Self-loops are dropped; an unordered pair listed several times (duplicates or both directions, as SNAP does
for undirected graphs) is one edge whose weight is the largest listed; nodes with no remaining edge are
removed.  Original node ids are kept (``node_ids[k]`` is the id of index ``k``, sorted ascending).
"""
import gzip
import warnings
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from ..errors import InputError

_INT64_MAX = np.iinfo(np.int64).max
_EDGE = np.dtype([("src", "<i8"), ("dst", "<i8"), ("weight", "<f8")])
_PAIR = np.dtype([("src", "<i8"), ("dst", "<i8")])


@dataclass
class Graph:
    """An undirected weighted graph on contiguous indices ``0..n-1``, each edge once with ``src < dst``."""

    node_ids: np.ndarray  # int64, (n,)
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


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="strict")
    return open(path, "rt", encoding="utf-8", errors="strict")


def _parse_id(token: str, path: Path, line_no: int) -> int:
    try:
        value = int(token)
    except ValueError:
        raise InputError(path, f"node id {token!r} is not an integer", line_no) from None
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


def _parse_lines_slowly(lines, first_line, path, sep) -> np.ndarray:
    """Parse line by line (the rules of ``read_edge_list``); raises ``InputError`` at the first bad line."""
    rows = []
    for line_no, line in enumerate(lines, start=first_line):
        if _is_comment_or_blank(line):
            continue
        fields = [field.strip() for field in line.split(sep)] if sep else line.split()
        if len(fields) not in (2, 3):
            raise InputError(path, f"expected 'src dst [weight]', got {len(fields)} fields", line_no)
        rows.append((_parse_id(fields[0], path, line_no), _parse_id(fields[1], path, line_no),
                     _parse_weight(fields[2], path, line_no) if len(fields) == 3 else 1.0))
    return np.array(rows, dtype=_EDGE)


def _parse_lines(lines, first_line, path, sep) -> np.ndarray:
    """Edges of ``lines`` (numbered from ``first_line``) with numpy's C parser when every data line has the
    same number of valid fields, otherwise line by line."""
    start = next((k for k, line in enumerate(lines) if not _is_comment_or_blank(line)), None)
    if start is None:
        return np.empty(0, dtype=_EDGE)
    data = lines[start:]
    if "#" in "".join(data):
        data = [line for line in data if not _is_comment_or_blank(line)]
    n_fields = len(data[0].split(sep))
    if n_fields in (2, 3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                parsed = np.loadtxt(data, dtype=_EDGE if n_fields == 3 else _PAIR, delimiter=sep, comments=None,
                                    ndmin=1)
        except (ValueError, Warning):
            parsed = None
        if parsed is not None and parsed["src"].min() >= 0 and parsed["dst"].min() >= 0:
            edges = np.empty(parsed.size, dtype=_EDGE)
            edges["src"], edges["dst"] = parsed["src"], parsed["dst"]
            edges["weight"] = parsed["weight"] if n_fields == 3 else 1.0
            weight = edges["weight"]
            if np.all((weight >= MIN_WEIGHT) & (weight <= MAX_WEIGHT)):
                return edges
    return _parse_lines_slowly(lines, first_line, path, sep)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def parse_edge_chunks(path: Path, chunk_lines: int = 1_000_000):
    """Yield the edges of each chunk of ``chunk_lines`` lines (``_EDGE`` records), the one parser of edge lists
    (``read_edge_list`` and the streaming ``scalemb.affinity.ingest``).  The separator is ``,`` if the first data line
    holds one (then a first data line whose first field is not a number is a header), else whitespace."""
    sep, decided, line_no = None, False, 1
    try:
        with _open_text(path) as handle:
            while lines := list(islice(handle, chunk_lines)):
                if not decided:
                    first = next((k for k, line in enumerate(lines) if not _is_comment_or_blank(line)), None)
                    if first is not None:
                        decided = True
                        if "," in lines[first]:
                            sep = ","
                            if not _is_number(lines[first].split(",")[0].strip()):
                                lines[first] = "\n"
                yield _parse_lines(lines, line_no, path, sep)
                line_no += len(lines)
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise InputError(path, f"cannot read as text edge list ({exc.__class__.__name__}: {exc})") from None


def read_edge_list(path) -> Graph:
    """Parse an edge list file into a ``Graph``; raises ``InputError`` naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file")
    if not path.is_file():
        raise InputError(path, "not a regular file")
    chunks = list(parse_edge_chunks(path))
    edges = np.concatenate(chunks) if chunks else np.empty(0, dtype=_EDGE)
    if edges.size == 0:
        raise InputError(path, "no edges (file is empty or only comments)")
    return graph_from_edges(edges["src"].astype(np.uint64), edges["dst"].astype(np.uint64), edges["weight"],
                            source=str(path))


def graph_from_edges(src, dst, weight, source: str) -> Graph:
    """Build a ``Graph`` from raw id arrays: drop self-loops, merge repeated pairs (max weight), drop isolated."""
    src = np.asarray(src, dtype=np.uint64)
    dst = np.asarray(dst, dtype=np.uint64)
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
    return Graph(node_ids.astype(np.int64), lo[first], hi[first], weight[first], source)
