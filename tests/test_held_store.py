"""No full copy on the client (issue 30, part 3): with delta-bar-delta's rows held on Dask workers, checkpoints are
written by the workers straight into the output store (each its own partitions' rows, atomically: the version is
pointed at only once every worker has reported); a cluster checkpoint resumes in-process and the other way round,
bit for bit; a worker lost rewinds the run to its last checkpoint, which the workers alive read back, or to its
start, re-derived from the seed; the scheduler lost stops the run with a clear message and it resumes from its
checkpoint."""
import json
import signal
import threading
import time

import numpy as np
import pytest
import zarr

import scalemb
from scalemb.affinity import AffinityStore
from scalemb.engine import LocalExecutor
from scalemb.engine.distributed import DaskExecutor
from scalemb.engine.held_dask import DaskHeld
from scalemb.errors import ScalembError
from scalemb.store.checkpoint import read_checkpoint, record_hash
from scalemb.store.checkpointer import Checkpointer
from scalemb.models import get_model
from scalemb.optim import make_optimizer
from scalemb.engine.held import store_chunk

from .cli_runner import run_cli
from .test_checkpoint import assert_same_result, pointer, stop_at
from .test_distributed import coauthor_store

SETTINGS = dict(model="tsne", max_iter=40, random_state=3, optimizer="dbd", tol=0.0, repulsion="fft")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return coauthor_store(tmp_path_factory.mktemp("held-store"), 1200, seed=11, n_partitions=5)


@pytest.fixture(scope="module")
def reference(store):
    """The uninterrupted in-process run."""
    return scalemb.Embedder(**SETTINGS).fit(str(store)).result_


def _version(out):
    return zarr.open_group(store=str(out / "checkpoints" / pointer(out)), mode="r")


def _interrupted(out, store, at: int, **params):
    with pytest.raises(scalemb.RunInterrupted, match=f"iteration {at} "):
        with Checkpointer(out, every=10, on_checkpoint=stop_at(0, at)) as checkpointer:
            scalemb.Embedder(**SETTINGS, **params).fit(str(store), checkpoint=checkpointer)


@pytest.mark.slow
def test_a_cluster_checkpoint_is_written_by_the_workers_and_resumes_in_process(store, reference, dask_cluster,
                                                                               tmp_path):
    out = tmp_path / "run.zarr"
    _interrupted(out, store, 20, scheduler=dask_cluster.address)
    version = _version(out)
    attrs = dict(version.attrs)
    edges = AffinityStore(store).partitions
    n, bounds = int(edges[-1]), list(zip(edges[:-1], edges[1:]))
    # the per-point arrays were written by their holders: blocked by the partitions, chunked within them
    assert attrs["row_blocks"] == [[int(a), int(b)] for a, b in bounds]
    assert sorted(attrs["blocked"]) == ["state/best_coords", "state/coords", "state/gains", "state/update"]
    assert version["state/coords"].shape == (2, n) and version["state/coords"].chunks == (2, store_chunk(bounds))
    assert "coords" not in attrs["state"]  # the light state's empty fields are not scalars
    # what any reader recomputes: the digests of the rows of each partition
    checkpoint = read_checkpoint(out)
    arrays = {f"state/{k}": v for k, v in checkpoint.state.split()[0].items()}
    assert record_hash(arrays, attrs) == attrs["record_hash"]
    assert checkpoint.iteration == 20 and checkpoint.state.coords.shape == (2, n)
    assert_same_result(scalemb.resume(out, in_process=True), reference)  # bit for bit


@pytest.mark.slow
def test_an_in_process_checkpoint_resumes_on_the_cluster(store, reference, dask_cluster, tmp_path):
    out = tmp_path / "run.zarr"
    _interrupted(out, store, 20)
    assert "blocked" not in dict(_version(out).attrs)  # the client wrote this one
    resumed = scalemb.resume(out, scheduler=dask_cluster.address)  # checkpoint 30 is then written by the workers
    assert_same_result(resumed, reference)


@pytest.mark.slow
def test_a_tampered_worker_written_checkpoint_is_refused(store, dask_cluster, tmp_path):
    out = tmp_path / "run.zarr"
    _interrupted(out, store, 20, scheduler=dask_cluster.address)
    coords = zarr.open_array(store=str(out / "checkpoints" / pointer(out) / "state" / "coords"), mode="r+")
    coords[0, 7] = coords[0, 7] + 1e-9
    with pytest.raises(ScalembError, match="content hash mismatch"):
        read_checkpoint(out)


@pytest.mark.slow
def test_workers_that_cannot_see_the_store_leave_the_checkpoints_to_the_client(store, reference, dask_cluster,
                                                                                tmp_path, monkeypatch, caplog):
    """A worker on a host without the client's file system finds no version directory: the checkpoint is written
    by the client instead (a warning), and so are the later ones; the run is unchanged."""
    from scalemb.engine.held import RowsExport

    original = RowsExport.write
    monkeypatch.setattr(RowsExport, "write", lambda self, directory: original(self, directory + ".elsewhere"))
    out = tmp_path / "run.zarr"
    _interrupted(out, store, 20, scheduler=dask_cluster.address)
    assert "not visible here" in caplog.text and "the client writes the checkpoints" in caplog.text
    assert "blocked" not in dict(_version(out).attrs)
    assert [p.name for p in (out / "checkpoints").iterdir() if p.is_dir()] == [pointer(out)]
    assert_same_result(scalemb.resume(out, in_process=True), reference)


def _start(n_points: int) -> np.ndarray:
    """The start of the runs below (the cluster's and the in-process reference's: the same one)."""
    return np.random.default_rng(5).normal(size=(2, n_points)) * 1e-4


def _runs_on_cluster(store, client, *, n_iter=40, checkpoint=None, callback=None):
    with DaskExecutor(store, get_model("tsne"), 2, 0, client, repulsion="fft") as dask:
        start = _start(dask.n_points)
        return make_optimizer("dbd", "tsne", tol=0.0).optimize(dask, lambda: start.copy(), n_iter,
                                                                checkpoint=checkpoint, callback=callback), dask


def _runs_in_process(store, n_iter):
    """``_runs_on_cluster``'s run in-process: the held run on the workers ends as it does, bit for bit
    (tests/test_held.py), so the fault tests compare with it."""
    st = AffinityStore(store)
    with LocalExecutor(st.to_affinity(), get_model("tsne"), 2, 0, partitions=st.partitions, repulsion="fft") as ex:
        return make_optimizer("dbd", "tsne", tol=0.0).optimize(ex, _start(ex.n_points), n_iter)


@pytest.mark.slow
def test_a_worker_lost_before_any_checkpoint_rewinds_to_the_start(store, dask_cluster, grow_dask):
    """Before any checkpoint, a worker lost rewinds the run to its start, re-derived from the recipe it was
    given (no copy kept): the run ends as the uninterrupted one (three workers: the session's two and one of
    this test's own, the one killed)."""
    [victim] = grow_dask(1)
    processes = dask_cluster
    expected = _runs_in_process(store, n_iter=25)

    def kill_at(it, kl):
        if it == 12 and victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait()

    got, dask = _runs_on_cluster(store, processes.client, n_iter=25, callback=kill_at)
    assert victim.poll() is not None and dask.stats["recoveries"] >= 1
    assert np.array_equal(expected.coords, got.coords)
    assert np.array_equal(expected.kl_history, got.kl_history, equal_nan=True)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["checkpoint", "final"])
def test_a_worker_killed_while_rows_are_written_or_gathered_rewinds_to_the_checkpoint(
        store, reference, dask_cluster, grow_dask, tmp_path, monkeypatch, moment):
    """A worker SIGKILLed during a checkpoint's write (between its two rounds) or during the final write (the
    workers writing the result's rows into the staged result, between its two rounds): the half-written version
    or staged result is removed, the run rewinds to the last complete checkpoint (read back by the workers
    alive) and ends bit-identical to the uninterrupted run; nothing half-written stays in the store (three
    workers: the session's two and one of this test's own, the one killed)."""
    [victim] = grow_dask(1)
    processes = dask_cluster
    seen = []

    def kill():
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait()

    out = tmp_path / "run.zarr"
    # checkpoint 20 (shift, even partitions, odd ones): killed after its even partitions; the final write (the
    # workers write the result's rows, the client gathers nothing): after the pending shift and the even partitions
    method, kill_at = ("write_rows", 5) if moment == "checkpoint" else ("write_result_rows", 2)
    writing = []
    original_write, original_gather = getattr(DaskHeld, method), DaskHeld._gather

    def write(self, directory, fields):
        writing.append(directory)
        try:
            return original_write(self, directory, fields)
        finally:
            writing.remove(directory)

    def gather_then_kill(self, futures):
        result = original_gather(self, futures)
        if writing:
            seen.append(writing[0])
            if len(seen) == kill_at:
                kill()
        return result

    monkeypatch.setattr(DaskHeld, method, write)
    monkeypatch.setattr(DaskHeld, "_gather", gather_then_kill)
    if moment != "checkpoint":
        monkeypatch.setattr(DaskHeld, "gather", lambda self, *names: pytest.fail(f"the client gathered {names}"))
    reads, versions = [], []
    original_load = DaskHeld.load_rows

    def load_rows(self, directory, fields):
        reads.append(directory)
        versions.append(sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir()))
        return original_load(self, directory, fields)

    monkeypatch.setattr(DaskHeld, "load_rows", load_rows)
    out = tmp_path / "run.zarr"
    with Checkpointer(out, every=10) as checkpointer:
        result = scalemb.Embedder(**SETTINGS, scheduler=processes.address).fit(str(store),
                                                                               checkpoint=checkpointer).result_
    assert victim.poll() is not None
    assert reads and reads[0].endswith("/state")  # rewound to a checkpoint the workers read back
    assert versions[0] == [reads[0].split("/")[-2]]  # the half-written version was removed, the last one kept
    assert_same_result(result, reference)
    assert_same_result(scalemb.EmbeddingResult.load(out), reference)
    assert not (out / "checkpoints").exists() and not list(tmp_path.glob(".*"))  # nothing half-written left


@pytest.mark.slow
def test_the_scheduler_killed_mid_run_exits_clearly_and_resumes_from_the_checkpoint(store, reference, start_dask,
                                                                                   dask_cluster, tmp_path):
    from dask import config as dask_config

    processes = start_dask(2, client_timeout=5)
    out = tmp_path / "run.zarr"

    def kill_after_first_checkpoint():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if json.loads((out / "zarr.json").read_text())["attributes"]["scalemb_checkpoint"]["current"]:
                    break
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.05)
        processes.scheduler.send_signal(signal.SIGKILL)
        processes.scheduler.wait()

    killer = threading.Thread(target=kill_after_first_checkpoint)
    killer.start()
    with dask_config.set({"distributed.comm.timeouts.connect": "3s"}):
        done = run_cli("embed", store, "--out", out, "--model", "tsne", "--iterations", 40, "--optimizer", "dbd",
                       "--tol", 0, "--seed", 3, "--repulsion", "fft", "--checkpoint-every", 10,
                       "--scheduler", processes.address, "--quiet")
    killer.join()
    assert done.returncode == 4, done.stderr
    assert "lost the Dask scheduler" in done.stderr and "Traceback" not in done.stderr
    checkpoint = read_checkpoint(out)
    assert checkpoint is not None and checkpoint.iteration >= 10
    resumed = run_cli("resume", out, "--scheduler", dask_cluster.address, "--quiet")  # on another cluster
    assert resumed.returncode == 0, resumed.stderr
    assert_same_result(scalemb.EmbeddingResult.load(out), reference)
