"""Defects of ``scalemb serve`` found by trying to break it (issue 23), each reproduced against a real service."""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import scalemb
from scalemb.affinity.store import write_affinity_store
from scalemb.embedding import EmbeddingResult
from scalemb.service.stores import clean_stores

from .cli_runner import run_cli
from .test_service import TOKEN, Service, _free_port


def serve_once(root, *args, timeout=60):
    """Run ``scalemb serve`` expecting it to refuse to start."""
    env = dict(os.environ, SCALEMB_TOKEN=TOKEN)
    return subprocess.run([sys.executable, "-m", "scalemb", "serve", "--data-root", str(root), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def shared(shared_service):
    """The session's ``scalemb serve`` (conftest's ``shared_service``) for the tests below that neither stop it
    nor need a data root of their own (each leaves no job running): ``service.root`` is its data root."""
    return shared_service


@pytest.mark.slow
def test_second_service_on_the_data_root_is_refused_before_touching_jobs(shared):
    service, tmp_path = shared, shared.root
    long = {"input": "grqc", "optimizer": "dbd", "iterations": 100000}
    _, job = service.json("POST", "/jobs", long)
    service.wait(job["id"], until=("running",), predicate=lambda r: (r["iteration"] or 0) >= 1)
    for port in (service.port, _free_port()):  # the busy port (as in the report), and a free one
        proc = serve_once(tmp_path, "--port", str(port))
        assert proc.returncode == 2, proc.stderr
        assert "in use by another scalemb serve" in proc.stderr and proc.stderr.count("\n") == 1
    record = service.json("GET", f"/jobs/{job['id']}")[1]
    assert record["state"] == "running" and record["resumed_from"] is None
    assert service.json("DELETE", f"/jobs/{job['id']}")[0] == 200
    assert service.wait(job["id"], timeout=30)["state"] == "cancelled"


@pytest.mark.slow
def test_busy_port_is_one_line_status_2_and_runs_no_job(shared, tmp_path):
    proc = serve_once(tmp_path, "--port", str(shared.port))
    assert proc.returncode == 2 and "cannot listen on 127.0.0.1" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_no_auth_on_a_non_loopback_host_needs_a_second_flag(tmp_path):
    # the command line in this process, the data root locked by the test: a ``serve`` that got past the check
    # would stop at once there ("in use by another scalemb serve") instead of serving
    from scalemb.service.app import lock_data_root

    held = lock_data_root(tmp_path)
    try:
        proc = run_cli("serve", "--data-root", tmp_path, "--insecure-no-auth", "--host", "0.0.0.0", "--port",
                       _free_port())
    finally:
        held.close()
    assert proc.returncode == 2 and "--allow-remote-no-auth" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "jobs.sqlite3").exists()


def _private_tmp_prefix(directory):
    """A command prefix running the service with ``directory`` mounted as a private tmpfs (its own mount
    namespace): the Dask workers then cannot see anything the service writes there, as on Kubernetes where
    the service pod's /tmp is not the workers'.  Empty where unprivileged (the store checks still apply)."""
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none "$0" && exec "$@"',
              str(directory)]
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode:
        return []
    return prefix


@pytest.mark.slow
def test_cluster_jobs_on_uploads_edge_lists_and_datasets_read_data_root_stores(tmp_path, dask_cluster):
    root = tmp_path / "root"
    root.mkdir()
    private = tmp_path / "service-tmp"
    private.mkdir()
    prefix = _private_tmp_prefix(private)
    svc = Service(root, "--scheduler", dask_cluster.address, prefix=prefix, env={"TMPDIR": str(private)})
    try:
        edges = "# t\n10 20\n20 30\n30 10\n30 40\n40 50\n50 10\n"
        assert svc.json("PUT", "/uploads/up.txt", raw=edges.encode())[0] == 201
        (root / "e.txt").write_text(edges + "50 60\n")
        jobs = {}
        for name in ("school", "uploads/up.txt", "e.txt", "school"):
            status, job = svc.json("POST", "/jobs", {"input": name, "model": "tsne", "iterations": 40, "seed": 1})
            assert status == 201, job
            jobs.setdefault(name, []).append(job["id"])
        # the upload is an input of a queued/running job: replacing it leaves the jobs their snapshot
        assert svc.json("PUT", "/uploads/up.txt", raw=b"1 2\n")[0] == 201
        for name, ids in jobs.items():
            for job_id in ids:
                record = svc.wait(job_id)
                assert record["state"] == "done", (name, record)
        stores = sorted((root / "stores").glob("*.zarr"))
        assert len(stores) == 3  # one per distinct input; the second school job reused its store
        for name, ids in jobs.items():
            result = EmbeddingResult.load(root / "jobs" / ids[0] / "run.zarr")
            assert result.provenance["executor"] == "dask"
            assert Path(result.provenance["store"]).parent == (root / "stores").resolve()
            if name == "school":
                here = scalemb.embed("school", model="tsne", iterations=40, seed=1)
                # the store's data-determined row-block layout: bit-identical to the in-process run
                assert np.array_equal(result.embedding, here.embedding)
                assert np.array_equal(result.kl_history, here.kl_history)
        assert not list(private.iterdir())  # nothing was left in the service's temporary directory
    finally:
        svc.stop()
    # the cleaning rule: unused and last used over ttl ago -> deleted
    old = time.time() - 3 * 3600
    os.utime(stores[0], (old, old))
    assert clean_stores(root, [], ttl_hours=1) == [stores[0]]
    assert sorted((root / "stores").glob("*.zarr")) == stores[1:]
    os.utime(stores[1], (old, old))
    assert clean_stores(root, [str(stores[1])], ttl_hours=1) == []  # in use by a job: kept


def _chunked_post(port, path, chunks, token=TOKEN):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=iter(chunks), encode_chunked=True,
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}",
                              "Transfer-Encoding": "chunked"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.slow
def test_limits_and_validation_are_early_one_line_and_never_echo(shared):
    service, tmp_path = shared, shared.root
    filler = b"A" * 65536
    status, body = _chunked_post(service.port, "/jobs", [b'{"input": "school", "bogus": "'] + [filler] * 80 +
                                 [b'"}'])
    assert status == 413 and len(body) < 500 and b"AAAA" not in body
    for request, fragment in (({"input": "school", "seed": -1}, "seed"),
                              ({"input": "school", "model": "tsne", "time": 1}, "time dimensions"),
                              ({"input": "school", "model": "tsne", "space": 16, "repulsion": "fft"}, "fft"),
                              ({"input": "school", "bogus": "B" * 30000}, "bogus")):
        status, err = service.json("POST", "/jobs", request)
        assert status == 422 and isinstance(err["detail"], str) and fragment in err["detail"], err
        assert "\n" not in err["detail"] and "BBBB" not in err["detail"]
    for raw in (json.dumps({"input": "x" * 5000}).encode(), b'{"input": "a\\ud800b"}'):
        status, content, headers = service.request("POST", "/jobs", raw=raw,
                                                   headers={"Content-Type": "application/json"})
        assert status == 400 and headers["content-type"] == "application/json", (status, content[:200])
    uploads = set((tmp_path / "uploads").iterdir()) if (tmp_path / "uploads").is_dir() else set()
    assert service.request("PUT", "/uploads/nl.txt%0A", raw=b"1 2\n")[0] == 400
    assert (set((tmp_path / "uploads").iterdir()) if (tmp_path / "uploads").is_dir() else set()) == uploads
    # a failing job's error names the input relative to the data root
    assert service.json("PUT", "/uploads/bad-cell.txt", raw=b"1 2\n2 x\n")[0] == 201
    _, job = service.json("POST", "/jobs", {"input": "uploads/bad-cell.txt", "iterations": 5})
    record = service.wait(job["id"])
    assert record["state"] == "failed" and "uploads/bad-cell.txt:2" in record["error"]
    assert str(tmp_path) not in json.dumps(record)


@pytest.mark.slow
def test_store_with_arrays_symlinked_outside_the_data_root_is_refused(shared, school_affinity):
    service, tmp_path = shared, shared.root
    outside = tmp_path.parent / f"{tmp_path.name}-outside-store"
    outside.mkdir()
    write_affinity_store(outside / "P.zarr", school_affinity, n_partitions=2)
    inside = tmp_path / "P.zarr"
    inside.mkdir()
    try:  # removed at the end: the data root is the session service's, and its other tests see no escaping link
        for entry in (outside / "P.zarr").iterdir():
            if entry.name == "data":
                (inside / "data").symlink_to(entry)
            elif entry.is_dir():
                shutil.copytree(entry, inside / entry.name)
            else:
                shutil.copy(entry, inside / entry.name)
        status, err = service.json("POST", "/jobs", {"input": "P.zarr", "iterations": 5})
        assert status == 403 and "outside the data root" in err["detail"]
    finally:
        shutil.rmtree(inside)


@pytest.mark.slow
def test_cancel_survives_kill_9(tmp_path):
    svc = Service(tmp_path, "--checkpoint-every", "5")
    try:
        _, job = svc.json("POST", "/jobs", {"input": "grqc", "optimizer": "dbd", "iterations": 100000})
        svc.wait(job["id"], until=("running",), predicate=lambda r: (r["iteration"] or 0) >= 6)
        assert svc.json("DELETE", f"/jobs/{job['id']}")[1]["state"] in ("cancelling", "cancelled")
        svc.stop(signal.SIGKILL)
        svc.start()
        record = svc.wait(job["id"], timeout=30)
        assert record["state"] == "cancelled", record
        time.sleep(1.0)
        assert svc.json("GET", f"/jobs/{job['id']}")[1]["state"] == "cancelled"
        assert not (tmp_path / "jobs" / job["id"] / "run.zarr").exists()
    finally:
        svc.stop()


@pytest.mark.slow
def test_upload_replaced_while_a_job_reads_it_leaves_the_job_its_snapshot(shared):
    service, root = shared, shared.root
    edges = "".join(f"{i} {i + 1}\n{i} {(i * 7 + 3) % 300}\n" for i in range(300)).encode()
    assert service.json("PUT", "/uploads/busy.txt", raw=edges)[0] == 201
    _, job = service.json("POST", "/jobs", {"input": "uploads/busy.txt", "optimizer": "dbd",
                                            "iterations": 100000})
    service.wait(job["id"], until=("running",), predicate=lambda r: (r["iteration"] or 0) >= 1)
    assert service.json("PUT", "/uploads/busy.txt", raw=b"1 2\n")[0] == 201  # jobs read snapshots (issue 34)
    assert (root / "uploads" / "busy.txt").read_bytes() == b"1 2\n"
    record = service.json("GET", f"/jobs/{job['id']}")[1]
    assert record["state"] == "running"
    snapshots = list((root / "snapshots").glob(f"{record['params']['input_sha256']}.txt"))
    assert [p.read_bytes() for p in snapshots] == [edges]
    assert service.json("DELETE", f"/jobs/{job['id']}")[0] == 200
    assert service.wait(job["id"], timeout=30)["state"] == "cancelled"
