"""Symmetric SNE: ``w_ij = exp(-|y_i - y_j|^2)`` (Hinton & Roweis 2002; SNEST paper, sec. 2).

``d log w / d y_i = -2 (y_i - y_j)``.
"""
from numba import njit

from ..repulsion.spec import GAUSS_CUTOFF, FFTSpec, gauss_plan, gauss_self_weight
from .base import Model
from .kernels import euclidean_similarity, make_kernels
from ..vecmath import fast_exp


@njit(inline="always", error_model="numpy")
def log_pair(d2s, d2t):
    return -d2s, -2.0, 0.0


@njit(inline="always", fastmath=True, error_model="numpy")
def pair(d2s, d2t):
    w = fast_exp(-d2s)
    return w, -2.0 * w, 0.0


def near_pair(d2s, d2t, cutoff2, s2, inv_s2):
    """The near field of the FFT grid (``FFTSpec.near_pair``): the whole Gaussian ``exp(-d²)`` within the cutoff
    (its grid has no far part), force coefficient ``-2 w``."""
    inside = 1.0 if d2s < cutoff2 else 0.0
    w = inside * fast_exp(-d2s)
    return w, -2.0 * w, 0.0


# FFT interpolation: 4 points in boxes of 0.25 in every dimension (relative errors <= 3.2e-5); the Gaussian has
# no far part, so a capped grid leaves all of it to the near field within GAUSS_CUTOFF.
FFT = FFTSpec(gauss_plan, {1: (4, 0.25), 2: (4, 0.25), 3: (4, 0.25)}, near_pair, gauss_self_weight,
              near_cutoff=GAUSS_CUTOFF)

# 'auto' optimizer: delta-bar-delta, whose momentum finds lower KL minima for SNE than the spectral direction
# (docs/design/optimisation.md)
MODEL = Model("sne", "SNE, Gaussian kernel exp(-d^2)", False, *make_kernels(log_pair, pair),
              similarity=euclidean_similarity, fft=FFT, default_optimizer="dbd")
