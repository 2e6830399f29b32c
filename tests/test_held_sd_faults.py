"""The spectral direction's state on the Dask workers under faults (issue 30): a worker SIGKILLed inside a CG solve,
before any checkpoint, after a checkpoint the workers wrote, or seen leaving during a wait; checkpoints and the final
write by the workers.  Every run ends as the uninterrupted in-process run, bit for bit.  (Split from
``test_held_sd.py``, whose schedule and helpers it shares, so that the two files run on different pytest-xdist
workers.)"""
import pytest

from scalemb.affinity import AffinityStore

from .test_distributed import coauthor_store
from .test_held_sd import _dask_run, _in_process, _same, _start


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``test_held_sd``'s store (the same graph and partitions), this module's own copy."""
    return coauthor_store(tmp_path_factory.mktemp("held-sd-faults"), 2000, seed=7, n_partitions=6)


def _kill_at_product(victim, nth, monkeypatch) -> list:
    """Have the ``nth`` held Laplacian product SIGKILL ``victim`` (a worker process) first; the calls, counted."""
    import signal

    from scalemb.engine.held_dask import DaskHeld

    calls = []
    original = DaskHeld.laplacian

    def laplacian_then_kill(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == nth and victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DaskHeld, "laplacian", laplacian_then_kill)
    return calls


@pytest.mark.slow
def test_a_worker_killed_mid_cg_rewinds_and_ends_as_the_uninterrupted_run(store, dask_cluster, grow_dask,
                                                                          monkeypatch, caplog):
    """A worker holding rows SIGKILLed inside a CG solve (the 14th Laplacian product: iteration 10's solve): the
    run rewinds to its last exported state (a checkpoint's export at the start of iteration 10) on the workers
    alive and replays; it ends as the uninterrupted run, bit for bit (three workers: the session's two and the
    victim)."""
    expected = _in_process(store)
    [victim] = grow_dask(1)
    calls = _kill_at_product(victim, 14, monkeypatch)
    exports = []

    def checkpoint(it, export):
        if it == 10:
            exports.append(export().iteration)

    got, _, workers = _dask_run(store, dask_cluster.client, "tsne", 0, checkpoint=checkpoint)
    assert victim.poll() is not None and workers == 2 and len(calls) > 14
    assert exports == [10] and "replaying from iteration 10" in caplog.text
    _same(expected, got)


@pytest.mark.slow
def test_a_worker_killed_before_any_checkpoint_rederives_the_start_from_its_recipe(store, dask_cluster, grow_dask,
                                                                                  monkeypatch, caplog):
    """The start given as a recipe (what the runner passes: ``derives_start``), so that the client keeps no copy
    of it: a worker SIGKILLed inside iteration 10's CG solve with no checkpoint taken rewinds to the start,
    re-derived by the recipe (called a second time), and ends as the uninterrupted run, bit for bit."""
    expected = _in_process(store)
    [victim] = grow_dask(1)
    n = AffinityStore(store).n_points
    calls, derived = _kill_at_product(victim, 14, monkeypatch), []

    def recipe():
        derived.append(1)
        return _start(n, 2, 3)

    got, _, workers = _dask_run(store, dask_cluster.client, "tsne", 0, start=recipe)
    assert victim.poll() is not None and workers == 2 and len(calls) > 14
    assert len(derived) == 2 and "replaying from iteration 0" in caplog.text
    _same(expected, got)


@pytest.mark.slow
def test_a_holder_seen_leaving_during_a_wait_rewinds_even_if_it_is_back(store, dask_cluster, monkeypatch, caplog):
    """A wait that saw a partition holder gone (``WorkerLeft``: under load, also a scheduler that did not answer)
    while every holder is alive again when the guard looks: the rows it held may be gone, so the run rewinds to
    the start, replays, and ends as the uninterrupted run, bit for bit (it used to end the run with the error)."""
    from scalemb.engine.distributed import DaskExecutor as Executor
    from scalemb.engine.faults import WorkerLeft

    expected = _in_process(store)
    calls = []
    original = Executor._halo_partials

    def partials_then_alarm(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 12:
            raise WorkerLeft("a Dask worker holding partitions left during the call")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Executor, "_halo_partials", partials_then_alarm)
    got, _, _ = _dask_run(store, dask_cluster.client, "tsne", 0)
    assert len(calls) > 12 and "replaying from iteration 0" in caplog.text
    _same(expected, got)


# each point's step bounded and the grid uncapped (``test_held_sd.FFT``), so that every evaluation runs on the
# workers' halos: unbounded, the layout spread to ~800 units and every evaluation took the capped grid's
# client-held way
SD_SETTINGS = dict(model="tsne", max_iter=30, random_state=3, optimizer="sd", solver="cg", preconditioner="jacobi",
                   early_exaggeration=4.0, exaggeration_iterations=8, tol=0.0, repulsion="fft", max_step_norm=2.0,
                   fft_max_nodes=1_000_000)


@pytest.fixture(scope="module")
def reference(store):
    """The in-process run with ``SD_SETTINGS`` (the tests only read it)."""
    import scalemb

    return scalemb.Embedder(**SD_SETTINGS).fit(str(store)).result_


@pytest.mark.slow
def test_cluster_checkpoints_and_the_final_write_are_the_workers_and_resume_in_process(store, reference,
                                                                                       dask_cluster, tmp_path):
    """With the rows held on the workers, a checkpoint's per-point arrays (coordinates, gradient and the buffers
    set then) are written by the workers into the output store; resumed in-process it ends as the uninterrupted
    in-process run; an uninterrupted cluster run's final embedding is written by the workers too, the same."""
    import zarr

    import scalemb
    from scalemb.store.checkpointer import Checkpointer

    from .test_checkpoint import assert_same_result, pointer, stop_at

    out = tmp_path / "run.zarr"
    with pytest.raises(scalemb.RunInterrupted, match="iteration 20 "):
        with Checkpointer(out, every=10, on_checkpoint=stop_at(0, 20)) as checkpointer:
            scalemb.Embedder(**SD_SETTINGS, scheduler=dask_cluster.address).fit(str(store), checkpoint=checkpointer)
    attrs = dict(zarr.open_group(store=str(out / "checkpoints" / pointer(out)), mode="r").attrs)
    assert sorted(attrs["blocked"]) == ["state/coords", "state/gradient", "state/previous_space"]
    assert_same_result(scalemb.resume(out, in_process=True), reference)
    whole = tmp_path / "whole.zarr"
    with Checkpointer(whole, every=10) as checkpointer:
        scalemb.Embedder(**SD_SETTINGS, scheduler=dask_cluster.address).fit(str(store), checkpoint=checkpointer)
    assert "embedding" in dict(zarr.open_group(store=str(whole), mode="r").attrs)["blocked"]  # the workers wrote it
    assert_same_result(scalemb.EmbeddingResult.load(whole), reference)


@pytest.mark.slow
def test_a_worker_killed_mid_cg_after_a_worker_written_checkpoint_rewinds_to_it(store, reference, dask_cluster,
                                                                                 grow_dask, monkeypatch, caplog,
                                                                                 tmp_path):
    """The checkpoint at iteration 10 written by the workers; a worker SIGKILLed in the CG solve after it: the
    workers alive read the checkpoint's rows back (checked against the digests they wrote) and the run replays
    from there, ending as the uninterrupted in-process run."""
    import signal

    import scalemb
    from scalemb.engine.held_dask import DaskHeld
    from scalemb.store.checkpointer import Checkpointer

    from .test_checkpoint import assert_same_result

    [victim] = grow_dask(1)
    calls = []
    original = DaskHeld.laplacian

    def laplacian_then_kill(self, *args, **kwargs):
        if calls:
            calls.append(1)
            if len(calls) == 3 and victim.poll() is None:  # the third product after the checkpoint
                victim.send_signal(signal.SIGKILL)
                victim.wait()
        return original(self, *args, **kwargs)

    def written(checkpointer, restart, iteration):
        if iteration == 10 and not calls:
            calls.append(1)

    monkeypatch.setattr(DaskHeld, "laplacian", laplacian_then_kill)
    out = tmp_path / "run.zarr"
    with Checkpointer(out, every=10, on_checkpoint=written) as checkpointer:
        scalemb.Embedder(**SD_SETTINGS, scheduler=dask_cluster.address).fit(str(store), checkpoint=checkpointer)
    assert victim.poll() is not None and "replaying from iteration 10" in caplog.text
    assert_same_result(scalemb.EmbeddingResult.load(out), reference)
