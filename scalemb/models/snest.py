"""Space-time SNE (SNEST, Sun, Wang & Marchand-Maillet): ``w_ij = exp(|t_i - t_j|^2) / (1 + |s_i - s_j|^2)``.

Closer in space or farther in time means more similar.  ``d log w / d s_i = -2 (s_i - s_j)/(1 + |s_i - s_j|^2)``,
``d log w / d t_i = +2 (t_i - t_j)``; hence the paper's eq. 9:
``dKL/ds_i = 2 sum_j (p_ij - q_ij)(s_i - s_j)/(1 + |s_i - s_j|^2)``, ``dKL/dt_i = -2 sum_j (p_ij - q_ij)(t_i - t_j)``
(unordered pairs).  The time factor saturates at exp(709) (see ``fast_exp``).
"""
import math

from numba import njit

from ..repulsion.spec import FFTSpec, cauchy_self_weight, cauchy_time_plan
from .base import MOMENTUM_EXAGGERATION, Model
from .kernels import make_kernels
from ..vecmath import fast_exp, fast_log


@njit(inline="always", error_model="numpy")
def log_pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    return d2t - fast_log(1.0 + d2s), -2.0 * q, 2.0


@njit(inline="always", fastmath=True, error_model="numpy")
def pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    w = fast_exp(d2t) * q
    return w, -2.0 * w * q, 2.0 * w


@njit(inline="always")
def similarity(d2s, d2t):
    """``log w = |Δt|² - log(1 + |Δs|²)``: closer in space or farther in time is more similar (the neighbour
    order of ``scalemb.metrics``)."""
    return d2t - math.log1p(d2s)


def near_pair(d2s, d2t, cutoff2, s2, inv_s2):
    """The near field of the split FFT grid (``FFTSpec.near_pair``): ``exp(Δt²)`` times t-SNE's Cauchy terms,
    ``(e (q - q_far), -2 e (q² - q_far²), 2 e (q - q_far))`` within the cutoff, 0 beyond (``q_far = 1 / (1 + d² +
    sigma² exp(-d² / sigma²))``, ``repulsion.spec.cauchy_time_plan``'s far part)."""
    inside = 1.0 if d2s < cutoff2 else 0.0
    q = 1.0 / (1.0 + d2s)
    qf = 1.0 / (1.0 + d2s + s2 * fast_exp(-d2s * inv_s2))
    et = inside * fast_exp(d2t)
    w = et * (q - qf)
    return w, -2.0 * et * (q * q - qf * qf), 2.0 * w


# FFT interpolation (one time dimension): R^{2,1} 6 points in unit boxes (1.3e-4 relative error; 3.1e-4 on the
# tests' converged layouts before the force kernels); the time weighting amplifies the space interpolation
# error in R^{1,1} (1.3e-3 with 6 points in unit boxes), hence narrower boxes there; R^{3,1} keeps 4 points in
# boxes of 0.4 (64 nodes per box and time component, not 216).  Split grids: the time force is a difference of
# large terms that amplifies the far kernel's interpolation error: on GrQc's converged R^{2,1} layout, 6 points
# in boxes of 1 sigma gave a relative gradient error of 1.3e-3, in boxes of 0.6 sigma 4e-5.
# From 20 000 points FFTParams(accuracy='auto') is 'fast' (6 points in boxes 9/7 as wide, 0.6x the space nodes, and
# the time components' rank tolerance 1e-6 instead of 1e-9, ``TIME_RANK_TOLS``): on a layout of 7.7e4 co-authors
# after the schedule at scale below, gradient error 6.4e-3 against the exact kernel (default grid 1.9e-3).
FFT = FFTSpec(cauchy_time_plan, {1: (4, 0.4), 2: (6, 1.0), 3: (4, 0.4)}, near_pair, cauchy_self_weight,
              time_dims=1, far_box_width=0.6, fast_from_points=20_000)

# 'auto' from 20 000 points on a graph: t-SNE's spectral schedule at scale with the SNEST paper's exaggeration (x4;
# openTSNE's x12 drives the time coordinates past exp(dt^2)'s range) for 100 bounded momentum steps, then 90 spectral
# steps (5 Jacobi-CG iterations each, every point's step bounded to norm 2), then delta-bar-delta polish steps (time
# by delta-bar-delta's rule) with a spectral step every 25, 300 iterations in all.  The bounded spectral steps are
# what raise the neighbourhoods: with 30, 45, 60, 90 of them NP@deg at 7.7e4 co-authors ends at 0.585, 0.595,
# 0.617, 0.646 (KL 4.01 -> 3.28), and at 7.7e5 30 -> 90 raises it from 0.473 to 0.540 (KL 6.02 -> 5.03) for ~2.4x
# the CPU; the old schedule's 750 delta-bar-delta iterations spread the time coordinates (time std 0.4: 11 time
# components against 3-5, the grid capped) and ended at NP@deg 0.33 at 7.7e5: docs/design/optimisation.md.
# From 1024 to 2e4 points the spectral steps give each point's time step its own gain, at most 2
# (``LineSearchDescent.time_gains``): the time rows leave the saddle t = 0 at their own speeds; measured in
# docs/design/optimisation.md.
TIME_GAINS = 2.0
# From 1024 to 2e4 points the momentum phase exaggerates x6 for 150 steps (the schedule at scale keeps x4 for 100):
# on GrQc R^{2,1} the spectral steps after it reach KL 0.75 in fewer iterations and end lower than after x4 (measured
# over ten starts, with x5, x7 and x8 beside it), and in fewer again after 150 steps than after 100, whose slowest
# starts needed up to 826 iterations (at most 584 after 150; 50, 75, 125, 175 and 200 steps beside it):
# docs/design/optimisation.md.
MID_EXAGGERATION = 6.0
MID_EXAGGERATION_ITERATIONS = 150
SPECTRAL_THEN_POLISH = {"optimizer": "sd", "solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 5,
                        "cg_tol": 0.1, "max_point_step": 2.0, "exaggeration": 4.0, "exaggeration_iterations": 100,
                        "exaggeration_steps": "momentum", "spectral_iterations": 90, "polish_spectral_every": 25,
                        "tol": 0.0, "window": 50, "max_iterations": 300}
MODEL = Model("snest", "space-time SNE, exp(dt^2)/(1+ds^2)", True, *make_kernels(log_pair, pair),
              similarity=similarity, fft=FFT, default_optimizer="sd",
              default_optimizer_at_scale=SPECTRAL_THEN_POLISH,
              default_optimizer_options={**MOMENTUM_EXAGGERATION, "exaggeration": MID_EXAGGERATION,
                                         "exaggeration_iterations": MID_EXAGGERATION_ITERATIONS,
                                         "time_gains": TIME_GAINS})
