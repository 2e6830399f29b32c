import numpy as np
from numba import njit

from scalemb.models.fastexp import fast_exp


@njit
def _apply(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = fast_exp(x[i])
    return out


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
