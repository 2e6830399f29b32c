"""A locality-preserving point order for P, for the sparse kernels' neighbour gathers.

The attraction (``scalemb.models.kernels``) reads, for each row i of P, the coordinates of i's neighbours j.
In the input's order (e.g. points of many clusters interleaved) the neighbours of consecutive rows lie all
over the coordinate array, and most reads miss the caches.  The reverse Cuthill-McKee order of P's graph
(Cuthill & McKee 1969; George & Liu 1981, ``scipy.sparse.csgraph.reverse_cuthill_mckee``) numbers every
point close to its neighbours (it minimises the bandwidth ``max |order(i) - order(j)|`` over the edges,
heuristically), so consecutive rows share the neighbours' cache lines: the attraction on a 1e5-point kNN P
(``benchmarks/repulsion.py``) ran ~1.5x faster single-threaded in this order.  After convergence, neighbours
in P are also close in the embedding, so the interpolation's grid accesses gain a little too.
"""
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

from ..errors import ScalembError


def locality_order(P: sp.csr_matrix) -> np.ndarray:
    """The points of the symmetric ``P`` in reverse Cuthill-McKee order: ``order[k]`` is the k-th point
    (int64, a permutation of ``range(N)``; deterministic)."""
    return np.asarray(reverse_cuthill_mckee(sp.csr_matrix(P), symmetric_mode=True), dtype=np.int64)


def inverse_permutation(order: np.ndarray) -> np.ndarray:
    """``rank`` with ``rank[order[k]] = k``."""
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0], dtype=order.dtype)
    return rank


# Point orders an affinity store can be written in (``write_affinity_store(point_order=...)``, ``scalemb affinity
# --point-order``).  The store's rows, columns, node ids and per-point arrays all follow the order, so every
# output (indexed by the store's node ids) still maps back to the input's ids.
STORE_POINT_ORDERS = ("given", "rcm", "partition")
METIS_SEED = 0
METIS_UFACTOR = 1  # allowed imbalance per bisection, in 1/1000: parts within ~0.1 % of their target size


def _pymetis():
    try:
        import pymetis
    except ImportError:
        raise ScalembError("--point-order partition needs the graph partitioner pymetis, which is not installed: "
                           "pip install 'scalemb[partition]' (or pip install pymetis)") from None
    return pymetis


def check_point_order(name: str) -> None:
    """ValueError for an unknown store point order; ScalembError if ``'partition'`` and pymetis is missing
    (checked before any work, so a failing run writes nothing)."""
    if name not in STORE_POINT_ORDERS:
        raise ValueError(f"unknown point order {name!r}; choose one of {', '.join(STORE_POINT_ORDERS)}")
    if name == "partition":
        _pymetis()


def metis_parts(P: sp.csr_matrix, n_parts: int, target_fractions=None, weights=None) -> np.ndarray:
    """Part (0..n_parts-1) of every point of P's graph by METIS multilevel recursive bisection (Karypis & Kumar
    1998, via pymetis), minimising the edges cut under a balance of ``METIS_UFACTOR``/1000 per bisection.

    Part k's halo is ``h_k = |{j not in V_k : p_ij > 0 for some i in V_k}|``; every halo entry needs a cut
    edge and every cut edge adds at most one entry to each side's halo, so ``sum_k h_k <= 2 cut``: fewer cut
    edges, smaller halos.  Recursive bisection balances the parts to ~0.1 %; METIS k-way minimising the
    communication volume ``sum_k h_k`` directly (``objtype=vol``) found halo sums within 2.5 % of it at K = 4-47
    on generated co-authorship graphs (12 % larger at K = 64), 1.4-5x the CPU time, with parts up to 2 % off their size
    (docs/design/inputs.md).  Bisection numbers the parts hierarchically (parts ``[0, K/2)`` are the first
    bisection's first side), so contiguous ranges of parts are good coarser partitions too.  ``target_fractions``:
    each part's share of the total vertex weight (``weights``: per point, default 1).  Deterministic: METIS's seed
    is fixed."""
    pymetis = _pymetis()
    n = P.shape[0]
    if n_parts <= 1 or n <= 1:
        return np.zeros(n, dtype=np.int64)
    P = sp.csr_matrix(P)
    dtype = np.dtype(pymetis.zero_copy_dtype()) if hasattr(pymetis, "zero_copy_dtype") else np.dtype(np.int32)
    if P.nnz >= np.iinfo(dtype).max:
        raise ScalembError(f"P has {P.nnz} non-zeros, more than this METIS build's {dtype} indices hold")
    adjacency = pymetis.CSRAdjacency(P.indptr.astype(dtype), P.indices.astype(dtype))
    options = pymetis.Options(seed=METIS_SEED, ufactor=METIS_UFACTOR)
    tpwgts = None if target_fractions is None else [float(f) for f in target_fractions]
    vweights = None if weights is None else np.asarray(weights, dtype=dtype)
    _, parts = pymetis.part_graph(int(n_parts), adjacency, vweights=vweights, tpwgts=tpwgts, recursive=True,
                                  options=options)
    return np.asarray(parts, dtype=np.int64)


def partition_order(P: sp.csr_matrix, parts: np.ndarray) -> np.ndarray:
    """The points grouped by part (parts in increasing number), each part's points in the reverse Cuthill-McKee
    order of the graph they induce (for the kernels' cache locality, as ``locality_order``): ``order[k]`` is the
    k-th point."""
    grouped = np.lexsort((np.arange(parts.size), parts)).astype(np.int64)
    Q = sp.csr_matrix(P)[grouped][:, grouped]
    bounds = np.concatenate([[0], np.cumsum(np.bincount(parts, minlength=int(parts.max()) + 1))])
    pieces = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            local = reverse_cuthill_mckee(sp.csr_matrix(Q[a:b, a:b]), symmetric_mode=True)
            pieces.append(grouped[a:b][np.asarray(local, dtype=np.int64)])
    return np.concatenate(pieces) if pieces else grouped


def store_point_order(P: sp.csr_matrix, name: str, layout_bounds: np.ndarray | None,
                      n_partitions: int | None = None):
    """``(order, partitions, info)`` for writing P's store in point order ``name``.

    ``order``: the permutation (None for ``'given'``); ``partitions``: row boundaries the store must record (None:
    the usual ones computed on the permuted P); ``info``: what the store's provenance records.  ``'partition'``
    splits into the store's own partition count -- a function of the data (``layout_bounds``, the
    data-determined layout, when ``n_partitions`` is None), never of the worker count:

    * default layout: METIS parts with the layout's row shares as targets, and the store keeps the layout's
      boundaries exactly (the data-determined blocks every executor uses, equal row counts balancing the
      repulsion); the ~0.1 % of points of a part beyond its target spill into the neighbouring partition;
    * ``n_partitions`` K: METIS parts balancing non-zeros (vertex weight = row length, as
      ``balanced_partitions``), and the partitions are the parts themselves.
    """
    check_point_order(name)
    n = P.shape[0]
    if name == "given":
        return None, None, {"name": "given"}
    if name == "rcm":
        return locality_order(P), None, {"name": "rcm", "method": "reverse Cuthill-McKee (scipy)"}
    pymetis = _pymetis()
    if n_partitions is None:
        k = int(layout_bounds.size - 1)
        parts = metis_parts(P, k, target_fractions=np.diff(layout_bounds) / n)
        partitions = None
    else:
        k = int(max(1, min(n_partitions, n)))
        weights = np.maximum(np.diff(sp.csr_matrix(P).indptr), 1)
        parts = metis_parts(P, k, weights=weights)
        sizes = np.bincount(parts, minlength=k)
        partitions = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64) if sizes.min() > 0 else None
    info = {"name": "partition", "method": "METIS recursive bisection (pymetis) + reverse Cuthill-McKee per part",
            "parts": k, "balance": "rows" if n_partitions is None else "nnz", "metis_seed": METIS_SEED,
            "metis_ufactor": METIS_UFACTOR, "pymetis": str(pymetis.version)}
    return partition_order(P, parts), partitions, info
