"""The joint affinity ``P'`` of a stored map's points and new ones, built the way the run's P was built.

Graph runs (``coauthorship`` or ``normalized`` P from edge weights C): ``P'`` is that rule applied to the union
of the run's graph and the new edges, so it is exactly the affinity a full re-embedding of the grown graph
would use (old-old entries change too: the old nodes' degrees grow).  The new edges come as an edge list (the
one reader, ``scalemb.io.edgelist``: text, CSV, Parquet, Arrow; integer or string ids as the map's), an ordinary
undirected edge list in either column order: an end that is not a stored node is a new node (``read_new_edges``).

kNN runs (``scalemb affinity --knn``): each new row's ``k`` nearest reference rows (exact search; same ``k``,
metric -- for supervised runs the learned LiRaM dissimilarity of the stored model -- and perplexity or uniform
weights as the run's provenance), conditional affinities ``p_j|i``
calibrated as ``affinity.knn.conditional_affinities`` does, and, the reference's own neighbour lists being
unchanged, ``P' = [[N P / (N + M), C^T / (2(N + M))], [C / (2(N + M)), 0]]`` with ``C`` the ``M x N``
conditional rows: the joint ``(P_cond + P_cond^T) / (2 N')`` of all ``N' = N + M`` points.
"""
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.spatial.distance import cdist

from ..affinity.affinity import Affinity, row_partition
from ..affinity.graph import coauthorship_affinity, normalized_affinity
from ..affinity.knn import METRICS, PERPLEXITY, conditional_affinities
from ..methods import affinity_metric
from ..errors import InputError
from ..io.edges import Edges, Graph, graph_from_edges
from ..io.edgelist import first_lines, parse_edge_chunks
from ..io.nodeids import as_node_ids, check_case_collision, is_string_ids

_BLOCK_ENTRIES = 1 << 22  # distances held at once by the exact search (32 MB)


def read_new_edges(path, old_ids: np.ndarray):
    """Parse the new nodes' edge list (any edge-list format ``scalemb.io.edgelist`` reads): ``A B [weight]`` per
    row, an undirected edge in either column order (SNAP-style files list each edge once, in any order, or in
    both directions).  The rule is ``new_edges``'; its errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "no such file" if not path.exists() else "not a regular file")
    edges = Edges.concat(parse_edge_chunks(path))
    if edges.size == 0:
        raise InputError(path, "no edges (file is empty or only comments)")
    return new_edges(edges.src, edges.dst, edges.weight, old_ids, path,
                     line=lambda ids, column=None: first_lines(path, ids, column=column))


def new_edges(first, second, weight, old_ids: np.ndarray, source, line=None):
    """The new nodes' edges ``first[i] -- second[i]`` (weights ``weight``) against the stored map's ``old_ids``:
    an end that is not a stored id is a new node; every edge needs at least one new end (an edge between two
    stored nodes would change the stored graph, which placement keeps).  Returns ``(new_ids (sorted), src, dst,
    weight)`` with ``src`` the new end of each edge (for an edge between two new nodes, the first); self-loops are
    dropped.  ``InputError`` naming ``source`` (and, with ``line(ids, column)``, the line) on any violation."""
    line = line or (lambda ids, column=None: [None] * len(ids))
    first, second = as_node_ids(first), as_node_ids(second)
    weight = np.asarray(weight, dtype=np.float64)
    old_sorted = np.sort(as_node_ids(old_ids))
    if old_sorted.size and is_string_ids(first) != is_string_ids(old_sorted):
        kinds = ("integers", "strings")
        raise InputError(source, f"node ids are {kinds[is_string_ids(first)]} but the stored map's are "
                                 f"{kinds[is_string_ids(old_sorted)]}", line([first[0]])[0])
    first_old, second_old = np.isin(first, old_sorted), np.isin(second, old_sorted)
    both_old = first_old & second_old
    if both_old.any():
        k = int(np.flatnonzero(both_old)[0])
        count = int(both_old.sum())
        raise InputError(source, f"edge {first[k]} {second[k]} joins two nodes of the stored map ({count} such "
                                 f"line{'s' if count != 1 else ''}; every edge needs a new node at one end)",
                         line([first[k]], column=0)[0])
    swap = first_old  # the new end goes first
    src, dst = np.where(swap, second, first), np.where(swap, first, second)
    new_ids = np.unique(np.concatenate([src, dst[~np.isin(dst, old_sorted)]]))
    check_case_collision(np.unique(np.concatenate([old_sorted, new_ids])), source, lambda a, b: line((a, b)))
    keep = src != dst
    return new_ids, src[keep], dst[keep], weight[keep]


def networkx_new_edges(G, old_ids: np.ndarray):
    """``read_new_edges`` for a networkx graph ``G`` holding the new nodes' edges (``weight`` attributes, 1
    without; edges between fitted nodes are ignored): ``(new_ids, src, dst, weight)``."""
    edges = list(G.edges(data="weight", default=1.0))
    names = np.empty(2 * len(edges), dtype=object)
    names[:] = [end for u, v, _ in edges for end in (u, v)]
    try:
        ends = as_node_ids(names, "node names") if len(edges) else np.zeros(0, dtype=np.int64)
    except ValueError as exc:
        raise InputError("networkx graph", str(exc)) from None
    first, second = ends[0::2], ends[1::2]
    weight = np.asarray([w for _, _, w in edges], dtype=np.float64)
    fitted = np.isin(first, old_ids) & np.isin(second, old_ids)  # the fitted graph's own edges
    if (~fitted).sum() == 0:
        raise InputError("networkx graph", "no edge with a new node (every node is in the fitted map)")
    if not np.all(np.isfinite(weight)) or (weight <= 0).any():
        raise InputError("networkx graph", "edge weights must be finite and positive")
    new_ids, src, dst, weight = new_edges(first[~fitted], second[~fitted], weight[~fitted], old_ids,
                                          "networkx graph")
    isolated = [n for n in G.nodes() if G.degree(n) == 0]
    if isolated:
        raise InputError("networkx graph", f"{len(isolated)} new nodes have no edge (e.g. node "
                                           f"{isolated[0]!r}); every new node needs a neighbour")
    return new_ids, src, dst, weight


def extended_graph_affinity(old: Graph, rule: str, old_ids: np.ndarray, new_ids, src, dst, weight) -> sp.csr_matrix:
    """``P'`` over ``[old_ids, new_ids]`` (that order) from the union of graph ``old`` and the new edges,
    with the run's ``rule`` (``coauthorship`` or ``normalized``)."""
    ids = np.concatenate([old.node_ids[old.src], src])
    others = np.concatenate([old.node_ids[old.dst], dst])
    union = graph_from_edges(ids, others, np.concatenate([old.weight, weight]), source=old.source)
    affinity = coauthorship_affinity(union) if rule == "coauthorship" else normalized_affinity(union)
    wanted = np.concatenate([as_node_ids(old_ids), as_node_ids(new_ids)])
    if wanted.size != union.n_nodes:  # a new node whose only edges were self-loops
        raise ValueError(f"{wanted.size - union.n_nodes} new nodes have no edge besides self-loops")
    order = np.searchsorted(union.node_ids, wanted)
    return affinity.permuted(order).P


@njit(cache=True)
def _smallest_k(D: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` smallest entries of each row of ``D`` (unordered): one pass per row with a
    max-heap of the k best (O(n) comparisons against the heap's top once it is full; argpartition's
    introselect is ~10x slower at k = 90 of 9e4).  Of equal values at the boundary the lower index is kept."""
    rows, n = D.shape
    out = np.empty((rows, k), dtype=np.int64)
    vals = np.empty(k)
    idx = np.empty(k, dtype=np.int64)
    for r in range(rows):
        for j in range(k):  # heapify the first k
            vals[j] = D[r, j]
            idx[j] = j
        for start in range(k // 2 - 1, -1, -1):
            _sift_down(vals, idx, start, k)
        for j in range(k, n):
            v = D[r, j]
            if v < vals[0]:
                vals[0] = v
                idx[0] = j
                _sift_down(vals, idx, 0, k)
        out[r] = idx
    return out


@njit(cache=True)
def _smallest_k_sq(G: np.ndarray, row_sq: np.ndarray, ref_sq: np.ndarray, k: int):
    """``_smallest_k`` of the squared distances ``max((row_sq[r] + ref_sq[j]) - 2 G[r, j], 0)`` (the same
    floating-point operations as the array expression), computed entry by entry: ``(indices, values)``."""
    rows, n = G.shape
    out = np.empty((rows, k), dtype=np.int64)
    out_vals = np.empty((rows, k))
    vals = np.empty(k)
    idx = np.empty(k, dtype=np.int64)
    for r in range(rows):
        a = row_sq[r]
        for j in range(k):
            vals[j] = max((a + ref_sq[j]) - 2.0 * G[r, j], 0.0)
            idx[j] = j
        for start in range(k // 2 - 1, -1, -1):
            _sift_down(vals, idx, start, k)
        for j in range(k, n):
            v = max((a + ref_sq[j]) - 2.0 * G[r, j], 0.0)
            if v < vals[0]:
                vals[0] = v
                idx[0] = j
                _sift_down(vals, idx, 0, k)
        out[r] = idx
        out_vals[r] = vals
    return out, out_vals


@njit(cache=True, inline="always")
def _sift_down(vals, idx, i, k):
    """Restore the max-heap below ``i`` (larger value, then larger index, on top)."""
    while True:
        left = 2 * i + 1
        if left >= k:
            return
        big = left
        right = left + 1
        if right < k and (vals[right] > vals[left] or (vals[right] == vals[left] and idx[right] > idx[left])):
            big = right
        if vals[big] > vals[i] or (vals[big] == vals[i] and idx[big] > idx[i]):
            vals[i], vals[big] = vals[big], vals[i]
            idx[i], idx[big] = idx[big], idx[i]
            i = big
        else:
            return


def _knn_against(X_new: np.ndarray, X_ref: np.ndarray, k: int, metric: str, n_jobs: int | None = None):
    """Exact ``k`` nearest reference rows of each new row: ``(indices, distances)``, ``(M, k)``, by
    increasing distance (ties: lower index).  Euclidean by matrix products (BLAS), other metrics by cdist.
    Blocks of new rows (``_BLOCK_ENTRIES`` distances each) on ``n_jobs`` threads (default: all CPUs; numpy's
    products and partitions release the GIL); each block's result is independent of the thread count."""
    from concurrent.futures import ThreadPoolExecutor

    from ..engine.local import default_threads

    m = X_new.shape[0]
    indices = np.empty((m, k), dtype=np.int64)
    distances = np.empty((m, k))
    ref_sq = np.einsum("ij,ij->i", X_ref, X_ref) if metric == "euclidean" else None

    def block(bounds):
        r0, r1 = bounds
        rows = X_new[r0:r1]
        if metric == "euclidean":  # |x|^2 + |y|^2 - 2 x.y, fused into the selection (no N-wide temporaries)
            candidates, values = _smallest_k_sq(rows @ X_ref.T, np.einsum("ij,ij->i", rows, rows), ref_sq, k)
        else:  # a metric name, or a callable f(u, v) -> distance (the estimator's metric=callable)
            D = cdist(rows, X_ref, metric=metric if callable(metric) else METRICS[metric][0])
            candidates = _smallest_k(D, k)
            values = np.take_along_axis(D, candidates, axis=1)
        order = np.lexsort((candidates, values), axis=-1)
        indices[r0:r1] = np.take_along_axis(candidates, order, axis=1)
        distances[r0:r1] = np.take_along_axis(values, order, axis=1)

    blocks = row_partition(m, -(-m * X_ref.shape[0] // _BLOCK_ENTRIES))
    threads = min(int(n_jobs) if n_jobs and n_jobs > 0 else default_threads(), len(blocks))
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(block, blocks))
    else:
        for bounds in blocks:
            block(bounds)
    if metric == "euclidean":
        np.sqrt(distances, out=distances)
    return indices, distances


def extended_knn_affinity(old: Affinity, X_ref: np.ndarray, X_new: np.ndarray, n_neighbors: int, metric: str,
                          perplexity, n_jobs: int | None = None, fitted=None) -> sp.csr_matrix:
    """``P'`` over ``[old, new]`` for new feature rows (module docstring); ``perplexity`` a number or
    ``"uniform"``.  A registered metric (``scalemb.methods.AffinityMetric``, e.g. ``liram``: supervised
    affinities, ``scalemb.lvq``) finds the neighbours itself, from its fitted state in the run's provenance
    (``fitted``: the entry its ``provenance_key`` names).  The caller has checked the widths."""
    n, m = old.n_points, X_new.shape[0]
    k = min(int(n_neighbors), n)
    X_new = np.ascontiguousarray(X_new, dtype=np.float64)
    X_ref = np.ascontiguousarray(X_ref, dtype=np.float64)
    registered = affinity_metric(metric)
    if registered is not None and registered.neighbours is not None:
        indices, distances = registered.neighbours(fitted, X_new, X_ref, k)
    elif not callable(metric) and metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} in the run's provenance")
    else:
        indices, distances = _knn_against(X_new, X_ref, k, metric, n_jobs)
    D = sp.csr_matrix((distances.ravel(), indices.ravel(), np.arange(0, m * k + 1, k)), shape=(m, n))
    method = "uniform" if perplexity == "uniform" else "gaussian"
    C = conditional_affinities(D, PERPLEXITY if method == "uniform" else float(perplexity), method, n_jobs)
    total = n + m
    cross = (C / (2.0 * total)).tocsr()
    return sp.bmat([[old.P * (n / total), cross.T], [cross, None]], format="csr")
