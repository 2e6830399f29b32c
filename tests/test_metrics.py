"""scalemb.metrics against brute-force references on small random data, known cases, sampling, the CLI."""
import json

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial.distance import cdist

from scalemb.datasets import school
from scalemb.embedding import EmbeddingResult
from scalemb.errors import InputError
from scalemb.store.results import write_result
from scalemb.metrics import (Metric, continuity, coranking_curve, evaluate_run, feature_metrics, graph_metrics, kl,
                             knn_precision, metrics_table, neighbourhood_preservation, node_preservation,
                             one_nn_error, to_json, trustworthiness)

from .conftest import dense_kl
from .cli_runner import run_cli


# ------------------------------------------------------------------------------------------- references

def brute_orders(S, model="euclidean", space_dims=None):
    """Per row, the other points best first: descending similarity, ties by index (the metrics' order)."""
    n, d = S.shape
    ds = d if space_dims is None else space_dims
    d2s = cdist(S[:, :ds], S[:, :ds], "sqeuclidean")
    d2t = cdist(S[:, ds:], S[:, ds:], "sqeuclidean") if ds < d else np.zeros((n, n))
    sim = d2t - np.log1p(d2s) if model == "snest" else -(d2s + d2t)
    orders = []
    for i in range(n):
        others = np.array([j for j in range(n) if j != i])
        orders.append(others[np.lexsort((others, -sim[i, others]))])
    return np.array(orders)


def brute_np(G, Y, model="euclidean", space_dims=None):
    order = brute_orders(Y, model, space_dims)
    values, jacc = [], []
    for i in range(Y.shape[0]):
        nbrs = set(G[i].indices) - {i}
        if nbrs:
            h = len(nbrs & set(order[i, :len(nbrs)]))
            values.append(h / len(nbrs))
            jacc.append(h / (2 * len(nbrs) - h))
    return np.mean(values), np.mean(jacc)


def brute_features(X, Y, k, k_max):
    n = X.shape[0]
    ox, oy = brute_orders(X), brute_orders(Y)
    rx = np.argsort(ox, axis=1) + 1  # rank of column position... (position of j in row i's list)
    ry = np.argsort(oy, axis=1) + 1
    # map list positions to point ids: rank_x[i, j] for j != i
    rank_x = np.zeros((n, n), int)
    rank_y = np.zeros((n, n), int)
    for i in range(n):
        rank_x[i, ox[i]] = np.arange(1, n)
        rank_y[i, oy[i]] = np.arange(1, n)
    del rx, ry
    t = c = p = 0.0
    for i in range(n):
        ny, nx = set(oy[i, :k]), set(ox[i, :k])
        t += sum(rank_x[i, j] - k for j in ny - nx)
        c += sum(rank_y[i, j] - k for j in nx - ny)
        p += len(nx & ny) / k
    scale = 2.0 / (n * k * (2 * n - 3 * k - 1))
    q = np.array([np.mean([len(set(ox[i, :K]) & set(oy[i, :K])) / K for i in range(n)]) for K in range(1, k_max + 1)])
    K = np.arange(1, k_max + 1)
    r = ((n - 1) * q - K) / (n - 1 - K)
    return 1 - scale * t, 1 - scale * c, p / n, q, r, np.sum(r / K) / np.sum(1 / K)


def random_graph(n, m, rng):
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    G = sp.coo_matrix((np.ones(m), (src, dst)), shape=(n, n)).tocsr()
    G = G + G.T
    G.setdiag(0)
    G.eliminate_zeros()
    return G.tocsr()


def grid_graph(side):
    idx = np.arange(side * side).reshape(side, side)
    rows = np.concatenate([idx[:, :-1].ravel(), idx[:-1].ravel()])
    cols = np.concatenate([idx[:, 1:].ravel(), idx[1:].ravel()])
    G = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(side * side,) * 2)
    xs, ys = np.meshgrid(np.arange(side), np.arange(side))
    return (G + G.T).tocsr(), np.c_[xs.ravel(), ys.ravel()].astype(float)


# --------------------------------------------------------------------------------------- the metrics

@pytest.mark.parametrize("model,space_dims,dims", [("tsne", None, 2), ("snest", 2, 3)])
def test_np_matches_brute_force(model, space_dims, dims):
    rng = np.random.default_rng(1)
    n = 80
    G = random_graph(n, 160, rng)
    Y = rng.standard_normal((n, dims))
    Y[5] = Y[6]  # a tie: broken by index in both
    ref_np, ref_j = brute_np(G, Y, "snest" if model == "snest" else "euclidean", space_dims)
    got = graph_metrics(G, Y, model, space_dims)
    assert got["np@deg"].value == pytest.approx(ref_np, abs=1e-12)
    assert got["jaccard@deg"].value == pytest.approx(ref_j, abs=1e-12)
    assert got["np@deg"].stderr is None and got["np@deg"].n_rows == int((G.getnnz(axis=1) > 0).sum())
    single = neighbourhood_preservation(G, Y, model, space_dims, jaccard=True, n_threads=1)
    assert single.value == pytest.approx(ref_j, abs=1e-12)


def test_snest_order_is_its_own_kernel():
    """Farther in time is more similar under SNEST: the same space layout scores differently."""
    G = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], float))
    Y = np.array([[0.0, 0, 0], [1.0, 0, 0], [3.0, 0, 3]])  # space on a line; node 2 far in space, far in time
    assert neighbourhood_preservation(G, Y[:, :2], "tsne").value == 1.0
    # sim(0, 1) = -log 2 < sim(0, 2) = 9 - log 10 and sim(1, 2) = 9 - log 5: node 2 is the most similar to both
    assert neighbourhood_preservation(G, Y, "snest", 2).value == 0.0
    Y[2, 2] = 0.0
    assert neighbourhood_preservation(G, Y, "snest", 2).value == 1.0


def test_grid_with_its_own_coordinates_and_random_layout():
    G, coords = grid_graph(15)
    assert neighbourhood_preservation(G, coords).value == 1.0
    assert graph_metrics(G, coords)["jaccard@deg"].value == 1.0
    n = coords.shape[0]
    deg = G.getnnz(axis=1)
    rng = np.random.default_rng(0)
    values = [neighbourhood_preservation(G, rng.standard_normal((n, 2))).value for _ in range(4)]
    expected = np.mean(deg / (n - 1))  # E[NP_i] = deg_i / (N - 1) for a random layout
    assert abs(np.mean(values) - expected) < 0.004


@pytest.mark.slow
def test_feature_metrics_match_brute_force_and_sklearn():
    from sklearn.manifold import trustworthiness as sk_trustworthiness

    rng = np.random.default_rng(2)
    X = rng.standard_normal((70, 6))
    Y = X[:, :2] + 0.3 * rng.standard_normal((70, 2))
    k, k_max = 5, 20
    metrics, curve = feature_metrics(X, Y, k, k_max)
    t, c, p, q, r, auc = brute_features(X, Y, k, k_max)
    assert metrics["trustworthiness@5"].value == pytest.approx(t, abs=1e-12)
    assert metrics["continuity@5"].value == pytest.approx(c, abs=1e-12)
    assert metrics["precision@5"].value == pytest.approx(p, abs=1e-12)
    assert metrics["auc_rnx"].value == pytest.approx(auc, abs=1e-12)
    np.testing.assert_allclose(curve.q_nx, q, atol=1e-12)
    np.testing.assert_allclose(curve.r_nx, r, atol=1e-12)
    assert t == pytest.approx(sk_trustworthiness(X, Y, n_neighbors=k), abs=1e-12)
    assert c == pytest.approx(sk_trustworthiness(Y, X, n_neighbors=k), abs=1e-12)
    # the single-metric entry points agree with the one-pass function
    assert trustworthiness(X, Y, k).value == metrics["trustworthiness@5"].value
    assert continuity(X, Y, k).value == metrics["continuity@5"].value
    assert knn_precision(X, Y, k).value == metrics["precision@5"].value
    assert coranking_curve(X, Y, k_max).auc.value == pytest.approx(auc, abs=1e-12)


def test_embedding_equal_to_features_is_perfect():
    X = np.random.default_rng(3).standard_normal((60, 3))
    metrics, curve = feature_metrics(X, X.copy(), 7, 30)
    assert all(m.value == pytest.approx(1.0, abs=1e-12) for m in metrics.values())
    np.testing.assert_allclose(curve.r_nx, 1.0)


def test_one_nn_error_matches_brute_force():
    rng = np.random.default_rng(4)
    Y = rng.standard_normal((90, 2))
    labels = np.where(Y[:, 0] + 0.5 * rng.standard_normal(90) > 0, "a", "b")
    nearest = brute_orders(Y)[:, 0]
    assert one_nn_error(Y, labels).value == pytest.approx(np.mean(labels[nearest] != labels), abs=1e-12)
    with pytest.raises(ValueError, match="89 labels for 90 points"):
        one_nn_error(Y, labels[:-1])


def test_sampled_rows_agree_with_exact_within_standard_errors():
    rng = np.random.default_rng(5)
    n = 1200
    centres = rng.standard_normal((12, 2)) * 6
    member = rng.integers(0, 12, n)
    Y = centres[member] + rng.standard_normal((n, 2))
    G = random_graph(n, 3000, rng)
    G = G + sp.csr_matrix((np.ones(n), (np.arange(n), (np.arange(n) + 1) % n)), shape=(n, n))  # plus a ring
    exact = neighbourhood_preservation(G + G.T, Y).value
    X = np.c_[Y, rng.standard_normal((n, 2))]
    exact_f = feature_metrics(X, Y, 10, 30)[0]
    misses = 0
    for seed in range(3):
        sampled = neighbourhood_preservation(G + G.T, Y, sample=300, seed=seed)
        assert sampled.n_rows == 300 and sampled.stderr > 0
        misses += abs(sampled.value - exact) > 3 * sampled.stderr
        for key, metric in feature_metrics(X, Y, 10, 30, sample=300, seed=seed)[0].items():
            misses += abs(metric.value - exact_f[key].value) > 3 * metric.stderr
    assert misses <= 1  # 15 comparisons at 3 standard errors


def test_kl_matches_dense_reference_and_fft_close():
    affinity = school()
    rng = np.random.default_rng(6)
    P = affinity.P.toarray()
    for model, dims, ds in (("tsne", 2, 2), ("snest", 3, 2)):
        Y = rng.standard_normal((42, dims))
        assert kl(affinity, Y, model, ds) == pytest.approx(dense_kl(P, Y.T, model, ds), rel=1e-10)
    Y = rng.standard_normal((42, 2)) * 3
    assert kl(affinity.P, Y, "tsne", repulsion="fft") == pytest.approx(kl(affinity.P, Y, "tsne"), abs=2e-3)


def test_metric_value_table_and_json():
    m = Metric(0.5, 0.01, 100, "np@deg")
    assert float(m) == 0.5
    with pytest.raises(Exception):
        m.value = 1.0
    table = metrics_table({"np@deg": m, "kl": Metric(1.25, None, 42, "kl")})
    assert "np@deg" in table and "± 0.01" in table and "exact" in table
    assert to_json({"x": Metric(float("nan"), None, 0, "x")}) == {"x": {"name": "x", "value": None, "stderr": None,
                                                                       "n_rows": 0}}


# ------------------------------------------------------------------------------------ runs and the CLI

def _school_run(path, embedding=None, node_ids=None, provenance=None):
    affinity = school()
    Y = np.random.default_rng(7).standard_normal((42, 3)) if embedding is None else embedding
    result = EmbeddingResult(Y, affinity.node_ids if node_ids is None else node_ids, 1.0, np.ones(1), "snest", 2, 1,
                             0, 0, provenance=dict(affinity.provenance) if provenance is None else provenance)
    result.save(path)
    return result


def test_evaluate_run_from_provenance_and_reordered_input(tmp_path):
    run = tmp_path / "run.zarr"
    result = _school_run(run)
    labels = np.arange(42) // 21
    metrics = evaluate_run(run, labels=labels)
    assert set(metrics) == {"kl", "np@deg", "jaccard@deg", "1nn_error"}
    affinity = school()
    assert metrics["kl"].value == pytest.approx(kl(affinity, result.embedding, "snest"), rel=1e-12)
    assert metrics["np@deg"].value == pytest.approx(brute_np(affinity.P, result.embedding, "snest", 2)[0])
    # the same input as an edge list with its rows in another order: aligned by node id
    src, dst = np.nonzero(sp.triu(affinity.P))
    edges = tmp_path / "e.txt"
    edges.write_text("".join(f"{b} {a}\n" for a, b in zip(src[::-1], dst[::-1])))
    again = evaluate_run(run, affinity=str(edges), graph_affinity="normalized", X=result.embedding[:, :2])
    assert again["np@deg"].value == metrics["np@deg"].value
    assert again["kl"].value == pytest.approx(metrics["kl"].value, rel=1e-12)
    assert "trustworthiness@10" in again and "auc_rnx" in again


def test_cli_metrics_json(tmp_path):
    run = tmp_path / "run.zarr"
    _school_run(run)
    np.save(tmp_path / "y.npy", np.arange(42) % 2)
    proc = run_cli("metrics", str(run), "--labels", str(tmp_path / "y.npy"), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"kl", "np@deg", "jaccard@deg", "1nn_error"}
    assert 0 <= data["np@deg"]["value"] <= 1 and data["np@deg"]["n_rows"] == 42


def test_cli_bad_inputs_exit_2_naming_the_file(tmp_path):
    run = tmp_path / "run.zarr"
    _school_run(run)
    other = tmp_path / "other.txt"
    other.write_text("1 2\n2 3\n3 1\n")
    bad_labels = tmp_path / "y.npy"
    np.save(bad_labels, np.zeros(41))
    nan_run = tmp_path / "nan.zarr"
    Y = np.random.default_rng(0).standard_normal((42, 3))
    Y[7, 1] = np.nan
    write_result(nan_run, {"embedding": Y, "node_ids": school().node_ids, "kl_history": np.ones(1)},
                 {"model": "snest", "space_dims": 2, "time_dims": 1, "iterations": 0, "kl": 1.0, "seed": 0,
                  "provenance": {"dataset": "school"}})
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, path, fragment in (((str(run), "--input", str(other)), other, "node ids differ"),
                                 ((str(run), "--labels", str(bad_labels)), bad_labels, "labels have shape (41,)"),
                                 ((str(nan_run),), nan_run, "non-finite coordinates (first: row 7"),
                                 ((str(tmp_path / "missing.zarr"),), tmp_path / "missing.zarr", "no such run")):
        proc = run_cli("metrics", *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and fragment in lines[0], proc.stderr
        assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_evaluate_run_errors_are_input_errors(tmp_path):
    run = tmp_path / "run.zarr"
    _school_run(run, provenance={})
    with pytest.raises(Exception, match="cannot be found from its provenance"):
        evaluate_run(run)
    with pytest.raises(InputError, match="features have shape"):
        evaluate_run(run, X=np.zeros((40, 2)))


def test_node_preservation_per_node():
    G, coords = grid_graph(6)
    G = G.tolil()
    G[0, :] = 0
    G[:, 0] = 0
    values = node_preservation(G.tocsr(), coords)
    assert np.isnan(values[0]) and values[35] == 1.0
    assert values[1] == 0.5  # its 2 nearest (ties by index) are 0, no longer a neighbour, and 2
    rng = np.random.default_rng(8)
    Y = rng.standard_normal((36, 2))
    per_node = node_preservation(G.tocsr(), Y)
    assert np.nanmean(per_node) == pytest.approx(neighbourhood_preservation(G.tocsr(), Y).value, abs=1e-12)
