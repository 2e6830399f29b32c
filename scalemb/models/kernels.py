"""Row-block kernels shared by every model.

A model is described by two scalar functions of the squared space distance ``d2s = |s_i - s_j|^2`` and
squared time distance ``d2t = |t_i - t_j|^2`` (both numba ``inline='always'``):

* ``log_pair(d2s, d2t) -> (log w, a, b)`` with ``d log w_ij / d s_i = a (s_i - s_j)`` and
  ``d log w_ij / d t_i = b (t_i - t_j)``; used on the sparse rows of P (attraction, KL).
* ``pair(d2s, d2t) -> (w, w a, w b)``; the same quantities weighted by ``w``, used on all pairs
  (normaliser and repulsion).  It must vectorise: no libm calls (use ``fast_exp``).

With ``q_ij = w_ij / Z``, ``Z = sum_{k != l} w_kl`` and a symmetric P summing to 1 over ordered pairs,
``KL(P||Q) = sum p log p - sum p log w + log Z`` and
``dKL/dy_i = 2 (-A_i + R_i / Z)``, ``A_i = sum_j p_ij d log w_ij/dy_i``, ``R_i = sum_j w_ij d log w_ij/dy_i``
(this is the SNEST paper's eq. 9 with ordered-pair normalisation).

``make_kernels`` compiles, for one model, the two functions every executor calls on a row block:

* ``attraction(indptr, indices, data, r0, S, T, A)``: rows ``[r0, r0 + len(indptr) - 1)`` of P (CSR slice
  with ``indptr`` starting at 0) -> fills ``A`` (rows of the block) and returns ``sum p log w``.
* ``repulsion(S, T, r0, r1, F, G)``: every unordered pair is visited once: row ``i`` is paired with the
  next ``floor((N-1)/2)`` rows cyclically (one more for ``i < N/2`` when N is even), so each row costs the
  same and any row partition is balanced.  Forces are scattered to both ends of a pair, so ``F`` (space)
  and ``G`` (time) are full ``(d, N)`` partial sums, summed over blocks.  Returns the block's part of Z.

Coordinates are passed transposed: ``S`` is ``(ds, N)``, ``T`` is ``(dt, N)``, both C-contiguous.
"""
import numpy as np
from numba import njit


def make_kernels(log_pair, pair):
    """Compile the attraction and repulsion row-block kernels for one model (see module docstring)."""

    @njit(cache=True, nogil=True, error_model="numpy")
    def attraction(indptr, indices, data, r0, S, T, A):
        ds = S.shape[0]
        dt = T.shape[0]
        plogw = 0.0
        for row in range(indptr.shape[0] - 1):
            i = r0 + row
            for idx in range(indptr[row], indptr[row + 1]):
                j = indices[idx]
                p = data[idx]
                d2s = 0.0
                for k in range(ds):
                    x = S[k, i] - S[k, j]
                    d2s += x * x
                d2t = 0.0
                for k in range(dt):
                    x = T[k, i] - T[k, j]
                    d2t += x * x
                logw, a, b = log_pair(d2s, d2t)
                plogw += p * logw
                for k in range(ds):
                    A[row, k] += p * a * (S[k, i] - S[k, j])
                for k in range(dt):
                    A[row, ds + k] += p * b * (T[k, i] - T[k, j])
        return plogw

    @njit(cache=True, nogil=True, fastmath=True, boundscheck=False, error_model="numpy")
    def repulsion(S, T, r0, r1, F, G):
        ds, n_points = S.shape
        dt = T.shape[0]
        half = (n_points - 1) // 2
        d2s = np.empty(n_points)
        d2t = np.empty(n_points)
        cs = np.empty(n_points)
        ct = np.empty(n_points)
        z = 0.0
        for i in range(r0, r1):
            partners = half + 1 if (n_points % 2 == 0 and i < n_points // 2) else half
            for segment in range(2):
                if segment == 0:
                    a, b = i + 1, min(i + 1 + partners, n_points)
                else:
                    a, b = 0, i + 1 + partners - n_points
                n = b - a
                if n <= 0:
                    continue
                bs = d2s[:n]
                bt = d2t[:n]
                bs[:] = 0.0
                bt[:] = 0.0
                for k in range(ds):
                    sk = S[k, a:b]
                    sik = S[k, i]
                    for jj in range(n):
                        x = sik - sk[jj]
                        bs[jj] += x * x
                for k in range(dt):
                    tk = T[k, a:b]
                    tik = T[k, i]
                    for jj in range(n):
                        x = tik - tk[jj]
                        bt[jj] += x * x
                c1 = cs[:n]
                c2 = ct[:n]
                for jj in range(n):
                    w, ca, cb = pair(bs[jj], bt[jj])
                    z += w
                    c1[jj] = ca
                    c2[jj] = cb
                for k in range(ds):
                    sk = S[k, a:b]
                    fk = F[k, a:b]
                    sik = S[k, i]
                    acc = 0.0
                    for jj in range(n):
                        f = c1[jj] * (sik - sk[jj])
                        acc += f
                        fk[jj] -= f
                    F[k, i] += acc
                for k in range(dt):
                    tk = T[k, a:b]
                    gk = G[k, a:b]
                    tik = T[k, i]
                    acc = 0.0
                    for jj in range(n):
                        f = c2[jj] * (tik - tk[jj])
                        acc += f
                        gk[jj] -= f
                    G[k, i] += acc
        return 2.0 * z

    return attraction, repulsion
