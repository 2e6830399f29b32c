"""Fault injection with real processes: SIGKILL of the service during an upload and during a job's final write,
and of a Dask worker while a cluster job's input is ingested.  Each ends with no data lost (the last complete
upload / result is there and loads) and nothing outside the data root written."""
import http.client
import os
import signal
import time

import numpy as np
import pytest

import scalemb
from scalemb.embedding import EmbeddingResult

from .test_service import TOKEN, Service


def _snapshot(directory):
    return sorted((str(p.relative_to(directory)), p.stat().st_mtime_ns, p.stat().st_size)
                  for p in directory.rglob("*"))


def _layout(tmp_path):
    """A data root, a private TMPDIR for the service and an untouchable sibling directory."""
    root, private, outside = tmp_path / "root", tmp_path / "tmp", tmp_path / "outside"
    for directory in (root, private, outside):
        directory.mkdir()
    (outside / "keep.txt").write_text("1 2\n")
    return root, private, outside


@pytest.mark.slow
def test_sigkill_during_upload_keeps_the_previous_upload(tmp_path):
    root, private, outside = _layout(tmp_path)
    before = _snapshot(outside)
    svc = Service(root, env={"TMPDIR": str(private)})
    try:
        first = b"1 2\n2 3\n3 1\n"
        assert svc.json("PUT", "/uploads/g.txt", raw=first)[0] == 201
        conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
        conn.putrequest("PUT", "/uploads/g.txt")
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.putheader("Content-Length", str(50 * 2 ** 20))
        conn.endheaders()
        for _ in range(40):
            conn.send(b"4 5\n" * 16384)
        deadline = time.monotonic() + 30
        while not list((root / "uploads").glob(".g.txt.*.part")) and time.monotonic() < deadline:
            time.sleep(0.01)
        svc.stop(signal.SIGKILL)
        conn.close()
        assert (root / "uploads" / "g.txt").read_bytes() == first
        svc.start()
        assert sorted(p.name for p in (root / "uploads").iterdir()) == ["g.txt"]  # the partial body is gone
        _, job = svc.json("POST", "/jobs", {"input": "uploads/g.txt", "model": "tsne", "iterations": 10})
        assert svc.wait(job["id"])["state"] == "done"
    finally:
        svc.stop()
    assert _snapshot(outside) == before and not list(private.iterdir())


@pytest.mark.slow
def test_sigkill_during_final_write_leaves_a_loadable_identical_result(tmp_path):
    root, private, outside = _layout(tmp_path)
    before = _snapshot(outside)
    svc = Service(root, "--checkpoint-every", "10", env={"TMPDIR": str(private)})
    try:
        _, job = svc.json("POST", "/jobs", {"input": "grqc", "model": "tsne", "iterations": 30, "seed": 3})
        run_dir = root / "jobs" / job["id"]
        deadline, killed = time.monotonic() + 120, False
        while time.monotonic() < deadline:  # the result is staged in .run.zarr.tmp-* and then swapped in
            if run_dir.exists() and any(p.name.startswith(".run.zarr.tmp-") for p in run_dir.iterdir()):
                os.kill(svc.proc.pid, signal.SIGKILL)
                killed = True
                break
            if svc.json("GET", f"/jobs/{job['id']}")[1]["state"] != "running" and \
                    svc.json("GET", f"/jobs/{job['id']}")[1]["state"] != "queued":
                break
            time.sleep(0.002)
        svc.stop(signal.SIGKILL)
        svc.start()
        record = svc.wait(job["id"])
        assert record["state"] == "done", (killed, record)
        stored = EmbeddingResult.load(run_dir / "run.zarr")
        direct = scalemb.embed("grqc", model="tsne", iterations=30, seed=3, n_threads=2)
        assert np.array_equal(stored.embedding, direct.embedding)
        assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []
    finally:
        svc.stop()
    assert _snapshot(outside) == before and not list(private.iterdir())


@pytest.mark.slow
def test_worker_killed_during_cluster_ingestion_loses_no_job(tmp_path, dask_cluster, grow_dask):
    root, private, outside = _layout(tmp_path)
    before = _snapshot(outside)
    (victim,) = grow_dask(1)  # the session cluster and a worker of this test's own, one of the three ingesting
    svc = Service(root, "--scheduler", dask_cluster.address, env={"TMPDIR": str(private)})
    try:
        assert svc.json("PUT", "/uploads/s.txt", raw=b"".join(
            f"{a} {b}\n".encode() for a, b in zip(*scalemb.datasets.school_edges())))[0] == 201
        _, job = svc.json("POST", "/jobs", {"input": "uploads/s.txt", "model": "tsne", "iterations": 40, "seed": 1})
        deadline = time.monotonic() + 60
        while not (root / "stores").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        victim.kill()
        record = svc.wait(job["id"], timeout=120)
        assert record["state"] == "done", record
        result = EmbeddingResult.load(root / "jobs" / job["id"] / "run.zarr")
        here = scalemb.embed(str(root / "uploads" / "s.txt"), model="tsne", iterations=40, seed=1)
        assert np.allclose(result.embedding, here.embedding, rtol=1e-8, atol=1e-10)
        assert len(list((root / "stores").glob("*.zarr"))) == 1
    finally:
        svc.stop()
    assert _snapshot(outside) == before and not list(private.iterdir())
