"""Reproduce the SNEST paper's Table 1 (SCHOOL and GrQc columns) with scalemb's defaults, beside openTSNE.

Usage: python benchmarks/table1.py [--out benchmarks/results/table1.md] [--optimizers dbd,auto]
       [--skip-sweep] [--skip-opentsne]

Prints Markdown tables: per-iteration time of the exact kernels on GrQc (median of 20), SCHOOL (best of 5
restarts) and GrQc (one run, seed 0) KL beside the paper's for each optimiser, openTSNE 1.0 on the same
GrQc P (BH repulsion, spectral init, 250 + 2000 iterations) with its exact KL, the measurements behind the
delta-bar-delta defaults, and the end-to-end wall time of ``scalemb embed`` with defaults.
openTSNE's library switches the process to flush-to-zero arithmetic when loaded, which changes later
floating-point trajectories, so it runs after every scalemb run.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import scalemb
from scalemb.datasets import grqc, school
from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.models import get_model
from scalemb.optim import DeltaBarDelta

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, timings, markdown_table  # noqa: E402

ROWS = [("sne", 2, 0), ("sne", 3, 0), ("sne", 4, 0), ("tsne", 2, 0), ("tsne", 3, 0), ("tsne", 4, 0),
        ("snest", 1, 1), ("snest", 2, 1), ("snest", 3, 1)]
PAPER = {"school": [0.52, 0.36, 0.19, 0.61, 0.58, 0.58, 0.43, 0.31, 0.29],
         "grqc": [3.19, 1.82, 1.03, 1.24, 1.14, 1.11, 2.34, 1.00, 0.88]}


def label(model, ds, dt):
    return f"{model} R^{ds}" + (f",{dt}" if dt else "")


def first_reaching(history, target):
    hits = np.nonzero(history <= target)[0]
    return int(hits[0]) if hits.size else None


def iteration_times(report, affinity):
    rows = []
    for model, ds, dt in ROWS:
        with LocalExecutor(affinity, get_model(model), ds, dt) as ex:
            coords = initial_coords(affinity.n_points, ds, dt, np.random.default_rng(0)) * 1e4
            times = timings(lambda: ex.evaluate(coords), 20)
        rows.append((label(model, ds, dt), f"{1e3 * np.median(times):.1f}", f"{1e3 * min(times):.1f}"))
    report("## One exact iteration (KL + gradient) on GrQc, N = 5241, 13.7M pairs, all threads")
    report(markdown_table(["model", "median ms", "min ms"], rows))
    report()


def table_column(report, name, affinity, restarts, optimizer):
    rows = []
    results = {}
    for (model, ds, dt), paper in zip(ROWS, PAPER[name]):
        t0 = time.perf_counter()
        res = scalemb.embed(affinity, model=model, space_dims=ds, time_dims=dt, restarts=restarts, seed=0,
                            optimizer=optimizer)
        wall = time.perf_counter() - t0
        results[(model, ds, dt)] = (res, wall)
        reach = first_reaching(res.kl_history, paper)
        rows.append((label(model, ds, dt), res.optimizer["optimizer"], paper, f"{res.kl:.4f}", f"{res.kl - paper:+.4f}",
                     res.iterations, "-" if reach is None else reach, f"{wall:.1f}",
                     " ".join(f"{k:.3f}" for k in res.restart_kls)))
    report(f"## {name.upper()} (N = {affinity.n_points}), optimizer={optimizer} with its defaults, "
           f"best of {restarts} restart(s), seed 0")
    report(markdown_table(["embedding", "optimizer", "paper KL", "scalemb KL", "diff", "iterations",
                           "iter. to reach paper",
                           "wall s", "KL per restart"], rows))
    report()
    return results


def opentsne_same_p(report, affinity, ours):
    import openTSNE
    from openTSNE.affinity import PrecomputedAffinities

    ex = LocalExecutor(affinity, get_model("tsne"), 2, 0)
    t0 = time.perf_counter()
    tsne = openTSNE.TSNE(n_jobs=len(__import__("os").sched_getaffinity(0)), negative_gradient_method="bh",
                         early_exaggeration_iter=250, n_iter=2000, random_state=0)
    emb = tsne.fit(affinities=PrecomputedAffinities(affinity.P), initialization="spectral")
    wall = time.perf_counter() - t0
    kl_open = ex.evaluate(np.ascontiguousarray(np.asarray(emb).T)).kl
    rows = [(f"openTSNE {openTSNE.__version__} (BH, spectral init, 250 EE + 2000)", 2250, f"{wall:.1f}",
             f"{kl_open:.4f}", "-", "-")]
    for optimizer, (res, wall_ours) in ours.items():
        reach = first_reaching(res.kl_history, kl_open)
        reach_s = "-" if reach is None else f"{res.seconds[reach]:.1f}"
        rows.append((f"scalemb exact, optimizer={optimizer} ({res.optimizer['optimizer']})", res.iterations,
                     f"{wall_ours:.1f}", f"{res.kl:.4f}", "-" if reach is None else reach, reach_s))
    report("## t-SNE R^2 on the same GrQc P: openTSNE vs scalemb (exact KL of both computed by scalemb)")
    report(markdown_table(["method", "iterations", "wall s", "exact KL", "iter. to openTSNE's KL", "s to it"],
                          rows))
    report()


def default_sweep(report, affinity, n_iter=2000):
    report(f"## Measurements behind the optimiser defaults (GrQc, {n_iter} iterations, seed 0)")
    rows = []
    n = affinity.n_points
    settings = [("snest", 2, 1, {"time_ratio": r}) for r in (0.01, 0.005, 0.002, 0.001)]
    settings += [("tsne", 2, 0, {"learning_rate": lr}) for lr in (n / 24, n / 12, n / 6)]
    settings += [("tsne", 2, 0, {"exaggeration": 12.0, "exaggeration_iterations": 250})]
    settings += [("snest", 2, 1, {"exaggeration": 1.0})]
    for model, ds, dt, kw in settings:
        opt = DeltaBarDelta(tol=0, **kw)
        with LocalExecutor(affinity, get_model(model), ds, dt) as ex:
            coords = initial_coords(n, ds, dt, np.random.default_rng([0, 0]))
            t0 = time.perf_counter()
            try:
                run = opt.optimize(ex, coords, n_iter)
                kl, h, backoffs = f"{run.kl:.4f}", run.kl_history, run.backoffs
            except FloatingPointError:
                kl, h, backoffs = "diverged", np.array([np.nan]), "-"
            wall = time.perf_counter() - t0
        at = lambda i: f"{h[i]:.3f}" if i < len(h) else "-"  # noqa: E731
        setting = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items())
        rows.append((label(model, ds, dt), setting, at(500), at(1000), kl, backoffs, f"{wall:.1f}"))
    report(markdown_table(["embedding", "setting", "KL@500", "KL@1000", f"KL@{n_iter}", "lr halvings", "wall s"],
                          rows))
    report("Defaults: learning rate N/12, time ratio 0.002, exaggeration 4 for 100 iterations, momentum "
           "0.5/0.8/0.9 switching at 250/1000, tol 1e-7 over 100 iterations.")
    report()


def end_to_end(report):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "grqc.zarr"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "scalemb", "embed", "--out", str(out), "--quiet"],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
    report("## End to end: `scalemb embed --out grqc.zarr` (defaults: GrQc, snest R^2,1, 5000 iterations max)")
    report(f"wall {wall:.1f} s (process start, load, embed, write); output: {proc.stdout.strip() or proc.stderr}")
    report()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the report to this file")
    parser.add_argument("--optimizers", default="dbd,auto", help="comma-separated optimizer names")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-opentsne", action="store_true")
    args = parser.parse_args()
    report = Report.start("SNEST Table 1 with scalemb")
    g = grqc()
    iteration_times(report, g)
    end_to_end(report)
    tsne_runs = {}
    for optimizer in args.optimizers.split(","):
        table_column(report, "school", school(), 5, optimizer)
        tsne_runs[optimizer] = table_column(report, "grqc", g, 1, optimizer)[("tsne", 2, 0)]
    if not args.skip_opentsne:
        opentsne_same_p(report, g, tsne_runs)
    if not args.skip_sweep:
        default_sweep(report, g)
    report.save(args.out)


if __name__ == "__main__":
    main()
