"""Exact KL and gradient of every model against a dense reference and central finite differences."""
import numpy as np
import pytest

from scalemb.engine import LocalExecutor
from scalemb.models import get_model

from .conftest import dense_kl

from .numerics import central_differences

CASES = [("sne", 2, 0), ("sne", 4, 0), ("tsne", 1, 0), ("tsne", 3, 0), ("snest", 1, 1), ("snest", 2, 1),
         ("snest", 3, 2)]


@pytest.mark.parametrize("name,ds,dt", CASES)
def test_kl_matches_dense_reference(school_affinity, name, ds, dt):
    ex = LocalExecutor(school_affinity, get_model(name), ds, dt)
    coords = np.random.default_rng(1).normal(size=(ds + dt, school_affinity.n_points)) * 0.7
    assert ex.evaluate(coords).kl == pytest.approx(dense_kl(school_affinity.P.toarray(), coords, name, ds),
                                                   rel=1e-12)


@pytest.mark.parametrize("name,ds,dt", CASES)
def test_gradient_matches_finite_differences(school_affinity, name, ds, dt):
    ex = LocalExecutor(school_affinity, get_model(name), ds, dt)
    coords = np.random.default_rng(2).normal(size=(ds + dt, school_affinity.n_points)) * 0.5
    grad = ex.evaluate(coords).gradient
    numeric = central_differences(lambda c: ex.evaluate(c).kl, coords)
    assert np.abs(numeric - grad).max() <= 1e-6 * np.abs(grad).max()


def test_exaggeration_scales_attraction_only(school_affinity):
    ex = LocalExecutor(school_affinity, get_model("tsne"), 2, 0)
    coords = np.random.default_rng(3).normal(size=(2, school_affinity.n_points))
    plain, exaggerated = ex.evaluate(coords), ex.evaluate(coords, exaggeration=4.0)
    assert exaggerated.kl == plain.kl  # the reported KL is always the true one
    # grad = 2(R/Z - alpha A): the difference between alpha = 4 and 1 is -6 A
    diff = exaggerated.gradient - plain.gradient
    assert np.abs(diff).max() > 0
    assert np.allclose(diff.sum(axis=1), 0, atol=1e-12)


@pytest.mark.parametrize("name,ds,dt", [("sne", 2, 1), ("tsne", 2, 1), ("snest", 2, 0), ("snest", 0, 1)])
def test_invalid_dimensions_rejected(school_affinity, name, ds, dt):
    with pytest.raises(ValueError):
        LocalExecutor(school_affinity, get_model(name), ds, dt)


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        get_model("umap")
