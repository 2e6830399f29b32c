"""The row-block contract: any partition of the rows gives the same KL, normaliser and gradient."""
import numpy as np
import pytest

from scalemb.affinity.affinity import row_partition
from scalemb.engine import LocalExecutor, evaluate_block, reduce_blocks
from scalemb.models import get_model


def _evaluate(affinity, model, coords, ds, bounds):
    blocks = [affinity.row_block(r0, r1) for r0, r1 in bounds]
    results = [evaluate_block(model, b, coords, ds) for b in blocks]
    return reduce_blocks(results, coords.shape, affinity.entropy_term())


@pytest.mark.parametrize("name,ds,dt", [("sne", 3, 0), ("tsne", 2, 0), ("snest", 2, 1)])
@pytest.mark.parametrize("n_points", [42, 43])  # even and odd N exercise both pairing rules
def test_any_partition_gives_same_totals(name, ds, dt, n_points):
    from scalemb.affinity import Affinity
    import scipy.sparse as sp

    rng = np.random.default_rng(n_points)
    A = sp.random(n_points, n_points, density=0.1, random_state=n_points)
    A = A + A.T
    A.setdiag(0)
    affinity = Affinity(A, np.arange(n_points))
    model = get_model(name)
    coords = rng.normal(size=(ds + dt, n_points))
    reference = _evaluate(affinity, model, coords, ds, [(0, n_points)])
    partitions = [row_partition(n_points, 2), row_partition(n_points, 5), [(0, 1), (1, 30), (30, n_points)],
                  [(i, i + 1) for i in range(n_points)]]
    for bounds in partitions:
        ev = _evaluate(affinity, model, coords, ds, bounds)
        assert ev.z == pytest.approx(reference.z, rel=1e-12)
        assert ev.kl == pytest.approx(reference.kl, rel=1e-12)
        np.testing.assert_allclose(ev.gradient, reference.gradient, rtol=1e-10, atol=1e-14)


def test_threaded_executor_matches_single_block(school_affinity):
    model = get_model("snest")
    coords = np.random.default_rng(0).normal(size=(3, school_affinity.n_points))
    one = LocalExecutor(school_affinity, model, 2, 1, n_blocks=1).evaluate(coords)
    with LocalExecutor(school_affinity, model, 2, 1, n_threads=2, n_blocks=4) as ex:
        many = ex.evaluate(coords)
    assert many.kl == pytest.approx(one.kl, rel=1e-12)
    np.testing.assert_allclose(many.gradient, one.gradient, rtol=1e-10, atol=1e-14)


def test_every_unordered_pair_counted_once():
    """Z from the cyclic half-pairing equals the sum over all ordered pairs, for odd and even N."""
    from scalemb.models.tsne import MODEL

    for n in (2, 3, 10, 11):
        coords = np.random.default_rng(n).normal(size=(2, n))
        d2 = ((coords[:, :, None] - coords[:, None, :]) ** 2).sum(0)
        W = 1 / (1 + d2)
        np.fill_diagonal(W, 0)
        z = MODEL.repulsion(coords, 2, 0, n, np.zeros((2, n)))
        assert z == pytest.approx(W.sum(), rel=1e-13)


def test_row_partition_covers_rows():
    for n, k in [(10, 3), (5, 8), (1, 1), (100, 7)]:
        bounds = row_partition(n, k)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("name,ds,dt", [("sne", 2, 0), ("tsne", 2, 0), ("snest", 2, 1)])
@pytest.mark.parametrize("repulsion", ["exact", "fft"])
def test_evaluation_without_kl_has_the_same_gradient(school_affinity, name, ds, dt, repulsion):
    coords = np.random.default_rng(5).normal(size=(ds + dt, school_affinity.n_points))
    with LocalExecutor(school_affinity, get_model(name), ds, dt, n_threads=2, repulsion=repulsion) as ex:
        full, fast = ex.evaluate(coords, 4.0), ex.evaluate(coords, 4.0, with_kl=False)
    assert np.isfinite(full.kl) and np.isnan(fast.kl) and np.isnan(fast.objective)
    assert fast.z == full.z
    np.testing.assert_allclose(fast.gradient, full.gradient, rtol=1e-13, atol=1e-15)
