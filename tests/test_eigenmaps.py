"""Graph eigenmaps through the row-block Laplacian products, Nyström, and kernel eigenmaps."""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph

from scalemb.affinity import Affinity, coauthorship_affinity, write_affinity_store
from scalemb.cli.main import main
from scalemb.eigenmaps import (CORRECTIONS, Eigenmap, KernelEigenmap, component_labels, laplacian_eigenmap,
                               nystrom_extend)
from scalemb.embedding import EmbeddingResult
from scalemb.engine import LocalExecutor
from scalemb.engine.distributed import DaskExecutor
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.io.edgelist import read_edge_list
from scalemb.models import get_model


def ring_affinity(sizes, extra_edges=0, seed=0):
    """Disjoint rings (plus random chords inside the first) as a symmetric, normalised P."""
    rng = np.random.default_rng(seed)
    rows, cols, start = [], [], 0
    for size in sizes:
        idx = np.arange(start, start + size)
        rows += list(idx)
        cols += list(np.roll(idx, 1))
        start += size
    for _ in range(extra_edges):
        i, j = rng.choice(sizes[0], 2, replace=False)
        rows.append(i)
        cols.append(j)
    n = start
    W = sp.csr_matrix((rng.uniform(0.5, 1.5, len(rows)), (rows, cols)), shape=(n, n))
    W = W + W.T
    return Affinity(W / W.sum(), np.arange(n))


def dense_reference(P, k):
    """Smallest non-trivial eigenvalues of L_sym, by component, densely."""
    n_comp, labels = csgraph.connected_components(P, directed=False)
    values = []
    for c in range(n_comp):
        idx = np.flatnonzero(labels == c)
        Pc = P[idx][:, idx].toarray()
        d = Pc.sum(axis=1)
        L = np.eye(idx.size) - Pc / np.sqrt(np.outer(d, d))
        values.extend(np.linalg.eigvalsh(L)[1:])
    return np.sort(values)[:k], n_comp, labels


@pytest.fixture(scope="module")
def graph():
    return ring_affinity([300, 40, 7, 2, 2], extra_edges=30)


@pytest.fixture(scope="module")
def executor(graph):
    with LocalExecutor(graph, get_model("tsne"), 2, 0, n_blocks=3) as ex:
        yield ex


def test_components_match_scipy(graph, executor):
    labels = component_labels(executor)
    n_comp, ref = csgraph.connected_components(graph.P, directed=False)
    assert labels.max() + 1 == n_comp == 5
    assert len(set(zip(labels, ref))) == n_comp  # the same partition


@pytest.mark.parametrize("method", ["lanczos", "lobpcg"])
def test_eigenpairs_residuals_orthogonality(graph, executor, method):
    sol = laplacian_eigenmap(executor, 3, method=method, tol=1e-9)
    ref, _, _ = dense_reference(graph.P, 3)
    np.testing.assert_allclose(sol.eigenvalues, ref, rtol=1e-6, atol=1e-9)
    assert np.all(sol.residuals < 1e-5)
    d = sol.degrees
    np.testing.assert_allclose(d, np.asarray(graph.P.sum(axis=1)).ravel(), rtol=1e-12)
    # D-orthonormal, and D-orthogonal to every component's constant vector (the trivial eigenvectors)
    np.testing.assert_allclose(sol.coords.T @ (sol.coords * d[:, None]), np.eye(3), atol=1e-6)
    for c in range(sol.n_components):
        mask = sol.labels == c
        assert np.all(np.abs(d[mask] @ sol.coords[mask]) < 1e-8)
    # the generalised problem P v = (1 - lambda) D v holds row by row
    np.testing.assert_allclose(graph.P @ sol.coords, sol.coords * d[:, None] * (1 - sol.eigenvalues),
                               atol=1e-5 * np.abs(sol.coords * d[:, None]).max())


def test_too_many_components_asked(executor):
    with pytest.raises(ValueError, match="non-trivial"):
        laplacian_eigenmap(executor, 400)


def test_nystrom_reproduces_training_rows_and_places_new_points(graph, executor):
    sol = laplacian_eigenmap(executor, 2)
    np.testing.assert_allclose(nystrom_extend(graph.P, sol.coords, sol.eigenvalues), sol.coords,
                               atol=1e-5 * np.abs(sol.coords).max())
    # a new node linked to two neighbours on the ring lands between them (weighted mean / mu)
    w = sp.csr_matrix(([1.0, 1.0], ([0, 0], [10, 11])), shape=(1, graph.n_points))
    y = nystrom_extend(w, sol.coords, sol.eigenvalues)
    np.testing.assert_allclose(y[0], (sol.coords[10] + sol.coords[11]) / 2 / (1 - sol.eigenvalues))
    with pytest.raises(ValueError, match="no weight"):
        nystrom_extend(sp.csr_matrix((1, graph.n_points)), sol.coords, sol.eigenvalues)
    with pytest.raises(ValueError, match="one column per"):
        nystrom_extend(np.ones((1, 3)), sol.coords, sol.eigenvalues)


@pytest.mark.slow
def test_dask_matches_local(tmp_path, dask_cluster):
    edges = write_coauthor_edge_list(tmp_path / "edges.txt", 600, seed=3)
    affinity = coauthorship_affinity(read_edge_list(edges))
    path = tmp_path / "P.zarr"
    write_affinity_store(path, affinity, n_partitions=3)
    with LocalExecutor(affinity, get_model("tsne"), 2, 0) as ex:
        local = laplacian_eigenmap(ex, 2)
    with DaskExecutor(path, get_model("tsne"), 2, 0, dask_cluster.client) as ex:
        remote = laplacian_eigenmap(ex, 2)
    np.testing.assert_allclose(remote.eigenvalues, local.eigenvalues, rtol=1e-8)
    np.testing.assert_array_equal(remote.labels, local.labels)
    np.testing.assert_allclose(np.abs(remote.coords), np.abs(local.coords), atol=1e-6 * np.abs(local.coords).max())


def test_eigenmap_cli_writes_a_result_store(tmp_path, capsys):
    out = tmp_path / "e.zarr"
    assert main(["embed", "school", "--model", "eigenmap", "--out", str(out), "--quiet"]) == 0
    result = EmbeddingResult.load(out)
    assert result.model == "eigenmap" and result.embedding.shape == (42, 2)
    assert all(r < 1e-8 for r in result.optimizer["residuals"])
    assert main(["plot", str(out), "--out", str(tmp_path / "e.png"), "--quiet"]) == 0
    # an eigenmap run has no model objective: metrics and the report leave it out rather than fail
    from scalemb.report.page import build_report

    page, metrics = build_report(out)
    assert "np@deg" in metrics and not {"kl", "E"} & set(metrics)
    est = Eigenmap(2).fit("school")
    np.testing.assert_allclose(est.embedding_, result.embedding)


def swiss_roll(n, seed):
    rng = np.random.default_rng(seed)
    t = 1.5 * np.pi * (1 + 2 * rng.random(n))
    h = 10 * rng.random(n)
    return np.column_stack([t * np.cos(t), h, t * np.sin(t)]), t


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_kernel_eigenmap_unrolls_and_maps_new_points(correction):
    X, t = swiss_roll(700, 0)
    train, test = slice(0, 600), slice(600, 700)
    model = KernelEigenmap(2, n_centres=32, correction=correction, random_state=1).fit(X[train])
    assert model.embedding_.shape == (600, 2)
    # the map is the same function on and off the training points
    np.testing.assert_allclose(model.transform(X[train]), model.embedding_, atol=1e-10)
    y_new = model.transform(X[test])
    # the leading coordinate follows the roll's angle, at held-out points as well
    assert abs(np.corrcoef(y_new[:, 0], t[test])[0, 1]) > 0.9
    if correction in ("reweighted", "stochastic"):
        assert model.first_ is not None and np.all(np.isfinite(y_new))


def test_kernel_eigenmap_store_roundtrip_and_bad_input(tmp_path):
    X, _ = swiss_roll(300, 2)
    np.save(tmp_path / "roll.npy", X)
    out = tmp_path / "k.zarr"
    assert main(["embed", str(tmp_path / "roll.npy"), "--model", "kernel-eigenmap", "--centres", "16",
                 "--out", str(out), "--quiet"]) == 0
    model = KernelEigenmap.from_result(out)
    np.testing.assert_allclose(model.transform(X), EmbeddingResult.load(out).embedding, atol=1e-10)
    with pytest.raises(ValueError, match="3 columns"):
        model.transform(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="NaN"):
        model.transform(np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="correction"):
        KernelEigenmap(correction="nope").fit(X)
