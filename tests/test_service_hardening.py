"""Defects of ``scalemb serve`` found by trying to break it (issue 23), each reproduced against a real service."""
import os
import sqlite3
import subprocess
import sys

import pytest

from .test_service import TOKEN, Service, _free_port


def serve_once(root, *args, timeout=60):
    """Run ``scalemb serve`` expecting it to refuse to start."""
    env = dict(os.environ, SCALEMB_TOKEN=TOKEN)
    return subprocess.run([sys.executable, "-m", "scalemb", "serve", "--data-root", str(root), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def service(tmp_path):
    svc = Service(tmp_path)
    yield svc
    svc.stop()


def test_second_service_on_the_data_root_is_refused_before_touching_jobs(service, tmp_path):
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


def test_busy_port_is_one_line_status_2_and_runs_no_job(service, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    proc = serve_once(other, "--port", str(service.port))
    assert proc.returncode == 2 and "cannot listen on 127.0.0.1" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


def test_no_auth_on_a_non_loopback_host_needs_a_second_flag(tmp_path):
    proc = serve_once(tmp_path, "--insecure-no-auth", "--host", "0.0.0.0", "--port", str(_free_port()))
    assert proc.returncode == 2 and "--allow-remote-no-auth" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "jobs.sqlite3").exists()
