"""Row-block graph-Laplacian products, the only P-touching operation of the spectral-direction solvers.

For weights ``C`` (symmetric, sparse, P's pattern) ``L(C) = diag(C 1) - C`` and
``(L(C) V)_i = sum_j c_ij (v_i - v_j)``: rows ``[r0, r1)`` of C and the full V in, rows of ``L V`` out.
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def laplacian_rows(indptr, indices, weights, r0, V, out):
    """``out[:, row] += (L(C) V)[:, r0 + row]`` for V of shape ``(d, N)``, out ``(d, r1 - r0)``.

    Each output entry is summed over the row's entries in storage order, in a register: coordinates go two at a
    time through the row (one pass for d = 2), so ``out`` is stored once per row and coordinate, not once per
    entry (storing per entry the compiler must assume ``out`` may alias ``V`` and reloads: 1.9-2.7x the time at
    7.7e5 points).  The additions and their order are the same either way, so the sums are the same bits."""
    d = V.shape[0]
    for row in range(indptr.shape[0] - 1):
        i = r0 + row
        start, stop = indptr[row], indptr[row + 1]
        for k in range(0, d - 1, 2):
            a, b = out[k, row], out[k + 1, row]
            va, vb = V[k, i], V[k + 1, i]
            for idx in range(start, stop):
                j = indices[idx]
                c = weights[idx]
                a += c * (va - V[k, j])
                b += c * (vb - V[k + 1, j])
            out[k, row], out[k + 1, row] = a, b
        if d % 2:
            a, va = out[d - 1, row], V[d - 1, i]
            for idx in range(start, stop):
                a += weights[idx] * (va - V[d - 1, indices[idx]])
            out[d - 1, row] = a


def row_sums(indptr, weights):
    """Diagonal of ``L(C)`` for the block's rows: ``sum_j c_ij``."""
    n_rows = indptr.size - 1
    rows = np.repeat(np.arange(n_rows), np.diff(indptr))
    return np.bincount(rows, weights=weights, minlength=n_rows)


def laplacian_matrix(C):
    """``L(C) = diag(C 1) - C`` as a CSR matrix, for a sparse symmetric ``C`` (solvers that factorise it)."""
    import scipy.sparse as sp

    return (sp.diags(np.asarray(C.sum(axis=1)).ravel()) - C).tocsr()
