"""t-SNE: ``w_ij = 1 / (1 + |y_i - y_j|^2)`` (van der Maaten & Hinton 2008; SNEST paper, sec. 2).

``d log w / d y_i = -2 (y_i - y_j) / (1 + |y_i - y_j|^2)``.
"""
from numba import njit

from ..repulsion.fft import NEAR_CAUCHY, FFTSpec, cauchy_plan, cauchy_self_weight
from .base import MOMENTUM_EXAGGERATION, OPENTSNE_SCHEDULE, Model
from .kernels import euclidean_similarity, make_kernels
from ..vecmath import fast_log


@njit(inline="always", error_model="numpy")
def log_pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    return -fast_log(1.0 + d2s), -2.0 * q, 0.0


@njit(inline="always", fastmath=True, error_model="numpy")
def pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    return q, -2.0 * q * q, 0.0


# FFT interpolation defaults (points per box p, box width) per space dimension, i.e. p / width nodes per unit
# length: measured on clustered (uncapped) and converged layouts to keep the relative errors of Z and of the
# gradient a few times below 1e-3, which tests/test_fft_repulsion.py checks (openTSNE's defaults, p = 3 and
# width 1, give ~1e-2 on the same layouts).  R^2: 5 points in boxes of 0.7, ~7 nodes per unit (worst relative
# force error 3.3e-4 over the layouts; 7.9e-4 with 6 points in unit boxes, 1.3e-3 with 4 in boxes of 2/3):
# 25 weights per point against 36 with 6 points at the same accuracy.  R^1: 5 in 0.6 (2.4e-4; 4 in 0.5:
# 5.8e-4), R^3: 4 in 0.5 (3.3e-4).  A split grid's far boxes are 1 sigma wide (gradient error 2e-5 on GrQc).
# From 20 000 points FFTParams(accuracy='auto') is 'fast' (5 points in boxes 9/7 as wide: 0.6x the nodes, gradient
# error ~2e-2 on a converged layout against ~7e-3): there the layouts are wide, an evaluation's time is the grid's,
# and whole runs at 'fast' end at the KL and neighbourhood preservation of the default grid
# (docs/design/repulsion.md).
FFT = FFTSpec(cauchy_plan, {1: (5, 0.6), 2: (5, 0.7), 3: (4, 0.5)}, NEAR_CAUCHY, cauchy_self_weight,
              fast_from_points=20_000)

# 'auto' optimizer: the spectral direction (far fewer iterations than delta-bar-delta); from 20 000 points
# openTSNE's schedule for large data (its steps spread the layout there, where repulsion costs ~N²):
# docs/design/optimisation.md
MODEL = Model("tsne", "t-SNE, Cauchy kernel 1/(1+d^2)", False, *make_kernels(log_pair, pair),
              similarity=euclidean_similarity, fft=FFT, default_optimizer="sd",
              default_optimizer_at_scale=OPENTSNE_SCHEDULE, default_optimizer_options=MOMENTUM_EXAGGERATION)
