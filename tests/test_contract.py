"""The model contract (issue 19): a model is one module.  A toy model defined in this file only, registered at run
time, runs end to end in-process and on a real two-worker Dask cluster (whose workers rebuild it from its name,
parameters and this file), has a finite-difference-checked gradient, shows up in MODEL_NAMES and the CLI, and is
refused the FFT repulsion it does not have.

The toy: ``w_ij = (1 + |y_i - y_j|^2)^-power`` (t-SNE is power 1), its objective ``weight * KL`` (an
``Objective`` of its own) and a point term ``c |Y|^2 / N`` switched on from iteration 1 (the shape of CO-SNE's
warm-up), reading ``affinity.n_points``.
"""
from dataclasses import dataclass

import numpy as np
import pytest
from numba import njit

import scalemb.models as models
from scalemb.cli.main import build_parser
from scalemb.embedding import Embedder
from scalemb.engine import LocalExecutor
from scalemb.models import KL, Model, get_model, register_model, unregister_model
from scalemb.models.kernels import euclidean_similarity, make_kernels
from scalemb.vecmath import fast_exp, fast_log


POINT_WEIGHT = 0.05


@dataclass(frozen=True)
class WeightedKL(KL):
    """``weight * KL`` and its gradient."""

    weight: float = 1.0

    def reduce(self, plogw, A, R, z, entropy, exaggeration, with_kl):
        value, objective, gradient = super().reduce(plogw, A, R, z, entropy, exaggeration, with_kl)
        return self.weight * value, self.weight * objective, self.weight * gradient


def toy_point_term(coords, iteration, affinity):
    """``c |Y|^2 / N`` from iteration 1 on (0 before and outside an optimisation)."""
    if iteration is None or iteration < 1:
        return 0.0, np.zeros_like(coords)
    n = affinity.n_points
    assert coords.shape[1] == n
    return POINT_WEIGHT * float(np.sum(coords * coords)) / n, 2.0 * POINT_WEIGHT * coords / n


def make_toy(power: float = 2.0, weight: float = 1.0) -> Model:
    @njit(inline="always", error_model="numpy")
    def log_pair(d2s, d2t):
        return -power * fast_log(1.0 + d2s), -2.0 * power / (1.0 + d2s), 0.0

    @njit(inline="always", fastmath=True, error_model="numpy")
    def pair(d2s, d2t):
        q = 1.0 / (1.0 + d2s)
        w = fast_exp(power * fast_log(q))
        return w, -2.0 * power * w * q, 0.0

    return Model("toy", f"toy kernel (1+d^2)^-{power}", False, *make_kernels(log_pair, pair),
                 similarity=euclidean_similarity, objective=WeightedKL(weight), default_optimizer="dbd",
                 point_term=toy_point_term, params={"power": power, "weight": weight})


@pytest.fixture
def toy():
    register_model(make_toy)
    yield get_model("toy", power=1.5, weight=2.0)
    unregister_model("toy")


def test_toy_is_a_model_like_the_others(toy, school_affinity):
    assert "toy" in models.MODEL_NAMES and "toy" in models.model_names()
    parser = build_parser()
    embed = next(a for a in parser._actions if a.dest == "command").choices["embed"]
    assert next(a for a in embed._actions if a.dest == "model").type("toy") == "toy"
    assert get_model("toy", power=1.5, weight=2.0) is toy  # built once per parameters
    assert get_model("toy").params == {"power": 2.0, "weight": 1.0}
    with pytest.raises(ValueError, match="taken"):
        register_model(make_toy, name="tsne")
    # no FFT spec: asking for fft names the model; auto stays exact
    with pytest.raises(ValueError, match="'toy'"):
        LocalExecutor(school_affinity, toy, 2, 0, repulsion="fft")
    with pytest.raises(ValueError, match="'toy'"):
        Embedder(model="toy", repulsion="fft")._check()
    assert LocalExecutor(school_affinity, toy, 2, 0, repulsion="auto").repulsion == "exact"


def test_toy_gradient_matches_finite_differences(toy, school_affinity):
    n = school_affinity.n_points
    coords = np.random.default_rng(2).normal(size=(2, n)) * 0.5
    ex = LocalExecutor(school_affinity, toy, 2, 0, point_order="locality")  # the point term in internal order
    off, on = ex.evaluate(coords, iteration=0), ex.evaluate(coords, iteration=5)
    assert on.kl - off.kl == pytest.approx(POINT_WEIGHT * np.sum(coords ** 2) / n, rel=1e-12)
    t_sne = LocalExecutor(school_affinity, get_model("tsne"), 2, 0).evaluate(coords).kl
    assert off.kl != pytest.approx(2.0 * t_sne, rel=1e-3)  # power 1.5 is not t-SNE
    from .numerics import central_differences  # here: Dask workers import this file by path, outside the package

    entries = [(0, 0), (1, 7), (0, n // 2), (1, n - 1)]
    numeric = central_differences(lambda c: ex.evaluate(c, iteration=5).kl, coords, entries)
    for k, i in entries:
        assert numeric[k, i] == pytest.approx(on.gradient[k, i], rel=1e-5, abs=1e-8 * np.abs(on.gradient).max())


@pytest.mark.slow
def test_toy_runs_end_to_end_locally_and_on_dask(toy, dask_cluster):
    options = dict(space_dims=2, iterations=25, seed=3, repulsion="exact", quiet=True)
    local = Embedder(model=toy, **options).fit("school")
    assert local.result_.model == "toy"
    history = np.asarray(local.result_.kl_history)
    assert np.all(np.isfinite(history)) and history[-1] < history[0]
    dask = Embedder(model=toy, scheduler=dask_cluster.address, **options).fit("school")
    # the workers rebuilt the toy (power 1.5, weight 2) from this file: the same numbers, bit for bit
    assert np.array_equal(dask.embedding_, local.embedding_)
    assert dask.kl_ == local.kl_
