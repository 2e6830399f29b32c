"""The latency of Dask itself on this machine: what a held iteration on the workers pays before any work.

Issue 30 asks a Dask iteration for <= 1.15x the in-process time.  A held delta-bar-delta iteration is a chain of
dependent tasks (the workers' own rows, their box order, charges, the summed grid, the convolution, the rows'
repulsion) and two client round trips (the evaluation's partial sums, then the step formed from Z).  This script
measures, on a ``LocalCluster`` of 2 worker processes x 1 thread (the one ``cluster.py`` uses), with trivial tasks:

* a chain of 11 dependent tasks all on one worker, and alternating between the two (a hop's latency);
* the same chains carrying ~1 MB and ~10 MB arrays from task to task (a grid's transfer between workers);
* one client round trip: a task per worker submitted, waited for and gathered;

each with Dask's batched-send intervals as they are (client -> scheduler 10 ms, scheduler -> worker 5 ms,
worker -> scheduler 2 ms, scheduler -> client 2 ms: fixed in ``distributed``) and set to 1 ms on the live
objects (a probe of what the batching costs, not something scalemb does to a user's cluster).  Medians of
``--repeats`` repetitions.

Usage: ``python benchmarks/dask_latency.py [--repeats 15]``
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# benchmarks/distributed.py would shadow the package: this directory last on the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
from common import machine_description  # noqa: E402


def _zeros(n):
    return np.zeros(n)


def _plus_one(a):
    return a + 1


def _echo(x):
    return x


def _set_worker_interval(seconds, dask_worker=None):
    dask_worker.batched_stream.interval = seconds


def _set_scheduler_interval(seconds, dask_scheduler=None):
    for stream in list(dask_scheduler.stream_comms.values()) + list(dask_scheduler.client_comms.values()):
        stream.interval = seconds


def chain(client, workers, alternate: bool, doubles: int, repeats: int) -> float:
    """Median seconds per dependent task of a chain of 11 (the first makes ``doubles`` zeros)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f = client.submit(_zeros, doubles, workers=[workers[0]], pure=False)
        for i in range(10):
            f = client.submit(_plus_one, f, workers=[workers[(i + 1) % 2 if alternate else 0]], pure=False)
        f.result()
        times.append((time.perf_counter() - t) / 11)
    return statistics.median(times)


def round_trip(client, workers, repeats: int) -> float:
    """Median seconds of one client round trip: a trivial task per worker, waited for and gathered."""
    from distributed import wait

    times = []
    for r in range(repeats):
        t = time.perf_counter()
        futures = [client.submit(_echo, r, workers=[w], pure=False) for w in workers]
        wait(futures)
        client.gather(futures)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    print(machine_description())
    print()
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = list(client.scheduler_info()["workers"])
        for batching in ("Dask's own", "1 ms"):
            if batching == "1 ms":
                client.run(_set_worker_interval, 0.001)
                client.run_on_scheduler(_set_scheduler_interval, 0.001)
                client.scheduler_comm.interval = 0.001
            chain(client, workers, False, 10, 3)  # warm-up: connections, function pickles
            cells = [batching]
            for alternate, doubles in ((False, 10), (True, 10), (True, 131_072), (True, 1_310_720)):
                cells.append(f"{1e3 * chain(client, workers, alternate, doubles, args.repeats):.1f}")
            cells.append(f"{1e3 * round_trip(client, workers, 3 * args.repeats):.1f}")
            rows.append(cells)
    header = ["batched sends", "hop, same worker (ms)", "hop, alternating (ms)", "hop, alternating, 1 MB (ms)",
              "hop, alternating, 10 MB (ms)", "client round trip, 2 tasks (ms)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
