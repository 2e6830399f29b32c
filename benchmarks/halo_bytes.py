"""Bytes the Dask halo exchange moves per evaluation on affinity stores written in different point orders.

For each store and each worker count W (a ``LocalCluster`` of W single-thread worker processes), one t-SNE R^2
evaluation with FFT repulsion (uncapped grid, a random layout of scale 5: the halo-exchange path) after a warm-up
one: the halo rows the workers receive from each other (all, and the largest per worker, / N), the rest of the
between-worker bytes (the charge grids' tree reduction and the potentials' broadcast), bytes sent to and
received from the client (``DaskExecutor.stats``).  Needs the Dask halo exchange (main at 105c7cf or later).

``python benchmarks/halo_bytes.py --stores P1e5.zarr,P1e5_partition.zarr --workers 2,4 --out halo_bytes.md``
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# benchmarks/distributed.py would shadow the ``distributed`` package: this directory goes last on the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from common import machine_description, run_description  # noqa: E402


def main():
    from distributed import Client, LocalCluster

    from scalemb.engine.distributed import DaskExecutor
    from scalemb.models import get_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--stores", required=True)
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lines = ["# Halo exchange bytes per evaluation by store point order", "", machine_description() + "  ",
             run_description(), "",
             "| store | point order | W | halo rows received / N (all; largest worker) | halo MB | grid MB between "
             "workers | MB to / from client | s per evaluation |", "|---|---|---|---|---|---|---|---|"]
    for workers in [int(w) for w in args.workers.split(",")]:
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            for path in args.stores.split(","):
                with DaskExecutor(path, get_model("tsne"), 2, 0, client, repulsion="fft") as ex:
                    n = ex.n_points
                    order = ex.store.provenance.get("point_order", {"name": "given"})["name"]
                    Y = np.random.default_rng(0).normal(scale=5.0, size=(2, n))
                    ex.evaluate(Y)
                    before = dict(ex.stats)
                    t = time.perf_counter()
                    ex.evaluate(Y)
                    seconds = time.perf_counter() - t
                    delta = {k: ex.stats[k] - before[k] for k in ("bytes_sent", "bytes_received",
                                                                  "bytes_between_workers", "halo_evaluations")}
                    assert delta["halo_evaluations"] == 1, "the evaluation did not take the halo-exchange path"
                    plan = ex._halo[0]  # the HaloPlan of the current holders
                    rows = sum(p.size for p in plan.needs.values())
                    largest = max(sum(p.size for (_, w), p in plan.needs.items() if w == u) for u in plan.workers)
                    halo_bytes = rows * Y.shape[0] * 8
                    lines.append(f"| {Path(path).name} | {order} | {workers} | {rows / n:.3f}; {largest / n:.3f} | "
                                 f"{halo_bytes / 1e6:.2f} | {(delta['bytes_between_workers'] - halo_bytes) / 1e6:.2f}"
                                 f" | {delta['bytes_sent'] / 1e6:.2f} / {delta['bytes_received'] / 1e6:.2f} | "
                                 f"{seconds:.2f} |")
                    print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
