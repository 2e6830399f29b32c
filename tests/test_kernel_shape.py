"""A new FFT kernel shape is its model's module alone: this file defines a model with a kernel scalemb does not
ship -- the Cauchy kernel at scale 2, ``w = 1 / (1 + |Δ|² / 4)`` -- with its pair functions, its FFT plan and its
near pair, registers it and gets FFT repulsion (uncapped and on a capped, split grid) that matches its exact
repulsion, with nothing in scalemb changed (issue 31: "files touched by a new FFT kernel shape 3 -> 1")."""
import numpy as np
import pytest
from numba import njit

from scalemb.models import Model, get_model, register_model, unregister_model
from scalemb.models.kernels import euclidean_similarity, make_kernels
from scalemb.repulsion import FFTParams, make_grid
from scalemb.repulsion.fft import fft_repulsion
from scalemb.repulsion.spec import FFTSpec, Plan, SpaceKernel
from scalemb.vecmath import fast_exp, fast_log


@njit(inline="always", error_model="numpy")
def log_pair(d2s, d2t):
    w = 1.0 / (1.0 + 0.25 * d2s)
    return -fast_log(1.0 + 0.25 * d2s), -0.5 * w, 0.0


@njit(inline="always", fastmath=True, error_model="numpy")
def pair(d2s, d2t):
    w = 1.0 / (1.0 + 0.25 * d2s)
    return w, -0.5 * w * w, 0.0


def wide(d2s, sigma):
    """The kernel on the grid: ``w``, or on a split grid its far part
    ``1 / (1 + d²/4 + sigma² exp(-d²/(4 sigma²)))``."""
    if sigma == 0:
        return 1.0 / (1.0 + 0.25 * d2s)
    return 1.0 / (1.0 + 0.25 * d2s + sigma ** 2 * np.exp(-0.25 * d2s / sigma ** 2))


def wide_force(d2s, sigma):
    """``SpaceKernel(radial, k)`` is ``-2 Δ_k radial``; the force kernel ``∂w/∂Δ_k = -Δ_k w² / 2``: radial w² / 4."""
    return 0.25 * wide(d2s, sigma) ** 2


def plan(space_dims):
    space = tuple(range(space_dims))
    return Plan((SpaceKernel(wide),) + tuple(SpaceKernel(wide_force, k) for k in space), time_kernels=(),
                 potentials=(0,) + tuple(1 + k for k in space), outputs=((0, 0),) + tuple((1 + k, 0) for k in space),
                 z_output=0, force=tuple(1 + k for k in space))


def near_pair(d2s, d2t, cutoff2, s2, inv_s2):
    inside = 1.0 if d2s < cutoff2 else 0.0
    w = 1.0 / (1.0 + 0.25 * d2s)
    wf = 1.0 / (1.0 + 0.25 * d2s + s2 * fast_exp(-0.25 * d2s * inv_s2))
    return inside * (w - wf), -0.5 * inside * (w * w - wf * wf), 0.0


def self_weight(sigma):
    return float(wide(np.float64(0.0), sigma))


MODEL = Model("wide-cauchy", "Cauchy kernel at scale 2, defined in a test", False, *make_kernels(log_pair, pair),
              similarity=euclidean_similarity,
              fft=FFTSpec(plan, {2: (5, 0.7)}, near_pair, self_weight))


@pytest.fixture
def wide_cauchy():
    register_model(MODEL)
    yield get_model("wide-cauchy")
    unregister_model("wide-cauchy")


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("spread, max_nodes", [(5.0, None), (60.0, 2 ** 12)])
def test_a_kernel_shape_defined_in_its_module_alone_gets_accurate_fft_repulsion(wide_cauchy, spread, max_nodes):
    """Clustered 2-D layouts: compact (a plain grid) and wide with a small node cap (a split grid, whose near field
    the generic near-field kernel compiles from this module's ``near_pair``): Z and the forces within 1e-3 of the
    model's exact all-pairs repulsion."""
    rng = np.random.default_rng(7)
    n = 2000
    centres = rng.normal(size=(20, 2)) * spread
    Y = np.ascontiguousarray((centres[rng.integers(0, 20, n)] + rng.normal(size=(n, 2))).T)
    params = FFTParams() if max_nodes is None else FFTParams(max_nodes=max_nodes)
    assert make_grid(wide_cauchy, 2, Y.min(1), Y.max(1), params, n).capped == (max_nodes is not None)
    Re = np.zeros_like(Y)
    ze = wide_cauchy.repulsion(Y, 2, 0, n, Re)
    Rf, zf = fft_repulsion(wide_cauchy, Y, 2, params)
    assert abs(zf / ze - 1) < 1e-3 and rel(Rf, Re) < 1e-3
