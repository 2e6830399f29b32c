"""Every Dask worker lost at once: the run recovers on the workers that come back, or stops with
``WorkersLostError`` (``scalemb`` exit 4) within the recovery deadline -- it never waits for ever."""
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from scalemb.engine.distributed import DaskExecutor, WorkersLostError
from scalemb.models import get_model
from scalemb.optim import make_optimizer

from .test_distributed import local_executor, run, store  # noqa: F401 - the module's store fixture


def _kill_all(processes) -> None:
    for proc in processes.workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in processes.workers:
        proc.wait()


class _Deadline:
    """Fails the test instead of hanging it: interrupts the main thread after ``seconds``."""

    def __init__(self, seconds: float):
        self.timer = threading.Timer(seconds, lambda: signal.raise_signal(signal.SIGINT))

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        return False


@pytest.mark.slow
def test_every_worker_lost_for_good_stops_within_the_deadline(store, start_dask):  # noqa: F811
    """No worker comes back: the call that finds them gone gives up ``recovery_timeout`` seconds later."""
    processes = start_dask(2)
    with DaskExecutor(store, get_model("tsne"), 2, 0, processes.client, recovery_timeout=4) as dask:
        Y = np.random.default_rng(0).normal(size=(2, dask.n_points))
        dask.evaluate(Y)
        _kill_all(processes)
        started = time.monotonic()
        with _Deadline(120), pytest.raises(WorkersLostError, match="within 4 s"):
            for _ in range(20):
                dask.evaluate(Y)
        assert time.monotonic() - started < 4 + 30


@pytest.mark.slow
def test_every_worker_killed_at_once_then_restarted_recovers_identically(store, start_dask):  # noqa: F811
    """Both workers SIGKILLed together mid-run and new ones started (what nannies do): the partitions left
    waiting for a worker are loaded again on the new workers and the run ends as the uninterrupted one."""
    with local_executor(store) as local:
        expected = run(local, make_optimizer("sd", "snest"), n_iter=40)
    processes = start_dask(2)
    with DaskExecutor(store, get_model("snest"), 2, 1, processes.client, recovery_timeout=120) as dask:
        def kill_at(it, kl):
            if it == 15 and processes.workers[0].poll() is None:
                _kill_all(processes)
                processes.workers.extend(
                    subprocess.Popen(["dask", "worker", processes.address, "--nthreads", "1", "--no-nanny",
                                      "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", "2GB"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2))

        coords = np.random.default_rng(1).normal(size=(3, dask.n_points)) * 1e-4
        with _Deadline(600):
            got = make_optimizer("sd", "snest").optimize(dask, coords, 40, callback=kill_at)
        assert dask.stats["recoveries"] >= 1
    assert np.array_equal(expected.coords, got.coords)


class _CancelsAnAssembly(DaskExecutor):
    """A ``DaskExecutor`` that, once ``armed``, has the scheduler cancel one future of its next halo assembly (a key
    forgotten under it, as when a worker dies holding a dependency): a real cancellation on a real cluster."""

    armed = False

    def _assemble(self, *args, **kwargs):
        futures = super()._assemble(*args, **kwargs)
        if self.armed:
            self.armed = False
            self.client.cancel([futures[min(futures)]])
        return futures


@pytest.mark.slow
def test_futures_the_scheduler_cancels_are_recovered_not_a_failure(store, dask_cluster, caplog):  # noqa: F811
    """A future the scheduler cancelled is a fault the executor recovers from, with the same numbers: in a call
    (the curvature weights gone), in the recovery itself (cancelled again while the weights are recomputed), and
    under the curvature factorisation.  Seen in a soak killing Dask workers under two services: a job failed with
    ``FuturesCancelledError`` while every partition holder was alive (a cancellation is never a task's own error,
    which would be ``error``)."""
    from scalemb.engine.factor import FactorizedSolver

    rng = np.random.default_rng(2)
    client = dask_cluster.client
    with local_executor(store) as local, \
            _CancelsAnAssembly(store, get_model("snest"), 2, 1, client) as dask, _Deadline(300):
        Y = rng.normal(size=(3, dask.n_points))
        V = rng.normal(size=(2, dask.n_points))
        local.set_curvature(Y)
        dask.set_curvature(Y)
        expected = local.laplacian_matvec(V)
        assert np.array_equal(dask.laplacian_matvec(V), expected)
        recoveries = dask.stats["recoveries"]
        client.cancel([dask._weights[0]])
        assert np.array_equal(dask.laplacian_matvec(V), expected)
        assert dask.stats["recoveries"] > recoveries
        client.cancel([dask._weights[-1]])
        dask.armed = True  # the recovery's recomputation of the weights is cancelled too
        with caplog.at_level("WARNING", logger="scalemb"):
            assert np.array_equal(dask.laplacian_matvec(V), expected)
        assert not dask.armed and "recovery interrupted (FuturesCancelledError" in caplog.text
        client.cancel([dask._weights[0]])  # the factorisation is built from the weights recomputed after it
        remote = dask.factorize_curvature(1e-6)
        here = FactorizedSolver(local.curvature_matrix(), 1e-6)
        assert np.array_equal(remote.ordering, here.ordering)
        here = here.solve(V)
        client.cancel([remote._future])
        dask.armed = True
        assert np.array_equal(remote.solve(V), here)
        assert np.array_equal(dask.laplacian_matvec(V), expected)


@pytest.mark.slow
def test_waits_run_on_the_executors_own_client_not_the_process_default(store, dask_cluster):  # noqa: F811
    """Several clients in one process (the service runs each job with its own): a wait must run on the loop of the
    executor's client.  ``distributed.wait`` runs on the process's default client -- the latest one created --
    which binds the futures' events to another client's loop, and the next wait on their own loop fails with
    "... is bound to a different event loop" (seen: a job failed so in a 500-job run of two services)."""
    from distributed import Client

    from scalemb.engine.distributed import WorkersLostError

    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client) as dask, \
            Client(dask_cluster.address) as other, _Deadline(120):  # noqa: F841 - now the process's default client
        slow = dask.client.submit(time.sleep, 3, pure=False)
        with pytest.raises(WorkersLostError, match="within 1 s"):
            dask._wait_for([slow], timeout=1)
        assert slow.result(timeout=60) is None  # waited for on its client's own loop
        Y = np.random.default_rng(0).normal(size=(2, dask.n_points))
        assert np.isfinite(dask.evaluate(Y).kl)
