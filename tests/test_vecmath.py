import numpy as np
import pytest
from numba import vectorize

from scalemb.vecmath import WIDE_VECTOR_BITS, _widest_vector_bits, fast_exp, fast_log


def _elementwise(scalar_function):
    """A NumPy ufunc calling the numba scalar function on each element."""
    return vectorize(["float64(float64)"])(lambda x: scalar_function(x))


_apply = _elementwise(fast_exp)
_apply_log = _elementwise(fast_log)


def test_fast_exp_relative_error():
    x = np.concatenate([np.linspace(-708, 709, 200_001), np.linspace(-1, 1, 10_001),
                        np.random.default_rng(0).uniform(-50, 50, 10_000)])
    rel = np.abs(_apply(x) / np.exp(x) - 1)
    assert rel.max() < 1e-13


def test_fast_exp_saturates_instead_of_overflowing():
    out = _apply(np.array([1e4, -1e4, 0.0]))
    assert np.isfinite(out).all()
    assert out[0] == _apply(np.array([709.0]))[0]
    assert out[2] == 1.0


def test_fast_log_absolute_error():
    rng = np.random.default_rng(1)
    x = np.concatenate([np.exp(rng.uniform(-700, 700, 100_000)), 1.0 + rng.uniform(0, 1e4, 100_000),
                        1.0 + np.logspace(-16, 0, 1_000), [np.sqrt(0.5), np.sqrt(2.0), 1.0, 2.0, 0.5,
                                                         np.finfo(float).tiny, np.finfo(float).max]])
    np.testing.assert_allclose(_apply_log(x), np.log(x), rtol=1e-15, atol=1e-15)
    assert _apply_log(np.array([1.0]))[0] == 0.0
    assert _apply_log(np.array([np.inf]))[0] == pytest.approx(1024 * np.log(2.0))


def test_widest_vector_bits_reads_avx512_from_the_feature_string():
    assert _widest_vector_bits("+sse2,+avx2,+avx512f,+avx512dq") == 512
    assert _widest_vector_bits("+sse2,+avx2,-avx512f") is None
    assert _widest_vector_bits("+avx512fp16,+avx2") is None  # only the foundation flag counts


@pytest.mark.skipif(WIDE_VECTOR_BITS != 512, reason="the host has no AVX-512: the kernels keep the default width")
def test_all_pairs_kernels_use_512_bit_vectors_and_sparse_ones_do_not():
    from scalemb.models import snest
    from scalemb.models.kernels import attraction_kernel, repulsion_kernel

    repulsion, attraction = repulsion_kernel(snest.pair), attraction_kernel(snest.log_pair)  # compiled here
    Y = np.random.default_rng(0).normal(size=(3, 64))
    repulsion(Y, 2, 0, 64, np.zeros_like(Y))
    assert "zmm" in "".join(repulsion.inspect_asm().values())
    indptr, indices, data = np.array([0, 1, 2]), np.array([1, 0]), np.array([0.5, 0.5])
    attraction(indptr, indices, data, 0, np.ascontiguousarray(Y[:, :2].T), 2, np.zeros((2, 3)), True)
    assert "zmm" not in "".join(attraction.inspect_asm().values())
