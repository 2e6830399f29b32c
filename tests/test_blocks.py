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


@pytest.mark.slow
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


@pytest.mark.parametrize("n", [2, 3, 10, 11, 42, 43])
def test_every_model_repulsion_writes_only_its_column_window(n):
    """The exact repulsion of rows [r0, r1) writes only the columns of ``repulsion_window`` (the reduction adds
    only those), for every registered model; a block partial on its window equals the full partial there."""
    from scalemb.engine.blocks import _window, repulsion_window
    from scalemb.models import MODEL_NAMES

    for name in MODEL_NAMES:
        model = get_model(name)
        dims = (2, 1) if model.default_time_dims() else (2, 0)
        coords = np.random.default_rng(n).normal(size=(sum(dims), n)) * 0.3
        for r0, r1 in [(0, n), (0, 1), (n // 2, n), (n - 1, n), (n // 3, n // 3 + 2), (1, 1)]:
            r1 = min(r1, n)
            R = np.full((sum(dims), n), np.nan)
            start, width = repulsion_window(r0, r1, n)
            for part in _window(R, start, width):
                part[...] = 0.0
            model.repulsion(coords, dims[0], r0, r1, R)
            inside = np.zeros(n, dtype=bool)
            inside[(start + np.arange(width)) % n] = True
            assert np.all(np.isnan(R[:, ~inside])), (name, n, r0, r1)
            assert np.all(np.isfinite(R[:, inside])), (name, n, r0, r1)
            full = np.zeros_like(R)
            model.repulsion(coords, dims[0], r0, r1, full)
            assert np.array_equal(R[:, inside], full[:, inside]) and not full[:, ~inside].any()


@pytest.mark.parametrize("name", ["tsne", "sne", "snest"])
def test_fused_repulsion_equals_the_general_loops(name):
    """The fused all-pairs loop (``kernels.fused_pairs_of``, every ``(ds, dt)`` of ``FUSED_DIMS``) gives the
    general loops' Z and forces to rounding (1e-13 relative: they differ in the last bits only), on odd and even N,
    whole maps and row ranges that wrap; a dimension outside ``FUSED_DIMS`` takes the general loops (compiled inside
    the model's kernel, which may round differently from the same loops compiled alone: to rounding there too)."""
    from scalemb.models import kernels
    from scalemb.models import sne, snest, tsne

    pair = {"tsne": tsne.pair, "sne": sne.pair, "snest": snest.pair}[name]
    fused, general = get_model(name).repulsion, kernels.general_repulsion_kernel(pair)
    rng = np.random.default_rng(3)
    for ds, dt in kernels.FUSED_DIMS + ((2, 2), (4, 0)):
        for n in (2, 3, 10, 41, 300):
            Y = np.ascontiguousarray(rng.normal(size=(ds + dt, n)) * (1.0 if name == "sne" else 3.0))
            Y[ds:] *= 0.3
            for r0, r1 in ((0, n), (n // 3, n // 2 + 1), (n - 1, n)):
                Rf, Rg = np.zeros_like(Y), np.zeros_like(Y)
                zf, zg = fused(Y, ds, r0, r1, Rf), general(Y, ds, r0, r1, Rg)
                assert zf == pytest.approx(zg, rel=1e-13, abs=1e-300), (ds, dt, n, r0, r1)
                np.testing.assert_allclose(Rf, Rg, rtol=0, atol=1e-13 * max(np.abs(Rg).max(), 1e-300))


def test_row_partition_covers_rows():
    for n, k in [(10, 3), (5, 8), (1, 1), (100, 7)]:
        bounds = row_partition(n, k)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@pytest.mark.slow
@pytest.mark.parametrize("name,ds,dt", [("sne", 2, 0), ("tsne", 2, 0), ("snest", 2, 1)])
@pytest.mark.parametrize("repulsion", ["exact", "fft"])
def test_evaluation_without_kl_has_the_same_gradient(school_affinity, name, ds, dt, repulsion):
    coords = np.random.default_rng(5).normal(size=(ds + dt, school_affinity.n_points))
    with LocalExecutor(school_affinity, get_model(name), ds, dt, n_threads=2, repulsion=repulsion) as ex:
        full, fast = ex.evaluate(coords, 4.0), ex.evaluate(coords, 4.0, with_kl=False)
    assert np.isfinite(full.kl) and np.isnan(fast.kl) and np.isnan(fast.objective)
    assert fast.z == full.z
    np.testing.assert_allclose(fast.gradient, full.gradient, rtol=1e-13, atol=1e-15)


def _shuffled_clusters(n, seed):
    """Symmetric P of 20-point cliques whose members are scattered over the numbering."""
    import scipy.sparse as sp
    from scalemb.affinity import Affinity

    rng = np.random.default_rng(seed)
    labels = rng.permutation(n) // 20
    rows, cols = np.nonzero((labels[:, None] == labels[None, :]) & ~np.eye(n, dtype=bool))
    P = sp.csr_matrix((rng.uniform(0.5, 1.0, rows.size), (rows, cols)), shape=(n, n))
    return Affinity(P + P.T, np.arange(n) * 7 + 3)


def test_locality_order_renumbers_neighbours_close_together():
    from scalemb.affinity.ordering import inverse_permutation, locality_order

    affinity = _shuffled_clusters(400, 0)
    order = locality_order(affinity.P)
    assert np.array_equal(np.sort(order), np.arange(400))
    rank = inverse_permutation(order)
    assert np.array_equal(rank[order], np.arange(400))
    def bandwidth(P):
        return int(np.abs(P.tocoo().row - P.tocoo().col).max())
    permuted = affinity.permuted(order)
    assert bandwidth(affinity.P) > 300 and bandwidth(permuted.P) < 20
    assert np.array_equal(permuted.node_ids, affinity.node_ids[order])
    np.testing.assert_array_equal(permuted.P.toarray(), affinity.P.toarray()[np.ix_(order, order)])


@pytest.mark.parametrize("name,ds,dt", [("tsne", 2, 0), ("snest", 2, 1)])
@pytest.mark.parametrize("repulsion", ["exact", "fft"])
def test_locality_order_gives_the_input_order_results(name, ds, dt, repulsion):
    """Evaluations, gradients and the curvature operators in the locality order, exchanged in the input's
    order, equal the input-order ones up to summation order."""
    affinity = _shuffled_clusters(600, 1)
    coords = np.random.default_rng(2).normal(size=(ds + dt, 600)) * 3
    coords[ds:] *= 0.2  # SNEST's time weights exp(|Δt|²) stay finite
    V = np.random.default_rng(3).normal(size=(ds, 600))
    model = get_model(name)
    with LocalExecutor(affinity, model, ds, dt, n_threads=2, repulsion=repulsion, point_order="given") as given, \
            LocalExecutor(affinity, model, ds, dt, n_threads=2, repulsion=repulsion,
                          point_order="locality") as local:
        assert given.point_order == "given" and local.point_order == "locality"
        a, b = given.evaluate(coords, 2.0), local.evaluate(coords, 2.0)
        assert b.kl == pytest.approx(a.kl, rel=1e-12) and b.z == pytest.approx(a.z, rel=1e-12)
        np.testing.assert_allclose(b.gradient, a.gradient, rtol=1e-9, atol=1e-12 * np.abs(a.gradient).max())
        for ex in (given, local):
            ex.set_curvature(coords, 2.0)
        np.testing.assert_allclose(local.laplacian_matvec(V), given.laplacian_matvec(V), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(local.curvature_diagonal(), given.curvature_diagonal(), rtol=1e-12)
        assert abs(local.curvature_matrix() - given.curvature_matrix()).max() < 1e-14


def test_point_order_default_and_bad_values():
    """The input order is the default at any N (the locality order would break bit-identity with the Dask
    executor and store inputs: tests/test_determinism.py)."""
    small = _shuffled_clusters(200, 4)
    assert LocalExecutor(small, get_model("tsne"), 2, 0).point_order == "given"
    big = _shuffled_clusters(3000, 5)
    assert LocalExecutor(big, get_model("tsne"), 2, 0, n_threads=1).point_order == "given"
    for bad in ("random", "auto"):
        with pytest.raises(ValueError, match="point_order"):
            LocalExecutor(small, get_model("tsne"), 2, 0, point_order=bad)
    with pytest.raises(ValueError, match="partitions"):
        LocalExecutor(small, get_model("tsne"), 2, 0, point_order="locality", partitions=[0, 100, 200])
