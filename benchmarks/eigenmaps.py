"""Eigenmaps (issue 20.1-2): graph eigenmaps on GrQc and generated co-authorship graphs, local vs 2-worker Dask,
Lanczos vs LOBPCG, time / peak memory / residual of each eigenpair; kernel eigenmap and Nyström on the swiss roll
with a held-out set: out-of-sample error against recomputing with the held-out points included.

    python benchmarks/eigenmaps.py --sizes 100000 --out benchmarks/results/eigenmaps.md

Every graph run is a fresh process (its peak RSS is the run's; with Dask it is the client's: P stays on the
workers).  Graphs are generated with ``scalemb generate coauthor`` and ingested with ``scalemb affinity``
(8 partitions) once, outside the timings.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import Report, markdown_table

HERE = Path(__file__).resolve().parent


CHILD = """
import json, resource, sys, time
from scalemb.eigenmaps import Eigenmap

from scalemb.eigenmaps import graph

data, executor, method, components = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
l_sym, t0 = graph._ProjectedLaplacian.l_sym, time.perf_counter()


def progress(op, U):  # how far a run got: products so far on stderr (the parent relays it)
    if op.matvecs // 100 != (op.matvecs + U.shape[1]) // 100:
        print(f"{op.matvecs + U.shape[1]} products, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return l_sym(op, U)


graph._ProjectedLaplacian.l_sym = progress
scheduler = executor if executor.startswith("tcp://") else None
start = time.perf_counter()
model = Eigenmap(components, method=method, workers=2 if executor == "dask" else None, scheduler=scheduler).fit(data)
wall = time.perf_counter() - start
workers_mb = []
if scheduler:
    from distributed import Client
    def peak():
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with Client(scheduler) as client:
        workers_mb = sorted(client.run(peak).values())
print(json.dumps({"wall": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "workers_mb": workers_mb,
                  "eigenvalues": model.eigenvalues_.tolist(), "residuals": model.residuals_.tolist(),
                  "matvecs": model.solution_.matvecs, "graph_components": model.n_graph_components_,
                  "n": int(model.embedding_.shape[0])}))
"""


def graph_run(data, executor, method, components):
    """One graph eigenmap in a fresh process (``python -c``, run from the repository root: this folder holds a
    distributed.py benchmark that would shadow the Dask package in the process and its spawned workers)."""
    cmd = [sys.executable, "-c", CHILD, str(data), executor, method, str(components)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ), cwd=HERE.parent)
    if out.returncode != 0:
        raise RuntimeError(f"eigenmap run failed ({out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def generated_store(n, workdir: Path) -> tuple[Path, float]:
    edges = workdir / f"coauthor-{n}.txt.gz"
    store = workdir / f"coauthor-{n}.zarr"
    start = time.perf_counter()
    if not store.exists():
        subprocess.run(["scalemb", "generate", "coauthor", "--authors", str(n), "--out", str(edges), "--quiet",
                        "--overwrite"], check=True)
        subprocess.run(["scalemb", "affinity", str(edges), "--out", str(store), "--partitions", "8", "--quiet",
                        "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    return store, time.perf_counter() - start


# ------------------------------------------------------------------------------------------------ swiss roll

def swiss_roll(n, rng):
    t = 1.5 * np.pi * (1 + 2 * rng.random(n))
    h = 21 * rng.random(n)
    X = np.column_stack([t * np.cos(t), h, t * np.sin(t)])
    return X + 0.05 * rng.standard_normal(X.shape), t


def aligned_error(Y_train_map, Y_test_map, Y_train_full, Y_test_full):
    """Held-out error of a map after the affine alignment (least squares on the training rows) that removes the
    eigenvectors' sign / rotation / scale freedom; relative to the full embedding's RMS spread."""
    A = np.column_stack([Y_train_map, np.ones(len(Y_train_map))])
    coef, *_ = np.linalg.lstsq(A, Y_train_full, rcond=None)
    pred = np.column_stack([Y_test_map, np.ones(len(Y_test_map))]) @ coef
    spread = np.sqrt(np.mean(np.sum((Y_train_full - Y_train_full.mean(axis=0)) ** 2, axis=1)))
    return float(np.sqrt(np.mean(np.sum((pred - Y_test_full) ** 2, axis=1))) / spread)


def swiss_roll_rows(n, held_out, seeds):
    import scipy.sparse as sp

    from scalemb.affinity import Affinity
    from scalemb.affinity.knn import knn_graph
    from scalemb.eigenmaps import CORRECTIONS, Eigenmap, KernelEigenmap, inverse_distance_graph

    rows = []
    results = {}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        X, t = swiss_roll(n, rng)
        test = np.sort(rng.choice(n, held_out, replace=False))
        train = np.setdiff1d(np.arange(n), test)
        order = np.concatenate([train, test])
        centres = X[train][np.sort(rng.choice(train.size, 64, replace=False))]
        for correction in CORRECTIONS:
            start = time.perf_counter()
            model = KernelEigenmap(2, centres=centres, correction=correction, random_state=seed).fit(X[train])
            fit_s = time.perf_counter() - start
            start = time.perf_counter()
            y_test = model.transform(X[test])
            map_s = time.perf_counter() - start
            start = time.perf_counter()
            full = KernelEigenmap(2, centres=centres, correction=correction, random_state=seed).fit(X[order])
            refit_s = time.perf_counter() - start
            err = aligned_error(model.embedding_, y_test, full.embedding_[:train.size], full.embedding_[train.size:])
            corr = abs(np.corrcoef(y_test[:, 0], t[test])[0, 1])
            results.setdefault(f"kernel eigenmap, {correction}", []).append((err, corr, fit_s, map_s, refit_s))
        # graph eigenmap of the same inverse-distance kNN graph + Nyström for the held-out points
        start = time.perf_counter()
        W = inverse_distance_graph(X[train], 12, random_state=seed)
        eig = Eigenmap(2).fit(Affinity(W / W.sum(), np.arange(train.size)))
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        idx, dist = knn_graph(np.vstack([X[train], X[test]]), 13, random_state=seed)
        idx, dist = idx[train.size:], dist[train.size:]
        keep = idx < train.size  # neighbours among the embedded points only
        rows_new = np.repeat(np.arange(held_out), keep.sum(axis=1))
        weights = sp.csr_matrix((1.0 / np.maximum(dist[keep], 1e-12), (rows_new, idx[keep])),
                                shape=(held_out, train.size))  # Nyström normalises each row: W's scale is moot
        y_test = eig.transform(weights)
        map_s = time.perf_counter() - start
        start = time.perf_counter()
        W_all = inverse_distance_graph(X[order], 12, random_state=seed)
        full = Eigenmap(2).fit(Affinity(W_all / W_all.sum(), np.arange(n)))
        refit_s = time.perf_counter() - start
        err = aligned_error(eig.embedding_, y_test, full.embedding_[:train.size], full.embedding_[train.size:])
        corr = abs(np.corrcoef(y_test[:, 0], t[test])[0, 1])
        results.setdefault("graph eigenmap + Nyström", []).append((err, corr, fit_s, map_s, refit_s))
    for name, values in results.items():
        v = np.array(values)
        rows.append([name, f"{np.median(v[:, 0]):.4f}", f"{np.median(v[:, 1]):.3f}", f"{np.median(v[:, 2]):.2f}",
                     f"{np.median(v[:, 3]) * 1e3:.1f}", f"{np.median(v[:, 4]):.2f}",
                     f"{np.median(v[:, 4] / v[:, 3]):.0f}x"])
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--components", type=int, default=2)
    parser.add_argument("--sizes", default="100000", help="generated co-authorship graph sizes (comma separated)")
    parser.add_argument("--roll", type=int, default=2000, help="swiss roll points (10 %% held out)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/scalemb-eigenmaps-bench")
    parser.add_argument("--dask", default="GrQc", help="graphs also run on 2 Dask workers (comma separated names, "
                                                        "'all'; 'none')")
    parser.add_argument("--dask-processes", default="none",
                        help="graphs also run on a real `dask scheduler` + 2 `dask worker` processes on loopback "
                             "(names as --dask)")
    parser.add_argument("--solvers", default="lanczos,lobpcg", help="local solvers (comma separated)")
    parser.add_argument("--no-grqc", action="store_true")
    parser.add_argument("--part", choices=("all", "graph", "roll"), default="all")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = Report.start("Eigenmaps")
    if args.part in ("all", "graph"):
        graph_part(args, report)
    if args.part in ("all", "roll"):
        roll_part(args, report)
    report.save(args.out)


def graph_part(args, report):
    report("## Graph eigenmaps (bottom 2 non-trivial eigenpairs of L_sym; residual |L_sym u - lambda u|, |u| = 1)\n")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    inputs = [] if args.no_grqc else [("GrQc", "grqc", 0.0)]
    for size in [int(s) for s in args.sizes.split(",") if s]:
        store, prep = generated_store(size, workdir)
        inputs.append((f"coauthor {size}", store, prep))
    rows = []
    for name, data, prep in inputs:
        configs = [("local", method) for method in args.solvers.split(",")]
        if args.dask == "all" or name in args.dask.split(","):
            configs.append(("dask", "lanczos"))
        if args.dask_processes == "all" or name in args.dask_processes.split(","):
            configs.append(("dask processes", "lanczos"))
        for executor, method in configs:
            if executor == "dask processes":  # a fresh real cluster per run: the workers' peak RSS is this run's
                from lvq import dask_processes

                # this folder holds benchmarks/distributed.py, which would shadow the dask package (as lvq.py)
                sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != str(HERE)]
                sys.modules.pop("distributed", None)
                with dask_processes(2) as address:
                    r = graph_run(data, address, method, args.components)
                label = "dask, 2 `dask worker` processes x 1 thread"
            else:
                r = graph_run(data, executor, method, args.components)
                label = executor + (" (LocalCluster, 2 workers)" if executor == "dask" else " (2 threads)")
            row = [name, r["n"], r["graph_components"], label, method, f"{r['wall']:.1f}", f"{r['rss_mb']:.0f}",
                   " / ".join(f"{v:.0f}" for v in r["workers_mb"]) or "-", r["matvecs"],
                   ", ".join(f"{v:.3e}" for v in r["eigenvalues"]), ", ".join(f"{v:.1e}" for v in r["residuals"])]
            rows.append(row)
            print(row, flush=True)
    report(markdown_table(["graph", "N", "components", "executor", "solver", "wall s", "peak RSS MB (client)",
                           "peak RSS MB (workers)", "products (vectors)", "eigenvalues", "residuals"], rows))
    report("\nGeneration + ingest (not timed above): "
           + ", ".join(f"{name} {prep:.0f} s" for name, _, prep in inputs if prep) + "\n")


def roll_part(args, report):
    report(f"## Swiss roll, {args.roll} points, 10 % held out, 64 kernels (the same centres for both fits), "
           f"12-NN inverse-distance graph; medians of {args.seeds} seeds\n")
    report("Out-of-sample error: the held-out points' coordinates from the map fitted without them, aligned (affine "
           "least squares on the training rows) to a fit that includes them, RMS error / RMS spread of that fit. "
           "corr: |correlation| of the first coordinate with the roll angle at the held-out points.\n")
    rows = swiss_roll_rows(args.roll, args.roll // 10, args.seeds)
    report(markdown_table(["method", "out-of-sample error", "corr (held out)", "fit s", "place held-out ms",
                           "refit with them s", "refit / place"], rows))


if __name__ == "__main__":
    main()
