"""Row-block kernels that rank every point's neighbours in a space (numba, ``nogil``).

A space is an ``(d, N)`` C-contiguous array ``Zt`` (one row per coordinate, space coordinates first), the
number ``sd`` of space coordinates, and a ``similarity(d2s, d2t)`` numba function, strictly increasing in the
similarity of two points (a model's ``similarity``, ``scalemb.models.base.Model``; Euclidean for input
features).  Point ``j`` is ranked before ``l`` in row ``i`` if it is more similar, or equally similar and
``j < l``: every order below is total and deterministic.  Ranks start at 1 and exclude ``i`` itself.

Every kernel is a function of (the rows ``rows[b0:b1]`` it owns, the full coordinates, small parameters) ->
(per-row values, small partial sums), the row-block contract of the executors: a local thread pool
(``map_rows``) or Dask workers can run the same function on any split of the rows.  Time O(N d) per row and
memory O(N) per call (one score buffer): exact for every row costs O(N² d / threads).  The kernels are compiled
once per similarity function and cached on disk under its fingerprint (``scalemb.numba_cache``).

The k most similar points of a row come from one pass keeping a k-element heap whose root is the worst kept
point (a new point enters only if strictly more similar than the root, since it has the larger index); a rank
outside the kept lists is counted directly: ``1 + #{l != i, j: l before j}``.
"""
import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from ..affinity.affinity import default_threads
from ..models.kernels import euclidean_similarity
from ..numba_cache import disk_cached

BLOCK_ROWS = 256  # rows per block: a data-independent constant, never a function of the thread count


@njit(inline="always")
def _worse(hs, hi, a, b):
    return hs[a] < hs[b] or (hs[a] == hs[b] and hi[a] > hi[b])


@njit
def _sift(hs, hi, p, k):
    while True:
        worst = p
        for c in (2 * p + 1, 2 * p + 2):
            if c < k and _worse(hs, hi, c, worst):
                worst = c
        if worst == p:
            return
        hs[p], hs[worst] = hs[worst], hs[p]
        hi[p], hi[worst] = hi[worst], hi[p]
        p = worst


@njit
def top_k(s, k, i, hs, hi):
    """The ``k`` points most similar to ``i`` by scores ``s`` (``k <= N - 1``) into ``hi[:k]`` (scores
    ``hs[:k]``), best first."""
    n = s.shape[0]
    m = 0
    j = 0
    while m < k:
        if j != i:
            hs[m] = s[j]
            hi[m] = j
            m += 1
        j += 1
    for p in range(k // 2 - 1, -1, -1):
        _sift(hs, hi, p, k)
    for jj in range(j, n):
        if jj != i and s[jj] > hs[0]:
            hs[0] = s[jj]
            hi[0] = jj
            _sift(hs, hi, 0, k)
    for a in range(1, k):  # insertion sort, best first (k is small)
        vs, vi = hs[a], hi[a]
        b = a - 1
        while b >= 0 and (hs[b] < vs or (hs[b] == vs and hi[b] > vi)):
            hs[b + 1] = hs[b]
            hi[b + 1] = hi[b]
            b -= 1
        hs[b + 1] = vs
        hi[b + 1] = vi


@njit
def rank_of(s, i, j):
    """Rank of ``j`` in row ``i`` (1 = most similar), counted over all points."""
    sj = s[j]
    r = 1
    for l in range(s.shape[0]):  # noqa: E741
        if l != i and l != j and (s[l] > sj or (s[l] == sj and l < j)):
            r += 1
    return r


@njit(inline="always")
def _degree(indptr, indices, i):
    """Non-zeros of row ``i`` other than ``i`` itself."""
    deg = 0
    for idx in range(indptr[i], indptr[i + 1]):
        if indices[idx] != i:
            deg += 1
    return deg


@njit(inline="always")
def _marked_neighbours(indptr, indices, i, hi, deg, mark):
    """How many of row ``i``'s graph neighbours are among ``hi[:deg]`` (``mark`` is all False on entry and on
    return)."""
    for m in range(deg):
        mark[hi[m]] = True
    h = 0
    for idx in range(indptr[i], indptr[i + 1]):
        j = indices[idx]
        if j != i and mark[j]:
            h += 1
    for m in range(deg):
        mark[hi[m]] = False
    return h


@njit(inline="always")
def _intrusions(sx, sy, i, k, hix, hiy, markx, marky):
    """Row ``i``'s trustworthiness and continuity terms ``sum (r - k)`` over the intruders into Y's k-ary
    neighbourhood and the extruders from X's, and how many of Y's k nearest are among X's (``markx``/``marky``:
    1-based ranks of the kept lists, 0 outside them, where the rank is counted directly)."""
    t = 0.0
    c = 0.0
    p = 0
    for m in range(k):
        rx = _rank(sx, i, hiy[m], markx)  # in Y's k-ary neighbourhood: an intruder unless in X's
        if rx > k:
            t += rx - k
        else:
            p += 1
        ry = _rank(sy, i, hix[m], marky)  # in X's: an extrusion unless in Y's
        if ry > k:
            c += ry - k
    return t, c, p


@njit(inline="always")
def _rank(s, i, j, mark):
    """``j``'s rank in row ``i``: its mark in the kept list, or counted over all points when it is outside it."""
    r = mark[j]
    return rank_of(s, i, j) if r == 0 else r


@njit(inline="always")
def _rnx_area(n, kk, kmax, hiy, markx, row_hist, hist):
    """The row's area under R_NX(K), K = 1..kmax, unnormalised; its co-ranking counts (pairs with ``max(rank_X,
    rank_Y) = m``) are added into ``hist``."""
    row_hist[:] = 0.0
    for m in range(kk):
        j = hiy[m]
        rx = markx[j]
        if rx > 0:
            top = max(rx, m + 1)
            if top <= kmax:
                row_hist[top] += 1.0
    area = 0.0
    q = 0.0
    for K in range(1, kmax + 1):
        q += row_hist[K]
        hist[K] += row_hist[K]
        area += ((n - 1) * q / K - K) / (n - 1 - K) / K
    return area


@functools.cache
def scores_kernel(similarity):
    """``scores(Zt, sd, i, d2s, d2t, out)``: ``out[j] = similarity(|s_i - s_j|², |t_i - t_j|²)`` for all j."""

    @njit(inline="always", error_model="numpy")
    def scores(Zt, sd, i, d2s, d2t, out):
        n = Zt.shape[1]
        d2s[:] = 0.0
        d2t[:] = 0.0
        for k in range(Zt.shape[0]):
            d2 = d2s if k < sd else d2t
            zk = Zt[k]
            zik = zk[i]
            for j in range(n):
                x = zik - zk[j]
                d2[j] += x * x
        for j in range(n):
            out[j] = similarity(d2s[j], d2t[j])

    return scores


@functools.cache
def graph_kernel(similarity):
    """``hits(Zt, sd, rows, b0, b1, indptr, indices, out_hits, out_deg)``: for each owned row ``i`` with
    graph degree ``deg`` (non-zeros of row i other than i), the number of its graph neighbours among its
    ``deg`` most similar points."""
    scores = scores_kernel(similarity)

    @njit(nogil=True)
    def hits(Zt, sd, rows, b0, b1, indptr, indices, out_hits, out_deg):
        n = Zt.shape[1]
        d2s = np.empty(n)
        d2t = np.empty(n)
        s = np.empty(n)
        mark = np.zeros(n, dtype=np.bool_)
        longest = 1
        for r in range(b0, b1):
            i = rows[r]
            longest = max(longest, indptr[i + 1] - indptr[i])
        hs = np.empty(longest)
        hi = np.empty(longest, dtype=np.int64)
        for r in range(b0, b1):
            i = rows[r]
            deg = _degree(indptr, indices, i)
            out_deg[r] = deg
            if deg == 0 or deg >= n - 1:
                out_hits[r] = deg
                continue
            scores(Zt, sd, i, d2s, d2t, s)
            top_k(s, deg, i, hs, hi)
            out_hits[r] = _marked_neighbours(indptr, indices, i, hi, deg, mark)

    return disk_cached(hits)


@functools.cache
def feature_kernel(similarity_x, similarity_y):
    """``ranks(Xt, sdx, Yt, sdy, rows, b0, b1, k, kmax, trust, cont, prec, auc, hist)`` for the owned rows:
    the trustworthiness and continuity terms ``sum (r - k)`` over the intruders / extruders of the k-ary
    neighbourhoods, the kNN precision ``|N_k^X ∩ N_k^Y| / k``, the row's AUC of R_NX over K = 1..kmax, and
    (added into ``hist``) the co-ranking counts: ``hist[m]`` = pairs with ``max(rank_X, rank_Y) = m``."""
    scores_x = scores_kernel(similarity_x)
    scores_y = scores_kernel(similarity_y)

    @njit(nogil=True)
    def ranks(Xt, sdx, Yt, sdy, rows, b0, b1, k, kmax, trust, cont, prec, auc, hist):
        n = Xt.shape[1]
        kk = max(k, kmax)
        d2s = np.empty(n)
        d2t = np.empty(n)
        sx = np.empty(n)
        sy = np.empty(n)
        hsx = np.empty(kk)
        hix = np.empty(kk, dtype=np.int64)
        hsy = np.empty(kk)
        hiy = np.empty(kk, dtype=np.int64)
        markx = np.zeros(n, dtype=np.int64)
        marky = np.zeros(n, dtype=np.int64)
        row_hist = np.zeros(kmax + 1)
        norm = 0.0
        for K in range(1, kmax + 1):
            norm += 1.0 / K
        for r in range(b0, b1):
            i = rows[r]
            scores_x(Xt, sdx, i, d2s, d2t, sx)
            scores_y(Yt, sdy, i, d2s, d2t, sy)
            top_k(sx, kk, i, hsx, hix)
            top_k(sy, kk, i, hsy, hiy)
            for m in range(kk):
                markx[hix[m]] = m + 1
                marky[hiy[m]] = m + 1
            t, c, p = _intrusions(sx, sy, i, k, hix, hiy, markx, marky)
            area = _rnx_area(n, kk, kmax, hiy, markx, row_hist, hist)
            for m in range(kk):
                markx[hix[m]] = 0
                marky[hiy[m]] = 0
            trust[r] = t
            cont[r] = c
            prec[r] = p / k
            auc[r] = area / norm

    return disk_cached(ranks)


@functools.cache
def nearest_kernel(similarity):
    """``nearest(Zt, sd, rows, b0, b1, out)``: each owned row's most similar point."""
    scores = scores_kernel(similarity)

    @njit(nogil=True)
    def nearest(Zt, sd, rows, b0, b1, out):
        n = Zt.shape[1]
        d2s = np.empty(n)
        d2t = np.empty(n)
        s = np.empty(n)
        hs = np.empty(1)
        hi = np.empty(1, dtype=np.int64)
        for r in range(b0, b1):
            i = rows[r]
            scores(Zt, sd, i, d2s, d2t, s)
            top_k(s, 1, i, hs, hi)
            out[r] = hi[0]

    return disk_cached(nearest)


def space(Z, similarity=None, space_dims=None):
    """``(Zt, sd, similarity)`` for the rows of ``Z`` (N x d): Euclidean over all columns by default."""
    Z = np.asarray(Z, dtype=np.float64)
    Zt = np.ascontiguousarray(Z.T)
    sd = Zt.shape[0] if space_dims is None else int(space_dims)
    return Zt, sd, euclidean_similarity if similarity is None else similarity


def map_rows(fn, n_rows: int, n_threads: int | None = None) -> list:
    """``[fn(b0, b1) for each block]`` over blocks of ``BLOCK_ROWS`` consecutive rows, on a thread pool (the
    kernels write per-row outputs in place; a block's partial sums are its return value)."""
    bounds = [(b0, min(b0 + BLOCK_ROWS, n_rows)) for b0 in range(0, n_rows, BLOCK_ROWS)]
    threads = n_threads or default_threads()
    if threads == 1 or len(bounds) <= 1:
        return [fn(b0, b1) for b0, b1 in bounds]
    with ThreadPoolExecutor(min(threads, len(bounds))) as pool:
        return list(pool.map(lambda b: fn(*b), bounds))
