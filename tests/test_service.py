"""``scalemb serve`` as deployed: a real uvicorn subprocess on loopback, a real SQLite file, real Zarr stores."""
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import scalemb
from scalemb.embedding import EmbeddingResult

from .cli_runner import run_cli

TOKEN = "test-token-7"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """A ``scalemb serve`` subprocess and a small urllib client for it."""

    def __init__(self, root, *args, token=TOKEN, prefix=(), env=None):
        self.root, self.args, self.token, self.prefix, self.env = root, args, token, list(prefix), env or {}
        self.start()

    def start(self):
        self.port = _free_port()
        env = dict(os.environ, SCALEMB_TOKEN=self.token, **self.env)
        self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "scalemb", "serve", "--data-root",
                                      str(self.root),
                                      "--port", str(self.port), "--threads", "2", *self.args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/health", auth=False)[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"service did not start: {self.stop()}")

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace")

    def request(self, method, path, body=None, auth=True, token=None, raw=None, headers=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {token or self.token}")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read(), dict(err.headers)

    def json(self, method, path, body=None, **kwargs):
        status, content, _ = self.request(method, path, body, **kwargs)
        return status, json.loads(content)

    def wait(self, job_id, until=("done", "failed", "cancelled"), timeout=90, predicate=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, record = self.json("GET", f"/jobs/{job_id}")
            assert status == 200, record
            if record["state"] in until and (predicate is None or predicate(record)):
                return record
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} still {record['state']} at iteration {record['iteration']}")


@pytest.fixture
def service(shared_service):
    """The session's ``scalemb serve`` (conftest's ``shared_service``) for the tests of this module that neither
    stop it nor start it with options of their own (``service.root``: its data root).  Each test names its own
    uploads and checks what it added to the listing, the jobs and stores directories and the database."""
    return shared_service


def _job_ids(service) -> set:
    status, listing = service.json("GET", "/jobs")
    assert status == 200 and listing["total"] < 100, listing  # one page holds them all
    return {j["id"] for j in listing["jobs"]}


@pytest.mark.slow
def test_submit_poll_fetch_embedding_and_plot(service):
    root, before = service.root, _job_ids(service)
    status, created = service.json("POST", "/jobs", {"input": "school", "model": "snest", "iterations": 120,
                                                     "seed": 2})
    assert status == 201 and created["state"] == "queued"
    record = service.wait(created["id"])
    assert record["state"] == "done", record
    assert record["iteration"] == 120 and len(record["kl_history"]) == 121 and record["n_points"] == 42
    assert record["timing"]["elapsed_s"] > 0
    stored = EmbeddingResult.load(root / "jobs" / created["id"] / "run.zarr")
    # the same run in-process gives the same embedding
    assert np.array_equal(stored.embedding, scalemb.embed("school", iterations=120, seed=2).embedding)
    assert record["kl"] == pytest.approx(stored.kl) and record["kl_history"] == pytest.approx(stored.kl_history)
    status, npy, headers = service.request("GET", f"/jobs/{created['id']}/embedding?format=npy")
    assert status == 200 and np.array_equal(np.load(__import__("io").BytesIO(npy)), stored.embedding)
    status, csv, headers = service.request("GET", f"/jobs/{created['id']}/embedding?format=csv")
    lines = csv.decode().splitlines()
    assert status == 200 and lines[0] == "node_id,s1,s2,t1" and len(lines) == 43
    table = np.loadtxt(lines[1:], delimiter=",")
    assert np.array_equal(table[:, 0], stored.node_ids) and np.array_equal(table[:, 1:], stored.embedding)
    status, png, headers = service.request("GET", f"/jobs/{created['id']}/plot.png")
    assert status == 200 and png.startswith(PNG_MAGIC) and headers["content-type"] == "image/png"
    # an uploaded edge list keeps its node ids
    status, up = service.json("PUT", "/uploads/tri.txt", raw=b"# t\n10 20\n20 30\n30 10\n30 40\n")
    assert status == 201 and up["input"] == "uploads/tri.txt"
    status, job2 = service.json("POST", "/jobs", {"input": up["input"], "model": "tsne", "iterations": 30})
    assert status == 201 and service.wait(job2["id"])["state"] == "done"
    csv2 = service.request("GET", f"/jobs/{job2['id']}/embedding")[1].decode().splitlines()
    assert [line.split(",")[0] for line in csv2[1:]] == ["10", "20", "30", "40"]
    # listing, OpenAPI, the SQLite records
    status, listing = service.json("GET", "/jobs")
    assert {j["id"] for j in listing["jobs"]} - before == {created["id"], job2["id"]}
    status, spec = service.json("GET", "/openapi.json", auth=False)
    assert status == 200 and {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/embedding"} <= set(spec["paths"])
    with sqlite3.connect(root / "jobs.sqlite3") as db:
        rows = {job_id: state for job_id, state in db.execute("SELECT id, state FROM jobs") if job_id not in before}
    assert rows == {created["id"]: "done", job2["id"]: "done"}
    assert service.json("GET", "/jobs/nope")[0] == 404


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.slow
def test_feature_uploads_embed_with_knn_affinities_and_bad_input_is_refused(service):
    root, before = service.root, _job_ids(service)
    dirs_before = {p.name for p in (root / "jobs").iterdir()} if (root / "jobs").is_dir() else set()
    stores_before = set((root / "stores").glob("*.zarr"))
    X = np.random.default_rng(5).normal(size=(60, 5))
    assert service.json("PUT", "/uploads/feats.npy", raw=_npy(X))[0] == 201
    text = "a,b,c,d,e\n" + "".join(",".join(repr(float(v)) for v in row) + "\n" for row in X)
    assert service.json("PUT", "/uploads/feats.csv", raw=text.encode())[0] == 201
    body = {"input": "uploads/feats.npy", "model": "tsne", "iterations": 60, "seed": 3, "perplexity": 10.0,
            "metric": "manhattan"}
    jobs = [service.json("POST", "/jobs", dict(body, input=name))[1]["id"]
            for name in ("uploads/feats.npy", "uploads/feats.csv")]  # 'auto' reads both as feature matrices
    # the estimator on the same array, with the service's threads: the same code path, bit for bit
    here = scalemb.Embedder(model="tsne", iterations=60, random_state=3, perplexity=10.0, metric="manhattan",
                            n_jobs=2).fit(X)
    for job_id in jobs:
        record = service.wait(job_id)
        assert record["state"] == "done", record
        assert record["n_points"] == 60 and record["params"]["affinity"] == "knn"
        stored = EmbeddingResult.load(root / "jobs" / job_id / "run.zarr")
        assert np.array_equal(stored.embedding, here.embedding_)
        assert np.array_equal(stored.kl_history, here.kl_history_)
    # bad input: 422, one line naming the field or the file (and line), nothing queued or written
    bad = {"nan.npy": _npy(np.where(np.arange(20).reshape(4, 5) == 7, np.nan, 1.0 * np.arange(20).reshape(4, 5))),
           "cell.tsv": b"# features\n1\t2\t3\n4\tx\t6\n", "one.csv": b"0.5,1.5,2.5,3.5\n"}
    for name, content in bad.items():
        assert service.json("PUT", f"/uploads/{name}", raw=content)[0] == 201
    for request, fragment in (
            ({"input": "uploads/nan.npy"}, "uploads/nan.npy: non-finite value nan at row 1, column 2"),
            ({"input": "uploads/cell.tsv", "affinity": "knn"}, "uploads/cell.tsv:3: non-numeric cell 'x' in column 1"),
            ({"input": "uploads/one.csv"}, "uploads/one.csv: a feature matrix needs at least 2 rows"),
            ({"input": "uploads/feats.npy", "perplexity": 0}, "perplexity: must be a number >= 1 and <= 1e6, got 0"),
            ({"input": "uploads/feats.npy", "perplexity": -3.0},
             "perplexity: must be a number >= 1 and <= 1e6, got -3.0"),
            ({"input": "uploads/feats.npy", "metric": "hamming"}, "metric: must be one of euclidean, "),
            ({"input": "uploads/feats.npy", "n_neighbors": 0}, "n_neighbors: must be an integer >= 1 and <= 10000"),
            ({"input": "school", "perplexity": 5}, "perplexity: kNN settings apply to a feature matrix"),
            ({"input": "uploads/feats.npy", "affinity": "graph", "metric": "cosine", "n_neighbors": 5},
             "n_neighbors, metric: kNN settings apply"),
            ({"input": "school", "affinity": "knn"}, "affinity: 'knn' needs a feature matrix"),
            ({"input": "uploads/feats.npy", "affinity": "precomputed"}, "affinity: 'precomputed' needs an affinity "
                                                                         "store")):
        status, err = service.json("POST", "/jobs", request)
        assert status == 422 and err["detail"].startswith(fragment) and "\n" not in err["detail"], (request, err)
    assert _job_ids(service) - before == set(jobs)
    assert sorted(p.name for p in (root / "jobs").iterdir() if p.name not in dirs_before) == sorted(jobs)
    assert len(set((root / "stores").glob("*.zarr")) - stores_before) == 2  # the two good jobs' kNN P, no more


@pytest.mark.slow
def test_auth_paths_and_limits_are_refused(service, monkeypatch):
    root = service.root
    outside = root.parent / f"{root.name}-outside-auth"
    outside.mkdir()
    (outside / "edges.txt").write_text("1 2\n")
    (root / "escape").symlink_to(outside)  # removed at the end: it is the session service's data root
    try:
        (root / "inside.txt").write_text("1 2\n2 3\n")
        body = {"input": "inside.txt", "iterations": 5}
        status, err = service.json("POST", "/jobs", body, auth=False)
        assert status == 401 and "bearer token" in err["detail"]
        assert service.json("POST", "/jobs", body, token="wrong")[0] == 401
        assert service.json("GET", "/jobs", auth=False)[0] == 401
        for path, code, fragment in ((str(outside / "edges.txt"), 400, "absolute"), ("../x/edges.txt", 400, "'..'"),
                                     ("sub/../../edges.txt", 400, "'..'"), ("escape/edges.txt", 403, "outside"),
                                     ("missing.txt", 404, "no such file")):
            status, err = service.json("POST", "/jobs", {"input": path})
            assert (status, fragment in err["detail"]) == (code, True), (path, status, err)
        assert service.json("PUT", "/uploads/..hidden", raw=b"1 2\n")[0] == 400
        assert service.json("POST", "/jobs", {"input": "inside.txt", "bogus": 1})[0] == 422
        status, err = service.json("POST", "/jobs", raw=b"{" + b" " * 70000 + b"}",
                                   headers={"Content-Type": "application/json"})
        assert status == 413 and "exceeds the limit" in err["detail"]
        assert service.json("POST", "/jobs", body)[0] == 201  # the confined path itself is accepted
        # no token configured: refuses to start, one line, status 2 (the command line in this process: a ``serve``
        # that got past the check would stop at once on the data root the service above holds)
        monkeypatch.delenv("SCALEMB_TOKEN", raising=False)
        proc = run_cli("serve", "--data-root", root)
        assert proc.returncode == 2 and "no bearer token" in proc.stderr and proc.stderr.count("\n") == 1
    finally:
        (root / "escape").unlink()


@pytest.mark.slow
def test_queue_full_is_429_and_jobs_cancel(tmp_path):
    svc = Service(tmp_path, "--max-running", "1", "--max-queue", "1")
    try:
        long = {"input": "grqc", "optimizer": "dbd", "iterations": 100000}
        _, running = svc.json("POST", "/jobs", long)
        svc.wait(running["id"], until=("running",), predicate=lambda r: (r["iteration"] or 0) >= 1)
        status, queued = svc.json("POST", "/jobs", {"input": "school", "iterations": 10})
        assert status == 201
        status, err = svc.json("POST", "/jobs", {"input": "school", "iterations": 10})
        assert status == 429 and "queue full" in err["detail"]
        assert svc.json("DELETE", f"/jobs/{queued['id']}")[1]["state"] == "cancelled"
        assert svc.json("DELETE", f"/jobs/{running['id']}")[1]["state"] == "cancelling"
        assert svc.wait(running["id"], timeout=30)["state"] == "cancelled"
        assert not (tmp_path / "jobs" / running["id"] / "run.zarr").exists()
        assert svc.json("DELETE", f"/jobs/{running['id']}")[1] == {"id": running["id"], "deleted": True}
        assert svc.json("DELETE", f"/jobs/{running['id']}")[0] == 404
        status, after = svc.json("POST", "/jobs", {"input": "school", "iterations": 10})  # room again
        assert status == 201 and svc.wait(after["id"])["state"] == "done"
    finally:
        svc.stop()


def _kill_running_job_and_restart(svc, tmp_path, params, start_timeout=60, end_timeout=90):
    """Submit ``params``, SIGKILL the service once the job runs past iteration 45 (the database must still say
    running), restart it on the same data root and wait for the job: ``(job, final record)``."""
    _, job = svc.json("POST", "/jobs", params)
    svc.wait(job["id"], until=("running",), predicate=lambda r: (r["iteration"] or 0) >= 45, timeout=start_timeout)
    svc.stop(signal.SIGKILL)
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
        assert db.execute("SELECT state FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0] == "running"
    svc.start()
    return job, svc.wait(job["id"], timeout=end_timeout)


@pytest.mark.slow
def test_killed_service_resumes_running_job_from_checkpoint(tmp_path):
    svc = Service(tmp_path, "--checkpoint-every", "20")
    try:
        params = {"input": "grqc", "optimizer": "dbd", "iterations": 150, "seed": 4}
        job, record = _kill_running_job_and_restart(svc, tmp_path, params)
        assert record["state"] == "done", record
        assert record["resumed_from"] >= 40 and record["resumed_from"] % 20 == 0
        assert record["iteration"] == 150 and len(record["kl_history"]) == 151
        # resuming from the checkpoint reproduces the uninterrupted run exactly
        stored = EmbeddingResult.load(tmp_path / "jobs" / job["id"] / "run.zarr")
        direct = scalemb.embed("grqc", optimizer="dbd", iterations=150, seed=4, n_threads=2)
        assert np.array_equal(stored.embedding, direct.embedding)
    finally:
        svc.stop()


@pytest.mark.slow
def test_transform_job_places_new_feature_rows_into_an_in_process_feature_job(service, tmp_path):
    """An in-process feature job keeps its kNN P in a data-root store that names the feature file, so a transform
    job places new rows against the job's map, as ``scalemb.placement.transform_run`` does on the stored run."""
    from scalemb.placement import transform_run
    from scalemb.placement.optimize import PlacementOptimizer

    root = service.root

    rng = np.random.default_rng(8)
    X = np.concatenate([rng.normal(size=(40, 5)) + 8 * k for k in range(2)])  # two clusters, rows 0-39 and 40-79
    new = X[[3, 45]] + 0.01 * rng.normal(size=(2, 5))
    assert service.json("PUT", "/uploads/clusters.npy", raw=_npy(X))[0] == 201
    assert service.json("PUT", "/uploads/new.npy", raw=_npy(new))[0] == 201
    _, job = service.json("POST", "/jobs", {"input": "uploads/clusters.npy", "model": "tsne", "iterations": 150,
                                            "seed": 1, "perplexity": 10.0})
    assert service.wait(job["id"])["state"] == "done"
    status, placed = service.json("POST", f"/jobs/{job['id']}/transform", {"new": "uploads/new.npy",
                                                                          "iterations": 100})
    assert status == 201, placed
    record = service.wait(placed["id"])
    assert record["state"] == "done" and record["n_points"] == 82, record
    csv = service.request("GET", f"/jobs/{placed['id']}/embedding")[1].decode().splitlines()
    assert [line.split(",")[0] for line in csv[-2:]] == ["80", "81"]  # new ids after the old ones
    source = EmbeddingResult.load(root / "jobs" / job["id"] / "run.zarr")
    result = EmbeddingResult.load(root / "jobs" / placed["id"] / "run.zarr")
    assert np.array_equal(result.embedding[:80], source.embedding)  # the old map stays fixed
    Y = source.embedding
    for row, twin in ((80, 3), (81, 45)):  # a new row lands in its twin's cluster, nearer the twin than most
        own = np.arange(40) + (40 if twin >= 40 else 0)
        other = np.setdiff1d(np.arange(80), own)
        d = np.linalg.norm(Y - result.embedding[row], axis=1)
        assert d[other].min() > d[own].max() / 2 and d[twin] < np.median(d[own])
    direct = transform_run(root / "jobs" / job["id"] / "run.zarr", root / "uploads" / "new.npy",
                           tmp_path / "direct.zarr", optimizer=PlacementOptimizer(iterations=100), n_threads=2)
    assert np.array_equal(direct.embedding, result.embedding)


@pytest.mark.slow
def test_killed_service_resumes_an_in_process_feature_job(tmp_path):
    """Killed mid-run, a feature job resumes from its checkpoint on the P in its data-root store and ends with
    the uninterrupted estimator run, bit for bit."""
    rng = np.random.default_rng(9)
    X = np.concatenate([rng.normal(size=(1000, 10)) + 5 * k for k in range(3)])
    (tmp_path / "uploads").mkdir()
    np.save(tmp_path / "uploads" / "feats.npy", X)
    svc = Service(tmp_path, "--checkpoint-every", "20")
    try:
        params = {"input": "uploads/feats.npy", "model": "tsne", "optimizer": "dbd", "iterations": 300, "seed": 4,
                  "perplexity": 20.0}
        job, record = _kill_running_job_and_restart(svc, tmp_path, params, start_timeout=120, end_timeout=180)
        assert record["state"] == "done", record
        assert record["resumed_from"] >= 40 and record["resumed_from"] % 20 == 0
        assert record["iteration"] == 300 and len(record["kl_history"]) == 301
        stored = EmbeddingResult.load(tmp_path / "jobs" / job["id"] / "run.zarr")
        here = scalemb.Embedder(model="tsne", optimizer="dbd", iterations=300, random_state=4, perplexity=20.0,
                                n_jobs=2).fit(X)
        assert np.array_equal(stored.embedding, here.embedding_)
        assert np.array_equal(stored.kl_history, here.kl_history_)
    finally:
        svc.stop()


@pytest.mark.slow
def test_jobs_run_on_a_dask_cluster(tmp_path, dask_cluster):
    svc = Service(tmp_path, "--scheduler", dask_cluster.address)
    try:
        _, job = svc.json("POST", "/jobs", {"input": "school", "model": "tsne", "iterations": 80, "seed": 1})
        record = svc.wait(job["id"])
        assert record["state"] == "done", record
        stored = EmbeddingResult.load(tmp_path / "jobs" / job["id"] / "run.zarr")
        assert stored.provenance["executor"] == "dask" and stored.provenance["scheduler"] == dask_cluster.address
        # P in 8 store partitions on the workers vs one block in-process: equal up to summation order
        here = scalemb.embed("school", model="tsne", iterations=80, seed=1)
        assert np.allclose(stored.embedding, here.embedding, rtol=1e-8, atol=1e-10)
        # a feature upload: its kNN affinity is built into a data-root store the workers read
        X = np.random.default_rng(5).normal(size=(60, 5))
        assert svc.json("PUT", "/uploads/feats.npy", raw=_npy(X))[0] == 201
        _, job = svc.json("POST", "/jobs", {"input": "uploads/feats.npy", "model": "tsne", "iterations": 40,
                                            "seed": 3, "perplexity": 10.0})
        record = svc.wait(job["id"])
        assert record["state"] == "done" and record["params"]["affinity"] == "knn", record
        assert len(list((tmp_path / "stores").glob("*.zarr"))) == 2  # school's and the features' kNN P
        stored = EmbeddingResult.load(tmp_path / "jobs" / job["id"] / "run.zarr")
        assert stored.provenance["executor"] == "dask"
        here = scalemb.Embedder(model="tsne", iterations=40, random_state=3, perplexity=10.0).fit(X)
        assert np.array_equal(stored.embedding, here.embedding_)
    finally:
        svc.stop()
