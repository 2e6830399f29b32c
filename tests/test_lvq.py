"""LiRaM LVQ / GMLVQ: gradients by finite differences (several prototypes per class), the stochastic step,
the estimator's contract, bad input, and the supervised affinities built on it."""
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_wine

from scalemb.lvq import LiRaMLVQ
from scalemb.lvq import kernels
from scalemb.lvq.estimator import logdet_regularizer
from scalemb.lvq.synthetic import three_tip_star

from .cli_runner import run_cli

from .numerics import central_differences


@pytest.fixture(scope="module")
def wine():
    X, y = load_wine(return_X_y=True)
    return (X - X.mean(axis=0)) / X.std(axis=0), y


def random_problem(rng, n=30, D=5, M=2, ppc=2, n_classes=3, localized=True):
    X = rng.normal(size=(n, D))
    y = np.arange(n) % n_classes
    m = ppc * n_classes
    W = rng.normal(size=(m, D))
    labels = np.repeat(np.arange(n_classes), ppc).astype(np.int64)
    omegas = rng.uniform(-1, 1, size=(m if localized else 1, M, D))
    omega_of = np.arange(m) if localized else np.zeros(m, dtype=np.int64)
    return X, y.astype(np.int64), W, labels, omegas, omega_of


def total_cost(X, y, W, labels, omegas, omega_of, nu):
    cost = kernels.batch_gradient(X, y, 0, X.shape[0], W, labels, omegas, omega_of, 3)[0]
    return cost + (logdet_regularizer(omegas, nu)[0] if nu else 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("localized", [True, False])
@pytest.mark.parametrize("nu", [0.0, 0.05])
def test_gradient_matches_finite_differences_with_several_prototypes_per_class(localized, nu):
    rng = np.random.default_rng(1)
    X, y, W, labels, omegas, omega_of = random_problem(rng, localized=localized)
    _, gW, gO = kernels.batch_gradient(X, y, 0, X.shape[0], W, labels, omegas, omega_of, 3)
    if nu:
        gO = gO + logdet_regularizer(omegas, nu)[1]
    # every prototype (two per class) is the J or K of some point, so every matrix gets a gradient
    d = kernels.prototype_distances(X, W, omegas, omega_of)
    assert np.all(np.abs(gW).sum(axis=1) > 0)
    num_W = central_differences(lambda Wp: total_cost(X, y, Wp, labels, omegas, omega_of, nu), W)
    num_O = central_differences(lambda Op: total_cost(X, y, W, labels, Op, omega_of, nu), omegas)
    np.testing.assert_allclose(gW, num_W, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gO, num_O, rtol=1e-6, atol=1e-7)
    assert d.shape == (X.shape[0], W.shape[0])


def test_local_matrices_are_indexed_by_prototype_not_by_class():
    """A point whose J is the second prototype of class 0 moves matrix 1 only (sklvq would move matrix 0)."""
    rng = np.random.default_rng(2)
    X, y, W, labels, omegas, omega_of = random_problem(rng, n=1, ppc=2, n_classes=2)
    W[1] = X[0] + 0.01  # prototype 1 (class 0) is the closest correct one
    y[:] = 0
    _, gW, gO = kernels.batch_gradient(X, y, 0, 1, W, labels, omegas, omega_of, 1)
    dist = kernels.prototype_distances(X, W, omegas, omega_of)[0]
    K = 2 + int(np.argmin(dist[2:]))
    touched = {j for j in range(4) if np.any(gO[j])}
    assert touched == {1, K}
    assert np.all(gW[0] == 0) and np.any(gW[1])


@pytest.mark.parametrize("localized,seed", [(True, 3), (False, 4)])
def test_sgd_step_is_minus_learning_rate_times_the_gradient(localized, seed):
    """One point's step; with one global matrix (GMLVQ) that matrix gets both winners' terms."""
    rng = np.random.default_rng(seed)
    X, y, W, labels, omegas, omega_of = random_problem(rng, n=1, localized=localized)
    _, gW, gO = kernels.batch_gradient(X, y, 0, 1, W, labels, omegas, omega_of, 1)
    W1, O1 = W.copy(), omegas.copy()
    kernels.sgd_sweep(X, y, np.array([0]), W1, labels, O1, omega_of, 0.01, 0.002)
    np.testing.assert_allclose(W1 - W, -0.01 * gW, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(O1 - omegas, -0.002 * gO, rtol=1e-10, atol=1e-15)
    O2 = omegas.copy()
    kernels.sgd_sweep(X, y, np.array([0]), W.copy(), labels, O2, omega_of, 0.01, 0.0)  # fixed matrices
    assert np.array_equal(O2, omegas)


# ------------------------------------------------------------------------------------------ estimator

def test_wine_learns_and_is_reproducible(wine):
    X, y = wine
    params = dict(prototypes_per_class=2, rank=2, epochs=60, lr_prototypes=0.1, lr_prototypes_decay=0.01,
                  lr_metric=0.01, lr_metric_decay=0.001, metric_start=10, random_state=5)
    a = LiRaMLVQ(**params).fit(X, y)
    b = LiRaMLVQ(**params).fit(X, y)
    assert np.array_equal(a.prototypes_, b.prototypes_) and np.array_equal(a.omegas_, b.omegas_)
    assert a.score(X, y) >= 0.95
    assert a.cost_history_[-1] < a.cost_history_[0]
    assert a.prototypes_.shape == (6, 13) and a.omegas_.shape == (6, 2, 13)
    np.testing.assert_allclose(np.einsum("rab,rab->r", a.omegas_, a.omegas_), 1.0)  # trace normalisation
    assert list(a.prototype_labels_) == [0, 0, 1, 1, 2, 2]
    c = LiRaMLVQ(**dict(params, random_state=6)).fit(X, y)
    assert not np.array_equal(a.omegas_, c.omegas_)


def test_global_gmlvq_shares_one_matrix(wine):
    X, y = wine
    model = LiRaMLVQ(localized=False, rank=3, epochs=40, lr_prototypes=0.1, metric_start=5, lr_metric=0.01)
    model.fit(X, y)
    assert model.omegas_.shape == (1, 3, 13) and np.all(model.omega_of_ == 0)
    Z = model.transform(X)
    np.testing.assert_allclose(Z, X @ model.omegas_[0].T)


def test_transform_predict_and_dissimilarity_follow_the_winner(wine):
    X, y = wine
    model = LiRaMLVQ(prototypes_per_class=2, epochs=30, lr_prototypes=0.1, metric_start=5, lr_metric=0.01)
    model.fit(X, y)
    d = model.prototype_distances(X)
    lam = model.lambdas_
    for i in (0, 70, 150):
        for j in range(d.shape[1]):
            v = X[i] - model.prototypes_[j]
            assert d[i, j] == pytest.approx(v @ lam[j] @ v, rel=1e-10)
    win = d.argmin(axis=1)
    np.testing.assert_array_equal(model.predict(X), model.prototype_labels_[win])
    Z = model.transform(X)
    for i in (0, 70, 150):
        np.testing.assert_allclose(Z[i], model.omegas_[model.omega_of_[win[i]]] @ X[i])
    D = model.dissimilarity(X)
    for i, k in ((0, 5), (70, 3), (150, 100)):
        v = X[i] - X[k]
        assert D[i, k] == pytest.approx(v @ lam[win[i]] @ v, rel=1e-9, abs=1e-12)
    S = model.dissimilarity(X, symmetric=True)
    np.testing.assert_allclose(S, 0.5 * (D + D.T))
    np.testing.assert_allclose(model.dissimilarity(X[:5], X[10:20]), D[:5, 10:20], rtol=1e-9, atol=1e-12)
    restored = LiRaMLVQ.from_dict(model.to_dict())
    np.testing.assert_array_equal(restored.transform(X), Z)


def test_regularizer_keeps_full_rank(wine):
    X, y = wine
    common = dict(epochs=80, lr_prototypes=0.1, metric_start=2, lr_metric=0.05, lr_metric_decay=0.0, rank=2)
    plain = LiRaMLVQ(**common).fit(X, y)
    reg = LiRaMLVQ(regularization=0.05, **common).fit(X, y)
    def ratio(model):  # smallest / largest singular value of each Omega
        s = np.linalg.svd(model.omegas_, compute_uv=False)
        return (s[:, -1] / s[:, 0]).min()
    assert ratio(reg) > ratio(plain)


def test_sklearn_compatibility(wine):
    from sklearn.model_selection import cross_val_score

    X, y = wine
    model = LiRaMLVQ(epochs=20, lr_prototypes=0.1, metric_start=5, lr_metric=0.01)
    cloned = clone(model)
    assert cloned.get_params() == model.get_params()
    scores = cross_val_score(model, X, y, cv=3)
    assert scores.mean() > 0.85


def test_partitioned_epochs_reduce_and_learn(wine):
    X, y = wine
    params = dict(prototypes_per_class=1, epochs=60, lr_prototypes=0.1, metric_start=5, lr_metric=0.01)
    model = LiRaMLVQ(partitions=3, **params).fit(X, y)
    assert model.score(X, y) >= 0.95


def test_three_tip_star_shape():
    X, y = three_tip_star(600, random_state=1)
    assert X.shape == (600, 10) and np.bincount(y).tolist() == [300, 300]
    X2, y2 = three_tip_star(600, random_state=1)
    assert np.array_equal(X, X2) and np.array_equal(y, y2)


# the bad inputs, for LiRaMLVQ itself and for Embedder(metric='liram')
BAD_INPUT = [
    (np.zeros((10, 3)), np.arange(9) % 2, {}, "labels have length 9 but X has 10 rows"),
    (np.random.default_rng(0).normal(size=(10, 3)), np.zeros(10), {}, "at least 2 classes"),
    (np.where(np.eye(10, 3) > 0, np.nan, 0.0), np.arange(10) % 2, {}, "non-finite value (nan) at row 0, column 0"),
    (np.random.default_rng(0).normal(size=(10, 3)), np.r_[np.zeros(8), np.ones(2)], {"prototypes_per_class": 3},
     "class 1.0 has 2 points, fewer than prototypes_per_class=3"),
    (np.random.default_rng(0).normal(size=(10, 3)), np.arange(10) % 2, {"rank": 4}, "rank must be in 1..3"),
]


@pytest.mark.parametrize("X, y, params, message", BAD_INPUT)
def test_bad_input_gives_one_clear_error(X, y, params, message):
    with pytest.raises(ValueError) as info:
        LiRaMLVQ(epochs=2, **params).fit(X, y)
    assert message in str(info.value)


# ------------------------------------------------------------------------------------ supervised affinity

@pytest.fixture(scope="module")
def star_model():
    X, y = three_tip_star(450, random_state=2)
    model = LiRaMLVQ(prototypes_per_class=3, rank=2, epochs=40, metric_start=5, lr_metric=0.01).fit(X, y)
    return X, y, model


def test_learned_neighbours_exact_and_tree(star_model):
    from scalemb.lvq import learned_neighbours

    X, y, model = star_model
    S = model.dissimilarity(X, symmetric=True)
    np.fill_diagonal(S, np.inf)
    idx, s = learned_neighbours(model, X, 12, algorithm="exact")
    np.testing.assert_allclose(s, np.sort(S, axis=1)[:, :12], rtol=1e-9)
    np.testing.assert_allclose(np.take_along_axis(S, idx, axis=1), s, rtol=1e-9)
    idx_t, s_t = learned_neighbours(model, X, 12, algorithm="tree", candidates=3)
    np.testing.assert_allclose(np.take_along_axis(S, idx_t, axis=1), s_t, rtol=1e-9)  # values are exact
    recall = np.mean([len(set(a) & set(b)) / 12 for a, b in zip(idx, idx_t)])
    assert recall > 0.97


def test_supervised_affinity_keeps_the_model(star_model):
    from scalemb.lvq import supervised_affinity

    X, y, model = star_model
    aff = supervised_affinity(X, model=model, perplexity=10)
    P = aff.P
    assert abs(P - P.T).max() == 0 and P.sum() == pytest.approx(1.0) and not P.diagonal().any()
    assert aff.provenance["metric"] == "liram" and aff.provenance["n_neighbors"] == 30
    restored = LiRaMLVQ.from_dict(aff.provenance["lvq"])
    np.testing.assert_array_equal(restored.transform(X), model.transform(X))
    # under the learned metric more of a point's affinity mass sits on its own class than under Euclidean
    from scalemb.affinity import knn_affinity

    def same_class_mass(P):
        rows = np.repeat(np.arange(P.shape[0]), np.diff(P.indptr))
        return P.data[y[rows] == y[P.indices]].sum()

    euclidean = same_class_mass(knn_affinity(X, perplexity=10).P)
    assert same_class_mass(P) > euclidean + 0.1
    fitted_here = supervised_affinity(X, y, perplexity=10, prototypes_per_class=3, epochs=40, metric_start=5,
                                      lr_metric=0.01)
    np.testing.assert_array_equal(fitted_here.P.toarray(), P.toarray())
    with pytest.raises(ValueError, match="needs labels"):
        supervised_affinity(X)


@pytest.mark.slow
def test_partitioned_fit_is_the_same_on_dask(dask_cluster, wine):
    X, y = wine
    params = dict(epochs=15, lr_prototypes=0.1, metric_start=3, lr_metric=0.01, partitions=2, random_state=3)
    local = LiRaMLVQ(**params).fit(X, y)
    remote = LiRaMLVQ(scheduler=dask_cluster.address, **params).fit(X, y)
    np.testing.assert_array_equal(local.prototypes_, remote.prototypes_)
    np.testing.assert_array_equal(local.omegas_, remote.omegas_)
    np.testing.assert_array_equal(local.cost_history_, remote.cost_history_)


# ---------------------------------------------------------------------------------------------------- CLI

@pytest.fixture(scope="module")
def star_files(tmp_path_factory):
    path = tmp_path_factory.mktemp("lvq-cli")
    X, y = three_tip_star(180, random_state=4)
    np.save(path / "X.npy", X)
    np.save(path / "y.npy", y)
    (path / "y.txt").write_text("\n".join("ab"[v] for v in y) + "\n")
    np.save(path / "y_short.npy", y[:-1])
    np.save(path / "y_one.npy", np.zeros_like(y))
    Xn = X.copy()
    Xn[7, 3] = np.nan
    np.save(path / "X_nan.npy", Xn)
    return path


@pytest.mark.slow
def test_cli_supervised_affinity_then_embed(star_files):
    import zarr

    proc = run_cli("affinity", "X.npy", "--labels", "y.txt", "--metric", "liram", "--prototypes-per-class", "3",
                   "--rank", "2", "--knn", "30", "--perplexity", "10", "--lvq-epochs", "30", "--out", "P.zarr",
                   cwd=star_files)
    assert proc.returncode == 0, proc.stderr
    group = zarr.open_group(str(star_files / "P.zarr"), mode="r")
    prov = dict(group.attrs)["scalemb"]["provenance"]
    assert prov["metric"] == "liram" and prov["lvq"]["classes"] == ["a", "b"] and prov["labels"] == "y.txt"
    y = np.load(star_files / "y.npy")
    np.testing.assert_array_equal(group["labels"][:], y)
    model = LiRaMLVQ.from_dict(prov["lvq"])
    assert model.prototypes_.shape == (6, 10) and model.omegas_.shape == (6, 2, 10)
    proc = run_cli("embed", "P.zarr", "--model", "tsne", "--iterations", "30", "--out", "run.zarr", "--quiet",
                   cwd=star_files)
    assert proc.returncode == 0, proc.stderr
    run = zarr.open_group(str(star_files / "run.zarr"), mode="r")
    assert run["embedding"].shape == (180, 2)
    assert dict(run.attrs)["provenance"]["lvq"]["kind"] == "liram_lvq"
    # new points are placed under the stored learned metric
    np.save(star_files / "X_new.npy", three_tip_star(20, random_state=5)[0])
    proc = run_cli("transform", "run.zarr", "X_new.npy", "--iterations", "20", "--out", "placed.zarr",
                   cwd=star_files)
    assert proc.returncode == 0, proc.stderr
    placed = zarr.open_group(str(star_files / "placed.zarr"), mode="r")
    assert placed["embedding"].shape == (200, 2)
    np.testing.assert_array_equal(placed["embedding"][:180], run["embedding"][:])


@pytest.mark.parametrize("args, message", [
    (("X.npy", "--labels", "y_short.npy"), "labels have length 179 but X has 180 rows"),
    (("X.npy", "--labels", "y_one.npy"), "at least 2 classes"),
    (("X_nan.npy", "--labels", "y.npy"), "X_nan.npy: non-finite value nan at row 7, column 3"),
    (("X.npy", "--labels", "y.npy", "--prototypes-per-class", "100"), "fewer than prototypes_per_class=100"),
    (("X.npy", "--labels", "y.npy", "--rank", "11"), "rank must be in 1..10"),
    (("X.npy", "--labels", "missing.npy"), "missing.npy: no such file"),
])
def test_cli_bad_input_exit_2_nothing_written(star_files, args, message):
    proc = run_cli("affinity", *args, "--metric", "liram", "--knn", "20", "--lvq-epochs", "2", "--out", "bad.zarr",
                   cwd=star_files)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not any(p.name.startswith(("bad.zarr", ".bad.zarr")) for p in star_files.iterdir())


# -------------------------------------------------------------------------- estimator and placing new points

LIRAM_FAST = {"epochs": 20, "lr_prototypes": 0.1, "lr_metric": 0.01, "metric_start": 5}


def test_estimator_metric_liram_fits_supervised_affinities(wine):
    from scalemb import Embedder
    from scalemb.lvq import supervised_affinity

    X, y = wine
    est = Embedder(model="tsne", metric="liram", metric_params=LIRAM_FAST, perplexity=10, iterations=60,
                   random_state=1).fit(X, y)
    assert est.embedding_.shape == (178, 2) and np.isfinite(est.kl_)
    assert est.result_.provenance["metric"] == "liram" and est.lvq_.omegas_.shape == (3, 2, 13)
    reference = supervised_affinity(X, y, perplexity=10, random_state=1, **LIRAM_FAST)
    assert est.result_.provenance["lvq"] == reference.provenance["lvq"]  # the seed reaches the LVQ fit
    np.testing.assert_array_equal(est.lvq_.transform(X), LiRaMLVQ.from_dict(reference.provenance["lvq"]).transform(X))
    with pytest.raises(ValueError, match="call fit\\(X, y\\)"):
        Embedder(metric="liram").fit(X)
    with pytest.raises(ValueError, match="unknown LiRaMLVQ setting"):
        Embedder(metric="liram", metric_params={"protos": 2}).fit(X, y)
    with pytest.raises(ValueError, match="settings of metric='liram'"):
        Embedder(metric_params={"rank": 2}).fit(X)


@pytest.mark.parametrize("X, y, params, message", BAD_INPUT)
def test_estimator_metric_liram_bad_input(X, y, params, message):
    from scalemb import Embedder

    with pytest.raises(ValueError) as info:
        Embedder(metric="liram", metric_params=dict(params, epochs=2), perplexity=3, iterations=5).fit(X, y)
    assert message in str(info.value)


@pytest.mark.slow
def test_new_points_are_placed_under_the_learned_metric(wine):
    from scalemb.embedding import Embedder
    from scalemb.lvq import learned_neighbours, neighbours_against, supervised_affinity

    X, y = wine
    train, test = np.arange(178) % 6 != 0, np.arange(178) % 6 == 0
    model = LiRaMLVQ(random_state=0, **LIRAM_FAST).fit(X[train], y[train])
    # against the rows themselves: self first (s = 0), then the learned neighbours
    idx, s = neighbours_against(model, X[train], X[train], 11)
    idx0, s0 = learned_neighbours(model, X[train], 10, algorithm="exact")
    np.testing.assert_array_equal(idx[:, 1:], idx0)
    np.testing.assert_allclose(s[:, 1:], s0, rtol=1e-12)
    S = np.array([[0.5 * (model.dissimilarity(a[None], b[None])[0, 0] + model.dissimilarity(b[None], a[None])[0, 0])
                   for b in X[train]] for a in X[test][:3]])
    idx, s = neighbours_against(model, X[test][:3], X[train], 5)
    np.testing.assert_allclose(s, np.sort(S, axis=1)[:, :5], rtol=1e-9)
    e = Embedder(model="tsne", iterations=100, seed=0).fit(supervised_affinity(X[train], model=model, perplexity=10))
    placed = e.transform(X[test], reference=X[train], iterations=50)
    assert placed.shape == (test.sum(), 2) and np.all(np.isfinite(placed))
    # placed by the learned metric, the held-out points land next to their own class
    from sklearn.neighbors import KNeighborsClassifier

    knn = KNeighborsClassifier(1).fit(e.embedding_, y[train])
    assert np.mean(knn.predict(placed) != y[test]) < 0.1
