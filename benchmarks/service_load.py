"""Load test of ``scalemb serve`` on loopback: 20 concurrent SCHOOL jobs, then status-call latency while a GrQc
job runs.  Starts its own service (a subprocess on a free port, temporary data root) and stops it.  With
``--cluster`` instead: 200 concurrent small jobs through the cluster path (a real ``dask scheduler`` and 2
``dask worker`` processes on loopback; SCHOOL and uploaded edge lists, ingested by the service into
DATA_ROOT/stores) with status-call latency under that load, then a soak of ``--soak-seconds`` (30 min) with
random SIGKILLs of the service (restarted on the same data root) and of workers (restarted): a bounded loop on
loopback only that keeps a few jobs outstanding, counting jobs submitted / completed / bit-identical to the
in-process run of the same request / lost.  With ``--faults``: a soak of ``--faults-seconds`` of an in-process
service on a data root of its own tmpfs (root only) with the fault kinds of issue 34 -- diverging jobs, uploads
racing the submissions that read them, inputs naming the service's own files, the disk full for
``--full-seconds``, one SIGKILL and restart of the service -- counting jobs accepted / done / failed with a reason
/ lost and every ``GET /jobs`` that was not 200; the section "Service faults" of ``--out`` is replaced (the
file's other sections are kept).  Every process it starts is ended on exit.

    python benchmarks/service_load.py --out benchmarks/results/service.md
    python benchmarks/service_load.py --cluster --out benchmarks/results/service_cluster.md
    python benchmarks/service_load.py --faults --out benchmarks/results/reliability.md
"""
import argparse
import hashlib
import http.client
import io
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
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

    def call(self, method, path, body=None, raw=None):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        data = raw
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, resp.read()

    def json(self, method, path, body=None):
        status, content = self.call(method, path, body)
        return status, json.loads(content)


def poll_ended(port: int, accepted, records: dict, vanished: set, listing: dict | None = None) -> None:
    """``GET /jobs/{id}`` of every accepted job not yet ended: ended records into ``records``, 404s into
    ``vanished``; other non-200 answers counted in ``listing`` when given (else the record is read as is)."""
    client = Client(port)
    for job_id in [j for j in accepted if j not in records and j not in vanished]:
        status, record = client.json("GET", f"/jobs/{job_id}")
        if status == 404:
            vanished.add(job_id)
        elif listing is not None and status != 200:
            listing["not_200"] += 1
            listing["codes"][status] = listing["codes"].get(status, 0) + 1
        elif record["state"] in ("done", "failed", "cancelled"):
            records[job_id] = record


def start_service(root, max_running, *extra, max_queue=64):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", "serve", "--data-root", root, "--port", str(port),
                             "--max-running", str(max_running), "--max-queue", str(max_queue), *extra],
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

CHILDREN = []  # every process the cluster benchmark starts; all are ended on exit, whatever ends the benchmark


def spawn(cmd, log=None, **kwargs):
    out = open(log, "ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if log else subprocess.DEVNULL, **kwargs)
    CHILDREN.append(proc)
    return proc


def end_children():
    """SIGTERM every child still running, SIGKILL after 20 s: no scheduler, worker or service outlives us."""
    for proc in CHILDREN:
        if proc.poll() is None:
            proc.terminate()
    for proc in CHILDREN:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load_average():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class ClusterService:
    """``scalemb serve --scheduler`` as a subprocess on loopback (log appended to ``DATA_ROOT/../service.log``);
    ``kill`` is SIGKILL, ``start`` restarts it on the same data root."""

    def __init__(self, root, scheduler, *extra, max_queue=64, log=None):
        self.root, self.scheduler, self.extra, self.max_queue = root, scheduler, extra, max_queue
        self.log = log or os.path.join(os.path.dirname(self.root), "service.log")
        self.start()

    def start(self):
        self.port = free_port()
        where = ["--scheduler", self.scheduler] if self.scheduler else []  # None: jobs run in the service
        self.proc = spawn([sys.executable, "-m", "scalemb", "serve", "--data-root", self.root, "--port",
                           str(self.port), "--max-running", "2", "--max-queue", str(self.max_queue), *where,
                           *self.extra], log=self.log, env=dict(os.environ, SCALEMB_TOKEN=TOKEN))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if Client(self.port).call("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("service did not start (see service.log)")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


class Dask:
    """A ``dask scheduler`` and ``n`` single-threaded ``dask worker`` processes (no nanny) on loopback."""

    def __init__(self, directory, n_workers):
        self.file = os.path.join(directory, "scheduler.json")
        self.log = os.path.join(directory, "dask.log")
        self.scheduler = spawn(["dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                "--scheduler-file", self.file], log=self.log)
        for _ in range(600):
            if os.path.exists(self.file) and open(self.file).read().strip():
                break
            time.sleep(0.1)
        time.sleep(0.3)
        self.address = json.load(open(self.file))["address"]
        self.workers = [self.worker() for _ in range(n_workers)]

    def worker(self):
        return spawn(["dask", "worker", self.address, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host",
                      "127.0.0.1", "--memory-limit", "2GB"], log=self.log)


class Inputs:
    """The jobs' inputs: the built-in SCHOOL and small uploaded edge lists (synthetic co-authorship graphs of
    ``authors`` authors, one seed each), every one ingested by the service into ``DATA_ROOT/stores``; and the
    in-process result of each (input, seed, iterations), computed once in this process."""

    def __init__(self, directory, authors=150):
        self.directory, self.authors = directory, authors
        self.local = {"school": "school"}
        self.cache = {}

    def upload(self, port, k):
        """Upload edge list number ``k`` as ``uploads/co<k>.txt``; its name for ``POST /jobs`` (None if the PUT
        did not answer 201, e.g. the service was being restarted)."""
        from scalemb.io.coauthor_generator import write_coauthor_edge_list

        local = os.path.join(self.directory, f"co{k}.txt")
        if not os.path.exists(local):
            write_coauthor_edge_list(local, self.authors, seed=k)
        with open(local, "rb") as handle:
            raw = handle.read()
        try:
            status = Client(port).call("PUT", f"/uploads/co{k}.txt", raw=raw)[0]
        except OSError:
            return None
        if status != 201:
            return None
        self.local[f"uploads/co{k}.txt"] = local
        return f"uploads/co{k}.txt"

    def expected(self, name, seed, iterations):
        key = (name, seed, iterations)
        if key not in self.cache:
            result = scalemb.embed(self.local[name], model="tsne", iterations=iterations, seed=seed)
            self.cache[key] = result
        return self.cache[key]


def request_body(name, seed, iterations):
    return {"input": name, "model": "tsne", "iterations": iterations, "seed": seed}


def compare(port, job_id, record, inputs, name, seed, iterations):
    """(equal within rtol 1e-8, bit-identical embedding, identical KL history) of a done job vs the in-process
    run of the same request."""
    content = Client(port).call("GET", f"/jobs/{job_id}/embedding?format=npy")[1]  # fresh: keep-alive times out
    got, expected = np.load(io.BytesIO(content)), inputs.expected(name, seed, iterations)
    history = Client(port).json("GET", f"/jobs/{job_id}")[1]["kl_history"] if record is None else \
        record["kl_history"]
    return (bool(got.shape == expected.embedding.shape and np.allclose(got, expected.embedding, rtol=1e-8,
                                                                         atol=1e-10)),
            bool(np.array_equal(got, expected.embedding)),
            bool(np.array_equal(np.asarray(history, dtype=float), expected.kl_history)))


def cluster_jobs(service, inputs, n_jobs, iterations, n_uploads=3, n_seeds=5):
    """``n_jobs`` small t-SNE jobs submitted at once (16 client threads) to a service on the cluster: input
    ``i % (1 + n_uploads)`` of SCHOOL and ``n_uploads`` uploaded edge lists, seed ``(i // inputs) % n_seeds``;
    every pending job's status polled meanwhile (the latency sample)."""
    names = ["school"] + [inputs.upload(service.port, k) for k in range(n_uploads)]
    assert None not in names, "an upload failed"
    plan = [(names[i % len(names)], (i // len(names)) % n_seeds) for i in range(n_jobs)]
    load_before = load_average()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        submitted = list(pool.map(lambda job: Client(service.port).json(
            "POST", "/jobs", request_body(job[0], job[1], iterations)), plan))
    refused = [s for s, _ in submitted if s != 201]
    ids = [job["id"] for s, job in submitted if s == 201]
    t_submit = time.perf_counter() - t0
    client, latencies = Client(service.port), []
    pending, records = set(ids), {}
    peak_load = max(os.getloadavg())
    while pending and time.perf_counter() - t0 < 3600:
        for job_id in list(pending):
            t = time.perf_counter()
            status, record = client.json("GET", f"/jobs/{job_id}")
            latencies.append(time.perf_counter() - t)
            if record["state"] in ("done", "failed", "cancelled"):
                records[job_id] = record
                pending.discard(job_id)
        peak_load = max(peak_load, max(os.getloadavg()))
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    load_after = load_average()
    print(f"cluster load: {len(records)} of {n_jobs} ended in {wall:.1f} s", file=sys.stderr, flush=True)
    close = same = same_kl = 0
    for (name, seed), (status, job) in zip(plan, submitted):
        record = records.get(job.get("id"))
        if record is not None and record["state"] == "done":
            c, e, k = compare(service.port, job["id"], record, inputs, name, seed, iterations)
            close, same, same_kl = close + c, same + e, same_kl + k
    ms = np.array(latencies) * 1e3
    errors = sorted({r["error"] for r in records.values() if r["state"] != "done" and r["error"]})
    return {"jobs": n_jobs, "accepted": len(ids), "refused": len(refused),
            "done": sum(r["state"] == "done" for r in records.values()),
            "failed": sum(r["state"] != "done" for r in records.values()), "unfinished": len(pending),
            "close": close, "identical": same, "identical_kl": same_kl, "wall_s": wall, "submit_s": t_submit,
            "calls": len(ms), "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()), "inputs": names, "load_before": load_before, "load_after": load_after,
            "peak_load1": peak_load, "errors": errors[:5]}


class Killer(threading.Thread):
    """Calls ``kill_one`` every uniform(``kill_every``) seconds from its own thread, so a kill can land at any
    moment of the benchmark's requests too (a POST or an upload in flight); ``error`` holds what stopped it."""

    def __init__(self, kill_one, kill_every, rng):
        super().__init__(daemon=True)
        self.kill_one, self.kill_every, self.rng = kill_one, kill_every, rng
        self.halt, self.error = threading.Event(), None
        self.start()

    def run(self):
        try:
            while not self.halt.wait(self.rng.uniform(*self.kill_every)):
                self.kill_one()
        except Exception as exc:  # noqa: BLE001 - reported by the soak loop
            self.error = exc

    def finish(self):
        self.halt.set()
        self.join()
        if self.error:
            raise self.error


def soak(service, dask, inputs, seconds, iterations, outstanding, kill_every, drain_seconds, seed=0,
         anytime=False):
    """For ``seconds``: keep ``outstanding`` jobs queued or running (a submission whenever one ends: the rate the system
    sustains), each on SCHOOL or an uploaded edge list (a new upload every 12th submission, so ingestion into
    DATA_ROOT/stores also happens under the kills), and every ``kill_every`` (min, max) seconds SIGKILL either the
    service (restarted on the same data root: queued jobs run, running ones resume from their checkpoints) or one
    worker (a new worker started); with ``anytime`` from a separate thread (a kill may then land during the
    benchmark's own POST or upload), else between the benchmark's requests. Then wait up to ``drain_seconds`` for
    every accepted job to end, and compare each done job with the in-process run of the same request. Bounded loop,
    loopback only."""
    rng = random.Random(seed)
    names = ["school"] + [n for n in inputs.local if n.startswith("uploads/")]
    next_upload = 1000
    accepted, records, vanished = {}, {}, set()
    kills = {"service": 0, "worker": 0}
    submissions = post_errors = 0
    load_before = load_average()
    peak_load = max(os.getloadavg())
    t0 = time.perf_counter()
    next_kill = t0 + rng.uniform(*kill_every)

    def kill_one():
        if rng.random() < 0.5:
            service.kill()
            service.start()
            kills["service"] += 1
        else:
            k = rng.randrange(len(dask.workers))
            dask.workers[k].kill()
            dask.workers[k].wait()
            dask.workers[k] = dask.worker()
            kills["worker"] += 1
        print(f"soak: {time.perf_counter() - t0:.0f} s, kills {kills}, accepted {len(accepted)}, ended "
              f"{len(records)} ({sum(r['state'] == 'done' for r in records.values())} done), load "
              f"{load_average()}", file=sys.stderr, flush=True)

    killer = Killer(kill_one, kill_every, random.Random(seed + 1)) if anytime else None

    def poll():
        poll_ended(service.port, accepted, records, vanished)

    while time.perf_counter() - t0 < seconds:
        try:
            poll()
            while len(accepted) - len(records) - len(vanished) < outstanding:
                submissions += 1
                if submissions % 12 == 0:
                    name = inputs.upload(service.port, next_upload)
                    next_upload += 1
                    if name is None:
                        break
                    names.append(name)
                name, job_seed = rng.choice(names[-6:] + ["school"]), rng.randrange(3)
                status, job = Client(service.port).json("POST", "/jobs", request_body(name, job_seed, iterations))
                if status != 201:
                    post_errors += 1
                    break
                accepted[job["id"]] = (name, job_seed)
        except (OSError, ValueError, http.client.HTTPException):
            post_errors += 1
        if killer is None and time.perf_counter() >= next_kill:
            kill_one()
            next_kill = time.perf_counter() + rng.uniform(*kill_every)
        if killer is not None and killer.error:
            raise killer.error
        peak_load = max(peak_load, max(os.getloadavg()))
        time.sleep(0.5)
    if killer is not None:
        killer.finish()
    submit_end = time.perf_counter()
    while time.perf_counter() - submit_end < drain_seconds and len(records) + len(vanished) < len(accepted):
        try:
            poll()
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    load_after = load_average()
    close = same = same_kl = resumed = 0
    for job_id, (name, job_seed) in accepted.items():
        record = records.get(job_id)
        if record is not None and record["state"] == "done":
            c, e, k = compare(service.port, job_id, record, inputs, name, job_seed, iterations)
            close, same, same_kl = close + c, same + e, same_kl + k
            resumed += record["resumed_from"] is not None
    states = {}
    for state in ("queued", "running", "done", "failed", "cancelled"):  # the listing pages: its totals count
        total = Client(service.port).json("GET", f"/jobs?state={state}&limit=1")[1]["total"]
        if total:
            states[state] = total
    done = sum(r["state"] == "done" for r in records.values())
    errors = sorted({r["error"] for r in records.values() if r["state"] != "done" and r["error"]})
    return {"seconds": time.perf_counter() - t0, "submit_seconds": seconds, "submitted": len(accepted),
            "done": done, "close": close, "identical": same, "identical_kl": same_kl, "resumed": resumed,
            "lost": len(records) - done + len(vanished), "unfinished": len(accepted) - len(records) - len(vanished),
            "kills": kills, "post_errors": post_errors, "uploads": sum(n.startswith("uploads/") for n in names),
            "database": states, "errors": errors[:5], "load_before": load_before, "load_after": load_after,
            "peak_load1": peak_load, "drain_s": time.perf_counter() - submit_end}


def cluster_main(args):
    import atexit
    import shutil

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import machine_description, run_description

    atexit.register(end_children)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally blocks and atexit run
    os.makedirs(args.work_dir, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="scalemb-cluster-", dir=args.work_dir)
    root = os.path.join(directory, "root")
    os.mkdir(root)
    inputs = Inputs(directory)
    header = [machine_description() + "  ", run_description(), ""]
    load = soaked = None
    try:
        dask = Dask(directory, 2)
        if args.cluster_jobs:
            service = ClusterService(root, dask.address, max_queue=args.cluster_jobs + 16)
            try:
                load = cluster_jobs(service, inputs, args.cluster_jobs, args.cluster_iterations)
            finally:
                service.stop()
        if args.soak_seconds:
            service = ClusterService(root, dask.address, "--checkpoint-every", str(args.soak_checkpoint_every),
                                     max_queue=256)
            try:
                for k in range(3):
                    inputs.upload(service.port, k)
                soaked = soak(service, dask, inputs, args.soak_seconds, args.soak_iterations, args.soak_outstanding,
                              (args.kill_min, args.kill_max), args.drain_seconds, anytime=args.kill_anytime)
            finally:
                service.stop()
    finally:
        end_children()
    lines = ["# Service on a Dask cluster: load and soak", "", *header,
             "`scalemb serve --scheduler` subprocess (`--max-running 2`) on loopback; a real `dask scheduler` and 2 "
             "`dask worker --nthreads 1 --no-nanny` processes; inputs (the built-in SCHOOL, N = 42, and uploaded "
             f"synthetic co-authorship edge lists of {inputs.authors} authors) ingested by the service into "
             "`DATA_ROOT/stores`.  Every done job is compared with `scalemb.embed` of the same request in the "
             "benchmark's process: \"identical\" = `np.array_equal` of the embedding (and of the KL history); "
             "\"equal\" = allclose(rtol 1e-8, atol 1e-10).", ""]
    if load:
        lines += [
            f"## {load['jobs']} concurrent jobs through the cluster path (t-SNE R^2, {args.cluster_iterations} "
            f"iterations; inputs {', '.join(load['inputs'])}; seeds 0..4)",
            "",
            "| submitted | accepted | done | failed | identical embedding | identical KL history | equal | "
            "wall, submit to last done | status calls | status p50 | status p99 | max |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {load['jobs']} | {load['accepted']} | {load['done']} | {load['failed']} | {load['identical']} | "
            f"{load['identical_kl']} | {load['close']} | {load['wall_s']:.1f} s | {load['calls']} | "
            f"{load['p50_ms']:.1f} ms | {load['p99_ms']:.1f} ms | {load['max_ms']:.1f} ms |",
            "",
            f"All {load['jobs']} POSTs took {load['submit_s']:.1f} s; status calls are `GET /jobs/{{id}}` of every "
            "pending job in turn on one keep-alive connection, 20 ms pause per sweep.  Load average (1, 5, 15 "
            f"min) before: {load['load_before']}, after: {load['load_after']}; peak 1-min: "
            f"{load['peak_load1']:.2f}.",
            "",
        ]
        if load["errors"]:
            lines += ["Errors: " + "; ".join(load["errors"]), ""]
    if soaked:
        lines += [
            f"## Soak: {soaked['submit_seconds']} s of submissions with random SIGKILLs (t-SNE, "
            f"{args.soak_iterations} iterations, checkpoint every {args.soak_checkpoint_every})",
            "",
            f"{args.soak_outstanding} jobs kept queued or running (a new submission whenever one ends); inputs "
            "SCHOOL and uploaded edge lists, a new upload (ingested into DATA_ROOT/stores under the kills) every "
            f"12th submission ({soaked['uploads']} uploads in all); every {args.kill_min}-{args.kill_max} s a "
            "SIGKILL of either the service (restarted on the same data root) or one worker (a new one started). "
            f"Then up to {args.drain_seconds} s for every accepted job to end ({soaked['drain_s']:.0f} s taken).  "
            + ("Kills come from a separate thread at any moment, also during the benchmark's own POSTs and "
               "uploads" if args.kill_anytime else "A kill happens between the benchmark's own requests (the "
               "service is restarted before the next one)")
            + ", at a random point of the jobs' runs, ingestions and writes; \"resumed\" counts jobs picked up again "
            "by a restarted service (from their last checkpoint, or from the start when they had none).",
            "",
            "| submitted (201) | completed | identical embedding | identical KL history | equal | resumed after a "
            "service kill | lost (failed, cancelled or vanished) | unfinished at the drain limit | service kills | "
            "worker kills |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {soaked['submitted']} | {soaked['done']} | {soaked['identical']} | {soaked['identical_kl']} | "
            f"{soaked['close']} | {soaked['resumed']} | {soaked['lost']} | {soaked['unfinished']} | "
            f"{soaked['kills']['service']} | {soaked['kills']['worker']} |",
            "",
            f"Job database at the end (every job of this data root, also those whose POST answer was lost to a kill, "
            "and the load phase's when it ran first): "
            f"{soaked['database']} ({sum(soaked['database'].values()) - soaked['submitted']} more than the 201s seen "
            "by the benchmark).  Submissions that got no 201 (service being killed or restarting): "
            f"{soaked['post_errors']}.  Load average before: {soaked['load_before']}, after: "
            f"{soaked['load_after']}; peak 1-min: {soaked['peak_load1']:.2f}.",
            "",
        ]
        if soaked["errors"]:
            lines += ["Errors of jobs that did not complete: " + "; ".join(soaked["errors"]), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    ok = (load is None or load["identical"] == load["jobs"]) and \
        (soaked is None or (soaked["lost"] == 0 and soaked["unfinished"] == 0
                            and soaked["identical"] == soaked["submitted"]))
    if ok:
        shutil.rmtree(directory)
    else:
        print(f"kept {directory} (data root, service.log, dask.log)", file=sys.stderr)
    return 0 if ok else 1


FAULTS_HEADING = "## Service faults"


def _edge_list(rng, n_nodes):
    """A small connected graph on ``n_nodes`` nodes (a ring plus random chords), as edge-list bytes."""
    edges = {(i, (i + 1) % n_nodes) for i in range(n_nodes)}
    edges |= {tuple(sorted(rng.sample(range(n_nodes), 2))) for _ in range(2 * n_nodes)}
    return "".join(f"{a} {b}\n" for a, b in sorted(edges)).encode()


class Racer(threading.Thread):
    """Streams ``content`` to ``PUT /uploads/NAME`` in 8 slices, ``pause`` s apart, so submissions reading
    ``uploads/NAME`` happen while it streams; ``status`` is the answer (None: no answer)."""

    def __init__(self, port, name, content, pause):
        super().__init__(daemon=True)
        self.port, self.name, self.content, self.pause, self.status = port, name, content, pause, None
        self.start()

    def run(self):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            conn.putrequest("PUT", f"/uploads/{self.name}")
            conn.putheader("Authorization", f"Bearer {TOKEN}")
            conn.putheader("Content-Length", str(len(self.content)))
            conn.endheaders()
            step = -(-len(self.content) // 8)
            for k in range(0, len(self.content), step):
                conn.send(self.content[k:k + step])
                time.sleep(self.pause)
            response = conn.getresponse()
            response.read()
            self.status = response.status
            conn.close()
        except (OSError, http.client.HTTPException):
            pass


def fault_soak(service, directory, seconds, full_at, full_seconds, kill_at, drain_seconds, iterations, seed=0):
    """For ``seconds``: keep 4 jobs outstanding, each submission one of: a t-SNE job on SCHOOL or on an upload
    (its upload replaced by a racing ``Racer`` upload while it is submitted, in half of them), a diverging CO-SNE
    job (``lambda2`` 1e308), or an input naming the service's database (must be refused); from ``full_at`` for
    ``full_seconds`` the data root's file system is full (a filler file); at ``kill_at`` the service is SIGKILLed
    and restarted.  ``GET /jobs`` every 0.5 s (and at every poll) must answer 200.  Then drain; every done job's
    embedding is compared with the in-process run on the content its record names (``input_sha256``)."""
    rng = random.Random(seed)
    contents = {}  # sha256 -> local file holding that content

    def keep(content):
        key = hashlib.sha256(content).hexdigest()
        if key not in contents:
            contents[key] = os.path.join(directory, f"{key}.txt")
            with open(contents[key], "wb") as handle:
                handle.write(content)
        return key

    root = service.root
    accepted, records, vanished = {}, {}, set()
    listing = {"calls": 0, "not_200": 0, "codes": {}}
    answers = {}  # POST /jobs and PUT answers by kind and status
    racers, full, killed = [], False, False
    t0 = time.perf_counter()

    def note(kind, status):
        answers.setdefault(kind, {}).setdefault(status, 0)
        answers[kind][status] += 1

    def get_listing():
        try:
            status = Client(service.port).call("GET", "/jobs")[0]
        except (OSError, http.client.HTTPException):
            return  # the service is being restarted
        listing["calls"] += 1
        if status != 200:
            listing["not_200"] += 1
            listing["codes"][status] = listing["codes"].get(status, 0) + 1

    def poll():
        poll_ended(service.port, accepted, records, vanished, listing)

    def submit():
        kind = rng.choice(["school", "upload", "race", "race", "diverge", "own-file"])
        client = Client(service.port)
        if kind == "own-file":
            note(kind, client.call("POST", "/jobs", {"input": "jobs.sqlite3", "iterations": 5})[0])
            return
        if kind == "diverge":
            body = {"input": "school", "model": "cosne", "iterations": iterations,
                    "model_params": {"lambda2": 1e308, "warmup": 5}}
        elif kind == "school":
            body = request_body("school", rng.randrange(3), iterations)
        else:
            name = f"up{rng.randrange(3)}.txt"
            status = client.call("PUT", f"/uploads/{name}", raw=_edge_list(rng, rng.randrange(30, 80)))[0]
            note("upload", status)
            if status != 201:
                return
            if kind == "race":  # a new version of the same upload streams while the job is submitted
                racers.append(Racer(service.port, name, _edge_list(rng, rng.randrange(30, 80)), 0.05))
                time.sleep(rng.uniform(0, 0.4))
            body = request_body(f"uploads/{name}", rng.randrange(3), iterations)
        status, job = client.json("POST", "/jobs", body)
        note(kind, status)
        if status == 201:
            accepted[job["id"]] = (kind, body)

    while time.perf_counter() - t0 < seconds:
        now = time.perf_counter() - t0
        if not full and full_at <= now < full_at + full_seconds:
            fd = os.open(os.path.join(root, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                while True:
                    os.write(fd, b"\0" * 65536)
            except OSError:
                pass
            os.close(fd)
            full = True
            print(f"faults: {now:.0f} s, disk full", file=sys.stderr, flush=True)
        elif full and now >= full_at + full_seconds:
            os.remove(os.path.join(root, "filler"))
            full = False
            print(f"faults: {now:.0f} s, disk space again", file=sys.stderr, flush=True)
        if not killed and now >= kill_at:
            service.kill()
            service.start()
            killed = True
            print(f"faults: {now:.0f} s, service SIGKILLed and restarted", file=sys.stderr, flush=True)
        try:
            poll()
            get_listing()
            while len(accepted) - len(records) - len(vanished) < 4 and time.perf_counter() - t0 < seconds:
                before = len(accepted)
                submit()
                if len(accepted) == before and full:
                    break  # refused (507): try again on the next round
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    if full:
        os.remove(os.path.join(root, "filler"))
    for racer in racers:
        racer.join(60)
        note("racing upload", racer.status)
    end = time.perf_counter()
    while time.perf_counter() - end < drain_seconds and len(records) + len(vanished) < len(accepted):
        try:
            poll()
            get_listing()
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    # every done job against the in-process run of the content its record names
    identical = mismatched = 0
    reasons = {}
    for job_id, (kind, body) in accepted.items():
        record = records.get(job_id)
        if record is None:
            continue
        if record["state"] == "failed":
            reason = (record["error"] or "NO REASON").split(":")[0]
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        if record["state"] != "done":
            continue
        content = Client(service.port).call("GET", f"/jobs/{job_id}/embedding?format=npy")[1]
        sha = record["params"].get("input_sha256")
        source = "school" if sha is None else contents.get(sha)
        if source is None:  # the content of a (racing) upload: read back from its snapshot
            snap = os.path.join(root, "snapshots", f"{sha}.txt")
            with open(snap, "rb") as handle:
                source = contents[keep(handle.read())]
        expected = scalemb.embed(source, model=body["model"], iterations=body["iterations"], seed=body["seed"])
        same = np.array_equal(np.load(io.BytesIO(content)), expected.embedding)
        identical, mismatched = identical + same, mismatched + (not same)
    by_state = {}
    for record in records.values():
        by_state[record["state"]] = by_state.get(record["state"], 0) + 1
    no_reason = sum(1 for r in records.values() if r["state"] == "failed" and not r["error"])
    return {"seconds": time.perf_counter() - t0, "accepted": len(accepted), "by_state": by_state,
            "kinds": {k: sum(1 for kind, _ in accepted.values() if kind == k) for k in
                      ("school", "upload", "race", "diverge")},
            "identical": identical, "mismatched": mismatched, "reasons": reasons, "no_reason": no_reason,
            "lost": len(vanished) + no_reason + sum(1 for r in records.values() if r["state"] == "cancelled"),
            "unfinished": len(accepted) - len(records) - len(vanished), "listing": listing, "answers": answers,
            "drain_s": time.perf_counter() - end}


def faults_main(args):
    """The fault soak on a tmpfs data root (mounted here, unmounted at the end), its section written to
    ``--out``."""
    import atexit
    import shutil

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import machine_description

    atexit.register(end_children)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(args.work_dir, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="scalemb-faults-", dir=args.work_dir)
    root = os.path.join(directory, "root")
    os.mkdir(root)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.disk_mb}m", "tmpfs", root],
                             capture_output=True).returncode == 0
    if not mounted:
        print("cannot mount a tmpfs (needs root): no full-disk phase", file=sys.stderr)
    load_before = load_average()
    try:
        service = ClusterService(root, None, "--checkpoint-every", "5", max_queue=256,
                                 log=os.path.join(directory, "service.log"))
        try:
            result = fault_soak(service, directory, args.faults_seconds, args.full_at,
                                args.full_seconds if mounted else 0, args.kill_at, args.drain_seconds,
                                args.faults_iterations)
        finally:
            service.stop()
    finally:
        end_children()
        if mounted:
            subprocess.run(["umount", "-l", root])
    uname = " ".join(platform.uname())
    ok = (result["lost"] == 0 and result["unfinished"] == 0 and result["listing"]["not_200"] == 0
          and result["mismatched"] == 0)
    lines = [
        FAULTS_HEADING,
        "",
        f"`python benchmarks/service_load.py --faults --faults-seconds {args.faults_seconds} --full-at "
        f"{args.full_at} --full-seconds {args.full_seconds} --kill-at {args.kill_at} --out {args.out}`  ",
        machine_description() + "  ",
        f"`uname -a`: {uname}; nproc {os.cpu_count()}; load average before: {load_before}, after: "
        f"{load_average()} (the machine is shared with other sessions' runs).",
        "",
        f"One `scalemb serve` (in-process jobs, `--max-running 2`, `--checkpoint-every 5`) on a data root that is "
        f"its own {args.disk_mb} MB tmpfs{'' if mounted else ' (NOT mounted: no full-disk phase)'}.  For "
        f"{args.faults_seconds} s, 4 jobs kept outstanding, each submission drawn from: t-SNE on SCHOOL; t-SNE on "
        "an upload (3 names, replaced at every use); the same with a new version of that upload streaming in 8 "
        "slices while the job is submitted (\"race\"); a diverging CO-SNE job (`lambda2` 1e308, `warmup` 5); an "
        "input naming `jobs.sqlite3`.  "
        f"From {args.full_at} s for {args.full_seconds} s the file system is full (a filler file written until "
        f"ENOSPC, then deleted); at {args.kill_at} s the service is SIGKILLed and restarted on the same data root.  "
        f"`GET /jobs` every 0.5 s, and `GET /jobs/{{id}}` of every pending job.  Then up to {args.drain_seconds} s "
        f"for every accepted job to end ({result['drain_s']:.0f} s taken).  Every done job's embedding is compared "
        "with `scalemb.embed` of the content its record names (`input_sha256`: the snapshot), bit for bit.",
        "",
        "| accepted (201) | done | failed with a reason | failed without one | lost (vanished, cancelled, no "
        "reason) | unfinished | done jobs identical to the in-process run of their snapshot | `GET /jobs` calls | "
        "not 200 |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {result['accepted']} | {result['by_state'].get('done', 0)} | "
        f"{result['by_state'].get('failed', 0) - result['no_reason']} | {result['no_reason']} | {result['lost']} | "
        f"{result['unfinished']} | {result['identical']} of {result['identical'] + result['mismatched']} | "
        f"{result['listing']['calls']} | {result['listing']['not_200']} {result['listing']['codes'] or ''} |",
        "",
        f"Accepted jobs by kind: {result['kinds']}.  Failure reasons (first words): {result['reasons']}.  "
        f"Answers by kind and HTTP status (507: disk full, 403: the service's own file): {result['answers']}.",
        "",
        "Result: " + ("every accepted job ended done or failed with a reason, none lost, `GET /jobs` never "
                      "failed." if ok else "NOT MET (see the table)."),
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if args.out:
        old = open(args.out).read() if os.path.exists(args.out) else "# Reliability\n\n"
        start = old.find(FAULTS_HEADING + "\n")
        if start >= 0:
            following = old.find("\n## ", start + len(FAULTS_HEADING))
            old = old[:start] + (old[following + 1:] if following >= 0 else "")
        with open(args.out, "w") as handle:
            handle.write(old.rstrip("\n") + "\n\n" + section)
    if ok:
        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"kept {directory} (service.log)", file=sys.stderr)
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="markdown report (default: print only)")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--school-iterations", type=int, default=500)
    parser.add_argument("--grqc-iterations", type=int, default=5000)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--max-running", type=int, default=2)
    parser.add_argument("--cluster", action="store_true", help="the cluster-path load test and soak instead")
    parser.add_argument("--cluster-jobs", type=int, default=200, help="concurrent cluster-path jobs (0: none)")
    parser.add_argument("--cluster-iterations", type=int, default=10)
    parser.add_argument("--soak-seconds", type=int, default=1800, help="submission period of the soak (0: none)")
    parser.add_argument("--soak-iterations", type=int, default=20)
    parser.add_argument("--soak-checkpoint-every", type=int, default=5)
    parser.add_argument("--soak-outstanding", type=int, default=4, help="jobs kept queued or running in the soak")
    parser.add_argument("--kill-min", type=float, default=20, help="seconds between kills: uniform(min, max)")
    parser.add_argument("--kill-max", type=float, default=60)
    parser.add_argument("--kill-anytime", action="store_true",
                        help="kill from a separate thread, also during the benchmark's own requests")
    parser.add_argument("--drain-seconds", type=int, default=600, help="wait for the soak's jobs to end")
    parser.add_argument("--faults", action="store_true", help="the fault soak of issue 34 instead (root: tmpfs)")
    parser.add_argument("--faults-seconds", type=int, default=360, help="submission period of the fault soak")
    parser.add_argument("--faults-iterations", type=int, default=30)
    parser.add_argument("--full-at", type=float, default=120, help="fault soak: the disk fills at this second")
    parser.add_argument("--full-seconds", type=float, default=60, help="fault soak: and stays full this long")
    parser.add_argument("--kill-at", type=float, default=200, help="fault soak: SIGKILL + restart at this second")
    parser.add_argument("--disk-mb", type=int, default=64, help="fault soak: size of the data root's tmpfs")
    parser.add_argument("--work-dir", default=tempfile.gettempdir(),
                        help="where the run's data root and logs go (removed after a clean run)")
    args = parser.parse_args()
    if args.cluster:
        return cluster_main(args)
    if args.faults:
        return faults_main(args)
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
        f"## {jobs['jobs']} concurrent SCHOOL jobs (snest R^2,1, {args.school_iterations} iterations, "
        f"seeds 0..{jobs['jobs'] - 1})",
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
