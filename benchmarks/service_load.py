"""Load test of ``scalemb serve`` on loopback: 20 concurrent SCHOOL jobs, then status-call latency while a GrQc
job runs.  Starts its own service (a subprocess on a free port, temporary data root) and stops it.

    python benchmarks/service_load.py --out benchmarks/results/service.md
"""
import argparse
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import scalemb

TOKEN = "load-test-token"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """One keep-alive HTTP connection to the service."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method, path, body=None):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, resp.read()

    def json(self, method, path, body=None):
        status, content = self.call(method, path, body)
        return status, json.loads(content)


def start_service(root, max_running):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", "serve", "--data-root", root, "--port", str(port),
                             "--max-running", str(max_running), "--max-queue", "64"],
                            env=dict(os.environ, SCALEMB_TOKEN=TOKEN), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if Client(port).call("GET", "/health")[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("service did not start")


def concurrent_jobs(port, n_jobs, iterations):
    """Submit ``n_jobs`` SCHOOL jobs at once, wait for all, check each against the in-process run."""
    seeds = list(range(n_jobs))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_jobs) as pool:
        submitted = list(pool.map(lambda s: Client(port).json("POST", "/jobs", {
            "input": "school", "model": "snest", "iterations": iterations, "seed": s})[1]["id"], seeds))
    client = Client(port)
    pending, records = set(submitted), {}
    while pending and time.perf_counter() - t0 < 600:
        for job_id in list(pending):
            status, record = client.json("GET", f"/jobs/{job_id}")
            if record["state"] in ("done", "failed", "cancelled"):
                records[job_id] = record
                pending.discard(job_id)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    correct = 0
    for seed, job_id in zip(seeds, submitted):
        record = records.get(job_id)
        if record is None or record["state"] != "done":
            continue
        status, content = client.call("GET", f"/jobs/{job_id}/embedding?format=npy")
        import io
        got = np.load(io.BytesIO(content))
        expected = scalemb.embed("school", model="snest", iterations=iterations, seed=seed)
        correct += bool(np.array_equal(got, expected.embedding) and record["kl"] == expected.kl)
    return {"jobs": n_jobs, "done": sum(r["state"] == "done" for r in records.values()), "correct": correct,
            "wall_s": wall}


def status_latency(port, iterations, calls):
    """Status calls (GET /jobs/{id}, with the KL history) on one keep-alive connection while GrQc runs."""
    client = Client(port)
    status, job = client.json("POST", "/jobs", {"input": "grqc", "model": "snest", "optimizer": "dbd",
                                                "iterations": iterations})
    while client.json("GET", f"/jobs/{job['id']}")[1]["state"] != "running":
        time.sleep(0.05)
    while (client.json("GET", f"/jobs/{job['id']}")[1]["iteration"] or 0) < 5:
        time.sleep(0.05)
    latencies, states, lengths = [], [], []
    for _ in range(calls):
        t = time.perf_counter()
        status, record = client.json("GET", f"/jobs/{job['id']}")
        latencies.append(time.perf_counter() - t)
        states.append(record["state"])
        lengths.append(len(record["kl_history"]))
        time.sleep(0.01)
    running = sum(s == "running" for s in states)
    final = client.json("GET", f"/jobs/{job['id']}")[1]
    if final["state"] == "running":
        client.call("DELETE", f"/jobs/{job['id']}")
    ms = np.array(latencies) * 1e3
    return {"calls": calls, "while_running": running, "p50_ms": float(np.percentile(ms, 50)),
            "p95_ms": float(np.percentile(ms, 95)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()), "history_len": (min(lengths), max(lengths)),
            "job_iteration": final["iteration"], "job_state": final["state"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="markdown report (default: print only)")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--school-iterations", type=int, default=500)
    parser.add_argument("--grqc-iterations", type=int, default=5000)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--max-running", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scalemb-load-") as root:
        proc, port = start_service(root, args.max_running)
        try:
            jobs = concurrent_jobs(port, args.jobs, args.school_iterations)
            latency = status_latency(port, args.grqc_iterations, args.calls)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    lines = [
        "# Service load test",
        "",
        f"`python benchmarks/service_load.py` — scalemb {scalemb.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; `scalemb serve` subprocess on loopback, `--max-running {args.max_running}`, "
        "in-process jobs, bearer token, client over keep-alive HTTP.",
        "",
        f"## {jobs['jobs']} concurrent SCHOOL jobs (snest R^2,1, {args.school_iterations} iterations, seeds 0..{jobs['jobs'] - 1})",
        "",
        "| submitted | done | identical to the in-process run (embedding and KL) | wall time, submit to last done |",
        "|---|---|---|---|",
        f"| {jobs['jobs']} | {jobs['done']} | {jobs['correct']} | {jobs['wall_s']:.2f} s |",
        "",
        "## Status calls while a GrQc job runs (snest, dbd, N = 5241, exact repulsion)",
        "",
        f"{latency['calls']} sequential `GET /jobs/{{id}}` calls, 10 ms apart, each returning the full KL history "
        f"({latency['history_len'][0]}–{latency['history_len'][1]} values); {latency['while_running']} of them while "
        f"the job was running (it reached iteration {latency['job_iteration']}, then was cancelled).",
        "",
        "| p50 | p95 | p99 | max | target |",
        "|---|---|---|---|---|",
        f"| {latency['p50_ms']:.2f} ms | {latency['p95_ms']:.2f} ms | {latency['p99_ms']:.2f} ms | "
        f"{latency['max_ms']:.2f} ms | p99 < 50 ms: {'met' if latency['p99_ms'] < 50 else 'NOT met'} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    ok = jobs["correct"] == jobs["jobs"] and latency["p99_ms"] < 50 and latency["while_running"] == latency["calls"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
