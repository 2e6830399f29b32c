"""The Dask executor against real `dask scheduler` / `dask worker` processes on loopback."""
import operator
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from dask import config as dask_config

from scalemb.affinity import AffinityStore, coauthorship_affinity, write_affinity_store
from scalemb.engine import LocalExecutor
from scalemb.engine.distributed import DaskExecutor, SchedulerLostError
from scalemb.errors import ScalembError
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.io.edgelist import read_edge_list
from scalemb.models import get_model
from scalemb.optim import make_optimizer
from scalemb.engine.factor import FactorizedSolver
from scalemb.repulsion import FFTParams, make_grid

from .cli_runner import run_cli


def coauthor_store(directory, n_authors: int, seed: int, n_partitions: int):
    """An affinity store of a generated co-authorship graph, in ``directory``."""
    edges = write_coauthor_edge_list(directory / "edges.txt", n_authors, seed=seed)
    path = directory / "P.zarr"
    write_affinity_store(path, coauthorship_affinity(read_edge_list(edges)), n_partitions=n_partitions)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return coauthor_store(tmp_path_factory.mktemp("dask"), 1500, seed=4, n_partitions=5)


def local_executor(store, model="snest", space=2, time_dims=1):
    st = AffinityStore(store)
    return LocalExecutor(st.to_affinity(), get_model(model), space, time_dims, partitions=st.partitions)


@pytest.mark.slow
def test_partitions_stay_on_workers_and_match_local(store, dask_cluster):
    rng = np.random.default_rng(0)
    n = AffinityStore(store).n_points
    Y = rng.normal(size=(3, n))
    with local_executor(store) as local, DaskExecutor(store, get_model("snest"), 2, 1, dask_cluster.client) as dask:
        holders = set(dask._holders)
        assert len(holders) == 2  # both workers hold partitions
        for exaggeration in (1.0, 4.0):
            a, b = local.evaluate(Y, exaggeration), dask.evaluate(Y, exaggeration)
            assert a.kl == b.kl and a.objective == b.objective and np.array_equal(a.gradient, b.gradient)
        local.set_curvature(Y)
        dask.set_curvature(Y)
        V = rng.normal(size=(2, n))
        assert np.array_equal(local.laplacian_matvec(V), dask.laplacian_matvec(V))
        assert np.array_equal(local.curvature_diagonal(), dask.curvature_diagonal())
        remote = dask.factorize_curvature(1e-6)
        here = FactorizedSolver(local.curvature_matrix(), 1e-6)
        assert np.array_equal(remote.ordering, here.ordering)
        assert np.array_equal(remote.solve(V), here.solve(V))
        # the coordinates go once to each worker per call; partitions were loaded once
        calls_before = dask.stats["calls"]
        dask.evaluate(Y)
        assert dask.stats["calls"] == calls_before + 1
        assert set(dask._holders) == holders


@pytest.mark.slow
@pytest.mark.parametrize("max_nodes", [None, 8_000])
def test_fft_repulsion_map_reduced_like_local(store, dask_cluster, max_nodes):
    """Charge grids map-reduced on the workers; with a capped grid the near-field cell index travels too."""
    st = AffinityStore(store)
    Y = np.random.default_rng(3).normal(size=(3, st.n_points))
    params = FFTParams(max_nodes=max_nodes)
    assert make_grid("snest", 2, Y.min(1), Y.max(1), params, st.n_points).capped == (max_nodes is not None)
    with LocalExecutor(st.to_affinity(), get_model("snest"), 2, 1, partitions=st.partitions,
                       repulsion="fft", fft_params=params) as local, \
            DaskExecutor(store, get_model("snest"), 2, 1, dask_cluster.client, repulsion="fft",
                         fft_params=params) as dask:
        a, b = local.evaluate(Y), dask.evaluate(Y)
        assert a.kl == b.kl and np.array_equal(a.gradient, b.gradient)
        without_kl = dask.evaluate(Y, with_kl=False)  # dbd's kl_every: the gradient alone
        assert np.isnan(without_kl.kl) and np.array_equal(without_kl.gradient, a.gradient)
        assert dask.stats["recoveries"] == 0


def run(executor, optimizer, n_iter=40, seed=1):
    coords = np.random.default_rng(seed).normal(size=(3, executor.n_points)) * 1e-4
    return optimizer.optimize(executor, coords, n_iter)


@pytest.mark.slow
@pytest.mark.parametrize("name, options", [("dbd", {}), ("sd", {}), ("dbd", {"kl_every": 3})])
def test_runs_identical_to_local(store, dask_cluster, name, options):
    with local_executor(store) as local:
        expected = run(local, make_optimizer(name, "snest", **options))
    with DaskExecutor(store, get_model("snest"), 2, 1, dask_cluster.client) as dask:
        got = run(dask, make_optimizer(name, "snest", **options))
    assert np.array_equal(expected.coords, got.coords)
    assert np.array_equal(expected.kl_history, got.kl_history, equal_nan=True)


@pytest.mark.slow
def test_the_spectral_schedule_at_scale_runs_identically_on_dask(store, dask_cluster):
    """t-SNE's 'auto' optimiser from 2e4 points (momentum exaggeration, bounded spectral steps solved by
    Jacobi-preconditioned CG on the executor's Laplacian products, delta-bar-delta polish steps with a spectral step
    every k), shortened to this store's size: the Dask run is the in-process run bit for bit."""
    from scalemb.models.tsne import SPECTRAL_THEN_POLISH

    options = {**{k: v for k, v in SPECTRAL_THEN_POLISH.items() if k != "optimizer"}, "exaggeration_iterations": 15,
               "spectral_iterations": 10, "polish_spectral_every": 6, "max_iterations": 45}
    coords = np.random.default_rng(2).normal(size=(2, AffinityStore(store).n_points)) * 1e-4
    with local_executor(store, "tsne", 2, 0) as local:
        expected = make_optimizer("sd", "tsne", **options).optimize(local, coords, 100)
    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client) as dask:
        got = make_optimizer("sd", "tsne", **options).optimize(dask, coords, 100)
    assert expected.iterations == got.iterations <= 45
    assert np.array_equal(expected.coords, got.coords)
    assert np.array_equal(expected.kl_history, got.kl_history, equal_nan=True)


@pytest.mark.slow
def test_worker_killed_mid_run(store, dask_cluster, grow_dask):
    """SIGKILL one of three workers (the session's two and one of this test's own) mid-run: its partitions are
    reloaded elsewhere, same result."""
    with local_executor(store) as local:
        expected = run(local, make_optimizer("sd", "snest"), n_iter=60)
    [victim] = grow_dask(1)
    processes = dask_cluster
    with DaskExecutor(store, get_model("snest"), 2, 1, processes.client) as dask:
        def kill_at(it, kl):
            if it == 20 and victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
                victim.wait()

        coords = np.random.default_rng(1).normal(size=(3, dask.n_points)) * 1e-4
        got = make_optimizer("sd", "snest").optimize(dask, coords, 60, callback=kill_at)
        assert victim.poll() is not None
        assert dask.stats["recoveries"] >= 1
        assert len(processes.client.scheduler_info()["workers"]) == 2
    assert np.array_equal(expected.coords, got.coords)


@pytest.mark.slow
def test_scheduler_lost_raises_clear_error(store, start_dask):
    processes = start_dask(1, client_timeout=5)  # the client gives up reconnecting after 5 s
    executor = DaskExecutor(store, get_model("tsne"), 2, 0, processes.client)
    Y = np.random.default_rng(0).normal(size=(2, executor.n_points))
    with local_executor(store, "tsne", 2, 0) as local:  # one worker: same run as the local executor
        assert np.array_equal(executor.evaluate(Y).gradient, local.evaluate(Y).gradient)
        start = np.random.default_rng(1).normal(size=(2, executor.n_points)) * 1e-4
        expected = make_optimizer("dbd", "tsne").optimize(local, start, 20).coords
    assert np.array_equal(make_optimizer("dbd", "tsne").optimize(executor, start, 20).coords, expected)
    processes.scheduler.send_signal(signal.SIGKILL)
    processes.scheduler.wait()
    with dask_config.set({"distributed.comm.timeouts.connect": "3s"}), \
            pytest.raises(SchedulerLostError, match="lost the Dask scheduler"):
        for _ in range(50):
            executor.evaluate(Y)
            time.sleep(0.1)


@pytest.mark.slow
def test_task_error_is_raised_without_recovery(store, dask_cluster):
    """A failure inside a task (no worker lost) is not retried."""
    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client) as dask:
        with pytest.raises(TypeError):
            dask._run(lambda: dask.map_blocks(operator.truediv, 0))  # RowBlock / 0, on the workers
        assert dask.stats["recoveries"] == 0


@pytest.mark.slow
def test_store_the_workers_cannot_read_is_a_clear_error(store, dask_cluster, tmp_path):
    broken = tmp_path / "broken.zarr"
    shutil.copytree(store, broken)
    (broken / "data" / "zarr.json").unlink()  # the client checks the arrays' metadata when it opens the store
    with pytest.raises(ScalembError, match="broken.zarr: the store has no array 'data'"):
        DaskExecutor(broken, get_model("tsne"), 2, 0, dask_cluster.client)


def test_not_a_store_is_refused(tmp_path):
    with pytest.raises(Exception, match="not a scalemb affinity store"):
        DaskExecutor(tmp_path, get_model("tsne"), 2, 0, None)


@pytest.mark.slow
def test_embed_on_existing_cluster_and_local_cluster(store, dask_cluster, tmp_path):
    import scalemb
    from scalemb.embedding import EmbeddingResult

    local = scalemb.embed(str(store), model="tsne", iterations=30, seed=2)
    remote = scalemb.embed(str(store), model="tsne", iterations=30, seed=2, scheduler=dask_cluster.address)
    assert np.array_equal(local.embedding, remote.embedding) and local.kl == remote.kl
    assert remote.provenance["executor"] == "dask" and remote.provenance["store"] == str(store)
    # the CLI with a LocalCluster started for the run, on an edge list streamed into a temporary store
    edges = tmp_path / "edges.txt"
    write_coauthor_edge_list(edges, 400, seed=5)
    out = tmp_path / "run.zarr"
    proc = subprocess.run(["scalemb", "embed", str(edges), "--model", "tsne", "--iterations", "20", "--workers",
                           "1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "iteration" in proc.stderr  # scalemb's progress, not Dask's own chatter (scheduler, nannies, client)
    assert not any(word in proc.stderr for word in ("Nanny", "Register worker", "Scheduler at", "Lost all")), \
        proc.stderr
    ran = EmbeddingResult.load(out)
    here = scalemb.embed(str(edges), model="tsne", iterations=20)
    assert np.allclose(ran.embedding, here.embedding, rtol=1e-6, atol=1e-12)
    assert np.array_equal(ran.node_ids, here.node_ids)


@pytest.mark.slow
def test_interrupted_dask_run_resumes_identical(store, dask_cluster, tmp_path):
    """Stopped at a checkpoint, then ``scalemb resume`` (CLI) on the same cluster: the uninterrupted result."""
    import scalemb
    from scalemb.embedding import EmbeddingResult
    from scalemb.store.checkpoint import read_checkpoint
    from scalemb.store.checkpointer import Checkpointer

    settings = dict(model="snest", iterations=60, seed=3, optimizer="sd", scheduler=dask_cluster.address)
    reference = scalemb.embed(str(store), **settings)
    out = tmp_path / "run.zarr"

    def stop_at_40(checkpointer, restart, iteration):
        if iteration == 40:
            checkpointer.request_stop()

    with pytest.raises(scalemb.RunInterrupted):
        with Checkpointer(out, every=20, on_checkpoint=stop_at_40) as checkpointer:
            scalemb.Embedder(**settings).fit(str(store), checkpoint=checkpointer)
    assert read_checkpoint(out).iteration == 40
    proc = run_cli("resume", out, "--scheduler", dask_cluster.address, "--quiet")
    assert proc.returncode == 0, proc.stderr
    resumed = EmbeddingResult.load(out)
    assert np.array_equal(resumed.embedding, reference.embedding) and resumed.kl == reference.kl
    assert resumed.provenance["executor"] == "dask"


@pytest.mark.slow
def test_unreachable_scheduler_is_a_clear_error(tmp_path):
    env = dict(os.environ, DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="3s")
    proc = subprocess.run(["scalemb", "embed", "school", "--scheduler", "tcp://127.0.0.1:9", "--out",
                           str(tmp_path / "r.zarr"), "--quiet"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 2 and "cannot connect to the Dask scheduler at tcp://127.0.0.1:9" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.zarr").exists()


@pytest.mark.slow
def test_factorisation_moved_to_another_worker_still_solves(store, dask_cluster):
    """The curvature factorisation may be moved between workers (work stealing, a dependent placed elsewhere):
    it pickles as its inputs and factorises again there, the same numbers -- scipy's ``SuperLU`` itself cannot be
    pickled, and each failed transfer was retried for ever (a hang).  The executor's own solves stay on the
    factor's worker."""
    from scalemb.engine.dask_factor import solve_factorized

    rng = np.random.default_rng(1)
    n = AffinityStore(store).n_points
    Y, V = rng.normal(size=(3, n)), rng.normal(size=(2, n))
    client = dask_cluster.client
    with local_executor(store) as local, DaskExecutor(store, get_model("snest"), 2, 1, client) as dask:
        local.set_curvature(Y)
        dask.set_curvature(Y)
        remote = dask.factorize_curvature(1e-6)
        here = FactorizedSolver(local.curvature_matrix(), 1e-6).solve(V)
        holder = remote._holder
        assert client.who_has([remote._future])[remote._future.key] == (holder,)
        other = next(w for w in client.scheduler_info()["workers"] if w != holder)
        moved = client.submit(solve_factorized, remote._future, V, workers=[other], allow_other_workers=False,
                              pure=False)
        assert np.array_equal(moved.result(timeout=60), here)
        assert np.array_equal(remote.solve(V), here)


@pytest.mark.slow
def test_a_task_that_can_never_run_is_an_error_not_a_hang(store, dask_cluster):
    """A task restricted to a worker that is not in the cluster stays ``no-worker`` for ever: the wait for it
    gives up after ``recovery_timeout`` seconds with ``WorkersLostError`` naming the task."""
    from scalemb.engine.distributed import WorkersLostError

    client = dask_cluster.client
    with DaskExecutor(store, get_model("snest"), 2, 1, client, recovery_timeout=2.0) as dask:
        stuck = client.submit(operator.add, 1, 2, workers=["tcp://127.0.0.1:9"], allow_other_workers=False,
                              pure=False)
        start = time.monotonic()
        with pytest.raises(WorkersLostError, match=stuck.key):
            dask._gather([stuck])
        assert time.monotonic() - start < 30
        stuck.cancel()
