"""The row-block Laplacian kernel (``engine.laplacian``) against dense algebra, for every coordinate count (the
kernel takes coordinates two at a time, with a last one alone when d is odd), rows of a block that starts inside
the matrix, and empty rows; and its sums in storage order, as the per-entry accumulation it replaced."""
import numpy as np
import pytest
import scipy.sparse as sp

from scalemb.engine.laplacian import laplacian_rows, row_sums


def _weights(n: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    C = sp.random(n, n, density=0.08, random_state=seed, format="csr")
    C = (C + C.T).tocsr()
    C.data = rng.uniform(1e-6, 2.0, C.nnz)
    C = C.tolil()
    C[3, :] = 0  # an empty row (and column)
    C[:, 3] = 0
    return C.tocsr()


def _per_entry(indptr, indices, weights, r0, V, out):
    """The accumulation the kernel replaced: each entry's term added to the output in memory, in storage order."""
    for row in range(indptr.shape[0] - 1):
        for idx in range(indptr[row], indptr[row + 1]):
            for k in range(V.shape[0]):
                out[k, row] += weights[idx] * (V[k, r0 + row] - V[k, indices[idx]])


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5])
def test_rows_of_the_product_are_dense_algebras_and_the_per_entry_sums(d):
    n = 60
    C = _weights(n, d)
    L = np.diag(np.asarray(C.sum(axis=1)).ravel()) - C.toarray()
    V = np.random.default_rng(10 + d).normal(size=(d, n)) * 30
    r0, r1 = 17, 49  # a block of rows inside the matrix
    block = C[r0:r1]
    out = np.zeros((d, r1 - r0))
    laplacian_rows(block.indptr, block.indices, block.data, r0, V, out)
    np.testing.assert_allclose(out, (V @ L.T)[:, r0:r1], rtol=1e-11, atol=1e-9)
    want = np.zeros_like(out)
    _per_entry(block.indptr, block.indices, block.data, r0, V, want)
    assert np.array_equal(out, want)  # the same additions in the same order: the same bits
    whole = np.zeros((d, n))
    laplacian_rows(C.indptr, C.indices, C.data, 0, V, whole)
    assert np.all(whole[:, 3] == 0.0)  # the empty row
    # the kernel adds to what ``out`` holds, as the per-entry form does
    got, want = np.full((d, r1 - r0), 0.1), np.full((d, r1 - r0), 0.1)
    laplacian_rows(block.indptr, block.indices, block.data, r0, V, got)
    _per_entry(block.indptr, block.indices, block.data, r0, V, want)
    assert np.array_equal(got, want)


def test_row_sums_are_bincounts_sums_bit_for_bit():
    C = _weights(80, 7)
    rows = np.repeat(np.arange(80), np.diff(C.indptr))
    want = np.bincount(rows, weights=C.data, minlength=80)
    got = row_sums(C.indptr, C.data)
    assert np.array_equal(got, want)
    assert got[3] == 0.0 and not np.signbit(got[3])
    assert row_sums(np.array([0]), np.array([])).shape == (0,)
