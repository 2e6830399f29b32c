"""Concurrent spectral-direction runs (``optimizer='sd'``, LU solves) sharing one 2-worker Dask cluster.

Starts a ``dask scheduler`` and two single-threaded ``dask worker`` processes (their logs in ``--dir``), runs
``--jobs`` threads each embedding ``--input`` ``--rounds`` times, stops after ``--limit`` seconds, and prints one
table row: runs finished, errors, runs still going, and how many times the workers logged ``SuperLU`` (a
curvature factorisation that failed to move between workers).

    PYTHONPATH=$PWD python benchmarks/dask_shared_sd.py --jobs 4 --input /work/shared/data/ca-GrQc.txt
"""
import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]  # distributed.py: a benchmark
from common import local_dask_cluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--input", default="school")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--limit", type=float, default=240.0, help="seconds before the runs still going are abandoned")
    ap.add_argument("--dir", default=None, help="where the scheduler's and workers' logs go")
    args = ap.parse_args()

    import scalemb

    d = Path(args.dir or tempfile.mkdtemp(prefix="dask-shared-sd-"))
    cluster = local_dask_cluster(2, d, "2GB")
    address = cluster.__enter__()  # left running: the process ends with os._exit below
    done, errors = [], []

    def job(seed):
        for _ in range(args.rounds):
            try:
                scalemb.embed(args.input, model="tsne", optimizer="sd", iterations=args.iterations, seed=seed,
                              scheduler=address)
                done.append(seed)
            except Exception as exc:  # noqa: BLE001 - counted and shown
                errors.append(repr(exc))

    threads = [threading.Thread(target=job, args=(i,), daemon=True) for i in range(args.jobs)]
    start = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and time.monotonic() - start < args.limit:
        time.sleep(1)
    superlu = sum((d / f"worker{i}.log").read_text().count("SuperLU") for i in range(2))
    print("| jobs x rounds | finished | errors | still running | 'SuperLU' in worker logs | seconds |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.jobs} x {args.rounds} | {len(done)} | {len(errors)} | {sum(t.is_alive() for t in threads)} | "
          f"{superlu} | {time.monotonic() - start:.0f} |", flush=True)
    for err in errors[:3]:
        print(err)
    cluster.__exit__(None, None, None)
    os._exit(0)  # threads stuck in a hang must not keep the process


if __name__ == "__main__":
    main()
