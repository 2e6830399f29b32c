"""Two ``scalemb serve`` replicas on one PostgreSQL and one data root, running jobs on a real 2-worker Dask
cluster, all on loopback (issue 33's "Measure"): ``--jobs`` small t-SNE jobs (SCHOOL and uploaded edge lists)
submitted concurrently, half to each replica, then every job's status polled through both replicas until all
have ended.  Counted: jobs accepted, done, bit-identical to the in-process run of the same request (embedding and
KL history), run twice (a job claimed more than once: there are no kills here, so any second claim is a double
run), lost (accepted, then gone or never ended); status-call latency (``GET /jobs/{id}``, p50/p99/max).  With
``--soak-seconds``: then a soak keeping ``--soak-outstanding`` jobs in flight while, every uniform(``--kill-min``,
``--kill-max``) seconds, one of: SIGKILL a replica (restarted), SIGKILL a Dask worker (a new one started), or
terminate every database connection (``pg_terminate_backend``); a job taken over from a killed replica resumes
from its checkpoint (``--lease-seconds`` after the kill), which counts as a takeover, and a second claim while
the previous owner was still alive (and not fenced off) as a double run.  The PostgreSQL server is a cluster of
its own (``tests/postgres_server.py``: Debian's package).  With ``--s3``: data and results in a local
S3-compatible server (moto's server mode, ``tests/s3_server.py``, a process of its own): the 3 edge lists are
objects ``s3://BUCKET/svc/data/co<k>.txt`` the jobs name as their input (instead of uploads), the replicas run with
``--storage s3://BUCKET/svc`` (results published at ``svc/jobs/<id>/run.zarr``, and the embeddings compared are
downloaded from there), and the published results are counted.  Every process it starts is ended on exit.

    python benchmarks/service_prod.py --jobs 100 --out benchmarks/results/service_prod.md
    python benchmarks/service_prod.py --jobs 500 --soak-seconds 600 --out benchmarks/results/service_prod.md
"""
import argparse
import atexit
import os
import random
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from common import machine_description, run_description  # noqa: E402
from service_load import (Client, ClusterService, Dask, Inputs, compare, end_children, load_average,  # noqa: E402
                          request_body)

from tests.postgres_server import PostgresServer  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

ENDED = ("done", "failed", "cancelled")


def claims(server, url) -> dict:
    """job id -> the owners of its claims, in order (from the jobs' logs)."""
    out = {}
    for job_id, line in server.sql("SELECT job_id, line FROM job_log WHERE line LIKE 'claimed by %' ORDER BY seq",
                                   url.rsplit("/", 1)[1]):
        out.setdefault(job_id, []).append(line.split()[2])
    return out


class Poller(threading.Thread):
    """``GET /jobs/{id}`` of every pending job, alternating replicas, timing each call, until ``halt``."""

    def __init__(self, replicas, pending: dict, records: dict):
        super().__init__(daemon=True)
        self.replicas, self.pending, self.records = replicas, pending, records
        self.latencies, self.codes, self.halt, self.vanished = [], {}, threading.Event(), set()
        self.start()

    def run(self):
        k = 0
        while not self.halt.is_set():
            for job_id in list(self.pending):
                k += 1
                replica = self.replicas[k % len(self.replicas)]
                t = time.perf_counter()
                try:
                    status, record = Client(replica.port).json("GET", f"/jobs/{job_id}")
                except (OSError, ValueError):  # a replica being restarted
                    self.codes["no answer"] = self.codes.get("no answer", 0) + 1
                    continue
                self.latencies.append(time.perf_counter() - t)
                self.codes[status] = self.codes.get(status, 0) + 1
                if status == 404:
                    self.vanished.add(job_id)
                    self.pending.pop(job_id, None)
                if status == 200 and record["state"] in ENDED:
                    self.records[job_id] = record
                    self.pending.pop(job_id, None)
            time.sleep(0.05)


def s3_inputs(inputs, fs, prefix, n_inputs=3) -> list:
    """The edge lists ``co<k>.txt`` (as ``Inputs.upload`` makes them) put at ``PREFIX/data/co<k>.txt``: their URLs."""
    from scalemb.io.coauthor_generator import write_coauthor_edge_list

    names = []
    for k in range(n_inputs):
        local = os.path.join(inputs.directory, f"co{k}.txt")
        if not os.path.exists(local):
            write_coauthor_edge_list(local, inputs.authors, seed=k)
        fs.put_file(local, f"{prefix[5:]}/data/co{k}.txt")
        inputs.local[f"{prefix}/data/co{k}.txt"] = local
        names.append(f"{prefix}/data/co{k}.txt")
    return names


def published(fs, prefix) -> int:
    """Results published under ``PREFIX/jobs`` (a root ``zarr.json`` at ``jobs/<id>/run.zarr``)."""
    return sum(key.endswith("/run.zarr/zarr.json") for key in fs.find(f"{prefix[5:]}/jobs"))


def load_test(replicas, inputs, server, url, n_jobs, iterations, n_uploads=3, n_seeds=5, max_wait=7200,
              sources=None):
    names = ["school"] + (sources or [inputs.upload(replicas[0].port, k) for k in range(n_uploads)])
    assert None not in names, "an upload failed"
    plan = [(names[i % len(names)], (i // len(names)) % n_seeds) for i in range(n_jobs)]
    load_before = load_average()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        submitted = list(pool.map(lambda item: Client(replicas[item[0] % 2].port).json(
            "POST", "/jobs", request_body(*item[1], iterations)), enumerate(plan)))
    t_submit = time.perf_counter() - t0
    accepted = {job["id"]: plan[k] for k, (status, job) in enumerate(submitted) if status == 201}
    records, pending = {}, dict(accepted)
    poller = Poller(replicas, pending, records)
    peak = max(os.getloadavg())
    while pending and time.perf_counter() - t0 < max_wait:
        time.sleep(1)
        peak = max(peak, max(os.getloadavg()))
    poller.halt.set()
    poller.join()
    wall = time.perf_counter() - t0
    print(f"load: {len(records)} of {len(accepted)} ended in {wall:.0f} s", file=sys.stderr, flush=True)
    same = same_kl = 0
    for job_id, (name, seed) in accepted.items():
        record = records.get(job_id)
        if record is not None and record["state"] == "done":
            _, e, k = compare(replicas[0].port, job_id, record, inputs, name, seed, iterations)
            same, same_kl = same + e, same_kl + k
    for job_id, record in records.items():
        if record["state"] != "done":  # the failure's log (where an unexpected exception was raised)
            lines = Client(replicas[0].port).json("GET", f"/jobs/{job_id}/log")[1]["lines"]
            print(f"failed {job_id}: " + " | ".join(e["line"] for e in lines[-3:]), file=sys.stderr, flush=True)
    owners = claims(server, url)
    ms = np.array(poller.latencies) * 1e3
    ran = {}
    for job_id in accepted:
        for owner in owners.get(job_id, []):
            ran[owner.rsplit(":", 1)[0]] = ran.get(owner.rsplit(":", 1)[0], 0) + 1
    errors = sorted({r["error"] for r in records.values() if r["error"]})
    return {"errors": errors[:5], "submitted": n_jobs, "accepted": len(accepted), "refused": n_jobs - len(accepted),
            "done": sum(r["state"] == "done" for r in records.values()),
            "failed": sum(r["state"] == "failed" for r in records.values()),
            "lost": len(poller.vanished), "unfinished": len(accepted) - len(records) - len(poller.vanished),
            "identical": same, "identical_kl": same_kl,
            "run_twice": sum(len(owners.get(j, [])) > 1 for j in accepted),
            "never_claimed": sum(j not in owners for j in accepted), "per_replica": sorted(ran.values()),
            "wall_s": wall, "submit_s": t_submit, "calls": len(ms), "codes": poller.codes,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "load_before": load_before, "load_after": load_average(), "peak_load1": peak}


def soak(replicas, dask, server, url, inputs, seconds, iterations, outstanding, kill_every, drain, seed=0):
    rng = random.Random(seed)
    names = ["school"] + [n for n in inputs.local if n.startswith(("uploads/", "s3://"))]
    accepted, records, pending = {}, {}, {}
    kills = {"replica": 0, "worker": 0, "database connections": 0} if dask is not None else \
        {"replica": 0, "database connections": 0}
    killed_owners, post_errors = set(), 0
    poller = Poller(replicas, pending, records)
    t0 = time.perf_counter()
    next_kill = t0 + rng.uniform(*kill_every)
    while time.perf_counter() - t0 < seconds:
        while len(pending) < outstanding:
            name, job_seed = rng.choice(names), rng.randrange(3)
            replica = rng.choice(replicas)
            try:
                status, job = Client(replica.port).json("POST", "/jobs", request_body(name, job_seed, iterations))
            except (OSError, ValueError):
                status = None
            if status != 201:
                post_errors += 1
                break
            accepted[job["id"]] = (name, job_seed)
            pending[job["id"]] = (name, job_seed)
        if time.perf_counter() >= next_kill:
            kind = rng.choice(list(kills))
            if kind == "replica":
                victim = rng.choice(replicas)
                killed_owners.add(f":{victim.proc.pid}:")
                victim.kill()
                victim.start()
            elif kind == "worker":
                k = rng.randrange(len(dask.workers))
                dask.workers[k].kill()
                dask.workers[k].wait()
                dask.workers[k] = dask.worker()
            else:
                server.kill_connections(url)
            kills[kind] += 1
            next_kill = time.perf_counter() + rng.uniform(*kill_every)
            print(f"soak {time.perf_counter() - t0:.0f} s: kills {kills}, accepted {len(accepted)}, ended "
                  f"{len(records)}, load {load_average()}", file=sys.stderr, flush=True)
        time.sleep(0.5)
    end = time.perf_counter()
    while pending and time.perf_counter() - end < drain:
        time.sleep(1)
    poller.halt.set()
    poller.join()
    same = same_kl = resumed = 0
    for job_id, (name, job_seed) in accepted.items():
        record = records.get(job_id)
        if record is not None and record["state"] == "done":
            _, e, k = compare(replicas[0].port, job_id, record, inputs, name, job_seed, iterations)
            same, same_kl = same + e, same_kl + k
            resumed += record["resumed_from"] is not None
    owners = claims(server, url)
    takeovers = twice = 0
    for job_id in accepted:
        chain = owners.get(job_id, [])
        for previous in chain[:-1]:
            takeovers += 1
            twice += not any(marker in previous for marker in killed_owners)
    ms = np.array(poller.latencies) * 1e3
    return {"seconds": seconds, "accepted": len(accepted), "done": sum(r["state"] == "done" for r in
                                                                         records.values()),
            "failed": sum(r["state"] == "failed" for r in records.values()), "lost": len(accepted) - len(records),
            "identical": same, "identical_kl": same_kl, "resumed": resumed, "takeovers": takeovers,
            "run_twice": twice, "kills": kills, "post_errors": post_errors, "codes": poller.codes,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
            "errors": sorted({r["error"] for r in records.values() if r["error"]})[:5]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument("--soak-seconds", type=float, default=0)
    parser.add_argument("--soak-outstanding", type=int, default=8)
    parser.add_argument("--soak-iterations", type=int, default=300)
    parser.add_argument("--kill-min", type=float, default=20)
    parser.add_argument("--kill-max", type=float, default=60)
    parser.add_argument("--drain-seconds", type=float, default=600)
    parser.add_argument("--local", action="store_true", help="jobs run in the replicas (no Dask cluster)")
    parser.add_argument("--max-wait", type=float, default=7200, help="seconds to wait for the jobs to end")
    parser.add_argument("--s3", action="store_true", help="data and results in a local S3 server (moto_server)")
    parser.add_argument("--work-dir", default=tempfile.gettempdir())
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    atexit.register(end_children)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    directory = tempfile.mkdtemp(prefix="scalemb-prod-", dir=args.work_dir)
    os.chmod(directory, 0o755)  # the PostgreSQL cluster inside runs as the postgres user (as root)
    root = os.path.join(directory, "root")
    os.mkdir(root)
    server = PostgresServer(os.path.join(directory, "pg"))
    atexit.register(server.stop)
    url = server.create_database()
    inputs = Inputs(directory)
    dask = None if args.local else Dask(directory, 2)
    extra = ("--database", url, "--lease-seconds", str(args.lease_seconds), "--checkpoint-every", "50")
    sources = fs = prefix = None
    if args.s3:
        s3 = S3Server()
        atexit.register(s3.stop)
        os.environ.update(s3.env())  # the replicas inherit the endpoint and credentials
        prefix = s3.make_bucket("scalemb-bench") + "/svc"
        fs = s3.filesystem()
        sources = s3_inputs(inputs, fs, prefix)
        extra += ("--storage", prefix)
    replicas = [ClusterService(root, None if dask is None else dask.address, *extra, max_queue=args.jobs + 64,
                               log=os.path.join(directory, f"replica{k}.log")) for k in range(2)]
    header = [machine_description() + "  ", run_description(), ""]
    load = load_test(replicas, inputs, server, url, args.jobs, args.iterations, max_wait=args.max_wait,
                     sources=sources)
    if fs is not None:
        load["published"] = published(fs, prefix)
    print(load, file=sys.stderr, flush=True)
    soaked = None
    if args.soak_seconds:
        soaked = soak(replicas, dask, server, url, inputs, args.soak_seconds, args.soak_iterations,
                      args.soak_outstanding, (args.kill_min, args.kill_max), args.drain_seconds)
        if fs is not None:
            soaked["published"] = published(fs, prefix) - load["published"]
            soaked["leftovers"] = [k for k in fs.find(prefix[5:]) if ".tmp-" in k or ".scalemb-publishing" in k]
            print("left in the bucket:", soaked["leftovers"][:20], file=sys.stderr, flush=True)
        print(soaked, file=sys.stderr, flush=True)
    for replica in replicas:
        replica.stop()
    lines = [*header, "## Two replicas on one PostgreSQL, " + ("local executor" if args.local else
                                                              "a 2-worker Dask cluster") + " (loopback)", "",
             f"`python benchmarks/service_prod.py --jobs {args.jobs} --iterations {args.iterations} --lease-seconds "
             f"{args.lease_seconds:g}" + (" --local" if args.local else "")
             + (f" --soak-seconds {args.soak_seconds:g}" if args.soak_seconds else "") + (" --s3" if args.s3 else "")
             + "`: two `scalemb serve --database postgresql://...` replicas (`--max-running 2` each) on one data "
             "root, PostgreSQL 15 in a cluster of the benchmark's own, "
             + ("jobs run in the replicas (local executor, no Dask)" if args.local else
                "jobs on a `dask scheduler` and 2 single-threaded `dask worker` processes")
             + ("; `--storage s3://scalemb-bench/svc` on a local moto_server: SCHOOL and 3 150-author edge lists "
                "read from `s3://scalemb-bench/svc/data/`, results published at `svc/jobs/<id>/run.zarr` and "
                "downloaded from there for the comparison, t-SNE, 5 " if args.s3 else
                "; SCHOOL and 3 uploaded 150-author edge lists, t-SNE, 5 ")
             + "seeds; submitted by 32 client threads alternating replicas; status polled through both.", "",
             "| submitted | accepted | done | failed | lost | unfinished at --max-wait "
             "| identical embedding | identical KL history | run twice "
             "| jobs per replica | wall, submit to last end | submit phase | status calls | p50 | p99 | max | load "
             "before / after / peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
             f"| {load['submitted']} | {load['accepted']} | {load['done']} | {load['failed']} | {load['lost']} | "
             f"{load['unfinished']} | "
             f"{load['identical']} | {load['identical_kl']} | {load['run_twice']} | {load['per_replica']} | "
             f"{load['wall_s']:.0f} s | {load['submit_s']:.1f} s | {load['calls']} ({load['codes']}) | "
             f"{load['p50_ms']:.1f} ms | {load['p99_ms']:.1f} ms | {load['max_ms']:.0f} ms | {load['load_before']} "
             f"/ {load['load_after']} / {load['peak_load1']:.1f} |", ""]
    if "published" in load:
        lines += [f"Results published in the S3 server by the load phase: {load['published']}.", ""]
    if soaked:
        lines += [f"Soak of {soaked['seconds']:g} s with kills {soaked['kills']}: accepted {soaked['accepted']}, "
                  f"done {soaked['done']}, failed {soaked['failed']}, lost {soaked['lost']}, identical "
                  f"{soaked['identical']} (KL history {soaked['identical_kl']}), resumed {soaked['resumed']}, "
                  f"takeovers {soaked['takeovers']}, run twice {soaked['run_twice']}, POST refusals "
                  f"{soaked['post_errors']}, status codes {soaked['codes']}, status p99 {soaked['p99_ms']} ms, "
                  f"errors {soaked['errors']}."
                  + (f"  Results published in the S3 server by the soak: {soaked['published']}; temporary "
                     f"prefixes or publishing markers left: {len(soaked['leftovers'])}." if "published" in soaked
                     else ""), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(text + "\n")
    ok = load["accepted"] == load["done"] == load["identical"] and load["run_twice"] == 0 and load["lost"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
