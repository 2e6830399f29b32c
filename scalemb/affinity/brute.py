"""Exact Euclidean k nearest neighbours by matrix products: the brute-force search that beats NN-descent up to a
few times 1e4 points.

``cdist`` computes every distance with its own loop over the features (~0.45 ns per point pair and feature on
one core); NN-descent is approximate and its set-up costs seconds.  Here a block of rows gets all its squared
distances at once from one BLAS product, ``|x_i|^2 + |x_j|^2 - 2 x_i . x_j``, and each row keeps its ``m = k +
CANDIDATE_MARGIN`` smallest as candidates (``candidate_rows``, numba, on ``n_jobs`` threads).  That form loses
digits to cancellation, so it only chooses candidates: their distances are computed again by ``cdist`` and sorted
by (distance, index), exactly as ``knn.exact_knn`` sorts every column.  A row's result is accepted only if no
point outside its candidates can be nearer than its k-th: every outside point's product value is at least the
m-th candidate's ``top``, its true squared distance at least ``top - err`` with ``err`` a bound on the product's
rounding error (``ROUNDING_BOUND (d + 4) eps (|x_i|^2 + max_j |x_j|^2)``), so ``d_k^2 < top - err`` proves it;
otherwise (duplicates, ties at the boundary) the row is searched again with ``cdist`` against every point.  The
neighbour lists and distances are therefore bit for bit those of the ``cdist`` search (tests/test_knn.py).

Selecting the candidates: each row's squared distances go to a buffer; the ``r``-th smallest of every
``SAMPLE_STRIDE``-th entry (``r ~ 2 m / stride``) is a threshold with about ``2 m`` entries below it; those are
collected and sorted.  If fewer than ``m`` fall below it, the row sorts all its entries.  The costs against
NN-descent, and where the search is chosen: docs/design/inputs.md.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit
from scipy.spatial.distance import cdist

from .affinity import row_partition

CANDIDATE_MARGIN = 8
SAMPLE_STRIDE = 8
ROUNDING_BOUND = 8.0
BLOCK_ENTRIES = 1 << 22  # product entries held at once per block of rows (32 MB)


@njit(inline="always")
def _kth_of_sample(buf, stride, r, best):
    """The ``r``-th smallest (from 0) of ``buf[::stride]``; ``best`` (``r + 1`` entries) is the sorted buffer."""
    best[:] = np.inf
    for q in range(0, buf.shape[0], stride):
        v = buf[q]
        if v < best[r]:
            p = r
            while p > 0 and best[p - 1] > v:
                best[p] = best[p - 1]
                p -= 1
            best[p] = v
    return best[r]


@njit(nogil=True, cache=True)
def candidate_rows(G, sq_rows, sq, r0, a, b, cand, top):
    """Rows ``[a, b)`` of a block starting at point ``r0``: with ``G`` the block's products ``X[r0:r1] @ X.T``,
    ``cand[row]`` gets the columns of the ``m = cand.shape[1]`` smallest ``sq_i + sq_j - 2 G_ij`` (``j != i``) and
    ``top[row]`` the largest of those values (module docstring)."""
    m = cand.shape[1]
    n = G.shape[1]
    buf = np.empty(n)
    stride = SAMPLE_STRIDE
    n_sample = (n + stride - 1) // stride
    rank = min(n_sample - 1, 2 * ((m + stride - 1) // stride) + 2)
    best = np.empty(rank + 1)
    picked = np.empty(n, dtype=np.int64)
    vals = np.empty(n)
    for row in range(a, b):
        i = r0 + row
        g = G[row]
        s = sq_rows[row]
        for j in range(n):
            buf[j] = s + sq[j] - 2.0 * g[j]
        buf[i] = np.inf
        t = _kth_of_sample(buf, stride, rank, best)
        c = 0
        for j in range(n):
            if buf[j] <= t:
                picked[c] = j
                c += 1
        if c < m:  # the sample's threshold was too low: all columns
            c = n
            for j in range(n):
                picked[j] = j
        for q in range(c):
            vals[q] = buf[picked[q]]
        order = np.argsort(vals[:c], kind="mergesort")[:m]
        for q in range(m):
            cand[row, q] = picked[order[q]]
        top[row] = vals[order[m - 1]]


def euclidean_knn(X: np.ndarray, k: int, n_threads: int = 1):
    """``(indices, distances)`` of the ``k`` nearest rows of every row of ``X`` (self excluded), sorted by
    (distance, index): the same arrays as ``knn.exact_knn(X, k, 'euclidean')`` (module docstring); the candidates
    are selected on ``n_threads`` threads."""
    if n_threads > 1:
        with ThreadPoolExecutor(n_threads) as pool:
            return _euclidean_knn(X, k, pool, n_threads)
    return _euclidean_knn(X, k, None, 1)


def _euclidean_knn(X: np.ndarray, k: int, pool, n_threads: int):
    """``euclidean_knn`` with ``pool`` (None: this thread) of ``n_threads`` threads."""
    n, d = X.shape
    sq = np.einsum("ij,ij->i", X, X)
    err = ROUNDING_BOUND * (d + 4) * np.finfo(np.float64).eps * (sq + sq.max())
    m = min(n - 1, k + CANDIDATE_MARGIN)
    indices = np.empty((n, k), dtype=np.int64)
    distances = np.empty((n, k), dtype=np.float64)
    for r0, r1 in row_partition(n, -(-n * n // BLOCK_ENTRIES)):
        G = X[r0:r1] @ X.T
        cand = np.empty((r1 - r0, m), dtype=np.int64)
        top = np.empty(r1 - r0)
        parts = row_partition(r1 - r0, n_threads)
        if pool is None or len(parts) == 1:
            candidate_rows(G, sq[r0:r1], sq, r0, 0, r1 - r0, cand, top)
        else:
            list(pool.map(lambda ab: candidate_rows(G, sq[r0:r1], sq, r0, ab[0], ab[1], cand, top), parts))
        for row in range(r1 - r0):
            i = r0 + row
            columns = cand[row]
            dist = cdist(X[i:i + 1], X[columns])[0]
            order = np.lexsort((columns, dist))[:k]
            if m == n - 1 or dist[order[-1]] ** 2 < top[row] - err[i]:
                indices[i], distances[i] = columns[order], dist[order]
                continue
            dist = cdist(X[i:i + 1], X)[0]  # not proven: this row against every point
            dist[i] = np.inf
            order = np.lexsort((np.arange(n), dist))[:k]
            indices[i], distances[i] = order, dist[order]
    return indices, distances
