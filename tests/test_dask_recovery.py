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
    with DaskExecutor(store, get_model("tsne"), 2, 0, processes.client, recovery_timeout=10) as dask:
        Y = np.random.default_rng(0).normal(size=(2, dask.n_points))
        dask.evaluate(Y)
        _kill_all(processes)
        started = time.monotonic()
        with _Deadline(120), pytest.raises(WorkersLostError, match="within 10 s"):
            for _ in range(20):
                dask.evaluate(Y)
        assert time.monotonic() - started < 10 + 30


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
