import json
import os
import subprocess
import time

# Dask's diagnostics the tests never read, off in this process and in every process the tests start (Dask
# schedulers and workers, `scalemb serve`, the CLI): the workers' statistical profiler (a thread sampling every
# 10 ms), the 20 ms event-loop tick and the 0.5 s system monitor.  An idle scheduler and two workers then spend
# ~0.9 CPU s a minute instead of ~3.5 (the session cluster lives through the whole suite); heartbeats, timeouts
# and memory limits, which the tests exercise, keep Dask's defaults.
os.environ.update({"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
                   "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
                   "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s"})

import dask.config  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from distributed import Client  # noqa: E402

dask.config.refresh()  # dask may be imported before this file (a plugin): read the variables above

from scalemb.datasets import school  # noqa: E402


@pytest.fixture(scope="session")
def school_affinity():
    return school()


def dense_kl(P, coords, model, space_dims):
    """Reference KL(P||Q) computed densely from the model's definition (SNEST paper, eqs. 1-8)."""
    S = coords[:space_dims].T
    T = coords[space_dims:].T
    d2s = ((S[:, None] - S[None]) ** 2).sum(-1)
    d2t = ((T[:, None] - T[None]) ** 2).sum(-1)
    W = {"sne": np.exp(-d2s), "tsne": 1 / (1 + d2s), "snest": np.exp(d2t) / (1 + d2s)}[model]
    np.fill_diagonal(W, 0)
    Q = W / W.sum()
    mask = P > 0
    return float(np.sum(P[mask] * np.log(P[mask] / Q[mask])))


def _worker(address: str) -> subprocess.Popen:
    """A single-threaded Dask worker process (no nanny: a killed worker stays dead) on loopback."""
    return subprocess.Popen(["dask", "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host",
                             "127.0.0.1", "--memory-limit", "2GB"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class DaskProcesses:
    """A scheduler and ``n_workers`` single-threaded worker processes (no nanny: a killed worker stays dead)
    and a client connected to them (``client_timeout``: its connect and reconnect limit, seconds)."""

    def __init__(self, tmp_path, n_workers: int, client_timeout: float = 30):
        self.file = tmp_path / f"scheduler-{os.getpid()}-{time.monotonic_ns()}.json"
        self.scheduler = subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                           "--no-dashboard", "--scheduler-file", str(self.file)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self.file.exists() or not self.file.read_text().strip():
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.1)
        time.sleep(0.2)
        self.address = json.loads(self.file.read_text())["address"]
        self.workers = [_worker(self.address) for _ in range(n_workers)]
        self.client = Client(self.address, timeout=client_timeout)
        self.client.wait_for_workers(n_workers, timeout=60)

    def close(self):
        try:
            self.client.close()
        except RuntimeError:
            # a client whose scheduler a test killed closes itself once reconnecting fails, and distributed's
            # close() can then race that close's expiring timeout ("Cannot change state of expiring Timeout")
            if self.scheduler.poll() is None:
                raise
        for proc in self.workers + [self.scheduler]:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.workers + [self.scheduler]:
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:  # a worker that lost its scheduler may linger: test processes
                proc.kill()
                proc.wait()


@pytest.fixture
def start_dask(tmp_path):
    """``start_dask(n, **options)``: a new ``DaskProcesses`` on loopback, stopped after the test."""
    started = []

    def start(n_workers: int, **options) -> DaskProcesses:
        started.append(DaskProcesses(tmp_path, n_workers, **options))
        return started[-1]

    yield start
    for processes in started:
        processes.close()


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory):
    """A scheduler and two single-threaded workers shared by the tests of a session."""
    processes = DaskProcesses(tmp_path_factory.mktemp("dask-cluster"), 2)
    yield processes
    processes.close()


@pytest.fixture
def grow_dask(dask_cluster):
    """``grow_dask(n)``: the session cluster (``dask_cluster``) with ``n`` more single-threaded worker processes of
    this test's own (returned: the test may SIGKILL them), stopped after the test, which then leaves the session's
    two workers as it found them.  A test that needs three workers, or one to kill, starts one process instead of
    a scheduler and three workers (~1.5 CPU s and a second or more of wall each); tests that kill every worker or
    the scheduler start their own cluster (``start_dask``)."""
    session = set(dask_cluster.client.scheduler_info()["workers"])
    assert len(session) == 2, "the session cluster lost a worker: a test killed one it does not own"
    started = []

    def grow(n_workers: int) -> list:
        new = [_worker(dask_cluster.address) for _ in range(n_workers)]
        started.extend(new)
        dask_cluster.client.wait_for_workers(len(session) + len(started), timeout=60)
        return new

    yield grow
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
    for proc in started:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30  # the scheduler forgets the stopped workers before the next test
    while set(dask_cluster.client.scheduler_info()["workers"]) != session:
        assert time.monotonic() < deadline, "a test's own workers are still registered, or a session worker left"
        time.sleep(0.05)


@pytest.fixture
def service(tmp_path):
    """A ``scalemb serve`` subprocess with ``tmp_path`` as its data root (``Service`` of tests/test_service.py),
    stopped after the test."""
    from .test_service import Service

    svc = Service(tmp_path)
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def shared_service(tmp_path_factory):
    """One ``scalemb serve`` with the default options (``Service`` of tests/test_service.py) for the tests of
    every module that neither stop it nor start it with options of their own nor need a data root to themselves
    (``shared_service.root``: its data root): each names its own files and checks only what it added to the
    listing and the data root.  Five modules' services are one start."""
    from .test_service import Service

    svc = Service(tmp_path_factory.mktemp("shared-service-root"))
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server (``tests/postgres_server.py``) for the session; the tests using it skip, naming
    the package, where Debian's ``postgresql`` is not installed (``.ci/run`` installs it)."""
    from .postgres_server import PostgresServer

    if PostgresServer.binaries() is None:
        pytest.skip(PostgresServer.MISSING)
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'scalemb[postgres]'")
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto's server mode, ``tests/s3_server.py``) for the session; the tests using it
    skip, naming the package, where moto's server is not installed."""
    from .s3_server import S3Server

    if not S3Server.available():
        pytest.skip(S3Server.MISSING)
    pytest.importorskip("s3fs", reason="s3fs is not installed: pip install 'scalemb[s3]'")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    """``s3_server`` with its AWS variables set for this test, a fresh bucket (``s3.bucket``: its URL) and a
    cache directory of the test's own."""
    import uuid

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SCALEMB_CACHE_DIR", str(tmp_path / "object-cache"))
    s3_server.bucket = s3_server.make_bucket(f"scalemb-{uuid.uuid4().hex[:12]}")
    return s3_server
