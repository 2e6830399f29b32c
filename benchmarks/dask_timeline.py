"""The tasks of a held delta-bar-delta iteration on Dask, as a timeline: which task ran on which worker, when, and
where the workers waited (issue 30's critical path).

On a ``LocalCluster`` of 2 worker processes x 1 thread, from the start layout of ``cluster.py`` (a Gaussian cloud
with the extent of a converged t-SNE map) with the default FFT grid, ``--iterations`` iterations of
delta-bar-delta (learning rate 1, no exaggeration) are run under ``distributed.get_task_stream``; the last two
iterations' tasks are printed (milliseconds from the start of the timed run: start, stop, worker, action --
``compute`` or ``transfer`` of the task's inputs -- and the task's operation, ``engine.dask_keys``), then per worker
the time it computed and the time it waited over the whole timed run.

``python benchmarks/dask_timeline.py STORE.zarr --iterations 6``
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = str(Path(__file__).resolve().parent)
if HERE in sys.path:  # benchmarks/distributed.py would shadow the ``distributed`` package
    sys.path.remove(HERE)


def main():
    from distributed import Client, LocalCluster, get_task_stream

    from scalemb.affinity import AffinityStore
    from scalemb.engine.distributed import DaskExecutor
    from scalemb.models import get_model
    from scalemb.optim import make_optimizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--iterations", type=int, default=6)
    args = ap.parse_args()
    n = AffinityStore(args.store).n_points
    start = np.random.default_rng(0).normal(size=(2, n)) * min(30.0, 0.1 * np.sqrt(n))

    def optimizer():
        return make_optimizer("dbd", "tsne", learning_rate=1.0, exaggeration=1.0, exaggeration_iterations=0)

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client, \
            DaskExecutor(args.store, get_model("tsne"), 2, 0, client, repulsion="fft") as dask:
        optimizer().optimize(dask, start, 3)  # warm-up: the workers' first tasks, the JIT
        t0 = time.time()
        with get_task_stream(client) as stream:
            optimizer().optimize(dask, start, args.iterations)
        t1 = time.time()
    per_iteration = (t1 - t0) / args.iterations
    print(f"{n:,} points: {per_iteration * 1e3:.1f} ms per iteration (with the start and the end)")
    rows, workers = [], {}
    for task in stream.data:
        key = task["key"][0] if isinstance(task["key"], tuple) else task["key"]
        operation = key.rsplit("-", 1)[0]
        for span in task["startstops"]:
            w = workers.setdefault(task["worker"], f"w{len(workers)}")
            rows.append((span["start"] - t0, span["stop"] - t0, w, span["action"], operation))
    rows.sort()
    last = rows[-1][1] - 2.2 * per_iteration
    print("| start ms | stop ms | worker | action | operation |")
    print("|---|---|---|---|---|")
    for a, b, w, action, operation in rows:
        if a >= last:
            print(f"| {a * 1e3:.1f} | {b * 1e3:.1f} | {w} | {action} | {operation} |")
    print("\n| worker | computing, s | waiting (not computing), s | tasks |")
    print("|---|---|---|---|")
    for w in sorted(workers.values()):
        busy = sum(b - a for a, b, v, action, _ in rows if v == w and action == "compute")
        count = sum(1 for *_, v, action, _ in rows if v == w and action == "compute")
        print(f"| {w} | {busy:.3f} | {t1 - t0 - busy:.3f} | {count} |")


if __name__ == "__main__":
    main()
