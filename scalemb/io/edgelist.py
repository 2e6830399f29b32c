"""SNAP-style edge lists: ``src dst [weight]`` per line, ``#`` comments, tab/space separated, optionally gzipped.

Self-loops are dropped; an unordered pair listed several times (duplicates or both directions, as SNAP does
for undirected graphs) is one edge whose weight is the largest listed; nodes with no remaining edge are
removed.  Original node ids are kept (``node_ids[k]`` is the id of index ``k``, sorted ascending).
"""
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError

_INT64_MAX = np.iinfo(np.int64).max


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


def read_edge_list(path) -> Graph:
    """Parse an edge list file into a ``Graph``; raises ``InputError`` naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file")
    if not path.is_file():
        raise InputError(path, "not a regular file")
    src, dst, weight = [], [], []
    try:
        with _open_text(path) as handle:
            for line_no, line in enumerate(handle, start=1):
                fields = line.split()
                if not fields or fields[0].startswith("#"):
                    continue
                if len(fields) not in (2, 3):
                    raise InputError(path, f"expected 'src dst [weight]', got {len(fields)} fields", line_no)
                src.append(_parse_id(fields[0], path, line_no))
                dst.append(_parse_id(fields[1], path, line_no))
                weight.append(_parse_weight(fields[2], path, line_no) if len(fields) == 3 else 1.0)
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise InputError(path, f"cannot read as text edge list ({exc.__class__.__name__}: {exc})") from None
    if not src:
        raise InputError(path, "no edges (file is empty or only comments)")
    return graph_from_edges(np.array(src, dtype=np.uint64), np.array(dst, dtype=np.uint64),
                            np.array(weight, dtype=np.float64), source=str(path))


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
