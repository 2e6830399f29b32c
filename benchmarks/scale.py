"""Issue 22 measurements: the spectral direction's linear solve at 1e4-1e6 nodes, sd runs against dbd, and
repulsion='auto' by predicted cost.

Inputs: affinity stores of generated co-authorship graphs (``scalemb generate coauthor --authors N --out e.txt.gz``,
``scalemb affinity e.txt.gz --out P.zarr``), given as ``--stores``.

Sections:
* ``solvers``: the curvature ``L(C) + mu I`` of t-SNE R^2 at the default start (the first sd iteration, the
  one that never finished at 7.7e5 nodes) per store: sparse LU (SuperLU, minimum degree; run in a child process
  killed after ``--lu-timeout`` s), smoothed-aggregation AMG (pyamg) and Jacobi: set-up seconds, then PCG on
  the row-block Laplacian products to relative residual 1e-3 (the optimiser's ``cg_tol``): iterations, seconds.
* ``runs``: t-SNE R^2 on ``--run-stores`` with dbd (defaults) and sd with each solver, at most ``--iterations``
  iterations: iterations and seconds until dbd's final KL is reached.
* ``repulsion``: layouts of a dbd t-SNE run (every ``--layout-every`` iterations) on ``--repulsion-stores``
  and GrQc: exact and fft evaluation on each (seconds, median of 3 below 20000 points), what
  ``repulsion='auto'``'s cost model predicts and picks (below ``AUTO_FFT_MIN_POINTS`` it stays exact).

``python benchmarks/scale.py --stores P10000.zarr,P100000.zarr,P1000000.zarr --out benchmarks/results/scale.md``
"""
import argparse
import multiprocessing
import time

import numpy as np

from common import machine_description, run_description, timings
from scalemb.affinity.store import AffinityStore
from scalemb.embedding import initial_coords, load_affinity
from scalemb.engine.local import LocalExecutor
from scalemb.models import get_model
from scalemb.optim import DeltaBarDelta, LineSearchDescent
from scalemb.optim.solvers import FactorizedSolver, MultigridPreconditioner, jacobi_preconditioner, pcg
from scalemb.repulsion.fft import FFTParams
from scalemb.repulsion.method import AUTO_FFT_MIN_POINTS, AutoRepulsion


def executor_for(path, repulsion="auto"):
    store = AffinityStore(path)
    affinity = store.to_affinity()
    return LocalExecutor(affinity, get_model("tsne"), 2, 0, partitions=store.partitions, repulsion=repulsion)


def _lu_child(L, mu, queue):
    t = time.perf_counter()
    FactorizedSolver(L, mu)
    queue.put(time.perf_counter() - t)


def lu_setup_seconds(L, mu, timeout):
    """Seconds of the LU factorisation in a child process, or None if it did not finish within ``timeout``."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_lu_child, args=(L, mu, queue))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.terminate()
        child.join()
        return None
    return queue.get() if not queue.empty() else None


def solvers_section(stores, lu_timeout, lines):
    lines += ["## Linear solve of the first sd iteration (t-SNE R^2, default start), PCG to relative residual 1e-3",
              "| graph | N | nnz(P) | method | set-up s | CG iterations | solve s | s per CG iteration |",
              "|---|---|---|---|---|---|---|---|"]
    for path in stores:
        ex = executor_for(path)
        n = ex.n_points
        coords = initial_coords(n, 2, 0, np.random.default_rng(0))
        rhs = -ex.evaluate(coords).gradient
        ex.set_curvature(coords)
        diagonal = ex.curvature_diagonal()
        mu = 1e-5 * float(diagonal.mean())
        L = ex.curvature_matrix()
        name = str(path).rstrip("/").split("/")[-1]
        lu = lu_setup_seconds(L, mu, lu_timeout)
        if lu is None:
            lines.append(f"| {name} | {n} | {L.nnz - n} | lu (SuperLU, MMD) | > {lu_timeout:.0f} (killed) | - | - "
                         "| - |")
        else:
            f = FactorizedSolver(L, mu)
            t = time.perf_counter()
            f.solve(rhs)
            lines.append(f"| {name} | {n} | {L.nnz - n} | lu (SuperLU, MMD) | {lu:.2f} | exact | "
                         f"{time.perf_counter() - t:.3f} | - |")
        for method in ("amg", "jacobi"):
            t = time.perf_counter()
            precondition = (MultigridPreconditioner(L, mu).solve if method == "amg"
                            else jacobi_preconditioner(diagonal, mu))
            setup = time.perf_counter() - t
            t = time.perf_counter()
            cg = pcg(ex.laplacian_matvec, rhs, precondition, mu, tol=1e-3, maxiter=1000)
            solve = time.perf_counter() - t
            lines.append(f"| {name} | {n} | {L.nnz - n} | {method} | {setup:.2f} | {cg.iterations} | {solve:.2f} | "
                         f"{solve / max(1, cg.iterations):.3f} |")
            print(lines[-1], flush=True)
        ex.close()
    lines.append("")


def _reach(result, target):
    hit = np.flatnonzero(result.kl_history <= target)
    return (int(hit[0]), float(result.seconds[hit[0]])) if hit.size else (None, None)


def runs_section(stores, iterations, lines):
    lines += [f"## t-SNE R^2 runs (at most {iterations} iterations, default start, seed 0): iterations and seconds "
              "to dbd's final KL",
              "| graph | N | optimizer | iterations | seconds | final KL | iterations to dbd's KL | "
              "seconds to dbd's KL | evaluations |", "|---|---|---|---|---|---|---|---|---|"]
    for path in stores:
        name = str(path).rstrip("/").split("/")[-1]
        optimizers = [("dbd", DeltaBarDelta()), ("sd auto", LineSearchDescent()),
                      ("sd cg + amg", LineSearchDescent(solver="cg", preconditioner="amg")),
                      ("sd cg + jacobi", LineSearchDescent(solver="cg", preconditioner="jacobi"))]
        target = None
        for label, opt in optimizers:
            with executor_for(path) as ex:
                n = ex.n_points
                if label == "sd auto":
                    label += f" ({'/'.join(opt.methods(n))})"
                coords = initial_coords(n, 2, 0, np.random.default_rng(0))
                res = opt.optimize(ex, coords, iterations)
            if target is None:
                target = res.kl
            it, sec = _reach(res, target)
            lines.append(f"| {name} | {n} | {label} | {res.iterations} | {res.seconds[-1]:.1f} | {res.kl:.4f} | "
                         f"{'-' if it is None else it} | {'-' if sec is None else f'{sec:.1f}'} | {res.evaluations} |")
            print(lines[-1], flush=True)
    lines.append("")


def _timed(fn, repeats=1):
    return float(np.median(timings(fn, repeats, warm_up=False)))


def repulsion_section(stores, iterations, every, lines):
    lines += [f"## repulsion='auto' on the layouts of a dbd t-SNE R^2 run (every {every} iterations of "
              f"{iterations}): one evaluation each, seconds",
              "| graph | N | iteration | extent | fft grid | near pairs | exact s | fft s | faster | "
              "predicted exact s | "
              "predicted fft s | cost model picks (fresh / in sequence; exact below the 10000-point floor) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for path in stores:
        if path == "grqc":
            affinity = load_affinity(None)
            make = lambda rep: LocalExecutor(affinity, get_model("tsne"), 2, 0, repulsion=rep)  # noqa: E731
            name = "GrQc"
        else:
            make = lambda rep, path=path: executor_for(path, rep)  # noqa: E731
            name = str(path).rstrip("/").split("/")[-1]
        layouts = _layouts(make, iterations, every)
        n = layouts[0][1].shape[1]
        auto = AutoRepulsion("tsne", 2, 0, FFTParams().resolved("tsne", 2))
        floor = AUTO_FFT_MIN_POINTS[2]
        totals = {"exact": 0.0, "fft": 0.0, "auto": 0.0, "best": 0.0}
        with make("exact") as exact, make("fft") as fft:
            for it, Y in layouts:
                te = _timed(lambda: exact.evaluate(Y), 3 if n < 20000 else 1)
                tf = _timed(lambda: fft.evaluate(Y), 3 if n < 20000 else 1)
                fresh = AutoRepulsion("tsne", 2, 0, FFTParams().resolved("tsne", 2)).predict(Y)
                fresh_pick = "fft" if fresh.fft_seconds < fresh.exact_seconds else "exact"
                pick = auto.choose(Y).method if n >= floor else "exact"
                totals["exact"] += te
                totals["fft"] += tf
                totals["auto"] += te if pick == "exact" else tf
                totals["best"] += min(te, tf)
                extent = float(np.max(Y.max(axis=1) - Y.min(axis=1)))
                capped = " capped" if fresh.grid.capped else ""
                lines.append(f"| {name} | {n} | {it} | {extent:.3g} | {fresh.grid.n_nodes}{capped} | "
                             f"{fresh.near_pairs} | {te:.3f} | {tf:.3f} | {'fft' if tf < te else 'exact'} | "
                             f"{fresh.exact_seconds:.3f} | {fresh.fft_seconds:.3f} | {fresh_pick} / {pick} |")
                print(lines[-1], flush=True)
        summary.append(f"{name}: sum over the layouts: exact {totals['exact']:.2f} s, fft {totals['fft']:.2f} s, "
                       f"auto's picks (in sequence) {totals['auto']:.2f} s, the faster of the two each time "
                       f"{totals['best']:.2f} s  ")
    lines += [""] + summary + [""]


def _layouts(make, iterations, every):
    """``[(iteration, coords)]`` every ``every`` iterations of one dbd t-SNE run (repulsion 'auto')."""
    out = []

    def checkpoint(it, export):
        if it % every == 0:
            out.append((it, np.ascontiguousarray(export().coords)))

    with make("auto") as ex:
        coords = initial_coords(ex.n_points, 2, 0, np.random.default_rng(0))
        res = DeltaBarDelta(tol=0).optimize(ex, coords, iterations, checkpoint=checkpoint)
    return [(0, coords)] + out + [(res.iterations, np.ascontiguousarray(res.coords))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stores", default="", help="comma-separated affinity stores for the solver table")
    parser.add_argument("--run-stores", default="", help="stores for the sd/dbd runs")
    parser.add_argument("--repulsion-stores", default="", help="stores (or 'grqc') for the auto-repulsion table")
    parser.add_argument("--lu-timeout", type=float, default=120.0)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--layout-iterations", type=int, default=600)
    parser.add_argument("--layout-every", type=int, default=150)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lines = ["# Scaling the spectral direction and repulsion='auto' (issue 22)", "", machine_description() + "  ",
             run_description(), ""]
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    if args.stores:
        solvers_section(split(args.stores), args.lu_timeout, lines)
    if args.run_stores:
        runs_section(split(args.run_stores), args.iterations, lines)
    if args.repulsion_stores:
        repulsion_section(split(args.repulsion_stores), args.layout_iterations, args.layout_every, lines)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
