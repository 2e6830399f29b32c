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
    entry (stored per entry, the compiler must assume ``out`` may alias ``V`` and reloads it every time).  The
    additions and their order are the same either way, so the sums are the same bits."""
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


@njit(cache=True, nogil=True, error_model="numpy")
def _row_sums(indptr, weights, out):
    for row in range(indptr.shape[0] - 1):
        total = 0.0
        for idx in range(indptr[row], indptr[row + 1]):
            total += weights[idx]
        out[row] = total


def row_sums(indptr, weights):
    """Diagonal of ``L(C)`` for the block's rows: ``sum_j c_ij``, each row summed from 0 in storage order (the
    sums ``np.bincount(rows, weights)`` forms, bit for bit, without its ``O(nnz)`` row-index array)."""
    out = np.empty(indptr.size - 1)
    _row_sums(indptr, np.ascontiguousarray(weights, dtype=np.float64), out)
    return out


def laplacian_matrix(C):
    """``L(C) = diag(C 1) - C`` as a CSR matrix, for a sparse symmetric ``C`` (solvers that factorise it)."""
    import scipy.sparse as sp

    return (sp.diags(np.asarray(C.sum(axis=1)).ravel()) - C).tocsr()
