"""Both Dask workers SIGKILLed at once, at random moments of a small checkpointed run (issue 34, M1).

A scheduler and two ``dask worker`` processes with their nannies (which restart a killed worker) on loopback; an
affinity store of a generated co-authorship graph.  First one uninterrupted ``scalemb embed --scheduler`` run: the
reference result and its duration D.  Then ``--tries`` runs, each with the worker processes of both nannies
SIGKILLed together at a moment drawn uniformly from [1 s, 0.8 D] after the run's start (seeded; drawn again
when the run had already ended).  Each run must end
one of two ways: exit 0 with a result bit-identical to the reference ("recovered"), or exit 4 within the
recovery deadline of the kill with its last checkpoint readable ("exit 4").  A run still going ``--hang`` seconds
after the kill is killed and counted as a hang; anything else is a failure.

``--gone``: the nannies are killed with their workers, so no worker comes back: every run must exit 4 within the
recovery deadline of the kill.

    python benchmarks/reliability_dask.py [--tries 10] [--authors 1500] [--iterations 30] [--seed 0] [--gone]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/distributed.py would shadow it


def children(pid: int) -> list:
    """Process ids whose parent is ``pid`` (a nanny's worker process)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


class Cluster:
    """A scheduler and two nanny-supervised single-threaded workers."""

    def __init__(self, directory: Path, n_workers: int = 2):
        from distributed import Client

        file = directory / "scheduler.json"
        self.scheduler = subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                           "--no-dashboard", "--scheduler-file", str(file)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not file.exists() or not file.read_text().strip():
            time.sleep(0.1)
        time.sleep(0.3)
        self.address = json.loads(file.read_text())["address"]
        self.n_workers = n_workers
        self._start_nannies()
        self.client = Client(self.address, timeout=30)
        self.wait()

    def wait(self, timeout: float = 120) -> None:
        self.client.wait_for_workers(self.n_workers, timeout=timeout)

    def _start_nannies(self) -> None:
        self.nannies = [subprocess.Popen(["dask", "worker", self.address, "--nthreads", "1", "--no-dashboard",
                                          "--host", "127.0.0.1", "--memory-limit", "2GB"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        for _ in range(self.n_workers)]

    def kill_workers(self, gone: bool = False) -> list:
        """SIGKILL every nanny's worker process at once (``gone``: the nannies first, so none comes back)."""
        victims = [c for n in self.nannies for c in children(n.pid)
                   if not any(t in Path(f"/proc/{c}/cmdline").read_bytes() for t in (b"resource_tracker",
                                                                                       b"forkserver"))]
        if gone:
            for nanny in self.nannies:
                nanny.kill()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        if gone:
            for nanny in self.nannies:
                nanny.wait()
        return victims

    def restart(self) -> None:
        """New nannies after a ``gone`` kill."""
        for nanny in self.nannies:
            if nanny.poll() is None:
                nanny.kill()
                nanny.wait()
        self._start_nannies()

    def close(self) -> None:
        self.client.close()
        for proc in self.nannies + [self.scheduler]:
            proc.terminate()
        for proc in self.nannies + [self.scheduler]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def embed(store: Path, out: Path, address: str, iterations: int) -> subprocess.Popen:
    return subprocess.Popen(["scalemb", "embed", str(store), "--model", "snest", "--optimizer", "sd", "--seed", "3",
                             "--iterations", str(iterations), "--tol", "0", "--scheduler", address,
                             "--checkpoint-every", "10", "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--authors", type=int, default=1500)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gone", action="store_true",
                        help="kill the nannies too: no worker comes back, every run must exit 4 in time")
    parser.add_argument("--hang", type=float, default=400.0, help="seconds after the kill counted as a hang")
    args = parser.parse_args()

    from scalemb.embedding import EmbeddingResult
    from scalemb.engine.dask_recovery import RECOVERY_TIMEOUT
    from scalemb.store.checkpoint import read_checkpoint
    from scalemb.io.coauthor_generator import write_coauthor_edge_list

    work = Path(tempfile.mkdtemp(prefix="scalemb-reliability-dask-"))
    rng = random.Random(args.seed)
    cluster, proc = None, None
    try:
        edges = write_coauthor_edge_list(work / "edges.txt", args.authors, seed=4)
        store = work / "P.zarr"
        subprocess.run(["scalemb", "affinity", str(edges), "--out", str(store), "--quiet"], check=True)
        cluster = Cluster(work)
        started = time.monotonic()
        ref = embed(store, work / "reference.zarr", cluster.address, args.iterations)
        _, err = ref.communicate()
        duration = time.monotonic() - started
        assert ref.returncode == 0, err
        reference = EmbeddingResult.load(work / "reference.zarr")
        print(f"reference: {duration:.1f} s, KL {reference.kl:.6f}; recovery deadline {RECOVERY_TIMEOUT:.0f} s",
              flush=True)
        counts = {"recovered": 0, "exit 4": 0, "hang": 0, "failed": 0}
        k, missed = 0, 0
        while k < args.tries:
            if args.gone:
                cluster.restart()
            cluster.wait()
            out = work / f"run{k}.zarr"
            delay = rng.uniform(1.0, 0.8 * duration)
            started = time.monotonic()
            proc = embed(store, out, cluster.address, args.iterations)
            while time.monotonic() - started < delay and proc.poll() is None:
                time.sleep(0.05)
            killed_at = time.monotonic()
            victims = cluster.kill_workers(args.gone) if proc.poll() is None else []
            if not victims:  # the run ended before the moment drawn (the machine's load varies): draw again
                proc.communicate()
                missed += 1
                shutil.rmtree(out, ignore_errors=True)
                continue
            k += 1
            try:
                _, err = proc.communicate(timeout=args.hang)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                outcome = "hang"
            else:
                after = time.monotonic() - killed_at
                if proc.returncode == 0:
                    got = EmbeddingResult.load(out)
                    same = np.array_equal(got.embedding, reference.embedding) and got.kl == reference.kl and \
                        np.array_equal(got.kl_history, reference.kl_history)
                    outcome = "recovered" if same else "failed"
                elif proc.returncode == 4:
                    try:  # the last checkpoint (None: stopped before the first one) reads back; no store: the
                        # run stopped while connecting, before it wrote anything
                        if out.exists():
                            read_checkpoint(out)
                        intact = True
                    except Exception as exc:  # noqa: BLE001 - reported as a failure
                        intact, err = False, f"{err}\nunreadable checkpoint: {exc}"
                    outcome = "exit 4" if intact and after <= RECOVERY_TIMEOUT + 30 else "failed"
                else:
                    outcome = "failed"
            counts[outcome] += 1
            last = err.strip().splitlines()[-1] if err.strip() else ""
            print(f"try {k}: kill at {delay:5.1f} s ({len(victims)} processes), rc {proc.returncode}, "
                  f"{time.monotonic() - killed_at:5.1f} s after the kill: {outcome}  {last[:150]}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
        print("outcomes:", ", ".join(f"{k} {v}" for k, v in counts.items()), f"(kill moments redrawn: {missed})")
        return 0 if counts["hang"] == 0 and counts["failed"] == 0 else 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
