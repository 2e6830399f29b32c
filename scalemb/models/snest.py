"""Space-time SNE (SNEST, Sun, Wang & Marchand-Maillet): ``w_ij = exp(|t_i - t_j|^2) / (1 + |s_i - s_j|^2)``.

Closer in space or farther in time means more similar.  ``d log w / d s_i = -2 (s_i - s_j)/(1 + |s_i - s_j|^2)``,
``d log w / d t_i = +2 (t_i - t_j)``; hence the paper's eq. 9:
``dKL/ds_i = 2 sum_j (p_ij - q_ij)(s_i - s_j)/(1 + |s_i - s_j|^2)``, ``dKL/dt_i = -2 sum_j (p_ij - q_ij)(t_i - t_j)``
(unordered pairs).  The time factor saturates at exp(709) (see ``fast_exp``).
"""
import math

from numba import njit

from .base import Model
from .kernels import make_kernels
from .vecmath import fast_exp, fast_log


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


MODEL = Model("snest", "space-time SNE, exp(dt^2)/(1+ds^2)", True, *make_kernels(log_pair, pair),
              similarity=similarity)
