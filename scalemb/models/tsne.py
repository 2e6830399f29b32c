"""t-SNE: ``w_ij = 1 / (1 + |y_i - y_j|^2)`` (van der Maaten & Hinton 2008; SNEST paper, sec. 2).

``d log w / d y_i = -2 (y_i - y_j) / (1 + |y_i - y_j|^2)``.
"""
from numba import njit

from ..repulsion.spec import FFTSpec, cauchy_plan, cauchy_self_weight
from .base import MOMENTUM_EXAGGERATION, OPENTSNE_SCHEDULE, Model
from .kernels import euclidean_similarity, make_kernels
from ..vecmath import fast_exp, fast_log


@njit(inline="always", error_model="numpy")
def log_pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    return -fast_log(1.0 + d2s), -2.0 * q, 0.0


@njit(inline="always", fastmath=True, error_model="numpy")
def pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    return q, -2.0 * q * q, 0.0


def near_pair(d2s, d2t, cutoff2, s2, inv_s2):
    """The near field of the split FFT grid (``FFTSpec.near_pair``): ``(q - q_far, -2 (q² - q_far²), 2 (q -
    q_far))`` within the cutoff, 0 beyond, with ``q_far = 1 / (1 + d² + sigma² exp(-d² / sigma²))`` the grid's far
    part (``repulsion.spec.cauchy_plan``)."""
    inside = 1.0 if d2s < cutoff2 else 0.0
    q = 1.0 / (1.0 + d2s)
    qf = 1.0 / (1.0 + d2s + s2 * fast_exp(-d2s * inv_s2))
    et = inside * 1.0
    w = et * (q - qf)
    return w, -2.0 * et * (q * q - qf * qf), 2.0 * w


# FFT interpolation defaults (points per box p, box width) per space dimension, i.e. p / width nodes per unit
# length: measured on clustered (uncapped) and converged layouts to keep the relative errors of Z and of the
# gradient a few times below 1e-3, which tests/test_fft_repulsion.py checks (openTSNE's defaults, p = 3 and
# width 1, give ~1e-2 on the same layouts).  R^2: 5 points in boxes of 0.7, ~7 nodes per unit (worst relative
# force error 3.3e-4 over the layouts; 7.9e-4 with 6 points in unit boxes, 1.3e-3 with 4 in boxes of 2/3):
# 25 weights per point against 36 with 6 points at the same accuracy.  R^1: 5 in 0.6 (2.4e-4; 4 in 0.5:
# 5.8e-4), R^3: 4 in 0.5 (3.3e-4).  A split grid's far boxes are 1 sigma wide (gradient error 2e-5 on GrQc).
# From 10 000 points (where 'auto' repulsion turns to the FFT in R^2) FFTParams(accuracy='auto') is 'fast' (5 points
# in boxes 9/7 as wide: 0.6x the nodes, gradient error ~2e-2 on a converged layout against ~7e-3): whole runs at
# 'fast' end at the KL, neighbourhood preservation and trustworthiness of the default grid at less CPU
# (docs/design/repulsion.md).
FFT = FFTSpec(cauchy_plan, {1: (5, 0.6), 2: (5, 0.7), 3: (4, 0.5)}, near_pair, cauchy_self_weight,
              fast_from_points=10_000)

# 'auto' optimizer from 20 000 points on a graph: a momentum exaggeration phase (x12, openTSNE's learning rate N/12,
# momentum 0.8, for 125 steps: the exaggerated KL is flat from ~130, and after 125 the spectral steps reach openTSNE's
# final KL as many iterations later, ~60, as after openTSNE's 250, ending at the same neighbourhoods), then
# 60 spectral steps (5 Jacobi-preconditioned CG iterations, relative tolerance 0.1: 10 reached openTSNE's KL two
# iterations later at 7.7e4 co-authors, for twice the Laplacian products) with every point's step bounded
# to norm 3 (unbounded, they spread loosely attached parts over ~1e5 units, where the FFT grid is capped; bounded by
# 3 rather than 2 they reach each KL in 2/3 the steps with the same extent and NP@deg, and the schedule ends at a
# lower KL and higher NP@deg: 5.15 / 0.532 against 5.60 / 0.514 at 7.7e5 co-authors in 0.8x the time, 3.79 / 0.616
# against 4.17 / 0.591 at 1.5e5 in 1.2x: sd_scale.md stop 49), then delta-bar-delta polish steps (momentum 0.8,
# steps <= 3) with a spectral step every 25.  The spectral phase takes
# the KL below openTSNE's final value in ~60 iterations; its neighbourhoods are worse than the KL says (sampled
# NP@deg ~0.5 at 7.7e4 co-authors) and the polish steps restore them within ~40 iterations, past openTSNE's.  The
# run stops when the map stops improving: the KL fell by less than 2e-4 of itself per iteration over the last 25
# (one polish cycle; opt-SNE's rule, "less than KL/5000 in an iteration"), at most 750 iterations (openTSNE's
# budget).  The neighbourhoods keep improving while the KL falls that fast (at 7.7e4 co-authors, after a 250-step
# exaggeration phase, the rule stopped at iteration ~470 with NP@deg 0.619, where a fixed 370 gave 0.612 and 750
# 0.631; after 125 steps it stops at ~330 with 0.613): docs/design/optimisation.md.
# Below 20 000 points the spectral direction with its sparse LU and a shorter exaggeration phase; P made from
# distances between points: openTSNE's schedule at every size.
SPECTRAL_THEN_POLISH = {"optimizer": "sd", "solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 5,
                        "cg_tol": 0.1, "max_point_step": 3.0, "exaggeration": 12.0, "exaggeration_iterations": 125,
                        "exaggeration_steps": "momentum", "spectral_iterations": 60, "polish_spectral_every": 25,
                        "tol": 2e-4, "window": 25, "max_iterations": 750}
MODEL = Model("tsne", "t-SNE, Cauchy kernel 1/(1+d^2)", False, *make_kernels(log_pair, pair),
              similarity=euclidean_similarity, fft=FFT, default_optimizer="sd",
              default_optimizer_at_scale=SPECTRAL_THEN_POLISH, default_optimizer_options=MOMENTUM_EXAGGERATION,
              default_optimizer_for_points=OPENTSNE_SCHEDULE)
