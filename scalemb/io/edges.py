"""Edges and graphs in memory, shared by the edge-list readers (``scalemb.io.edgelist`` for text,
``scalemb.io.arrow_edges`` for Parquet / Arrow / Feather) and the streaming ingest (``scalemb.affinity.ingest``):
``Edges``, the raw rows of one chunk as every reader yields them; ``PairSet``, the distinct pairs merged as the
chunks stream in; ``Graph``, the undirected graph on contiguous indices; and the limits on what a small file may
decode to (``expansion_limit``) and on a weight (``MIN_WEIGHT`` .. ``MAX_WEIGHT``)."""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from .nodeids import env_limit, is_string_ids

_INT64_MAX = np.iinfo(np.int64).max
_EDGE = np.dtype([("src", "<i8"), ("dst", "<i8"), ("weight", "<f8")])


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


MIN_WEIGHT = float(np.finfo(np.float64).tiny)  # smallest normal float64
MAX_WEIGHT = 1e300


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
