"""t-SNE: ``w_ij = 1 / (1 + |y_i - y_j|^2)`` (van der Maaten & Hinton 2008; SNEST paper, sec. 2).

``d log w / d y_i = -2 (y_i - y_j) / (1 + |y_i - y_j|^2)``.
"""
from numba import njit

from .base import Model
from .kernels import euclidean_similarity, make_kernels
from .vecmath import fast_log


@njit(inline="always", error_model="numpy")
def log_pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    return -fast_log(1.0 + d2s), -2.0 * q, 0.0


@njit(inline="always", fastmath=True, error_model="numpy")
def pair(d2s, d2t):
    q = 1.0 / (1.0 + d2s)
    return q, -2.0 * q * q, 0.0


MODEL = Model("tsne", "t-SNE, Cauchy kernel 1/(1+d^2)", False, *make_kernels(log_pair, pair),
              similarity=euclidean_similarity)
