"""Geometries: Euclidean is today's arithmetic bit for bit; the Poincaré ball's Riemannian gradient is the
inverse metric times the gradient, its retraction lands strictly inside the ball, and validate() names bad input."""
import dataclasses

import numpy as np
import pytest

from scalemb.geometry import EUCLIDEAN, POINCARE, Euclidean, PoincareBall, get_geometry
from scalemb.init import random_coords


def ball_distance(u, v):
    """Poincaré-ball distance ``arcosh(1 + 2 |u - v|^2 / ((1 - |u|^2)(1 - |v|^2)))``."""
    return np.arccosh(1 + 2 * np.sum((u - v) ** 2) / ((1 - u @ u) * (1 - v @ v)))


def fd_gradient(f, y, h=1e-7):
    return np.array([(f(y + h * e) - f(y - h * e)) / (2 * h) for e in np.eye(y.size)])


def test_euclidean_is_todays_arithmetic():
    rng = np.random.default_rng(0)
    coords, step = rng.standard_normal((3, 50)), rng.standard_normal((3, 50))
    assert EUCLIDEAN.riemannian_gradient(coords, step) is step
    assert np.array_equal(EUCLIDEAN.retract(coords, step), coords + step)
    recentred = EUCLIDEAN.recentre(coords, 2)  # every row (SNEST time too) is centred, as the optimisers did
    assert np.array_equal(recentred, coords - coords.mean(axis=1, keepdims=True))
    assert recentred is not coords and np.allclose(recentred.mean(axis=1), 0)
    start = EUCLIDEAN.initial(40, 2, np.random.default_rng(7))
    assert np.array_equal(start, random_coords(40, 2, 1, np.random.default_rng(7))[:2])
    EUCLIDEAN.validate(coords * 1e6, "coords")  # no domain bound
    assert isinstance(get_geometry("euclidean"), Euclidean) and get_geometry("poincare") is POINCARE


@pytest.mark.parametrize("dims", [2, 5])
def test_poincare_riemannian_gradient_is_the_inverse_metric(dims):
    rng = np.random.default_rng(dims)
    y = rng.standard_normal((dims, 6))
    y *= np.array([0.0, 0.1, 0.5, 0.9, 0.99, 0.999]) / np.linalg.norm(y, axis=0)
    grad = rng.standard_normal((dims, 6))
    expected = (1 - np.sum(y * y, axis=0)) ** 2 / 4 * grad
    assert np.allclose(POINCARE.riemannian_gradient(y, grad), expected, rtol=1e-14, atol=0)
    # independent check: the hyperbolic distance to a point has Riemannian gradient of unit metric norm
    # lambda_y |rgrad| = 1, lambda_y = 2 / (1 - |y|^2), with the Euclidean gradient taken by finite differences
    p = np.full(dims, 0.3 / np.sqrt(dims))
    distance_gradient = lambda u: fd_gradient(lambda v: ball_distance(v, p), u)[:, None]  # noqa: E731
    for i in range(1, 5):
        rgrad = POINCARE.riemannian_gradient(y[:, i:i + 1], distance_gradient(y[:, i]))
        metric_norm = 2 / (1 - y[:, i] @ y[:, i]) * np.linalg.norm(rgrad)
        assert metric_norm == pytest.approx(1.0, rel=1e-5)
    # the Riemannian gradient descends: distance falls by ~ t |rgrad|_g^2 along -t rgrad through the retraction
    u = y[:, 3]
    rgrad = POINCARE.riemannian_gradient(u[:, None], distance_gradient(u))
    t = 1e-3
    moved = POINCARE.retract(u[:, None], -t * rgrad)[:, 0]
    expected = -t * (2 / (1 - u @ u)) ** 2 * np.sum(rgrad ** 2)
    assert ball_distance(moved, p) - ball_distance(u, p) == pytest.approx(expected, rel=1e-2)


def test_poincare_retraction_lands_strictly_inside():
    rng = np.random.default_rng(1)
    y = rng.standard_normal((2, 8))
    y *= np.array([0.0, 0.5, 0.9, 1 - 1e-5, 1 - 1e-12, 1.0, 1.0, 1.0]) / np.linalg.norm(y, axis=0)
    small = 1e-6 * rng.standard_normal((2, 8))
    inside = y[:, :3]
    assert np.array_equal(POINCARE.retract(inside, small[:, :3]), inside + small[:, :3])  # no projection needed
    with np.errstate(over="ignore"):
        steps = [small, 1e3 * rng.standard_normal((2, 8)), np.full((2, 8), 1e300), np.full((2, 8), -1.7e308),
                 np.where(rng.random((2, 8)) < 0.5, np.inf, -np.inf), np.vstack([np.full(8, np.inf), np.ones(8)])]
        for step in steps:
            moved = POINCARE.retract(y, step)
            assert np.isfinite(moved).all()
            assert (np.linalg.norm(moved, axis=0) <= 1 - 1e-5 + 1e-15).all()
            assert (np.linalg.norm(moved, axis=0) < 1).all()
    # a huge step keeps its direction; an infinite component becomes the direction
    moved = POINCARE.retract(np.zeros((2, 1)), np.array([[3e300], [4e300]]))
    assert np.allclose(moved[:, 0], [0.6 * (1 - 1e-5), 0.8 * (1 - 1e-5)], rtol=1e-12)
    moved = POINCARE.retract(np.zeros((2, 1)), np.array([[-np.inf], [5.0]]))
    assert np.allclose(moved[:, 0], [-(1 - 1e-5), 0.0])
    # a NaN step is not hidden: the optimiser's blow-up test must see it
    assert np.isnan(POINCARE.retract(inside, np.full((2, 3), np.nan))).all()
    # first order: R_y(t v) = y + t v + o(t) inside the ball
    v = rng.standard_normal((2, 3))
    assert np.allclose((POINCARE.retract(inside, 1e-8 * v) - inside) / 1e-8, v, atol=1e-6)
    assert np.array_equal(POINCARE.recentre(inside, 2), inside)
    # a coarser eps is the radius of the projection
    assert np.linalg.norm(PoincareBall(eps=0.1).retract(np.zeros((2, 1)), np.ones((2, 1)))) == pytest.approx(0.9)


def test_poincare_initial_and_validate():
    start = POINCARE.initial(100, 2, np.random.default_rng(3))
    assert np.array_equal(start, EUCLIDEAN.initial(100, 2, np.random.default_rng(3)))  # 1e-4 scale: no projection
    assert (np.linalg.norm(POINCARE.initial(100, 2, np.random.default_rng(3), scale=10.0), axis=0) < 1).all()
    POINCARE.validate(start, "init.npy")
    cases = {"NaN": [[0.1, np.nan], [0.0, 0.0]], "infinite": [[0.1, 0.2], [0.0, -np.inf]],
             "on or outside": [[0.1, 0.6], [0.0, 0.8]], "outside": [[0.1, 1.5], [0.0, 0.0]]}
    for words, coords in cases.items():
        with pytest.raises(ValueError, match=rf"^points\.npy: 1 point\(s\) .*{words}.*point 1"):
            POINCARE.validate(np.array(coords), "points.npy")
    with pytest.raises(ValueError, match="^coords: 1 point"):
        EUCLIDEAN.validate(np.array([[0.0, np.nan]]), "coords")
    with pytest.raises(ValueError, match="eps must be in"):
        PoincareBall(eps=0.0)
    with pytest.raises(ValueError, match="unknown geometry 'sphere'"):
        get_geometry("sphere")


def ball_model(name="tsne"):
    """A real model's kernels with the Poincaré ball as its geometry (the optimisers' side of CO-SNE: they must
    step, search and re-centre through ``model.geometry`` alone)."""
    from scalemb.models import get_model

    return dataclasses.replace(get_model(name), geometry=POINCARE)


def ball_start(n_points):
    """Norms spread over (0, 1): the conformal factor differs by orders of magnitude between points."""
    y = np.random.default_rng(5).standard_normal((2, n_points))
    return y * np.linspace(0.01, 0.99, n_points) / np.linalg.norm(y, axis=0)


@pytest.mark.parametrize("name", ["dbd", "gd", "sd"])
def test_optimisers_step_through_the_geometry(school_affinity, name):
    from scalemb.engine import LocalExecutor
    from scalemb.optim import DeltaBarDelta, make_optimizer

    ex = LocalExecutor(school_affinity, ball_model(), 2, 0)
    x0 = ball_start(school_affinity.n_points)
    ev = ex.evaluate(x0, 4.0 if name == "dbd" else 1.0)
    rgrad = POINCARE.riemannian_gradient(x0, ev.gradient)
    first = make_optimizer(name, "tsne", tol=0).optimize(ex, x0, 1).coords  # the ball is not re-centred
    if name == "dbd":  # gains 1.2 after the first sign test; momentum buffer 0
        lr = DeltaBarDelta().resolved_learning_rate(school_affinity.n_points)
        assert np.allclose(first, POINCARE.retract(x0, -lr * 1.2 * rgrad), rtol=1e-12, atol=1e-15)
        assert not np.allclose(first, POINCARE.retract(x0, -lr * 1.2 * ev.gradient), rtol=1e-6)
    elif name == "gd":  # an Armijo trial a0 rho^k along the Riemannian gradient, through the retraction
        trials = [POINCARE.retract(x0, -(school_affinity.n_points / 12 * 0.5 ** k) * rgrad) for k in range(30)]
        assert any(np.allclose(first, t, rtol=1e-12, atol=1e-15) for t in trials)
    # huge steps stay strictly inside the ball, every iterate finite; the line search never increases the KL
    seen = []
    huge = {"learning_rate": 1e5} if name == "dbd" else {"max_step": 1e3}
    run = make_optimizer(name, "tsne", tol=0, **huge).optimize(
        ex, x0, 12, stop=lambda it, kl, coords: seen.append(coords.copy()) and False)
    for coords in seen + [run.coords]:
        assert np.isfinite(coords).all() and (np.linalg.norm(coords, axis=0) <= POINCARE.radius * (1 + 1e-15)).all()
    assert np.isfinite(run.kl_history).all()
    if name != "dbd":
        assert (np.diff(run.kl_history) <= 1e-12).all()
    with pytest.raises(ValueError, match="start coordinates: 1 point.*outside the unit ball"):
        make_optimizer(name, "tsne").optimize(ex, np.hstack([x0[:, :-1], [[0.6], [0.8]]]), 3)


def test_starts_come_from_the_models_geometry(school_affinity):
    from scalemb.engine import LocalExecutor
    from scalemb.init import Initializer
    from scalemb.models import get_model

    ex = LocalExecutor(school_affinity, ball_model(), 2, 0)
    n = school_affinity.n_points
    start = Initializer("random", ex, 2, 0).coords(np.random.default_rng(3))
    assert np.array_equal(start, POINCARE.initial(n, 2, np.random.default_rng(3)))
    outside = ball_start(n).T.copy()
    outside[4] = [0.6, 0.8]
    with pytest.raises(ValueError, match=r"^init array: 1 point\(s\) on or outside the unit ball \(first: point 4"):
        Initializer(outside, ex, 2, 0).layout()  # before any store is written (Embedder.fit)
    euclidean = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)  # no bound: the same start is fine
    assert np.array_equal(Initializer(outside, euclidean, 2, 0).coords(np.random.default_rng(0)), outside.T)
