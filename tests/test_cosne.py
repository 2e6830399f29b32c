"""CO-SNE: the hyperbolic kernels against a dense reference and central finite differences (also near the
boundary of the ball), the norm loss, parameter validation."""
import numpy as np
import pytest
import scipy.sparse as sp

from scalemb.affinity.hyperbolic import poincare_distance
from scalemb.models.cosne import check_params, hyperboloid, make_kernels, norm_loss

from .numerics import central_differences

GAMMA = 0.3


def dense_distance(Y):
    """Poincaré distances of the columns of ``Y`` (d, N), straight from the definition."""
    n2 = np.sum(Y * Y, axis=0)
    d2 = np.sum((Y[:, :, None] - Y[:, None, :]) ** 2, axis=0)
    return np.arccosh(1 + 2 * d2 / np.outer(1 - n2, 1 - n2))


def dense_weights(Y, gamma=GAMMA):
    W = gamma ** 2 / (dense_distance(Y) ** 2 + gamma ** 2)
    np.fill_diagonal(W, 0)
    return W


def random_affinity(n, rng):
    P = sp.random(n, n, density=0.3, random_state=np.random.RandomState(int(rng.integers(1 << 30))))
    P = P + P.T
    P.setdiag(0)
    P.eliminate_zeros()
    return sp.csr_matrix(P / P.sum())


def points(n, dims, rng, near_boundary):
    """Random points in the ball; ``near_boundary``: a third of them at radius 0.97-0.995."""
    Y = rng.normal(size=(dims, n))
    Y *= rng.uniform(0.05, 0.8, size=n) / np.linalg.norm(Y, axis=0)
    if near_boundary:
        Y[:, ::3] *= rng.uniform(0.97, 0.995, size=Y[:, ::3].shape[1]) / np.linalg.norm(Y[:, ::3], axis=0)
    return np.ascontiguousarray(Y)


def run_kernels(P, Y, gamma=GAMMA):
    """``(sum p log w, A, Z, R)`` from the kernels, the matrix in two row blocks (as the executors call it)."""
    attraction, repulsion, _, _ = make_kernels(gamma)
    n = Y.shape[1]
    Yt = np.ascontiguousarray(Y.T)
    A = np.zeros((n, Y.shape[0]))
    R = np.zeros_like(Y)
    plogw = z = 0.0
    for r0, r1 in ((0, n // 3), (n // 3, n)):
        lo, hi = P.indptr[r0], P.indptr[r1]
        indptr = (P.indptr[r0:r1 + 1] - lo).astype(np.int64)
        plogw += attraction(indptr, P.indices[lo:hi].astype(np.int64), P.data[lo:hi], r0, Yt, Y.shape[0],
                            A[r0:r1], True)
        z += repulsion(Y, Y.shape[0], r0, r1, R)
    return plogw, A.T, z, R


@pytest.mark.parametrize("dims,near_boundary", [(2, False), (2, True), (3, True)])
def test_kernels_match_dense_reference_and_finite_differences(dims, near_boundary):
    rng = np.random.default_rng(dims + 10 * near_boundary)
    n = 13
    P = random_affinity(n, rng)
    Y = points(n, dims, rng, near_boundary)
    plogw, A, z, R = run_kernels(P, Y)
    W = dense_weights(Y)
    Pd = P.toarray()
    mask = Pd > 0
    assert plogw == pytest.approx(np.sum(Pd[mask] * np.log(W[mask])), rel=1e-12)
    assert z == pytest.approx(W.sum(), rel=1e-12)
    # d(sum p log w)/dy_i = 2 A_i and dZ/dy_i = 2 R_i (ordered pairs, symmetric P and w)
    num_a = central_differences(lambda c: run_kernels(P, c)[0], Y)
    num_r = central_differences(lambda c: run_kernels(P, c)[2], Y)
    assert np.abs(num_a - 2 * A).max() <= 1e-6 * np.abs(A).max()
    assert np.abs(num_r - 2 * R).max() <= 1e-6 * np.abs(R).max()
    # the KL gradient 2 (R/Z - A) against differences of the dense KL
    kl = lambda Y: float(np.sum(Pd[mask] * np.log(Pd[mask] * W_of(Y).sum() / W_of(Y)[mask])))  # noqa: E731
    W_of = dense_weights
    grad = 2 * (R / z - A)
    num = central_differences(kl, Y)
    assert np.abs(num - grad).max() <= 1e-6 * np.abs(grad).max()


def test_close_pairs_and_series_branch():
    """Points closer than the series threshold: finite, and forces continuous across the threshold."""
    attraction, repulsion, curvature, _ = make_kernels(GAMMA)
    base = np.array([0.3, -0.2])
    for gap in (0.0, 1e-9, 3e-4, 1e-3):  # delta = 2 gap^2 / (alpha^2) around 1e-5 for gap ~ 2e-3
        Y = np.ascontiguousarray(np.stack([base, base + [gap, 0.0], [-0.5, 0.4]], axis=1))
        R = np.zeros_like(Y)
        z = repulsion(Y, 2, 0, 3, R)
        assert np.isfinite(z) and np.isfinite(R).all()
        assert z == pytest.approx(dense_weights(Y).sum(), rel=1e-12)
    # d(w)/d(gap) is continuous at the switch delta = SERIES_BELOW
    alpha = 1 - base @ base
    switch = np.sqrt(1e-5 / 2) * alpha
    forces = []
    for gap in (switch * (1 - 1e-7), switch * (1 + 1e-7)):
        Y = np.ascontiguousarray(np.stack([base, base + [gap, 0.0]], axis=1))
        R = np.zeros_like(Y)
        repulsion(Y, 2, 0, 2, R)
        forces.append(R[0, 0])
    assert forces[0] == pytest.approx(forces[1], rel=1e-6)


def test_cross_repulsion_and_curvature_agree_with_the_pair_kernels():
    rng = np.random.default_rng(5)
    n = 11
    Y = points(n, 2, rng, True)
    _, repulsion, curvature, cross = make_kernels(GAMMA)
    R = np.zeros_like(Y)
    z = repulsion(Y, 2, 0, n, R)
    Rc = np.zeros_like(Y)
    zc = cross(Y, 0, n, Y, 2, True, Rc)
    assert zc == pytest.approx(z, rel=1e-12)
    assert np.allclose(Rc, R, rtol=1e-10, atol=1e-14)
    # curvature: c_ij = -2 a_ij p_ij with a the coefficient of (y_i - y_j) in d log w_ij / d y_i
    P = random_affinity(n, rng)
    out = np.zeros(P.nnz)
    curvature(P.indptr.astype(np.int64), P.indices.astype(np.int64), P.data, 0, np.ascontiguousarray(Y.T), 2, out)
    D = dense_distance(Y)
    n2 = np.sum(Y * Y, axis=0)
    rows = np.repeat(np.arange(n), np.diff(P.indptr))
    d = D[rows, P.indices]
    ab = (1 - n2[rows]) * (1 - n2[P.indices])
    a = -8 * (d / np.sqrt(np.cosh(d) ** 2 - 1)) / (d ** 2 + GAMMA ** 2) / ab
    assert np.allclose(out, -2 * a * P.data, rtol=1e-10)


def test_norm_loss_gradient():
    rng = np.random.default_rng(7)
    Y = points(9, 2, rng, True)
    radii = rng.uniform(0, 0.99, 9)
    value, grad = norm_loss(Y, radii)
    assert value == pytest.approx(np.mean((radii ** 2 - np.sum(Y * Y, 0)) ** 2))
    num = central_differences(lambda c: norm_loss(c, radii)[0], Y)
    assert np.abs(num - grad).max() <= 1e-7 * np.abs(grad).max()


def test_distance_helpers():
    rng = np.random.default_rng(3)
    Y = points(6, 3, rng, True)
    D = dense_distance(Y)
    assert poincare_distance(Y[:, 0], Y[:, 4]) == pytest.approx(D[0, 4], rel=1e-12)
    X = hyperboloid(Y.T)
    d2s = np.sum((X[:, None, :-1] - X[None, :, :-1]) ** 2, -1)
    d2t = (X[:, None, -1] - X[None, :, -1]) ** 2
    assert np.allclose(d2s - d2t, 2 * (np.cosh(D) - 1), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kwargs,match", [({"gamma": 0.0}, "gamma"), ({"gamma": -1.0}, "gamma"),
                                          ({"lambda1": 0.0}, "lambda1"), ({"lambda2": -0.1}, "lambda2"),
                                          ({"gamma": float("nan")}, "gamma"), ({"warmup": -1}, "warmup")])
def test_bad_parameters(kwargs, match):
    params = {"gamma": 0.1, "lambda1": 10.0, "lambda2": 0.01, "warmup": 500, **kwargs}
    with pytest.raises(ValueError, match=match):
        check_params(**params)


def test_hyperbolic_affinity_and_radii(tmp_path):
    from scalemb.affinity import Affinity, AffinityStore, write_affinity_store
    from scalemb.affinity.hyperbolic import hyperbolic_affinity, poincare_distances, wrapped_normal_clusters

    X, labels = wrapped_normal_clusters(seed=1)
    assert X.shape == (100, 5) and np.bincount(labels).tolist() == [20] * 5
    assert np.linalg.norm(X, axis=1).max() < 1
    assert np.array_equal(X, wrapped_normal_clusters(seed=1)[0])
    A = hyperbolic_affinity(X, perplexity=5, n_neighbors=15)
    P = A.P.toarray()
    assert np.allclose(P, P.T) and P.sum() == pytest.approx(1.0)
    assert np.allclose(A.radii, np.linalg.norm(X, axis=1))
    # the stored neighbours are the 15 nearest in the Poincaré distance (not in the Euclidean one)
    D = poincare_distances(X, X)
    np.fill_diagonal(D, np.inf)
    nearest = np.argsort(D, axis=1)[:, :15]
    rows_of_p = (P > 0)
    assert all(rows_of_p[i, nearest[i]].all() for i in range(100))
    # the two clusters far out (means at 0.9) are well separated: their strongest affinity is within the cluster
    far = labels >= 3
    assert np.mean(labels[np.argmax(P, axis=1)][far] == labels[far]) > 0.9
    # radii survive the store and a permutation; bad radii are refused
    path = write_affinity_store(tmp_path / "p.zarr", A)
    assert np.array_equal(AffinityStore(path).radii, A.radii)
    assert np.array_equal(AffinityStore(path).to_affinity().radii, A.radii)
    # the content hash covers the radii: changed (still valid) radii are a corrupt store, streaming or not
    import zarr

    from scalemb.errors import InputError

    zarr.open_group(str(path), mode="r+")["radii"][:3] = 0.5
    with pytest.raises(InputError, match="content hash mismatch"):
        AffinityStore(path).to_affinity()
    with pytest.raises(InputError, match="content hash mismatch"):
        AffinityStore(path).verify_hash()
    order = np.arange(100)[::-1]
    assert np.array_equal(A.permuted(order).radii, A.radii[order])
    for bad in (np.full(100, 1.0), np.full(99, 0.5), np.r_[np.full(99, 0.5), np.nan]):
        with pytest.raises(ValueError, match="radii"):
            Affinity(A.P, A.node_ids, radii=bad)


@pytest.mark.parametrize("value,match", [(1.0, "norm 1"), (1.5, "norm 1.5"), (np.nan, "non-finite")])
def test_points_outside_the_ball_are_refused(value, match):
    from scalemb.affinity.hyperbolic import hyperbolic_affinity

    X = np.random.default_rng(0).uniform(-0.3, 0.3, size=(20, 3))
    X[7] = [value, 0, 0]
    with pytest.raises(ValueError, match=match):
        hyperbolic_affinity(X, perplexity=3)


def test_degree_radii_put_hubs_inside():
    from scalemb.affinity import Affinity
    from scalemb.models.cosne import degree_radii, target_radii

    star = sp.lil_matrix((6, 6))
    for j in range(1, 6):
        star[0, j] = star[j, 0] = 1
    star[1, 2] = star[2, 1] = 1
    A = Affinity(sp.csr_matrix(star), np.arange(6))
    r = target_radii(A)
    assert r[0] == 0 and r[1] == r[2] < r[3] == r[4] == r[5] < 1
    assert r[3] == pytest.approx(np.tanh(0.5 * np.log(5)))
    assert np.array_equal(degree_radii([5, 2, 2, 1, 1, 1]), r)
    A.radii = np.full(6, 0.5)  # stored radii (input norms) take precedence
    assert np.array_equal(target_radii(A), A.radii)


def test_points_at_the_projection_radius_give_finite_values():
    """After a huge step the geometry projects points onto |y| = 1 - eps: the kernels stay finite there, also for
    two points projected onto the same spot and for antipodal ones."""
    from scalemb.geometry import POINCARE

    rng = np.random.default_rng(4)
    Y = points(12, 2, rng, False)
    step = np.zeros_like(Y)
    step[:, :4] = [[1e6, 1e6, -1e300, np.inf], [0.0, 1e-3, 0.0, 0.0]]
    Y = POINCARE.retract(Y, step)
    assert np.linalg.norm(Y, axis=0).max() <= POINCARE.radius + 1e-15
    P = random_affinity(12, rng)
    plogw, A, z, R = run_kernels(P, np.ascontiguousarray(Y))
    assert np.isfinite([plogw, z]).all() and np.isfinite(A).all() and np.isfinite(R).all()
    grad = POINCARE.riemannian_gradient(Y, 2 * (R / z - A))
    assert np.isfinite(grad).all()


@pytest.fixture(scope="module")
def paper_affinity():
    from scalemb.affinity.hyperbolic import hyperbolic_affinity, wrapped_normal_clusters

    X, labels = wrapped_normal_clusters(seed=0)
    return X, labels, hyperbolic_affinity(X, perplexity=10)


def test_full_objective_gradient_through_the_executor(paper_affinity):
    """Evaluation of the whole model (KL reduction + point term after its warm-up) against finite differences."""
    from scalemb.engine import LocalExecutor
    from scalemb.models import get_model

    _, _, affinity = paper_affinity
    model = get_model("cosne", gamma=0.2, lambda2=0.5, warmup=3)
    coords = points(affinity.n_points, 2, np.random.default_rng(8), True)
    with LocalExecutor(affinity, model, 2, 0, repulsion="exact") as ex:
        before, after = ex.evaluate(coords, iteration=2), ex.evaluate(coords, iteration=3)
        h_value, h_grad = norm_loss(coords, affinity.radii)
        weight = 0.5 / 10.0 * affinity.n_points
        assert after.kl - before.kl == pytest.approx(weight * h_value, rel=1e-10)
        assert np.allclose(after.gradient - before.gradient, weight * h_grad, rtol=1e-9, atol=1e-14)
        rng = np.random.default_rng(9)
        chosen = rng.choice(affinity.n_points, 8, replace=False)  # boundary points are every third one
        entries = [(k, i) for i in chosen for k in range(2)]
        numeric = central_differences(lambda c: ex.evaluate(c, iteration=3).kl, coords, entries)
        for k, i in entries:
            assert numeric[k, i] == pytest.approx(after.gradient[k, i], rel=1e-5,
                                                  abs=1e-7 * np.abs(after.gradient).max())


@pytest.mark.slow
def test_cosne_end_to_end_local_and_dask(paper_affinity, dask_cluster, tmp_path):
    """The Python API locally and on 2 Dask workers (bit-identical), delta-bar-delta and gradient descent, the
    warm-up switching H on, the map inside the ball, the 1-NN error of the far clusters."""
    from scalemb.embedding import Embedder
    from scalemb.models import get_model

    X, labels, affinity = paper_affinity
    model = get_model("cosne", warmup=20)
    runs = {}
    for optimizer in ("dbd", "gd"):
        runs[optimizer] = Embedder(model=model, iterations=40, optimizer=optimizer, repulsion="exact").fit(affinity)
        Y = runs[optimizer].embedding_
        assert np.isfinite(Y).all() and np.linalg.norm(Y, axis=1).max() < 1
    # H joins the objective at iteration 20: until then the run equals one without H, bit for bit
    plain = Embedder(model=get_model("cosne", warmup=20, lambda2=0.0), iterations=40, optimizer="dbd",
                     repulsion="exact").fit(affinity).result_.kl_history
    history = runs["dbd"].result_.kl_history
    assert np.array_equal(history[:20], plain[:20]) and not np.any(history[20:] == plain[20:])
    dask = Embedder(model=model, iterations=40, optimizer="dbd", repulsion="exact",
                    scheduler=dask_cluster.address).fit(affinity)
    assert np.array_equal(dask.embedding_, runs["dbd"].embedding_)
    assert dask.kl_ == runs["dbd"].kl_


def cli_cosne_run(tmp_path):
    """A small CO-SNE run through the CLI (Poincaré kNN affinities of wrapped-normal clusters, 30 iterations):
    ``(affinity store, run)``."""
    from scalemb.affinity.hyperbolic import wrapped_normal_clusters
    from scalemb.cli.main import main

    X, _ = wrapped_normal_clusters(seed=2)
    np.save(tmp_path / "x.npy", X)
    store, out = tmp_path / "p.zarr", tmp_path / "run.zarr"
    assert main(["affinity", str(tmp_path / "x.npy"), "--knn", "30", "--perplexity", "8", "--metric", "poincare",
                 "--out", str(store), "--quiet"]) == 0
    assert main(["embed", str(store), "--model", "cosne", "--iterations", "30", "--out", str(out), "--quiet",
                 "--model-param", "warmup=10", "--model-param", "gamma=0.2"]) == 0
    return store, out


def test_cli_cosne_runs_plots_and_refuses_bad_input(tmp_path, capsys):
    from scalemb.cli.main import main
    from scalemb.plot.mapdata import map_data

    store, out = cli_cosne_run(tmp_path)
    X = np.load(tmp_path / "x.npy")
    assert map_data(out).ball
    assert main(["plot", str(out), "--out", str(tmp_path / "map.png"), "--quiet"]) == 0
    bad = tmp_path / "bad.npy"
    for row, message in (([1.0, 0, 0, 0, 0], "norm 1"), ([0.9, 0.9, 0, 0, 0], "norm 1.27")):
        Xb = X.copy()
        Xb[5] = row
        np.save(bad, Xb)
        capsys.readouterr()
        assert main(["affinity", str(bad), "--knn", "30", "--metric", "poincare", "--out",
                     str(tmp_path / "bad.zarr"), "--quiet"]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "bad.zarr").exists()
    for extra, message in ((["--model-param", "gamma=0"], "gamma must be > 0"),
                           (["--model-param", "lambda2=-1"], "lambda2 must be >= 0"),
                           (["--model-param", "lambda1=-1"], "lambda1 must be > 0"),
                           (["--time", "1"], "no time dimensions"),
                           (["--model-param", "delta=1"], "does not take")):
        capsys.readouterr()
        assert main(["embed", str(store), "--model", "cosne", "--iterations", "3", "--out",
                     str(tmp_path / "never.zarr"), "--quiet", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "never.zarr").exists()


@pytest.mark.slow
def test_metrics_rank_in_the_poincare_distance(paper_affinity):
    """NP@deg and the 1-NN error with model='cosne' rank neighbours by the Poincaré distance (not the Euclidean
    one): checked against a brute-force count on a map where the two orders differ."""
    from scalemb.affinity.hyperbolic import poincare_distances
    from scalemb.metrics import neighbourhood_preservation, one_nn_error

    _, labels, affinity = paper_affinity
    Y = points(affinity.n_points, 2, np.random.default_rng(11), True).T
    D = poincare_distances(Y, Y)
    np.fill_diagonal(D, np.inf)
    G = affinity.P
    expected = []
    for i in range(G.shape[0]):
        neighbours = G.indices[G.indptr[i]:G.indptr[i + 1]]
        nearest = np.argsort(D[i], kind="stable")[:neighbours.size]
        expected.append(np.isin(nearest, neighbours).mean())
    assert neighbourhood_preservation(affinity, Y, model="cosne").value == pytest.approx(np.mean(expected))
    assert neighbourhood_preservation(affinity, Y, model="tsne").value != pytest.approx(np.mean(expected))
    assert one_nn_error(Y, labels, model="cosne").value == pytest.approx(np.mean(labels[D.argmin(1)] != labels))
