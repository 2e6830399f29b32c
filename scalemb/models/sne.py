"""Symmetric SNE: ``w_ij = exp(-|y_i - y_j|^2)`` (Hinton & Roweis 2002; SNEST paper, sec. 2).

``d log w / d y_i = -2 (y_i - y_j)``.
"""
from numba import njit

from .base import Model
from .kernels import euclidean_similarity, make_kernels
from .vecmath import fast_exp


@njit(inline="always", error_model="numpy")
def log_pair(d2s, d2t):
    return -d2s, -2.0, 0.0


@njit(inline="always", fastmath=True, error_model="numpy")
def pair(d2s, d2t):
    w = fast_exp(-d2s)
    return w, -2.0 * w, 0.0


MODEL = Model("sne", "SNE, Gaussian kernel exp(-d^2)", False, *make_kernels(log_pair, pair),
              similarity=euclidean_similarity)
