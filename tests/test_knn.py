import json

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from pynndescent.distances import named_distances
from scipy.spatial.distance import cdist
from sklearn.datasets import load_digits

from scalemb.affinity import AffinityStore, write_affinity_store
from scalemb.affinity.knn import (METRICS, affinity_from_distances, conditional_affinities, exact_knn,
                                  exact_search, knn_affinity, knn_graph, read_features)
from scalemb.errors import InputError


@pytest.fixture(scope="module")
def digits():
    return load_digits().data.astype(np.float64)


@pytest.fixture(scope="module")
def digits_knn(digits):
    return knn_graph(digits, 90, algorithm="exact")


@pytest.fixture(scope="module")
def digits_dist(digits):
    """All pairwise distances by |x|^2 + |y|^2 - 2 x.y (exact here: the digits are small integers)."""
    sq = (digits ** 2).sum(axis=1)
    return np.sqrt(np.maximum(sq[:, None] + sq[None] - 2 * digits @ digits.T, 0))


def knn_csr(indices, distances):
    n, k = indices.shape
    return sp.csr_matrix((distances.ravel(), indices.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))


def row_perplexities(P_cond):
    perp = np.empty(P_cond.shape[0])
    for i in range(P_cond.shape[0]):
        p = P_cond.data[P_cond.indptr[i]:P_cond.indptr[i + 1]]
        p = p[p > 0]
        perp[i] = np.exp(-np.sum(p * np.log(p)))
    return perp


def check_joint(P):
    assert abs(P - P.T).max() == 0.0
    assert P.sum() == pytest.approx(1.0, abs=1e-12)
    assert not P.diagonal().any()
    assert P.data.min() > 0


# ------------------------------------------------------------------------------------------- neighbours

def test_exact_neighbours_match_brute_force(digits_dist, digits_knn):
    indices, distances = digits_knn
    full = digits_dist.copy()
    np.fill_diagonal(full, np.inf)
    np.testing.assert_allclose(distances, np.sort(full, axis=1)[:, :90], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(np.take_along_axis(full, indices, axis=1), distances, rtol=1e-12, atol=1e-9)
    assert (np.diff(distances, axis=1) >= 0).all()


@pytest.mark.slow
def test_nndescent_recall_and_seed(digits, digits_dist, digits_knn):
    # the first NNDescent in a process spends ~25 s compiling pynndescent's (uncached) numba functions
    k = 15
    indices, distances = knn_graph(digits, k, algorithm="nndescent", random_state=42)
    n = digits.shape[0]
    assert indices.shape == distances.shape == (n, k)
    assert not (indices == np.arange(n)[:, None]).any()
    assert all(len(set(row)) == k for row in indices)
    exact_of_found = np.take_along_axis(digits_dist, indices, axis=1)
    np.testing.assert_allclose(distances, exact_of_found, rtol=1e-5, atol=1e-4)  # pynndescent works in float32
    # recall against the exact k-th distance (the digits have many ties, so compare distances, not ids)
    recall = np.mean(exact_of_found <= digits_knn[1][:, k - 1:k] + 1e-9)
    assert recall >= 0.95
    again = knn_graph(digits, k, algorithm="nndescent", random_state=42)
    np.testing.assert_array_equal(again[0], indices)
    np.testing.assert_array_equal(again[1], distances)


def cdist_knn(X, k):
    """The reference: every distance by cdist, k smallest by (distance, index)."""
    D = cdist(X, X)
    np.fill_diagonal(D, np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(len(X)), D.shape), D), axis=-1)[:, :k]
    return order, np.take_along_axis(D, order, axis=1)


@pytest.mark.parametrize("n_jobs", [1, 2, 3])
def test_euclidean_search_is_the_cdist_search_bit_for_bit(n_jobs):
    """Candidates from matrix products, re-ranked by cdist: the same lists and the same bits, on clustered data
    with many exact ties (integer features, duplicated rows) and on data far from the origin (cancellation)."""
    rng = np.random.default_rng(3)
    ties = rng.integers(0, 3, size=(700, 4)).astype(np.float64)  # 81 distinct rows: ties and duplicates everywhere
    far = 1e6 + rng.normal(size=(600, 5))  # |x|^2 ~ 5e12: the product form has no digits left for the distances
    clustered = rng.normal(size=(5, 8))[rng.integers(0, 5, 900)] * 4 + rng.normal(size=(900, 8))
    for X in (ties, far, clustered):
        for k in (1, 7, 40):
            got = exact_knn(X, k, "euclidean", n_jobs=n_jobs)
            want = cdist_knn(X, k)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_auto_searches_exactly_where_that_is_cheaper():
    assert exact_search(4096, 10_000, "cosine") and not exact_search(4097, 2, "cosine")
    assert exact_search(30_000, 50) and not exact_search(60_000, 50)
    assert exact_search(16_000, 784) and not exact_search(30_000, 784)
    X = np.random.default_rng(1).normal(size=(5000, 3))
    assert knn_affinity(X, perplexity=5).provenance["knn"] == "exact"


def test_euclidean_search_with_every_point_a_candidate():
    X = np.random.default_rng(0).normal(size=(12, 3))
    for k in (1, 5, 11):
        got = exact_knn(X, k, "euclidean")
        want = cdist_knn(X, k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_duplicates_keep_each_other_and_exclude_self():
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    indices, distances = knn_graph(X, 2)
    assert indices[0, 0] == 1 and indices[1, 0] == 0
    assert distances[0, 0] == distances[1, 0] == 0.0
    assert not (indices == np.arange(5)[:, None]).any()


@pytest.mark.parametrize("metric", sorted(METRICS))
def test_metric_names_mean_the_same_in_scipy_and_pynndescent(metric):
    scipy_name, pynnd_name = METRICS[metric]
    x, y = np.random.default_rng(1).uniform(0.1, 2.0, size=(2, 7))
    expected = cdist(x[None], y[None], metric=scipy_name)[0, 0]
    assert named_distances[pynnd_name](x, y) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_neighbors": 20}, "n_neighbors"),
    ({"n_neighbors": 0}, "n_neighbors"),
    ({"metric": "mahalanobis"}, "unknown metric"),
    ({"algorithm": "kd_tree"}, "algorithm"),
])
def test_knn_graph_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        knn_graph(np.random.default_rng(0).normal(size=(20, 3)), **kwargs)


# ------------------------------------------------------------------------------------------ calibration

@pytest.mark.parametrize("perplexity", [5.0, 30.0, 80.0])
def test_every_row_reaches_the_perplexity(digits_knn, perplexity):
    P_cond = conditional_affinities(knn_csr(*digits_knn), perplexity)
    np.testing.assert_allclose(np.asarray(P_cond.sum(axis=1)).ravel(), 1.0, rtol=0, atol=1e-12)
    assert np.abs(row_perplexities(P_cond) - perplexity).max() < 1e-3


def test_calibration_is_thread_count_independent(digits_knn):
    D = knn_csr(*digits_knn)
    one = conditional_affinities(D, 30.0, n_jobs=1)
    two = conditional_affinities(D, 30.0, n_jobs=2)
    np.testing.assert_array_equal(one.data, two.data)


def test_gaussian_weights_follow_squared_distances():
    # one row, neighbours at distances d: p_j ∝ exp(-beta d_j^2) for one beta
    d = np.array([1.0, 2.0, 2.5, 4.0, 5.0])
    D = sp.csr_matrix((d, np.arange(1, 6), [0, 5, 5, 5, 5, 5, 5]), shape=(6, 6))[:1]
    p = conditional_affinities(D, 3.0).data
    beta = np.log(p[0] / p[1:]) / (d[1:] ** 2 - d[0] ** 2)
    np.testing.assert_allclose(beta, beta[0], rtol=1e-10)
    assert np.exp(-np.sum(p * np.log(p))) == pytest.approx(3.0, abs=1e-4)


def test_equidistant_row_warns_and_is_uniform():
    D = sp.csr_matrix((np.ones(4), np.arange(1, 5), [0, 4]), shape=(1, 5))
    with pytest.warns(RuntimeWarning, match="did not reach"):
        P_cond = conditional_affinities(D, 2.0)
    np.testing.assert_allclose(P_cond.data, 0.25)


def test_uniform(digits):
    A = knn_affinity(digits, n_neighbors=10, method="uniform")
    check_joint(A.P)
    indices, _ = knn_graph(digits, 10)
    n = digits.shape[0]
    C = sp.csr_matrix((np.full(n * 10, 0.1), indices.ravel(), np.arange(0, n * 10 + 1, 10)), shape=(n, n))
    np.testing.assert_allclose(A.P.toarray(), ((C + C.T) / (2 * n)).toarray(), rtol=1e-14, atol=0)
    assert A.provenance["perplexity"] == "uniform"
    assert A.provenance["n_neighbors"] == 10


# ----------------------------------------------------------------------------------------------- joint P

def test_knn_affinity_joint_p(digits, digits_knn):
    A = knn_affinity(digits, perplexity=30.0)
    n = digits.shape[0]
    check_joint(A.P)
    np.testing.assert_array_equal(A.node_ids, np.arange(n))
    assert A.provenance == {"source": None, "method": "knn", "metric": "euclidean", "n_neighbors": 90,
                            "knn": "exact", "perplexity": 30.0, "seed": 0}
    # P = (P_cond + P_cond^T) / 2N with P_cond calibrated on the same neighbours
    P_cond = conditional_affinities(knn_csr(*digits_knn), 30.0)
    np.testing.assert_allclose(A.P.toarray(), ((P_cond + P_cond.T) / (2 * n)).toarray(), rtol=1e-12, atol=0)


def test_knn_affinity_reproducible(digits):
    a = knn_affinity(digits[:500], perplexity=10.0, random_state=3)
    b = knn_affinity(digits[:500], perplexity=10.0, random_state=3)
    assert (a.P != b.P).nnz == 0


def test_knn_affinity_from_path_and_store(tmp_path, digits):
    path = tmp_path / "digits.npy"
    np.save(path, digits[:300])
    A = knn_affinity(path, perplexity=5.0)
    assert A.provenance["source"] == str(path)
    assert A.provenance["n_neighbors"] == 15
    store = write_affinity_store(tmp_path / "p.zarr", A)
    loaded = AffinityStore(store).to_affinity()
    assert loaded.provenance["perplexity"] == 5.0
    assert (loaded.P != A.P).nnz == 0
    json.dumps(A.provenance)


@pytest.mark.parametrize("kwargs, match", [
    ({"perplexity": 30.0, "n_neighbors": 30}, "perplexity"),
    ({"perplexity": 30.0, "n_neighbors": 20}, "perplexity"),
    ({"perplexity": 40.0}, "perplexity"),  # k = min(N - 1, 120) = 39
    ({"perplexity": 0.5, "n_neighbors": 5}, "at least 1"),
    ({"method": "student"}, "method"),
])
def test_knn_affinity_rejects(kwargs, match):
    X = np.random.default_rng(0).normal(size=(40, 3))
    with pytest.raises(ValueError, match=match):
        knn_affinity(X, **kwargs)


# ------------------------------------------------------------------------------------------ precomputed

def test_affinity_from_distances_matches_knn(digits, digits_knn):
    D = knn_csr(*digits_knn)
    A = affinity_from_distances(D, perplexity=30.0)
    B = knn_affinity(digits, perplexity=30.0)
    np.testing.assert_allclose(A.P.toarray(), B.P.toarray(), rtol=1e-12, atol=0)
    assert A.provenance == {"source": None, "method": "precomputed", "perplexity": 30.0}
    U = affinity_from_distances(D.tocoo(), method="uniform")
    check_joint(U.P)
    assert U.provenance["perplexity"] == "uniform"


def test_affinity_from_distances_ignores_diagonal_keeps_zeros():
    # rows of different lengths, a stored diagonal and an explicit zero distance (duplicate points)
    rows = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    cols = [0, 1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2]
    vals = [0.0, 0.0, 1.0, 2.0, 0.0, 1.5, 2.5, 1.0, 1.5, 1.2, 2.0, 2.5, 1.2]
    D = sp.csr_matrix((vals, (rows, cols)), shape=(4, 4))
    A = affinity_from_distances(D, perplexity=1.5)
    check_joint(A.P)
    assert A.P[0, 1] > 0
    assert A.P.nnz == 12


def test_affinity_from_distances_rejects():
    D = sp.csr_matrix((np.ones(4), ([0, 0, 2, 2], [1, 2, 0, 1])), shape=(3, 3))
    with pytest.raises(ValueError, match="row 1 has no neighbours"):
        affinity_from_distances(D, method="uniform")
    with pytest.raises(ValueError, match="row 1 has no neighbours"):
        affinity_from_distances(D + sp.eye(3), method="uniform")  # a diagonal entry is not a neighbour
    full = sp.csr_matrix(np.ones((3, 3)) - np.eye(3))
    with pytest.raises(ValueError, match="perplexity"):
        affinity_from_distances(full, perplexity=2.0)
    with pytest.raises(ValueError, match="non-negative"):
        affinity_from_distances(-full, perplexity=1.5)
    with pytest.raises(ValueError, match="square"):
        affinity_from_distances(sp.csr_matrix(np.ones((2, 3))))
    with pytest.raises(TypeError, match="sparse"):
        affinity_from_distances(np.ones((3, 3)))


# -------------------------------------------------------------------------------------------- reading

def test_read_npy_csv_zarr(tmp_path):
    X = np.arange(12, dtype=np.float64).reshape(4, 3) / 7
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    np.testing.assert_array_equal(read_features(tmp_path / "x.npy"), X.astype(np.float32))
    csv = tmp_path / "x.csv"
    body = "\n".join(",".join(repr(float(v)) for v in row) for row in X)
    csv.write_text(f"# features\na, b ,c\n\n{body.replace(chr(10), chr(10) + '# note' + chr(10), 1)}  # end\n")
    out = read_features(csv)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, X)
    (tmp_path / "nohead.csv").write_text(body + "\n")
    np.testing.assert_array_equal(read_features(tmp_path / "nohead.csv"), X)
    (tmp_path / "bom.csv").write_text("\ufeff1,2\n3,4\n", encoding="utf-8")
    np.testing.assert_array_equal(read_features(tmp_path / "bom.csv"), [[1.0, 2.0], [3.0, 4.0]])
    zarr.create_array(str(tmp_path / "x.zarr"), data=X.astype(np.int32) * 3)
    np.testing.assert_array_equal(read_features(tmp_path / "x.zarr"), X.astype(np.int32) * 3)


def write(path, content):
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize("name, content, line, match", [
    ("missing.csv", None, None, "no such file"),
    ("empty.csv", "", None, "empty"),
    ("empty.npy", "", None, "empty"),
    ("comments.csv", "# nothing\n\n", None, "no data rows"),
    ("header.csv", "a,b\n", None, "no data rows"),
    ("ragged.csv", "a,b\n1,2\n3,4\n5\n", 4, "expected 2 columns"),
    ("ragged2.csv", "1,2\n# c\n3,4,5\n", 3, "expected 2 columns"),
    ("word.csv", "1,2\n3,x\n", 2, "non-numeric cell 'x'"),
    ("mixed_head.csv", "a,2\n3,4\n", 1, "non-numeric cell 'a'"),
    ("hole.csv", "1,2\n3,\n", 2, "empty cell"),
    ("nan.csv", "a,b\n1,2\n\n3,nan\n4,inf\n", 4, "row 1"),
    ("inf.csv", "1,2\n-inf,2\n", 2, "row 1, column 0"),
    ("latin1.csv", b"1,2\n\xe9,3\n", None, "UTF-8"),
    ("nan.npy", np.array([[1.0, 2.0], [3.0, 4.0], [np.inf, 0.0], [np.nan, 1.0]]), None, "row 2, column 0"),
    ("flat.npy", np.arange(5.0), None, "2-D"),
    ("cube.npy", np.zeros((2, 2, 2)), None, "2-D"),
    ("norows.npy", np.zeros((0, 3)), None, "no data"),
    ("text.npy", np.array([["a", "b"]]), None, "real numbers"),
    ("complex.npy", np.ones((2, 2), dtype=complex), None, "real numbers"),
    ("corrupt.npy", b"\x93NUMPY garbage", None, "cannot read as .npy"),
    ("features.txt", "1 2\n", None, "unsupported format"),
])
def test_read_features_rejects(tmp_path, name, content, line, match):
    path = tmp_path / name
    if content is not None:
        write(path, content)
    with pytest.raises(InputError, match=match) as info:
        read_features(path)
    assert str(path) in str(info.value)
    assert info.value.line == line
    if line is not None:
        assert f"{path}:{line}:" in str(info.value)


def test_read_zarr_rejects(tmp_path):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_array("x", data=np.ones((3, 2)))
    (tmp_path / "plain").mkdir()
    zarr.create_array(str(tmp_path / "nan.zarr"), data=np.array([[1.0], [np.nan]]))
    zarr.create_array(str(tmp_path / "flat.zarr"), data=np.ones(4))
    for name, match in [("g.zarr", "cannot read as a Zarr array"), ("plain", "no zarr.json"),
                        ("nan.zarr", "row 1, column 0"), ("flat.zarr", "2-D")]:
        with pytest.raises(InputError, match=match) as info:
            read_features(tmp_path / name)
        assert str(tmp_path / name) in str(info.value)
