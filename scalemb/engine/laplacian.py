"""Row-block graph-Laplacian products, the only P-touching operation of the spectral-direction solvers.

For weights ``C`` (symmetric, sparse, P's pattern) ``L(C) = diag(C 1) - C`` and
``(L(C) V)_i = sum_j c_ij (v_i - v_j)``: rows ``[r0, r1)`` of C and the full V in, rows of ``L V`` out.
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def laplacian_rows(indptr, indices, weights, r0, V, out):
    """``out[:, row] = (L(C) V)[:, r0 + row]`` for V of shape ``(d, N)``, out ``(d, r1 - r0)``."""
    for row in range(indptr.shape[0] - 1):
        i = r0 + row
        for idx in range(indptr[row], indptr[row + 1]):
            j = indices[idx]
            c = weights[idx]
            for k in range(V.shape[0]):
                out[k, row] += c * (V[k, i] - V[k, j])


def row_sums(indptr, weights):
    """Diagonal of ``L(C)`` for the block's rows: ``sum_j c_ij``."""
    n_rows = indptr.size - 1
    rows = np.repeat(np.arange(n_rows), np.diff(indptr))
    return np.bincount(rows, weights=weights, minlength=n_rows)


def laplacian_matrix(C):
    """``L(C) = diag(C 1) - C`` as a CSR matrix, for a sparse symmetric ``C`` (solvers that factorise it)."""
    import scipy.sparse as sp

    return (sp.diags(np.asarray(C.sum(axis=1)).ravel()) - C).tocsr()
