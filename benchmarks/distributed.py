"""Dask executor vs local executor: per-iteration wall time, traffic and client memory on one machine.

A synthetic co-authorship graph (``--authors`` nodes) is ingested into an affinity store in a temporary
directory.  Two child processes then time the same work on the same store partitions:

* ``local``: ``LocalExecutor`` with 2 threads (P in the process);
* ``dask``: ``DaskExecutor`` on a ``LocalCluster`` of 2 worker processes x 1 thread (P on the workers).

Each measures the median wall time of ``--evals`` KL+gradient evaluations and of ``--sd-iterations``
spectral-direction iterations (line search and distributed factorisation included), and reports its own
peak RSS (``ru_maxrss``): the Dask client must stay O(N d), never holding P.  The Dask child also reports
scheduler calls and bytes moved per evaluation.

Usage: ``python benchmarks/distributed.py --out benchmarks/results/distributed.md``
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# This file shares its name with the `distributed` package: keep its folder behind site-packages on the path
# (for `common`), so that `import distributed` finds the package, not this script.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
from common import Report, markdown_table  # noqa: E402


def child(kind: str, store: str, model: str, evals: int, sd_iterations: int, repulsion: str) -> dict:
    from scalemb.affinity import AffinityStore
    from scalemb.models import get_model
    from scalemb.optim import make_optimizer

    meta = AffinityStore(store)
    space, time_dims = (2, 1) if model == "snest" else (2, 0)
    coords = np.random.default_rng(0).normal(size=(space + time_dims, meta.n_points))
    out = {"kind": kind, "model": model, "repulsion": repulsion, "n": meta.n_points, "nnz": meta.nnz,
           "partitions": len(meta.partitions) - 1}
    cluster = client = None
    start = time.perf_counter()
    if kind == "local":
        from scalemb.engine import LocalExecutor

        executor = LocalExecutor(meta.to_affinity(verify=False), get_model(model), space, time_dims, n_threads=2,
                                 partitions=meta.partitions, repulsion=repulsion)
    else:
        from distributed import Client, LocalCluster

        from scalemb.engine.distributed import DaskExecutor

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        executor = DaskExecutor(store, get_model(model), space, time_dims, client, repulsion=repulsion)
    out["setup_s"] = time.perf_counter() - start
    executor.evaluate(coords)  # warm-up: numba caches, first transfers
    times = []
    stats_before = dict(getattr(executor, "stats", {}))
    for _ in range(evals):
        t0 = time.perf_counter()
        executor.evaluate(coords)
        times.append(time.perf_counter() - t0)
    out["eval_s"] = statistics.median(times)
    if kind == "dask":
        for key in ("calls", "bytes_sent", "bytes_received"):
            out[f"{key}_per_eval"] = (executor.stats[key] - stats_before[key]) / evals
        out["workers"] = len(client.scheduler_info()["workers"])
    init = np.random.default_rng(1).normal(size=coords.shape) * 1e-4
    t0 = time.perf_counter()
    # matrix-free spectral direction (CG, Jacobi preconditioner): the form that distributes; the default sparse
    # LU fills in badly on this graph at this N (measured: > 10 min and > 4 GB for one factorisation)
    run = make_optimizer("sd", model, solver="cg", preconditioner="jacobi").optimize(executor, init, sd_iterations)
    out["sd_iteration_s"] = (time.perf_counter() - t0) / max(run.iterations, 1)
    out["sd_kl"] = run.kl
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    executor.close()
    if client is not None:
        client.close()
        cluster.close()
    return out


def measure(kind, store, model, evals, sd_iterations, repulsion) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--store", str(store), "--model", model,
                           "--evals", str(evals), "--sd-iterations", str(sd_iterations), "--repulsion", repulsion],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--authors", type=int, default=260_000, help="default: N close to 2e5 after ingestion")
    parser.add_argument("--runs", default="tsne:exact,snest:exact,tsne:fft,snest:fft",
                        help="model:repulsion pairs, comma separated")
    parser.add_argument("--evals", type=int, default=3)
    parser.add_argument("--sd-iterations", type=int, default=3)
    parser.add_argument("--repulsion", default="exact", help=argparse.SUPPRESS)  # a child's method
    parser.add_argument("--child", choices=("local", "dask"))
    parser.add_argument("--store")
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.store, args.model, args.evals, args.sd_iterations,
                               args.repulsion)))
        return
    from scalemb.affinity import AffinityStore, ingest_edge_list
    from scalemb.io.coauthor_generator import write_coauthor_edge_list

    report = Report.start("Dask executor vs local executor (one machine)")
    with tempfile.TemporaryDirectory(prefix="scalemb-dist-") as tmp:
        edges = write_coauthor_edge_list(Path(tmp) / "edges.txt", args.authors, seed=0)
        store = ingest_edge_list(edges, Path(tmp) / "P.zarr", n_partitions=8)
        meta = AffinityStore(store)
        report(f"Synthetic co-authorship graph: {args.authors} authors -> N = {meta.n_points}, "
               f"{meta.nnz // 2} undirected edges, {len(meta.partitions) - 1} store partitions. "
               "local = LocalExecutor, 2 threads; dask = DaskExecutor on a LocalCluster of 2 worker processes "
               "x 1 thread, partitions loaded by the workers from the store. Medians of "
               f"{args.evals} evaluations; sd = mean over {args.sd_iterations} spectral-direction iterations "
               "(solver cg, Jacobi preconditioner: Laplacian products on the workers).")
        report()
        header = ["model", "repulsion", "executor", "setup s", "s / evaluation", "ratio vs local",
                  "s / sd iteration", "ratio vs local", "task batches / MB sent / MB received per evaluation",
                  "process peak RSS GB"]
        rows = []
        for model, repulsion in (run.split(":") for run in args.runs.split(",")):
            local = measure("local", store, model, args.evals, args.sd_iterations, repulsion)
            dask = measure("dask", store, model, args.evals, args.sd_iterations, repulsion)
            for r in (local, dask):
                extra = (f"{r['calls_per_eval']:.0f} / {r['bytes_sent_per_eval'] / 1e6:.1f} / "
                         f"{r['bytes_received_per_eval'] / 1e6:.1f}" if r["kind"] == "dask" else "-")
                rows.append([model, repulsion, r["kind"], f"{r['setup_s']:.1f}", f"{r['eval_s']:.2f}",
                             f"{r['eval_s'] / local['eval_s']:.2f}", f"{r['sd_iteration_s']:.2f}",
                             f"{r['sd_iteration_s'] / local['sd_iteration_s']:.2f}", extra,
                             f"{r['peak_rss_gb']:.2f}"])
            print(markdown_table(header, rows[-2:]), flush=True)
            if args.out:  # rows so far, in case a later configuration fails
                Path(args.out).write_text(report.text() + markdown_table(header, rows) + "\n")
        report(markdown_table(header, rows))
        report()
    report.save(args.out)


if __name__ == "__main__":
    main()
