"""Placing new nodes and points into a stored map: the objective against the full executor, its gradient by
finite differences, the CLI on graph and kNN runs, and the bad inputs (exit 2, nothing written)."""

import numpy as np
import pytest
import scipy.sparse as sp

from scalemb.affinity import Affinity
from scalemb.datasets import school_edges
from scalemb.embedding import EmbeddingResult
from scalemb.engine import LocalExecutor
from scalemb.errors import ScalembError
from scalemb.models import get_model
from scalemb.placement import (FREE_EXAGGERATION, FREE_HOPS, FREE_ITERATIONS, FREE_MAX_SHARE, FREE_STORED_ATTRACTION,
                               PRE_FREE_ITERATIONS, PlacementObjective, PlacementOptimizer, auto_free_hops,
                               freed_points, place, placement_defaults)
from scalemb.placement.optimize import (EXAGGERATION, EXAGGERATION_ITERATIONS, FINAL_EXAGGERATION, ITERATIONS,
                                        TIME_STEPS, initial_positions)

from .cli_runner import run_cli

from .numerics import central_differences

DIMS = {"tsne": (2, 0), "sne": (2, 0), "snest": (2, 1)}


def random_affinity(n_total, seed=1):
    A = sp.random(n_total, n_total, density=0.15, random_state=seed)
    A = (A + A.T).tolil()
    A.setdiag(0)
    return Affinity(A.tocsr(), np.arange(n_total))


@pytest.mark.parametrize("name", sorted(DIMS))
def test_objective_is_the_full_kl_and_its_gradient_rows(name):
    """KL, Z and gradient of the new points equal the whole-map executor's at the same layout."""
    n, m = 40, 9
    affinity = random_affinity(n + m)
    ds, dt = DIMS[name]
    model = get_model(name)
    Y = np.random.default_rng(0).standard_normal((ds + dt, n + m))
    Y[ds:] *= 0.3
    with LocalExecutor(affinity, model, ds, dt) as executor:
        full = executor.evaluate(Y)
    with PlacementObjective(model, ds, affinity.P, Y[:, :n]) as objective:
        part = objective.evaluate(Y[:, n:])
    assert part.kl == pytest.approx(full.kl, rel=1e-12)
    assert part.z == pytest.approx(full.z, rel=1e-12)
    np.testing.assert_allclose(part.gradient, full.gradient[:, n:], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", sorted(DIMS))
def test_gradient_matches_finite_differences(name):
    n, m = 30, 12
    affinity = random_affinity(n + m, seed=4)
    ds, dt = DIMS[name]
    rng = np.random.default_rng(2)
    Y = rng.standard_normal((ds + dt, n + m))
    Y[ds:] *= 0.3
    with PlacementObjective(get_model(name), ds, affinity.P, Y[:, :n]) as objective:
        X = Y[:, n:].copy()
        gradient = objective.evaluate(X).gradient
        entries = [(k, i) for k in range(ds + dt) for i in range(0, m, 3)]
        numeric = central_differences(lambda c: objective.evaluate(c).kl, X, entries)
        for k, i in entries:
            assert numeric[k, i] == pytest.approx(gradient[k, i], rel=1e-5, abs=1e-9)


def test_start_is_weighted_median_and_placement_lowers_kl():
    n, m = 30, 6
    affinity = random_affinity(n + m, seed=5)
    P = affinity.P.tolil()
    P[n:, n:] = 0  # new points attached to old ones only
    P[n + 5, :] = 0  # ... except one, attached to new point n + 4 only
    P[:, n + 5] = 0
    P[n + 5, n + 4] = P[n + 4, n + 5] = 0.05
    P = sp.csr_matrix(P)
    P.eliminate_zeros()
    old = np.random.default_rng(0).standard_normal((2, n))
    X0, unattached = initial_positions(P[n:], old, 2, seed=0)
    assert unattached == 0
    row = P[n].tocoo()
    values, weights = old[0, row.col], row.data
    order = np.argsort(values)
    median = values[order][np.searchsorted(np.cumsum(weights[order]), 0.5 * weights.sum())]
    assert X0[0, 0] == pytest.approx(median, abs=5e-2)  # up to the start's jitter
    assert np.abs(X0[:, 5] - X0[:, 4]).max() < 5e-2  # placed from its placed new neighbour
    run, _ = place("tsne", 2, old, Affinity(P, np.arange(n + m)).P)
    assert run.kl < run.kl_history[0]
    assert np.all(np.diff(run.kl_history) <= 1e-12)  # Armijo: never up


def test_start_jitter_follows_each_coordinates_scale():
    """SNEST: a map spread over 1e4 units in space but ~0.1 in time jitters the new points' time by ~1e-4,
    not by the space scale (exp(|Δt|²) would overflow)."""
    rng = np.random.default_rng(0)
    n, m = 50, 4
    old = np.concatenate([1e4 * rng.standard_normal((2, n)), 0.1 * rng.standard_normal((1, n))])
    P = sp.lil_matrix((n + m, n + m))
    for k in range(m):
        P[n + k, k] = P[k, n + k] = 1.0
    X0, _ = initial_positions(sp.csr_matrix(P)[n:], old, 2, seed=0)
    assert np.abs(X0[2] - old[2, :m]).max() < 1e-3
    assert np.abs(X0[:2] - old[:2, :m]).max() < 1e2


def test_free_hops_moves_only_the_stored_neighbours_and_lowers_the_kl():
    n, m = 40, 5
    affinity = random_affinity(n + m, seed=3)
    P = affinity.P.tolil()
    P[n:, :] = 0
    P[:, n:] = 0
    for k, j in enumerate((0, 1, 2, 3, 3)):  # new point n + k attached to stored point j (and n + k - 1)
        P[n + k, j] = P[j, n + k] = 0.02
        if k:
            P[n + k, n + k - 1] = P[n + k - 1, n + k] = 0.01
    P = sp.csr_matrix(P)
    P.eliminate_zeros()
    P = P / P.sum()
    assert list(freed_points(P, n, 1)) == [0, 1, 2, 3]
    two = freed_points(P, n, 2)
    B = P[:n, :n].tocsr()
    expected = set(range(4)) | set(B[:4].indices)
    assert set(two) == expected
    old = np.random.default_rng(1).standard_normal((2, n))
    plain = PlacementOptimizer(exaggeration=1.0, final_exaggeration=1.0)  # the KL itself descends
    unweighted = dict(free_exaggeration=1.0, free_stored_attraction=1.0)  # ... in the free phase too
    fixed, _ = place("tsne", 2, old, P, plain, free_hops=0)
    freed, _ = place("tsne", 2, old, P, plain, free_hops=1, free_iterations=20, **unweighted)
    assert fixed.moved.size == 0 and list(freed.moved) == [0, 1, 2, 3]
    assert freed.kl < fixed.kl
    assert np.all(np.diff(freed.kl_history) <= 1e-12)  # both phases descend the same whole-map KL
    assert not np.allclose(freed.moved_coords, old[:, :4])
    with PlacementObjective(get_model("tsne"), 2, P, old) as objective:  # moved rows make the returned map
        assert objective.evaluate(fixed.coords).kl == pytest.approx(fixed.kl, rel=1e-10)
    moved_old = old.copy()
    moved_old[:, freed.moved] = freed.moved_coords
    with PlacementObjective(get_model("tsne"), 2, P, moved_old) as objective:
        assert objective.evaluate(freed.coords).kl == pytest.approx(freed.kl, rel=1e-10)
    with pytest.raises(ValueError, match="free_hops"):
        place("tsne", 2, old, P, free_hops=-1)
    with pytest.raises(ValueError, match="time coordinates"):
        place("snest", 2, np.concatenate([old, np.zeros((1, n))]), P,
              PlacementOptimizer(exaggeration=4.0, exaggeration_iterations=10))
    with pytest.raises(ScalembError, match="frees every stored point"):
        place("tsne", 2, old, P, free_hops=n)


@pytest.mark.parametrize("name", sorted(DIMS))
def test_curvature_matrix_is_the_attractive_partial_hessian(name):
    """``B = diag(h) - C_nn``: symmetric, its diagonal ``curvature_diagonal``, and with the fixed points at the
    origin ``B X`` is the attractive part of the new rows' gradient (as ``L(C) S`` is the embedding's)."""
    ds, dt = DIMS[name]
    n, m = 30, 12
    P = random_affinity(n + m, seed=5).P
    P = P / P.sum()
    rng = np.random.default_rng(6)
    old = np.concatenate([np.zeros((ds, n)), 0.3 * rng.standard_normal((dt, n))])
    X = np.concatenate([rng.standard_normal((ds, m)), 0.3 * rng.standard_normal((dt, m))])
    with PlacementObjective(get_model(name), ds, P, old) as objective:
        B = objective.curvature_matrix(X)
        assert B.shape == (m, m) and B[:, :].nnz > m  # the new-new weights are there
        np.testing.assert_allclose(B.toarray(), B.T.toarray(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(B.diagonal(), objective.curvature_diagonal(X), rtol=1e-12)
        attractive = objective.evaluate(X, 2.0).gradient - objective.evaluate(X, 1.0).gradient
        np.testing.assert_allclose(B @ X[:ds].T, attractive[:ds].T, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("name", ["tsne", "sne"])
def test_free_phase_objective_weighs_the_pairs_of_placed_points_apart(name):
    """With freed rows (``n_placed`` < the moving rows) the exaggeration alpha weighs the pairs with a placed point
    and ``stored_attraction`` beta the others: the KL is the map's own, the gradient and the curvature those of
    the affinity so reweighted, the gradient that of the descended objective by finite differences."""
    n, m, freed = 30, 12, 5  # moving rows: 5 freed stored points, then 7 placed ones
    P = random_affinity(n + m, seed=9).P
    P = sp.csr_matrix(P / P.sum())
    rng = np.random.default_rng(10)
    old, X = rng.standard_normal((2, n)), rng.standard_normal((2, m))
    alpha, beta = 3.5, 0.75
    coo = P.tocoo()
    placed = (coo.row >= n + freed) | (coo.col >= n + freed)
    moving = (coo.row >= n) | (coo.col >= n)
    weights = np.where(placed, alpha, np.where(moving, beta, 1.0))
    reweighted = sp.csr_matrix((coo.data * weights, (coo.row, coo.col)), shape=P.shape)
    model = get_model(name)
    with PlacementObjective(model, 2, P, old, n_placed=m - freed, stored_attraction=beta) as weighed, \
            PlacementObjective(model, 2, P, old) as plain, PlacementObjective(model, 2, reweighted, old) as target:
        ev, plain_ev = weighed.evaluate(X, alpha), plain.evaluate(X, alpha)
        assert ev.kl == pytest.approx(plain_ev.kl, rel=1e-12) and ev.z == pytest.approx(plain_ev.z, rel=1e-12)
        np.testing.assert_allclose(ev.gradient, target.evaluate(X).gradient, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(weighed.curvature_matrix(X, alpha).toarray(),
                                   target.curvature_matrix(X).toarray(), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(weighed.curvature_diagonal(X, alpha), target.curvature_diagonal(X), rtol=1e-10)
        assert not np.allclose(ev.gradient, plain_ev.gradient)  # beta != alpha: not the plain exaggeration
        entries = [(k, i) for k in range(2) for i in range(0, m, 2)]
        numeric = central_differences(lambda c: weighed.evaluate(c, alpha).objective, X, entries)
        for k, i in entries:
            assert numeric[k, i] == pytest.approx(ev.gradient[k, i], rel=1e-5, abs=1e-9)
        same = PlacementObjective(model, 2, P, old, n_placed=m - freed)  # beta 1, alpha 1: the KL's own gradient
        np.testing.assert_allclose(same.evaluate(X).gradient, plain.evaluate(X).gradient, rtol=1e-12, atol=1e-15)
        same.close()
    for bad in (dict(n_placed=0), dict(n_placed=m + 1), dict(stored_attraction=0.0)):
        with pytest.raises(ValueError):
            PlacementObjective(model, 2, P, old, **bad)


def test_spectral_direction_places_and_frees_like_the_jacobi_one():
    """The spectral direction (``direction='spectral'``): the same objective descended; with no edge among the
    moving points it is the Jacobi direction exactly."""
    n, m = 40, 6
    P = random_affinity(n + m, seed=7).P
    P = P / P.sum()
    old = np.random.default_rng(8).standard_normal((2, n))
    plain = dict(exaggeration=1.0, final_exaggeration=1.0)  # the KL itself is the objective descended
    jacobi, _ = place("tsne", 2, old, P, PlacementOptimizer(iterations=40, **plain), free_hops=0)
    spectral, _ = place("tsne", 2, old, P, PlacementOptimizer(iterations=40, direction="spectral", **plain),
                        free_hops=0)
    assert spectral.settings["optimizer"] == "placement-spectral"
    assert np.all(np.diff(spectral.kl_history) <= 1e-12) and spectral.kl < spectral.kl_history[0]
    assert spectral.kl == pytest.approx(jacobi.kl, rel=2e-3)
    freed, _ = place("tsne", 2, old, P, PlacementOptimizer(iterations=40, direction="spectral", **plain),
                     free_hops=1, free_iterations=10, free_exaggeration=1.0, free_stored_attraction=1.0)
    assert freed.moved.size and freed.kl < spectral.kl and np.all(np.diff(freed.kl_history) <= 1e-12)
    lone = P.tolil()
    lone[n:, n:] = 0
    lone = sp.csr_matrix(lone)
    lone.eliminate_zeros()
    runs = [place("tsne", 2, old, lone, PlacementOptimizer(iterations=15, direction=d), free_hops=0)[0]
            for d in ("jacobi", "spectral")]
    np.testing.assert_array_equal(runs[0].coords, runs[1].coords)
    with pytest.raises(ValueError, match="direction"):
        PlacementOptimizer(direction="newton")


@pytest.mark.parametrize("name,far", [("tsne", False), ("tsne", True), ("sne", True), ("snest", False)])
def test_frozen_fft_grid_matches_the_exact_objective(name, far):
    """The fixed map's repulsion through one FFT grid (``placement.frozen``): the same KL and gradient as the
    exact sums, on an uncapped and a split (capped, near field) grid, with new points inside the map, far
    outside the grid (exact fallback) and beyond the old points' cells."""
    ds, dt = DIMS[name]
    rng = np.random.default_rng(3)
    n, m = 800, 60
    scale = 3.0 if far else 1.0  # the unspread map fits an uncapped grid
    centres = scale * rng.standard_normal((8, ds))
    Y = centres[rng.integers(8, size=n)] + rng.standard_normal((n, ds))
    if far:
        Y[:n // 20] *= 200.0  # a spread-out map: the grid is capped and split
    old = np.concatenate([Y.T, 0.3 * rng.standard_normal((dt, n))])
    X = np.concatenate([(centres[rng.integers(8, size=m)] + rng.standard_normal((m, ds))).T,
                        0.3 * rng.standard_normal((dt, m))])
    X[:ds, 0] = 1e7  # outside the grid
    X[:ds, 1] = old[:ds].max(axis=1) + 5.0  # just beyond the old points
    A = sp.random(n + m, n + m, density=6 / (n + m), random_state=1)
    A = (A + A.T).tocsr()
    A.setdiag(0)
    A.eliminate_zeros()
    P = A / A.sum()
    model = get_model(name)
    with PlacementObjective(model, ds, P, old) as exact, PlacementObjective(model, ds, P, old, repulsion="fft") as fft:
        assert fft.field.grid.capped == far or name == "sne"
        assert fft.z_old == pytest.approx(exact.z_old, rel=1e-5)
        e, f = exact.evaluate(X), fft.evaluate(X)
    assert f.kl == pytest.approx(e.kl, rel=1e-6)
    assert np.linalg.norm(f.gradient - e.gradient) <= 1e-3 * np.linalg.norm(e.gradient)
    assert np.abs(f.gradient[:, 0] - e.gradient[:, 0]).max() <= 1e-9 * np.abs(e.gradient[:, 0]).max()
    if name == "tsne" and far:
        run, _ = place(name, ds, old, P, repulsion="fft")
        assert run.settings["repulsion"] == "fft" and run.kl < run.kl_history[0]


def _school_split(tmp_path, new_nodes=(3, 4, 30)):
    """SCHOOL with ``new_nodes`` held out: the old edge list and the new nodes' edges (new id first)."""
    src, dst = school_edges()
    new = set(new_nodes)
    old_lines, new_lines = [], []
    for a, b in zip(src, dst):
        if a in new:
            new_lines.append(f"{a} {b}")
        elif b in new:
            new_lines.append(f"{b} {a}")
        else:
            old_lines.append(f"{a} {b}")
    old_path, new_path = tmp_path / "old.txt", tmp_path / "new.txt"
    old_path.write_text("\n".join(old_lines) + "\n")
    new_path.write_text("\n".join(new_lines) + "\n")
    return old_path, new_path


@pytest.fixture(scope="module")
def school_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("school")
    old_path, new_path = _school_split(tmp_path)
    run = tmp_path / "run.zarr"
    proc = run_cli("embed", str(old_path), "--model", "tsne", "--iterations", "300", "--out", str(run), "--quiet")
    assert proc.returncode == 0, proc.stderr
    return tmp_path, run, new_path


def test_cli_places_new_graph_nodes(school_run):
    tmp_path, run, new_path = school_run
    out = tmp_path / "placed.zarr"
    proc = run_cli("transform", str(run), str(new_path), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    before, after = EmbeddingResult.load(run), EmbeddingResult.load(out)
    assert list(after.node_ids[39:]) == [3, 4, 30]
    assert after.kl < after.provenance["start_kl"]
    # each new student lands among its own class (students 0-19 + teacher 20 vs 21-40 + 41)
    Y, ids = after.embedding, after.node_ids
    for k, node in enumerate((3, 4, 30)):
        d = np.linalg.norm(Y[:39] - Y[39 + k], axis=1)
        nearest = ids[:39][np.argsort(d)[:3]]
        assert np.all((nearest <= 20) == (node <= 20)), (node, nearest)
    # the default free phase: the stored neighbours of the new students moved (1 hop: fewer than half the map),
    # every other stored row stayed where it was
    n_moved = after.provenance["n_moved"]
    assert f"{n_moved} stored points moved" in proc.stdout and 0 < n_moved <= 39 // 2
    still = np.all(after.embedding[:39] == before.embedding, axis=1)
    assert np.count_nonzero(~still) <= n_moved and np.count_nonzero(still) >= 39 - n_moved
    freed = tmp_path / "freed.zarr"
    proc = run_cli("transform", str(run), str(new_path), "--out", str(freed), "--free-hops", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    # the default is 1 hop: the same map, bit for bit (the free phase's sums are reproducible: test_determinism)
    freed_result = EmbeddingResult.load(freed)
    assert freed_result.provenance["n_moved"] == n_moved
    np.testing.assert_array_equal(freed_result.embedding, after.embedding)
    assert (freed_result.optimizer["free_exaggeration"], freed_result.optimizer["free_stored_attraction"]) == \
        (FREE_EXAGGERATION, FREE_STORED_ATTRACTION)
    plain = tmp_path / "plain.zarr"  # the free phase on the plain KL: other weights, another map
    proc = run_cli("transform", str(run), str(new_path), "--out", str(plain), "--free-exaggeration", "1",
                   "--free-stored-attraction", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    plain_result = EmbeddingResult.load(plain)
    assert (plain_result.optimizer["free_exaggeration"], plain_result.optimizer["free_stored_attraction"]) == (1, 1)
    assert plain_result.provenance["n_moved"] == n_moved and not np.array_equal(plain_result.embedding, after.embedding)
    bad = tmp_path / "bad.zarr"
    proc = run_cli("transform", str(run), str(new_path), "--out", str(bad), "--free-stored-attraction", "0")
    assert proc.returncode == 2 and "--free-stored-attraction must be > 0" in proc.stderr and not bad.exists()
    fixed = tmp_path / "fixed.zarr"
    proc = run_cli("transform", str(run), str(new_path), "--out", str(fixed), "--free-hops", "0", "--quiet")
    assert proc.returncode == 0, proc.stderr and "moved" not in proc.stdout
    fixed_result = EmbeddingResult.load(fixed)
    assert np.array_equal(fixed_result.embedding[:39], before.embedding)  # old rows fixed
    assert fixed_result.provenance["n_moved"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("free_hops", ["0", "1"])
def test_cli_transform_on_a_dask_cluster_matches_local(school_run, dask_cluster, free_hops):
    """``scalemb transform --scheduler``: the same whole map as on local threads, bit for bit, with the stored
    map fixed and with the free phase (``--free-hops 1``, the graph default)."""
    tmp_path, run, new_path = school_run
    outs = [tmp_path / f"local-{free_hops}.zarr", tmp_path / f"dask-{free_hops}.zarr"]
    for out, extra in zip(outs, ([], ["--scheduler", dask_cluster.address])):
        proc = run_cli("transform", str(run), str(new_path), "--out", str(out), "--free-hops", free_hops, "--quiet",
                       *extra)
        assert proc.returncode == 0, proc.stderr
    local, dask = (EmbeddingResult.load(out) for out in outs)
    np.testing.assert_array_equal(dask.embedding, local.embedding)
    assert dask.kl == local.kl


def test_new_edges_in_either_column_order_place_the_same(school_run, tmp_path):
    """An ordinary undirected edge list of the new nodes' edges: each edge's new end is the one not in the map,
    whichever column it is in, so the stored-first spelling of the same edges places the same points."""
    _, run, new_path = school_run
    rows = [line.split() for line in new_path.read_text().splitlines()]
    flipped = tmp_path / "flipped.txt"  # every edge with a stored end written stored-first; new-new edges kept
    flipped.write_text("".join(f"{b} {a}\n" if int(b) not in (3, 4, 30) else f"{a} {b}\n" for a, b in rows))
    assert flipped.read_text() != new_path.read_text()
    outs = [tmp_path / "canonical.zarr", tmp_path / "flipped.zarr"]
    for out, edges in zip(outs, (new_path, flipped)):
        proc = run_cli("transform", str(run), str(edges), "--out", str(out), "--quiet")
        assert proc.returncode == 0, proc.stderr
    canonical, other = (EmbeddingResult.load(out) for out in outs)
    assert list(other.node_ids[39:]) == [3, 4, 30]
    np.testing.assert_array_equal(other.embedding, canonical.embedding)


def test_bad_graph_inputs_exit_2_and_write_nothing(school_run, tmp_path):
    _, run, new_path = school_run
    out = tmp_path / "placed.zarr"
    cases = {
        "collide.txt": ("3 0\n5 0\n", ":2: edge 5 0 joins two nodes of the stored map"),  # 5 and 0 are old
        "bad.txt": ("3 x\n", ":1: node id 'x' is a string but node id '3' on line 1 is an integer"),
        "strings.txt": ("a b\n", ":1: node ids are strings but the stored map's are integers"),
    }
    for name, (text, fragment) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        proc = run_cli("transform", str(run), str(path), "--out", str(out))
        assert proc.returncode == 2, (name, proc.stderr)
        assert fragment in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert not out.exists()
    lonely = tmp_path / "lonely.txt"
    lonely.write_text("3 0\n500 501\n501 500\n")  # 500 and 501 reach no stored node
    proc = run_cli("transform", str(run), str(lonely), "--out", str(out), "--refuse-unattached")
    assert proc.returncode == 2 and "2 new nodes share no edge path" in proc.stderr
    assert not out.exists()
    proc = run_cli("transform", str(run), str(new_path), "--out", str(out), "--free-hops", "-1")
    assert proc.returncode == 2 and "--free-hops must be >= 0" in proc.stderr and not out.exists()
    proc = run_cli("transform", str(run), str(lonely), "--out", str(out), "--quiet")
    assert proc.returncode == 0 and "(2 unattached" in proc.stdout
    assert list(sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))) == []


@pytest.fixture(scope="module")
def knn_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("knn")
    rng = np.random.default_rng(0)
    centres = 8.0 * rng.standard_normal((3, 5))
    labels = np.repeat(np.arange(3), 60)
    X = centres[labels] + rng.standard_normal((180, 5))
    np.save(tmp_path / "ref.npy", X)
    new_labels = np.array([0, 1, 2, 0, 1, 2])
    np.save(tmp_path / "new.npy", centres[new_labels] + rng.standard_normal((6, 5)))
    store, run = tmp_path / "store.zarr", tmp_path / "run.zarr"
    proc = run_cli("affinity", str(tmp_path / "ref.npy"), "--knn", "15", "--perplexity", "5", "--out", str(store),
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("embed", str(store), "--model", "tsne", "--iterations", "200", "--out", str(run), "--quiet")
    assert proc.returncode == 0, proc.stderr
    return tmp_path, run, labels, new_labels


def test_cli_places_feature_rows_in_their_cluster(knn_run):
    tmp_path, run, labels, new_labels = knn_run
    out = tmp_path / "placed.zarr"
    proc = run_cli("transform", str(run), str(tmp_path / "new.npy"), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    result = EmbeddingResult.load(out)
    assert list(result.node_ids[180:]) == list(range(180, 186))
    Y = result.embedding
    for k, label in enumerate(new_labels):
        nearest = np.argsort(np.linalg.norm(Y[:180] - Y[180 + k], axis=1))[:5]
        assert np.all(labels[nearest] == label)


def test_bad_feature_inputs_exit_2(knn_run):
    tmp_path, run, _, _ = knn_run
    out = tmp_path / "never.zarr"
    np.save(tmp_path / "wide.npy", np.zeros((3, 7)))
    proc = run_cli("transform", str(run), str(tmp_path / "wide.npy"), "--out", str(out))
    assert proc.returncode == 2 and "the reference has 5 columns" in proc.stderr
    moved = tmp_path / "moved.zarr"
    (tmp_path / "store.zarr").rename(moved)
    try:
        proc = run_cli("transform", str(run), str(tmp_path / "new.npy"), "--out", str(out))
    finally:
        moved.rename(tmp_path / "store.zarr")
    assert proc.returncode == 2 and "affinity store" in proc.stderr and "is gone" in proc.stderr
    assert not out.exists()


def test_embedder_transform_in_memory_knn_and_graph_dataset(tmp_path):
    from scalemb.embedding import Embedder  # the engine-level runner: the estimator has no transform yet
    from scalemb.affinity import knn_affinity

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.standard_normal((50, 3)), 10 + rng.standard_normal((50, 3))])
    embedder = Embedder(model="tsne", iterations=150).fit(knn_affinity(X, perplexity=5, n_neighbors=15))
    placed = embedder.transform(np.array([[0.0, 0, 0], [10.0, 10, 10]]), reference=X)
    assert placed.shape == (2, 2)
    Y = embedder.embedding_
    for row, cluster in zip(placed, (slice(0, 50), slice(50, 100))):
        nearest = np.argmin(np.linalg.norm(Y - row, axis=1))
        assert nearest in range(100)[cluster]
    assert embedder.transform_result_.embedding.shape == (102, 2)
    edges = tmp_path / "new.txt"
    edges.write_text("100 0\n100 1\n100 2\n")
    school = Embedder(model="snest", iterations=100).fit("school")
    assert school.transform(str(edges)).shape == (1, 3)
    assert list(school.transform_result_.node_ids[-1:]) == [100]


@pytest.mark.slow
def test_service_transform_job(tmp_path):
    from tests.test_service import Service

    service = Service(tmp_path)
    try:
        status, created = service.json("POST", "/jobs", {"input": "school", "model": "tsne", "iterations": 100})
        assert status == 201 and service.wait(created["id"])["state"] == "done"
        status, _ = service.json("PUT", "/uploads/new.txt", raw=b"100 0\n100 1\n101 100\n")
        assert status == 201
        status, job = service.json("POST", f"/jobs/{created['id']}/transform", {"new": "uploads/new.txt"})
        assert status == 201, job
        record = service.wait(job["id"])
        assert record["state"] == "done" and record["n_points"] == 44, record
        csv = service.request("GET", f"/jobs/{job['id']}/embedding")[1].decode().splitlines()
        assert [line.split(",")[0] for line in csv[-2:]] == ["100", "101"]
        weights = {"new": "uploads/new.txt", "free_exaggeration": 1.0, "free_stored_attraction": 1.0}
        status, job = service.json("POST", f"/jobs/{created['id']}/transform", weights)
        assert status == 201 and service.wait(job["id"])["state"] == "done", job
        status, _ = service.json("POST", f"/jobs/{created['id']}/transform", dict(weights, free_stored_attraction=0))
        assert status == 422
        status, _ = service.json("PUT", "/uploads/bad.txt", raw=b"5 0\n")  # 5 and 0 are stored nodes
        status, job = service.json("POST", f"/jobs/{created['id']}/transform", {"new": "uploads/bad.txt"})
        record = service.wait(job["id"])
        assert record["state"] == "failed" and "joins two nodes of the stored map" in record["error"]
        assert service.json("POST", "/jobs/nope/transform", {"new": "uploads/new.txt"})[0] == 404
        assert service.json("POST", f"/jobs/{created['id']}/transform", {"new": "../x"})[0] == 400
    finally:
        service.stop()


def test_eigenmap_runs_place_through_nystrom(tmp_path):
    eigenmaps = pytest.importorskip("scalemb.eigenmaps")  # issue 20's eigenmaps, merged with this branch
    from scalemb.datasets import school
    from scalemb.eigenmaps.graph import nystrom_extend
    from scalemb.placement import place_into

    fitted = eigenmaps.Eigenmap(n_components=2).fit("school")
    edges = tmp_path / "new.txt"
    edges.write_text("100 0\n100 1\n100 20 2\n101 100\n101 30\n")
    whole = place_into(fitted.result_, str(edges))
    assert np.array_equal(whole.embedding[:42], fitted.result_.embedding)
    assert list(whole.node_ids[42:]) == [100, 101]
    P = school().P
    assert np.all(np.isfinite(whole.embedding[42:])) and P.shape == (42, 42)
    # the same as the extension applied to the new rows' affinities to the stored nodes
    from scalemb.placement import grown_affinity, reference_of
    grown, _ = grown_affinity(reference_of("run", fitted.result_.provenance, fitted.result_.node_ids),
                              fitted.result_.node_ids, str(edges))
    expected = nystrom_extend(grown[42:, :42], fitted.result_.embedding, fitted.result_.optimizer["eigenvalues"])
    np.testing.assert_allclose(whole.embedding[42:], expected)


def test_kernel_eigenmap_runs_apply_their_stored_map(tmp_path):
    kernel = pytest.importorskip("scalemb.eigenmaps.kernel")
    from scalemb.errors import InputError
    from scalemb.placement import place_into

    rng = np.random.default_rng(0)
    t = rng.uniform(0, 3, 300)
    X = np.column_stack([t * np.cos(3 * t), rng.uniform(0, 1, 300), t * np.sin(3 * t)])
    fitted = kernel.KernelEigenmap(n_components=2, n_centres=20).fit(X)
    result = fitted.to_result()
    X_new = X[:5] + 0.01
    whole = place_into(result, X_new)
    assert np.array_equal(whole.embedding[:300], result.embedding)
    np.testing.assert_allclose(whole.embedding[300:], fitted.transform(X_new))
    assert list(whole.node_ids[300:]) == list(range(300, 305))
    with pytest.raises(InputError, match="takes 3 columns"):
        place_into(result, np.zeros((2, 4)))


def test_new_point_ids_follow_the_maps_id_kind():
    from scalemb.errors import ScalembError
    from scalemb.placement import new_point_ids

    assert new_point_ids(np.array([3, 9]), 2).tolist() == [10, 11]
    assert new_point_ids(np.array(["a", "b"]), 2).tolist() == ["new-0", "new-1"]
    with pytest.raises(ScalembError, match="already has ids of the form 'new-K'"):
        new_point_ids(np.array(["new-1", "b"]), 2)


def test_separate_time_step_descends_space_and_time_on_their_own_steps():
    """``time_step="separate"`` (SNEST): the KL never rises, both kinds of coordinate move, and for a model
    without time coordinates it is the joint step exactly."""
    n, m = 40, 6
    P = random_affinity(n + m, seed=11).P
    P = P / P.sum()
    rng = np.random.default_rng(12)
    old = np.concatenate([rng.standard_normal((2, n)), 0.3 * rng.standard_normal((1, n))])
    start, _ = initial_positions(sp.csr_matrix(P)[n:], old, 2)
    run, _ = place("snest", 2, old, P, PlacementOptimizer(iterations=30, time_step="separate", time_ratio=1.0))
    assert run.settings["time_step"] == "separate"
    assert np.all(np.diff(run.kl_history) <= 1e-12) and run.kl < run.kl_history[0]
    assert not np.allclose(run.coords[2], start[2]) and not np.allclose(run.coords[:2], start[:2])
    flat = [place("tsne", 2, old[:2], P, PlacementOptimizer(iterations=10, time_step=t))[0] for t in TIME_STEPS]
    np.testing.assert_array_equal(flat[0].coords, flat[1].coords)
    with pytest.raises(ValueError, match="time_step"):
        PlacementOptimizer(time_step="alternate")


@pytest.mark.slow
@pytest.mark.parametrize("name,repulsion", [("tsne", "fft"), ("snest", "exact")])
def test_dask_placement_is_bit_identical_to_local(dask_cluster, name, repulsion):
    """``place(client=...)``: the row blocks on real `dask worker` processes give the local result bit for bit
    (both phases: the placement and the free phase; exact sums and the frozen grid)."""
    ds, dt = DIMS[name]
    n, m = 400, 300  # two row blocks of new points
    A = sp.random(n + m, n + m, density=0.01, random_state=9).tolil()
    A[n:, 200:n] = 0  # the new points touch only the first 200 stored ones: the free phase frees some
    A = sp.csr_matrix(A + A.T)
    A.setdiag(0)
    A.eliminate_zeros()
    P = A / A.sum()
    rng = np.random.default_rng(10)
    old = np.concatenate([3.0 * rng.standard_normal((ds, n)), 0.3 * rng.standard_normal((dt, n))])
    options = dict(optimizer=PlacementOptimizer(iterations=5), free_hops=1, free_iterations=3, repulsion=repulsion)
    local, _ = place(name, ds, old, P, n_threads=2, **options)
    dask, _ = place(name, ds, old, P, client=dask_cluster.client, **options)
    np.testing.assert_array_equal(dask.coords, local.coords)
    np.testing.assert_array_equal(dask.moved_coords, local.moved_coords)
    np.testing.assert_array_equal(dask.kl_history, local.kl_history)
    assert local.settings["repulsion"] == repulsion and local.iterations == 8


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["euclidean", "manhattan"])
def test_exact_knn_of_new_rows_matches_brute_force(metric):
    """The fused top-k search (``placement.affinity._knn_against``): the k nearest by (distance, index), ties
    included, the same on 1 and 2 threads and over several row blocks."""
    from scipy.spatial.distance import cdist

    from scalemb.placement import affinity as placement_affinity

    rng = np.random.default_rng(13)
    X_ref = rng.integers(0, 3, size=(700, 4)).astype(float)  # many exact ties
    X_new = rng.integers(0, 3, size=(90, 4)).astype(float)
    D = cdist(X_new, X_ref, "euclidean" if metric == "euclidean" else "cityblock")
    expected = np.lexsort((np.broadcast_to(np.arange(700), D.shape), D), axis=-1)[:, :25]
    blocks = placement_affinity._BLOCK_ENTRIES
    try:
        placement_affinity._BLOCK_ENTRIES = 700 * 20  # 5 blocks of new rows
        runs = [placement_affinity._knn_against(X_new, X_ref, 25, metric, n_jobs) for n_jobs in (1, 2)]
    finally:
        placement_affinity._BLOCK_ENTRIES = blocks
    for indices, distances in runs:
        np.testing.assert_array_equal(indices, expected)
        np.testing.assert_allclose(distances, np.take_along_axis(D, expected, axis=1), rtol=1e-12, atol=1e-7)
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def _chain_affinity(n: int, attach) -> sp.csr_matrix:
    """A path of ``n`` stored points and one new point per entry of ``attach`` (edge to that stored point)."""
    m = len(attach)
    P = sp.lil_matrix((n + m, n + m))
    for i in range(n - 1):
        P[i, i + 1] = P[i + 1, i] = 1.0
    for k, j in enumerate(attach):
        P[n + k, j] = P[j, n + k] = 1.0
    P = sp.csr_matrix(P)
    return P / P.sum()


def test_placement_defaults_are_one_table_every_front_reads():
    """The placement's defaults are written once (scalemb.placement, scalemb.placement.optimize) and the CLI, the
    service and the run's transform take them from there; maps with time coordinates are not exaggerated."""
    from scalemb.cli.main import build_parser
    from scalemb.service.requests import TransformRequest

    space, timed = PlacementOptimizer().resolved(with_time=False), PlacementOptimizer().resolved(with_time=True)
    assert (space.exaggeration, space.exaggeration_iterations, space.final_exaggeration, space.iterations) == \
        (EXAGGERATION, EXAGGERATION_ITERATIONS, FINAL_EXAGGERATION, ITERATIONS)
    assert (timed.exaggeration, timed.exaggeration_iterations, timed.final_exaggeration) == (1.0, 0, 1.0)
    assert EXAGGERATION > 1.0 and FINAL_EXAGGERATION > 1.0 and FREE_HOPS >= 1 and 0 < FREE_MAX_SHARE < 1
    defaults = placement_defaults()
    assert defaults["final_exaggeration"] == FINAL_EXAGGERATION and defaults["free_iterations"] == FREE_ITERATIONS
    assert defaults["iterations before a free phase"] == PRE_FREE_ITERATIONS
    assert (defaults["free_exaggeration"], defaults["free_stored_attraction"]) == \
        (FREE_EXAGGERATION, FREE_STORED_ATTRACTION)
    assert FREE_EXAGGERATION > 1.0 and 0 < FREE_STORED_ATTRACTION <= 1.0
    args = build_parser().parse_args(["transform", "run.zarr", "new.txt", "--out", "o.zarr"])
    assert (args.iterations, args.free_hops, args.free_iterations, args.tol) == \
        (None, None, FREE_ITERATIONS, PlacementOptimizer.tol)
    request = TransformRequest(new="uploads/new.txt")
    assert (request.iterations, request.free_hops, request.free_iterations, request.free_exaggeration,
            request.free_stored_attraction) == (None, None, None, None, None)
    assert (args.free_exaggeration, args.free_stored_attraction) == (None, None)
    with pytest.raises(ValueError, match="time coordinates"):
        PlacementOptimizer(final_exaggeration=1.5).resolved(with_time=True)
    with pytest.raises(ValueError, match="iterations"):
        PlacementOptimizer(iterations=0)


def test_default_free_phase_follows_the_share_of_the_map_it_would_move():
    """``free_hops=None``: 1 hop when the new points' stored neighbours are at most FREE_MAX_SHARE of the map
    (the first phase then at most PRE_FREE_ITERATIONS), else the map stays fixed."""
    n = 40
    few = _chain_affinity(n, [3, 20])  # 1 hop frees stored points 3 and 20
    assert auto_free_hops(few, n) == FREE_HOPS
    old = np.stack([np.arange(n, dtype=float), np.zeros(n)]) + 0.01 * np.random.default_rng(0).standard_normal((2, n))
    run, _ = place("tsne", 2, old, few)
    assert list(run.moved) == list(freed_points(few, n, FREE_HOPS))
    assert run.settings["n_moved"] == run.moved.size and run.iterations <= PRE_FREE_ITERATIONS + FREE_ITERATIONS
    fixed = np.setdiff1d(np.arange(n), run.moved)
    assert fixed.size and run.moved_coords.shape == (2, run.moved.size)
    many = _chain_affinity(n, list(range(30)))  # 30 of the 40 stored points are a new point's neighbours
    assert freed_points(many, n, FREE_HOPS).size > FREE_MAX_SHARE * n and auto_free_hops(many, n) == 0
    run, _ = place("tsne", 2, old, many)
    assert run.moved.size == 0 and run.settings["exaggeration"] == EXAGGERATION
    assert run.settings["final_exaggeration"] == FINAL_EXAGGERATION and run.settings["iterations"] == ITERATIONS
    run, _ = place("tsne", 2, old, few)
    assert run.settings["iterations"] == PRE_FREE_ITERATIONS  # the first phase's cap before a free phase
    assert (run.settings["free_exaggeration"], run.settings["free_stored_attraction"]) == \
        (FREE_EXAGGERATION, FREE_STORED_ATTRACTION)
    timed = np.concatenate([old, np.zeros((1, n))])
    run, _ = place("snest", 2, timed, few)  # time coordinates: no exaggeration, the full first phase
    assert run.settings["exaggeration"] == 1.0 and run.settings["final_exaggeration"] == 1.0
    assert run.moved.size and run.settings["iterations"] == ITERATIONS
    assert (run.settings["free_exaggeration"], run.settings["free_stored_attraction"]) == (1.0, 1.0)
    with pytest.raises(ValueError, match="time coordinates"):
        place("snest", 2, timed, few, free_exaggeration=2.0)
    with pytest.raises(ValueError, match="must be > 0"):
        place("tsne", 2, old, few, free_stored_attraction=0.0)


@pytest.mark.slow
def test_default_placement_keeps_most_of_a_reembeddings_neighbourhoods():
    """On a generated co-authorship graph (~600 nodes, 10 % held out at random), the placed nodes' neighbourhood
    preservation with the defaults is at least 0.8 of a full re-embedding's and above that of the fixed-map,
    unexaggerated placement (measured 0.54 vs re-embedding 0.63 and 0.48)."""
    from scalemb.affinity import coauthorship_affinity
    from scalemb.embedding import Embedder
    from scalemb.io.coauthor_generator import generate_coauthor_edges
    from scalemb.io.edges import graph_from_edges
    from scalemb.placement.affinity import extended_graph_affinity
    from scipy.spatial import cKDTree

    src, dst = map(np.concatenate, zip(*generate_coauthor_edges(800, seed=1)))
    graph = graph_from_edges(src, dst, np.ones(src.size), "generated")
    n = graph.n_nodes
    neighbours = [set() for _ in range(n)]
    for a, b in zip(graph.src, graph.dst):
        neighbours[a].add(b)
        neighbours[b].add(a)
    ids = graph.node_ids
    held = np.isin(ids, np.random.default_rng(1).choice(ids, n // 10, replace=False))
    keep = ~held[graph.src] & ~held[graph.dst]
    old_graph = graph_from_edges(ids[graph.src[keep]], ids[graph.dst[keep]], graph.weight[keep], "old")
    new_ids = np.setdiff1d(ids, old_graph.node_ids)
    a, b = graph.src[~keep], graph.dst[~keep]
    first_new = np.isin(ids[a], new_ids)
    new_src, new_dst = np.where(first_new, ids[a], ids[b]), np.where(first_new, ids[b], ids[a])
    both = np.isin(ids[a], new_ids) & np.isin(ids[b], new_ids)
    new_src, new_dst = np.concatenate([new_src, ids[b[both]]]), np.concatenate([new_dst, ids[a[both]]])

    def fit(affinity):
        return Embedder(model="tsne", space_dims=2, time_dims=0, seed=0).fit(affinity)

    def preservation(Y, rows):  # fraction of each node's graph neighbours among its deg nearest map points
        tree = cKDTree(Y)
        scores = [len(set(tree.query(Y[i], k=len(neighbours[i]) + 1)[1][1:]) & neighbours[i]) / len(neighbours[i])
                  for i in rows if neighbours[i]]
        return float(np.mean(scores))

    full = coauthorship_affinity(graph)
    stored = fit(coauthorship_affinity(old_graph))
    old_ids = stored.result_.node_ids
    where = np.searchsorted(full.node_ids, np.concatenate([old_ids, new_ids]))
    rows = where[old_ids.size:]
    P = extended_graph_affinity(old_graph, "coauthorship", old_ids, new_ids, new_src, new_dst, np.ones(new_src.size))
    scores = {}
    for label, options in (("defaults", {}), ("fixed", dict(optimizer=PlacementOptimizer(
            exaggeration=1.0, final_exaggeration=1.0), free_hops=0))):
        run, _ = place("tsne", 2, np.ascontiguousarray(stored.embedding_.T), P, **options)
        Y_stored = stored.embedding_.copy()
        if run.moved.size:
            Y_stored[run.moved] = run.moved_coords.T
        Y = np.empty((n, 2))
        Y[where] = np.concatenate([Y_stored, run.coords.T])
        scores[label] = preservation(Y, rows)
    reembedded = preservation(fit(full).embedding_, rows)
    assert scores["defaults"] >= 0.8 * reembedded, (scores, reembedded)
    assert scores["defaults"] > scores["fixed"] + 0.02, (scores, reembedded)


def test_new_feature_rows_are_placed_with_a_reembeddings_row_mass():
    """A new feature row of P' holds half the attraction mass of a stored row (its own conditional affinities
    only), so feature rows are placed at x KNN_FINAL_EXAGGERATION = 2 after the first phase unless the optimiser
    sets it; graph nodes and maps with time coordinates keep their rules."""
    from scalemb.affinity import knn_affinity
    from scalemb.placement import Reference, knn_optimizer, place_into
    from scalemb.placement.affinity import extended_knn_affinity
    from scalemb.placement.optimize import KNN_FINAL_EXAGGERATION

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.standard_normal((50, 3)), 10 + rng.standard_normal((50, 3))])
    X_new = np.array([[0.0, 0, 0], [10.0, 10, 10], [0.5, 0, 0]])
    affinity = knn_affinity(X, perplexity=5, n_neighbors=15)
    P = extended_knn_affinity(affinity, X, X_new, 15, "euclidean", 5.0)
    n_all = 103
    rows = np.asarray(P.sum(axis=1)).ravel()
    np.testing.assert_allclose(rows[100:], 1.0 / (2 * n_all))
    stored = np.asarray(P[:100, :100].sum(axis=1)).ravel()  # a stored row's mass among the stored rows
    assert stored.mean() == pytest.approx(1.0 / n_all)
    assert KNN_FINAL_EXAGGERATION == 2.0
    assert knn_optimizer(None, with_time=False).final_exaggeration == KNN_FINAL_EXAGGERATION
    assert knn_optimizer(PlacementOptimizer(final_exaggeration=1.5), with_time=False).final_exaggeration == 1.5
    assert knn_optimizer(None, with_time=True).final_exaggeration is None  # resolved to 1.0 for time maps

    from scalemb.embedding import Embedder

    embedder = Embedder(model="tsne", iterations=150).fit(affinity)
    reference = Reference("knn", affinity=affinity, features=X, knn={"n_neighbors": 15, "perplexity": 5.0})
    default = place_into(embedder.result_, X_new, reference)
    assert default.optimizer["final_exaggeration"] == KNN_FINAL_EXAGGERATION
    given = place_into(embedder.result_, X_new, reference, PlacementOptimizer(final_exaggeration=FINAL_EXAGGERATION))
    assert given.optimizer["final_exaggeration"] == FINAL_EXAGGERATION
    assert not np.allclose(default.embedding[100:], given.embedding[100:])
    np.testing.assert_array_equal(default.embedding[:100], embedder.result_.embedding)  # the map stays fixed
    for row, cluster in zip(default.embedding[100:], (range(50), range(50, 100), range(50))):
        assert np.argmin(np.linalg.norm(embedder.result_.embedding - row, axis=1)) in cluster
