"""Row-block kernels shared by every model.

A model is described by two scalar functions of the squared space distance ``d2s = |s_i - s_j|^2`` and
squared time distance ``d2t = |t_i - t_j|^2`` (both numba ``inline='always'``):

* ``log_pair(d2s, d2t) -> (log w, a, b)`` with ``d log w_ij / d s_i = a (s_i - s_j)`` and
  ``d log w_ij / d t_i = b (t_i - t_j)``; used on the sparse rows of P (attraction, KL).
* ``pair(d2s, d2t) -> (w, w a, w b)``; the same quantities weighted by ``w``, used on all pairs
  (normaliser and repulsion).
Both must vectorise: no libm calls (use ``vecmath.fast_exp`` and ``fast_log``).

With ``q_ij = w_ij / Z``, ``Z = sum_{k != l} w_kl`` and a symmetric P summing to 1 over ordered pairs,
``KL(P||Q) = sum p log p - sum p log w + log Z`` and
``dKL/dy_i = 2 (-A_i + R_i / Z)``, ``A_i = sum_j p_ij d log w_ij/dy_i``, ``R_i = sum_j w_ij d log w_ij/dy_i``
(this is the SNEST paper's eq. 9 with ordered-pair normalisation).

``make_kernels`` compiles, for one model, the two functions every executor calls on a row block:

* ``attraction(indptr, indices, data, r0, Yt, ds, A, with_kl)``: rows ``[r0, r0 + len(indptr) - 1)`` of P
  (CSR slice with ``indptr`` starting at 0) -> fills ``A`` (rows of the block) and returns ``sum p log w``,
  or 0 without ``with_kl`` (the logarithms, ~1/5 of the kernel's time, are then skipped).
* ``repulsion(Y, ds, r0, r1, R)``: every unordered pair is visited once: row ``i`` is paired with the
  next ``floor((N-1)/2)`` rows cyclically (one more for ``i < N/2`` when N is even), so each row costs the
  same and any row partition is balanced.  Forces are scattered to both ends of a pair, so ``R`` is a full
  ``(d, N)`` partial sum, summed over blocks.  Returns the block's part of Z.

* ``curvature(indptr, indices, data, r0, Yt, ds, out)``: ``out[idx] = c_ij = -2 a_ij p_ij`` for the block's
  non-zeros, the weights of the attractive term's Laplacian in space: its gradient is ``L(C) S``
  (``C = 4 P o K`` for t-SNE, ``4 P`` for SNE; Vladymyrov & Carreira-Perpinan's partial Hessian).

* ``cross_repulsion(Yq, r0, r1, Ys, ds, skip_self, R)``: query columns ``[r0, r1)`` of ``Yq`` against every
  column of the sources ``Ys`` (both ``(ds + dt, .)``): adds ``sum_j w_ij d log w_ij / d y_i`` to ``R``
  (``(ds + dt, r1 - r0)``) and returns ``sum_i sum_j w_ij``; ``skip_self`` (``Yq`` is ``Ys``) leaves out the
  pairs ``(i, i)``.  Placing new points into a fixed map (``scalemb.placement``) calls it for the new rows
  against the fixed points and against each other, O(rows x sources).

The all-pairs repulsion takes ``Y`` as ``(ds + dt, N)``, C-contiguous, space rows first: its pair loops run
over contiguous slices so that LLVM vectorises them (``error_model='numpy'`` removes the division-by-zero
branch that otherwise blocks it).  The sparse loops take the point-major copy ``Yt = Y.T`` (``(N, ds + dt)``,
C-contiguous): a neighbour's coordinates then share one cache line (the attraction on a 1e5-point kNN P runs
~1.4x faster than reading ``Y``'s rows).  The attraction works row by row: gather the coordinate differences
to the row's neighbours into a buffer, then contiguous loops: squared distances, ``log_pair`` in one
vectorised loop, each force coordinate accumulated in a register (compiled with ``fastmath``, checked against
finite differences in tests/test_gradients.py).  On a 1e5-point kNN P (4.8 M non-zeros, 2 threads) that is
~25 ms per evaluation against ~60 ms for one loop calling libm's ``log`` per non-zero.

Bit-reproducible wherever the arrays lie: every scratch buffer a loop stores to while it sums is a row of one
``vecmath.scratch`` block, and the all-pairs kernels, which store to ``R``, read the coordinates from a copy in
such rows (``vecmath``'s module docstring says why: before, the same call gave sums differing in the last bit
now and then, in placement's free phase).
"""
import functools

import numpy as np
from numba import njit

from ..numba_cache import disk_cached
from ..vecmath import scratch, scratch_row, wide_vectors


@njit(inline="always")
def euclidean_similarity(d2s, d2t):
    """``-|Δ|²`` (space and time alike): the order of every kernel decreasing in the Euclidean distance (a
    model's ``similarity``, see ``base.Model``; ``scalemb.metrics`` ranks input features by it)."""
    return -(d2s + d2t)


@functools.cache
def make_kernels(log_pair, pair):
    """Compile the attraction and repulsion row-block kernels for one model (see module docstring).

    One set per ``(log_pair, pair)`` in a process (EE's models of every lambda share SNE's), cached on disk
    under a fingerprint of the closure (``scalemb.numba_cache``: numba's own ``cache=True`` misses for closures
    in every new process), so a new process (a Dask worker, the CLI, the service) loads them instead of
    compiling them again.
    """
    kernels = (attraction_kernel(log_pair), repulsion_kernel(pair), curvature_kernel(log_pair),
               cross_repulsion_kernel(pair))
    return tuple(disk_cached(kernel) for kernel in kernels)


@njit(inline="always")
def partners_of(i, n_points, half):
    """How many rows after ``i`` (cyclically) it is paired with in the all-pairs loops: ``floor((N-1)/2)``, one
    more for ``i < N/2`` when N is even, so every unordered pair is visited once."""
    return half + 1 if (n_points % 2 == 0 and i < n_points // 2) else half


@njit(inline="always")
def pair_segment(i, partners, n_points, segment):
    """Columns ``[a, b)`` of row ``i``'s partners: segment 0 the ones after ``i``, segment 1 the ones wrapped
    around to column 0 (empty, ``b <= a``, when none are)."""
    if segment == 0:
        return i + 1, min(i + 1 + partners, n_points)
    return 0, i + 1 + partners - n_points


@njit(inline="always")
def scatter_forces(c, yk, yik, rk, i, a, b):
    """Coordinate ``k`` of the forces ``c_j (y_i - y_j)`` between row ``i`` and columns ``[a, b)``: added to
    ``rk[i]`` (summed in a register), subtracted from ``rk[a:b]`` (``yk``: coordinate k of those columns, a copy
    clear of ``rk``)."""
    seg = rk[a:b]
    acc = 0.0
    for jj in range(b - a):
        f = c[jj] * (yik - yk[jj])
        acc += f
        seg[jj] -= f
    rk[i] += acc


def row_log_weights_of(log_pair):
    """``row_log_weights(p, d2s, d2t, ca, cb, with_kl)`` for ``log_pair``: one row of P's ``sum_j p_j log w_j``
    (0 without ``with_kl``), and ``ca = p a``, ``cb = p b`` (one vectorised loop each way; the unused ``log w``
    is compiled away in the second)."""

    @njit(inline="always", error_model="numpy")
    def row_log_weights(p, d2s, d2t, ca, cb, with_kl):
        plogw = 0.0
        if with_kl:
            for jj in range(p.shape[0]):
                logw, a, b = log_pair(d2s[jj], d2t[jj])
                plogw += p[jj] * logw
                ca[jj] = p[jj] * a
                cb[jj] = p[jj] * b
        else:
            for jj in range(p.shape[0]):
                a, b = log_pair(d2s[jj], d2t[jj])[1:]
                ca[jj] = p[jj] * a
                cb[jj] = p[jj] * b
        return plogw

    return row_log_weights


def attraction_kernel(log_pair):
    """``attraction(indptr, indices, data, r0, Yt, ds, A, with_kl)`` of the model with ``log_pair`` (module
    docstring), not yet cached on disk."""

    row_log_weights = row_log_weights_of(log_pair)

    @njit(nogil=True, fastmath=True, error_model="numpy")
    def attraction(indptr, indices, data, r0, Yt, space_dims, A, with_kl):
        dims = Yt.shape[1]
        n_rows = indptr.shape[0] - 1
        longest = 0
        for row in range(n_rows):
            longest = max(longest, indptr[row + 1] - indptr[row])
        diff = np.empty((dims, longest))
        block = scratch(4, longest)  # row_log_weights stores to ca, cb while summing: module docstring
        d2s = scratch_row(block, 0, longest)
        d2t = scratch_row(block, 1, longest)
        ca = scratch_row(block, 2, longest)
        cb = scratch_row(block, 3, longest)
        plogw = 0.0
        for row in range(n_rows):
            i = r0 + row
            start, stop = indptr[row], indptr[row + 1]
            n = stop - start
            for jj in range(n):  # gather the differences to the row's neighbours
                j = indices[start + jj]
                for k in range(dims):
                    diff[k, jj] = Yt[i, k] - Yt[j, k]
            d2s[:n] = 0.0
            d2t[:n] = 0.0
            for k in range(dims):
                d2 = d2s if k < space_dims else d2t
                dk = diff[k]
                for jj in range(n):
                    d2[jj] += dk[jj] * dk[jj]
            plogw += row_log_weights(data[start:stop], d2s[:n], d2t[:n], ca[:n], cb[:n], with_kl)
            for k in range(dims):  # forces, accumulated in a register per coordinate
                c = ca if k < space_dims else cb
                dk = diff[k]
                acc = 0.0
                for jj in range(n):
                    acc += c[jj] * dk[jj]
                A[row, k] += acc
        return plogw

    return attraction


def curvature_kernel(log_pair):
    """``curvature(indptr, indices, data, r0, Yt, ds, out)`` of the model with ``log_pair`` (module docstring)."""

    @njit(nogil=True, error_model="numpy")
    def curvature(indptr, indices, data, r0, Yt, space_dims, out):
        for row in range(indptr.shape[0] - 1):
            i = r0 + row
            for idx in range(indptr[row], indptr[row + 1]):
                j = indices[idx]
                d2s = 0.0
                d2t = 0.0
                for k in range(Yt.shape[1]):
                    x = Yt[i, k] - Yt[j, k]
                    if k < space_dims:
                        d2s += x * x
                    else:
                        d2t += x * x
                a = log_pair(d2s, d2t)[1]
                out[idx] = -2.0 * a * data[idx]

    return curvature


# (space, time) dimensions with a fused all-pairs loop (``fused_pairs_of``); the others take the general loops
FUSED_DIMS = ((1, 0), (2, 0), (3, 0), (1, 1), (2, 1), (3, 1))


def fused_pairs_of(pair, n_space, n_time):
    """``fused_pairs(Y, ys, r0, r1, R, z)`` for ``(ds, dt) = (n_space, n_time)`` (``FUSED_DIMS``): the all-pairs
    loop of rows ``[r0, r1)`` as one pass per row segment -- coordinate differences, ``pair``, Z and the forces
    scattered to both ends -- with ``ys``: the ``scratch`` block holding ``Y``'s rows (the coordinates read while
    ``R`` is stored to, module docstring); returns ``z`` plus the segments' sum of ``w``.

    Why: the general loops make four passes over a segment (squared distances coordinate by coordinate, ``pair``
    into two coefficient buffers, the forces coordinate by coordinate), storing and reloading three buffers per
    pair; fused, a pair is its coordinates loaded once and its forces stored once (in R^2 about a third of the
    CPU per pair; with SNEST's ``exp`` per pair about 0.6).  The arithmetic is the same, but under
    ``fastmath`` the compiler contracts and orders it differently in one loop than across four, so Z and the
    forces differ from the general loops' in the last bits (relative ~1e-16, tests/test_blocks.py); the results
    are as reproducible as before (any thread count, any array placement).  The unused coordinates are closure
    constants, so their branches compile away and the loop vectorises."""
    s1, s2, t0 = n_space > 1, n_space > 2, n_time > 0
    dims = n_space + n_time

    @njit(inline="always", fastmath=True, boundscheck=False, error_model="numpy")
    def fused_pairs(Y, ys, r0, r1, R, z):
        n_points = Y.shape[1]
        half = (n_points - 1) // 2
        y0 = scratch_row(ys, 0, n_points)
        y1 = scratch_row(ys, min(1, dims - 1), n_points)
        y2 = scratch_row(ys, min(2, dims - 1), n_points)
        y3 = scratch_row(ys, dims - 1, n_points)  # the time coordinate, if any
        R0, R1, R2, R3 = R[0], R[min(1, dims - 1)], R[min(2, dims - 1)], R[dims - 1]
        for i in range(r0, r1):
            partners = partners_of(i, n_points, half)
            yi0, yi1, yi2, yi3 = Y[0, i], Y[min(1, dims - 1), i], Y[min(2, dims - 1), i], Y[dims - 1, i]
            for segment in range(2):
                a, b = pair_segment(i, partners, n_points, segment)
                acc0 = acc1 = acc2 = acc3 = 0.0
                v0, v1, v2, v3 = y0[a:b], y1[a:b], y2[a:b], y3[a:b]
                g0, g1, g2, g3 = R0[a:b], R1[a:b], R2[a:b], R3[a:b]
                for jj in range(b - a):
                    x0 = yi0 - v0[jj]
                    d2s = x0 * x0
                    x1 = x2 = x3 = d2t = 0.0
                    if s1:
                        x1 = yi1 - v1[jj]
                        d2s += x1 * x1
                    if s2:
                        x2 = yi2 - v2[jj]
                        d2s += x2 * x2
                    if t0:
                        x3 = yi3 - v3[jj]
                        d2t = x3 * x3
                    w, ca, cb = pair(d2s, d2t)
                    z += w
                    f = ca * x0
                    acc0 += f
                    g0[jj] -= f
                    if s1:
                        f = ca * x1
                        acc1 += f
                        g1[jj] -= f
                    if s2:
                        f = ca * x2
                        acc2 += f
                        g2[jj] -= f
                    if t0:
                        f = cb * x3
                        acc3 += f
                        g3[jj] -= f
                R0[i] += acc0
                if s1:
                    R1[i] += acc1
                if s2:
                    R2[i] += acc2
                if t0:
                    R3[i] += acc3
        return z

    return fused_pairs


def repulsion_kernel(pair):
    """``repulsion(Y, ds, r0, r1, R)`` of the model with ``pair`` (module docstring): the fused loop of
    ``fused_pairs_of`` for the dimensions of ``FUSED_DIMS``, ``general_repulsion_kernel``'s loops for the others."""
    f10, f20, f30, f11, f21, f31 = (fused_pairs_of(pair, ns, nt) for ns, nt in FUSED_DIMS)
    general = general_repulsion_kernel(pair)

    @njit(nogil=True, fastmath=True, boundscheck=False, error_model="numpy")
    def repulsion(Y, space_dims, r0, r1, R):
        wide_vectors()
        dims, n_points = Y.shape
        time_dims = dims - space_dims
        if not (1 <= space_dims <= 3 and 0 <= time_dims <= 1):
            return general(Y, space_dims, r0, r1, R)
        ys = scratch(dims, n_points)  # the coordinates the pair loop reads while it stores to R: module docstring
        for k in range(dims):
            scratch_row(ys, k, n_points)[:] = Y[k]
        if time_dims == 0:
            if space_dims == 1:
                return 2.0 * f10(Y, ys, r0, r1, R, 0.0)
            if space_dims == 2:
                return 2.0 * f20(Y, ys, r0, r1, R, 0.0)
            return 2.0 * f30(Y, ys, r0, r1, R, 0.0)
        if space_dims == 1:
            return 2.0 * f11(Y, ys, r0, r1, R, 0.0)
        if space_dims == 2:
            return 2.0 * f21(Y, ys, r0, r1, R, 0.0)
        return 2.0 * f31(Y, ys, r0, r1, R, 0.0)

    return repulsion


def general_repulsion_kernel(pair):
    """``repulsion(Y, ds, r0, r1, R)`` for any dimensions, in four passes over each row segment: squared
    distances coordinate by coordinate, ``pair`` into two coefficient buffers, the forces coordinate by coordinate
    (``scatter_forces``).  ``repulsion_kernel`` calls it outside ``FUSED_DIMS``; tests compare the fused loops
    with it."""

    @njit(nogil=True, fastmath=True, boundscheck=False, error_model="numpy")
    def repulsion(Y, space_dims, r0, r1, R):
        wide_vectors()
        dims, n_points = Y.shape
        half = (n_points - 1) // 2
        block = scratch(4 + dims, n_points)  # the pair loops store while summing: module docstring
        d2s = scratch_row(block, 0, n_points)
        d2t = scratch_row(block, 1, n_points)
        cs = scratch_row(block, 2, n_points)
        ct = scratch_row(block, 3, n_points)
        for k in range(dims):  # the coordinates the force loop reads while it stores to R, clear of R
            scratch_row(block, 4 + k, n_points)[:] = Y[k]
        z = 0.0
        for i in range(r0, r1):
            partners = partners_of(i, n_points, half)
            for segment in range(2):
                a, b = pair_segment(i, partners, n_points, segment)
                n = b - a
                if n <= 0:
                    continue
                d2s[:n] = 0.0
                d2t[:n] = 0.0
                for k in range(dims):
                    d2 = d2s[:n] if k < space_dims else d2t[:n]
                    yk = scratch_row(block, 4 + k, n_points)[a:b]
                    yik = Y[k, i]
                    for jj in range(n):
                        x = yik - yk[jj]
                        d2[jj] += x * x
                bs = d2s[:n]
                bt = d2t[:n]
                c1 = cs[:n]
                c2 = ct[:n]
                for jj in range(n):
                    w, ca, cb = pair(bs[jj], bt[jj])
                    z += w
                    c1[jj] = ca
                    c2[jj] = cb
                for k in range(dims):
                    scatter_forces(cs[:n] if k < space_dims else ct[:n], scratch_row(block, 4 + k, n_points)[a:b],
                                   Y[k, i], R[k], i, a, b)
        return 2.0 * z

    return repulsion


def cross_repulsion_kernel(pair):
    """``cross_repulsion(Yq, r0, r1, Ys, ds, skip_self, R)`` of the model with ``pair`` (module docstring)."""

    @njit(nogil=True, fastmath=True, boundscheck=False, error_model="numpy")
    def cross_repulsion(Yq, r0, r1, Ys, space_dims, skip_self, R):
        wide_vectors()
        dims, n_sources = Ys.shape
        block = scratch(4, n_sources)  # the pair loop stores to cs, ct while summing: module docstring
        d2s = scratch_row(block, 0, n_sources)
        d2t = scratch_row(block, 1, n_sources)
        cs = scratch_row(block, 2, n_sources)
        ct = scratch_row(block, 3, n_sources)
        self_w = pair(0.0, 0.0)[0]
        z = 0.0
        for i in range(r0, r1):
            d2s[:] = 0.0
            d2t[:] = 0.0
            for k in range(dims):
                d2 = d2s if k < space_dims else d2t
                yk = Ys[k]
                yik = Yq[k, i]
                for j in range(n_sources):
                    x = yik - yk[j]
                    d2[j] += x * x
            zi = 0.0
            for j in range(n_sources):
                w, ca, cb = pair(d2s[j], d2t[j])
                zi += w
                cs[j] = ca
                ct[j] = cb
            if skip_self:  # the pair (i, i): weight w(0, 0), zero force
                zi -= self_w
            z += zi
            for k in range(dims):
                c = cs if k < space_dims else ct
                yk = Ys[k]
                yik = Yq[k, i]
                acc = 0.0
                for j in range(n_sources):
                    acc += c[j] * (yik - yk[j])
                R[k, i - r0] += acc
        return z

    return cross_repulsion
