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
* ``caps``: the FFT grid's node cap (``FFTParams.max_nodes``) on saved layouts (``--cap-layouts a.npy,...``,
  ``(N, 2)`` or ``(2, N)``) of ``--cap-store``: one t-SNE evaluation per cap (16, 32, 64 N nodes) and exact,
  after a warm-up evaluation, rounds in rotated order, median of ``--rounds``.
* ``accuracy``: ``--fft-accuracy`` levels on the same saved layouts: relative error of Z and of the whole
  gradient against the exact evaluation, seconds per evaluation (median of ``--rounds``), grid nodes.
* ``halo``: halo sizes (``scalemb.affinity.store.halo_size``) of ``--halo-store`` split into 2-16 row partitions
  balanced by non-zeros, in the store's order and in P's reverse Cuthill-McKee order: what a worker would
  receive per evaluation with a halo exchange instead of all N coordinate rows.
* ``partition``: halo sizes of each of ``--partition-stores`` split into K = 2, 4, 8, 16, 64 (and the store's own
  count) equal row ranges (the data-determined layout's convention) in the store's order, in reverse
  Cuthill-McKee order and in the ``--point-order partition`` order (METIS recursive bisection into K parts, RCM
  within each part; and METIS k-way minimising the communication volume, for comparison): halo sum / N,
  largest halo / N, seconds to compute each order; then the wall time of ``scalemb affinity`` on the store's
  source edge list with ``--point-order given`` and ``partition`` (``--partition-edges``), child processes.
* ``chain``: the end-to-end command chain with defaults (``--chain-authors N``): ``scalemb generate coauthor``,
  ``scalemb affinity``, ``scalemb embed --model M`` for each of ``--chain-models`` and ``scalemb metrics
  --sample``, each a child process: wall seconds, peak RSS (``getrusage`` of the child), iterations, KL,
  optimiser and repulsion, sampled NP@deg.
* ``repulsion``: layouts of a dbd t-SNE run (every ``--layout-every`` iterations) on ``--repulsion-stores``
  and GrQc: exact and fft evaluation on each (seconds, median of 3 below 20000 points), what
  ``repulsion='auto'``'s cost model predicts and picks (below ``AUTO_FFT_MIN_POINTS`` it stays exact).

``python benchmarks/scale.py --stores P10000.zarr,P100000.zarr,P1000000.zarr --out benchmarks/results/scale.md``
"""
import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import machine_description, run_description, timings
from scalemb.affinity.store import AffinityStore
from scalemb.embedding import initial_coords, load_affinity
from scalemb.engine.factor import FactorizedSolver, MultigridPreconditioner
from scalemb.engine.local import LocalExecutor
from scalemb.models import get_model
from scalemb.optim import DeltaBarDelta, LineSearchDescent
from scalemb.optim.solvers import jacobi_preconditioner, pcg
from scalemb.repulsion.spec import FFTParams
from scalemb.repulsion.method import AUTO_FFT_MIN_POINTS, AutoRepulsion


def executor_for(path, repulsion="auto", fft_params=None):
    store = AffinityStore(path)
    affinity = store.to_affinity()
    return LocalExecutor(affinity, get_model("tsne"), 2, 0, partitions=store.partitions, repulsion=repulsion,
                         fft_params=fft_params)


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


def caps_section(store, layouts, rounds, lines):
    """Seconds of one t-SNE evaluation on each saved layout per node cap (alternating rounds, median)."""
    st = AffinityStore(store)
    affinity = st.to_affinity()
    n = affinity.node_ids.size
    caps = [16 * n, 32 * n, 64 * n]
    lines += [f"## FFT node cap on saved layouts of {Path(store).name} (N = {n}), t-SNE R^2, one evaluation, "
              f"after a warm-up, median of {rounds} rounds in rotated order, seconds", "",
              "| layout | extent | uncapped nodes | " + " | ".join(f"cap {c // n} N" for c in caps)
              + " | exact | max rel. gradient diff (caps vs exact) |",
              "|---|---|---|" + "---|" * (len(caps) + 2)]
    executors = {c: LocalExecutor(affinity, get_model("tsne"), 2, 0, partitions=st.partitions, repulsion="fft",
                                  fft_params=FFTParams(max_nodes=c)) for c in caps}
    executors["exact"] = LocalExecutor(affinity, get_model("tsne"), 2, 0, partitions=st.partitions,
                                       repulsion="exact")
    try:
        for path in layouts:
            Y = np.load(path)
            Y = np.ascontiguousarray(Y if Y.shape[0] == 2 else Y.T, dtype=np.float64)
            grid = AutoRepulsion("tsne", 2, 0, FFTParams(max_nodes=2 ** 40).resolved("tsne", 2)).predict(Y).grid
            times = {k: [] for k in executors}
            grads = {k: ex.evaluate(Y).gradient for k, ex in executors.items()}  # warm-up: plans, buffers
            keys = list(executors)
            for r in range(rounds):
                for k in keys[r % len(keys):] + keys[:r % len(keys)]:  # rotated order: no position bias
                    t = time.perf_counter()
                    executors[k].evaluate(Y)
                    times[k].append(time.perf_counter() - t)
            ref = grads["exact"]
            err = max(float(np.abs(grads[c] - ref).max() / np.abs(ref).max()) for c in caps)
            extent = float(np.max(Y.max(axis=1) - Y.min(axis=1)))
            capped = [c for c in caps if grid.n_nodes > c]
            lines.append(f"| {Path(path).name} | {extent:.4g} | {grid.n_nodes} ({grid.n_nodes / n:.1f} N) | "
                         + " | ".join(f"{np.median(times[c]):.3f}{' (capped)' if c in capped else ''}"
                                      for c in caps)
                         + f" | {np.median(times['exact']):.3f} | {err:.1e} |")
            print(lines[-1], flush=True)
    finally:
        for ex in executors.values():
            ex.close()
    lines.append("")


def accuracy_section(store, layouts, rounds, lines):
    """Each FFT accuracy level against the exact evaluation on saved t-SNE layouts."""
    from scalemb.repulsion.spec import FFT_ACCURACY

    st = AffinityStore(store)
    affinity = st.to_affinity()
    n = affinity.node_ids.size
    lines += [f"## FFT accuracy on saved layouts of {Path(store).name} (N = {n}), t-SNE R^2, seconds per "
              f"evaluation (median of {rounds})", "",
              "| layout | extent | accuracy | points in box width | nodes | Z rel. err. | gradient rel. err. | s |",
              "|---|---|---|---|---|---|---|---|"]
    for path in layouts:
        Y = np.load(path)
        Y = np.ascontiguousarray(Y if Y.shape[0] == 2 else Y.T, dtype=np.float64)
        extent = float(np.max(Y.max(axis=1) - Y.min(axis=1)))
        with LocalExecutor(affinity, get_model("tsne"), 2, 0, partitions=st.partitions, repulsion="exact") as ex:
            t = time.perf_counter()
            ref = ex.evaluate(Y)
            lines.append(f"| {Path(path).name} | {extent:.4g} | exact | - | - | 0 | 0 | "
                         f"{time.perf_counter() - t:.2f} |")
        for accuracy in FFT_ACCURACY:
            params = FFTParams(accuracy=accuracy)
            with LocalExecutor(affinity, get_model("tsne"), 2, 0, partitions=st.partitions, repulsion="fft",
                               fft_params=params) as ex:
                ev = ex.evaluate(Y)
                seconds = _timed(lambda: ex.evaluate(Y), rounds)
                resolved = ex.fft_params
            grid = AutoRepulsion("tsne", 2, 0, resolved).predict(Y).grid
            lines.append(f"| {Path(path).name} | {extent:.4g} | {accuracy} | {resolved.points} in "
                         f"{resolved.box_width:.3g} | {grid.n_nodes}{' capped' if grid.capped else ''} | "
                         f"{abs(ev.z / ref.z - 1):.1e} | "
                         f"{np.linalg.norm(ev.gradient - ref.gradient) / np.linalg.norm(ref.gradient):.1e} | "
                         f"{seconds:.3f} |")
            print(lines[-1], flush=True)
    lines.append("")


def halo_section(store, lines):
    """Halo sizes per partition count, store order vs reverse Cuthill-McKee order."""
    import scipy.sparse as sp

    from scalemb.affinity.ordering import locality_order
    from scalemb.affinity.store import balanced_partitions, halo_size

    P = AffinityStore(store).to_affinity().P
    n = P.shape[0]
    t = time.perf_counter()
    order = locality_order(P)
    rcm_seconds = time.perf_counter() - t
    orders = {"store order": P, "RCM order": sp.csr_matrix(P[order][:, order])}
    lines += [f"## Halo sizes of {Path(store).name} (N = {n}, nnz = {P.nnz}); RCM ordering {rcm_seconds:.1f} s", "",
              "| order | partitions | halo sum / N | largest halo / N | largest halo / rows of its partition |",
              "|---|---|---|---|---|"]
    for name, Q in orders.items():
        for k in (2, 4, 8, 16):
            bounds = balanced_partitions(Q.indptr.astype(np.int64), k, 1)
            halos = np.array([halo_size(Q.indices[Q.indptr[a]:Q.indptr[b]], a, b, n)
                              for a, b in zip(bounds[:-1], bounds[1:])])
            rows = np.diff(bounds)
            lines.append(f"| {name} | {k} | {halos.sum() / n:.3f} | {halos.max() / n:.3f} | "
                         f"{(halos / rows).max():.2f} |")
            print(lines[-1], flush=True)
    lines.append("")


def _equal_range_halos(Q, k):
    """Halo sizes of ``Q`` (CSR) split into ``k`` equal row ranges (``row_partition``, as ``layout_partitions``)."""
    from scalemb.affinity.affinity import row_partition
    from scalemb.affinity.store import halo_size

    n = Q.shape[0]
    return np.array([halo_size(Q.indices[Q.indptr[a]:Q.indptr[b]], a, b, n) for a, b in row_partition(n, k)])


def partition_section(stores, edges, ks, lines):
    """Halo sizes per partition count: store order, RCM, METIS recursive bisection + RCM, METIS k-way (vol).
    Each order's cost as wall and CPU seconds (the orders are single-threaded: CPU seconds are what they cost on
    an idle core when the machine is shared)."""
    from scalemb.affinity.ordering import locality_order, metis_parts, partition_order
    from scalemb.affinity.store import layout_block_count

    def clocks():
        return time.perf_counter(), time.process_time()

    def since(start):
        return time.perf_counter() - start[0], time.process_time() - start[1]

    for path in stores:
        P = AffinityStore(path).to_affinity().P
        n = P.shape[0]
        own = layout_block_count(n)
        counts = sorted(set(ks) | {own})
        lines += [f"## Halo sizes by point order: {Path(path).name} (N = {n}, nnz = {P.nnz}, layout K = {own})", "",
                  "K equal row ranges; halo = distinct columns outside a partition that its rows touch; order "
                  "seconds: wall / CPU.", "",
                  "| order | K | halo sum / N | largest halo / N | largest halo / rows of its partition | "
                  "order s (wall / CPU) |", "|---|---|---|---|---|---|"]

        def row(name, k, order, seconds):
            Q = P if order is None else P[order][:, order]
            halos = _equal_range_halos(Q, k)
            lines.append(f"| {name} | {k} | {halos.sum() / n:.3f} | {halos.max() / n:.3f} | "
                         f"{(halos / (n / k)).max():.2f} | {seconds[0]:.2f} / {seconds[1]:.2f} |")
            print(lines[-1], flush=True)

        start = clocks()
        rcm = locality_order(P)
        rcm_seconds = since(start)
        for k in counts:
            row("given", k, None, (0.0, 0.0))
            row("RCM", k, rcm, rcm_seconds)
            start = clocks()
            parts = metis_parts(P, k, target_fractions=np.full(k, 1.0 / k))
            metis_cpu = since(start)[1]
            order = partition_order(P, parts)
            total = since(start)
            row(f"METIS bisection + RCM per part (CPU {metis_cpu:.2f} + {total[1] - metis_cpu:.2f} s)", k, order,
                total)
            if k > 2:
                import pymetis

                start = clocks()
                adjacency = pymetis.CSRAdjacency(P.indptr.astype(np.int64), P.indices.astype(np.int64))
                options = pymetis.Options(seed=0, ufactor=1, objtype=int(pymetis.ObjType.VOL))
                _, kway = pymetis.part_graph(k, adjacency, recursive=False, options=options)
                kway = np.asarray(kway, dtype=np.int64)
                row("METIS k-way, objtype vol (grouped by part)", k, np.lexsort((np.arange(n), kway)), since(start))
        lines.append("")
    if edges:
        lines += ["## `scalemb affinity` time by point order", "", "| edge list | point order | wall s | CPU s | "
                  "peak RSS GB | output |", "|---|---|---|---|---|---|"]
        wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
                   "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
                   "print('USAGE', u.ru_utime + u.ru_stime, u.ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")
        for path in edges:
            for order in ("given", "partition"):
                out = Path(path).parent / f"bench_{order}.zarr"
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-c", wrapper, "scalemb", "affinity", str(path), "--out",
                                       str(out), "--overwrite", "--quiet", "--point-order", order],
                                      capture_output=True, text=True, check=True)
                seconds = time.perf_counter() - t
                cpu, rss = next(x.split()[1:] for x in proc.stderr.splitlines() if x.startswith("USAGE"))
                lines.append(f"| {Path(path).name} | {order} | {seconds:.1f} | {float(cpu):.1f} | "
                             f"{int(rss) / 2 ** 20:.2f} | {proc.stdout.strip().splitlines()[-1]} |")
                print(lines[-1], flush=True)
        lines.append("")


def _child(argv, label):
    """Run ``argv`` as a child process: ``(seconds, peak RSS GB, stdout)``.  Each step runs under a fresh Python
    wrapper that reports its one child's ``ru_maxrss`` (``RUSAGE_CHILDREN`` of this process would mix steps)."""
    wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(r.returncode)")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, text=True)
    seconds = time.perf_counter() - t
    rss = next((int(x.split()[1]) for x in proc.stderr.splitlines() if x.startswith("MAXRSS_KB")), 0) / 2 ** 20
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, rss, proc.stdout


def chain_section(authors, models, workdir, sample, lines, peers=(), time_models=()):
    """The command chain with defaults at ``authors`` authors, each step a child process."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    edges, store = work / f"e{authors}.txt.gz", work / f"P{authors}.zarr"
    lines += [f"## End to end with defaults: {authors} generated authors", "",
              "| step | wall s | peak RSS GB | result |", "|---|---|---|---|"]
    steps = [("generate", ["scalemb", "generate", "coauthor", "--authors", str(authors), "--out", str(edges),
                          "--overwrite"]),
             ("affinity", ["scalemb", "affinity", str(edges), "--out", str(store), "--overwrite", "--quiet"])]
    for label, argv in steps:
        seconds, rss, out = _child(argv, label)
        lines.append(f"| {label} | {seconds:.1f} | {rss:.2f} | {out.strip().splitlines()[-1] if out else ''} |")
        print(lines[-1], flush=True)
    for model in models:
        run = work / f"run_{model}_{authors}.zarr"
        seconds, rss, out = _child(["scalemb", "embed", str(store), "--model", model, "--out", str(run),
                                    "--overwrite", "--quiet"], f"embed {model}")
        attrs = json.loads((run / "zarr.json").read_text())["attributes"]
        msec, _, mout = _child(["scalemb", "metrics", str(run), "--sample", str(sample), "--json", "--quiet"],
                               f"metrics {model}")
        metrics = json.loads(mout)
        np_deg = metrics["np@deg"]
        lines.append(f"| embed {model} (defaults) | {seconds:.1f} | {rss:.2f} | "
                     f"{attrs.get('iterations')} it., {attrs.get('optimizer', {}).get('optimizer')}, "
                     f"{attrs.get('repulsion', {}).get('method')} repulsion, KL {attrs.get('kl'):.4f}, NP@deg "
                     f"{np_deg['value']:.3f} ± {np_deg['stderr'] or 0:.3f} ({np_deg['n_rows']} rows; metrics "
                     f"{msec:.0f} s) |")
        print(lines[-1], flush=True)
    if "opentsne" in peers:
        _chain_opentsne(store, work / f"opentsne_{authors}.npy", sample, lines)
    for model in time_models:
        _chain_time_per_evaluation(store, model, lines)
    lines.append("")


def run_opentsne_child(store, out):
    """(In a child process of ``_chain_opentsne``.)  openTSNE with its defaults on the store's P
    (``PrecomputedAffinities``, one job per core, seed 0); the layout saved to ``out``; prints the fit seconds."""
    from openTSNE import TSNE
    from openTSNE.affinity import PrecomputedAffinities

    P = AffinityStore(store).to_affinity().P
    start = time.perf_counter()
    Y = TSNE(n_jobs=len(os.sched_getaffinity(0)), random_state=0).fit(affinities=PrecomputedAffinities(P))
    seconds = time.perf_counter() - start
    np.save(out, np.asarray(Y))
    print(f"fit {seconds:.1f}")


def _chain_opentsne(store, out, sample, lines):
    """openTSNE on the chain's P in a child process (wall, peak RSS), then the same KL and sampled NP@deg as for
    scalemb's runs (KL: ``scalemb.metrics.kl``, the t-SNE kernel with the FFT normaliser)."""
    from scalemb.metrics import graph_metrics, kl

    seconds, rss, out_text = _child([sys.executable, __file__, "--opentsne-run", str(store), str(out)], "openTSNE")
    affinity = AffinityStore(store).to_affinity()
    Y = np.load(out)
    t = time.perf_counter()
    value = kl(affinity, Y, "tsne")
    np_deg = graph_metrics(affinity.P, Y, "tsne", sample=sample)["np@deg"]
    lines.append(f"| openTSNE (defaults, same P, {len(os.sched_getaffinity(0))} jobs) | {seconds:.1f} | {rss:.2f} | "
                 f"{out_text.strip()} s in TSNE.fit, 750 it. (250 EE + 500), KL {value:.4f}, NP@deg "
                 f"{np_deg.value:.3f} ± {np_deg.stderr or 0:.3f} ({np_deg.n_rows} rows; metrics "
                 f"{time.perf_counter() - t:.0f} s) |")
    print(lines[-1], flush=True)


def _chain_time_per_evaluation(store, model, lines, evaluations=3):
    """Seconds per FFT evaluation of ``model`` (R^2, or R^{2,1} with time) on the chain's P at each accuracy
    setting, at a layout of openTSNE's extent (Gaussian, std 30 in space; time N(0, 0.3²)): the cost of a
    750-iteration run that was not made."""
    from scalemb.repulsion.spec import FFT_ACCURACY

    affinity = AffinityStore(store).to_affinity()
    m = get_model(model)
    dt = 1 if m.has_time else 0
    rng = np.random.default_rng(0)
    Y = np.concatenate([rng.normal(size=(2, affinity.n_points)) * 30, rng.normal(size=(dt, affinity.n_points)) * 0.3])
    for accuracy in FFT_ACCURACY:
        with LocalExecutor(affinity, m, 2, dt, repulsion="fft", fft_params=FFTParams(accuracy=accuracy)) as ex:
            ex.evaluate(Y, with_kl=False)  # warm-up
            times = []
            for _ in range(evaluations):
                t = time.perf_counter()
                ex.evaluate(Y, with_kl=False)
                times.append(time.perf_counter() - t)
        seconds = float(np.median(times))
        lines.append(f"| {model} R^{{2,{dt}}} one evaluation, --fft-accuracy {accuracy} | {seconds:.2f} | - | "
                     f"median of {evaluations}; 750 iterations ≈ {750 * seconds / 60:.0f} min |")
        print(lines[-1], flush=True)


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
    parser.add_argument("--cap-store", default=None, help="affinity store of the --cap-layouts")
    parser.add_argument("--cap-layouts", default="", help="comma-separated .npy layouts for the node-cap table")
    parser.add_argument("--accuracy-layouts", default="", help="comma-separated .npy layouts (of --cap-store) "
                        "for the FFT accuracy table")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--halo-store", default=None, help="affinity store for the halo-size table")
    parser.add_argument("--partition-stores", default="", help="comma-separated stores for the point-order table")
    parser.add_argument("--partition-edges", default="", help="comma-separated edge lists: scalemb affinity wall "
                        "time with --point-order given / partition")
    parser.add_argument("--partition-ks", default="2,4,8,16,64")
    parser.add_argument("--chain-authors", type=int, default=None, help="authors of the end-to-end chain")
    parser.add_argument("--chain-models", default="tsne,snest")
    parser.add_argument("--chain-dir", default="/tmp/scalemb-chain")
    parser.add_argument("--chain-sample", type=int, default=20000)
    parser.add_argument("--chain-peers", default="", help="'opentsne': openTSNE on the chain's P in the same run")
    parser.add_argument("--chain-time-models", default="", help="models whose FFT evaluation is timed per accuracy "
                        "setting on the chain's P (instead of a full run)")
    parser.add_argument("--opentsne-run", nargs=2, default=None, metavar=("STORE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.opentsne_run:
        return run_opentsne_child(*args.opentsne_run)
    lines = ["# Scaling the spectral direction and repulsion='auto' (issue 22)", "", machine_description() + "  ",
             run_description(), ""]
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    if args.stores:
        solvers_section(split(args.stores), args.lu_timeout, lines)
    if args.run_stores:
        runs_section(split(args.run_stores), args.iterations, lines)
    if args.cap_layouts:
        caps_section(args.cap_store, split(args.cap_layouts), args.rounds, lines)
    if args.accuracy_layouts:
        accuracy_section(args.cap_store, split(args.accuracy_layouts), args.rounds, lines)
    if args.halo_store:
        halo_section(args.halo_store, lines)
    if args.partition_stores or args.partition_edges:
        partition_section(split(args.partition_stores), split(args.partition_edges),
                          [int(k) for k in split(args.partition_ks)], lines)
    if args.chain_authors:
        chain_section(args.chain_authors, split(args.chain_models), args.chain_dir, args.chain_sample, lines,
                      split(args.chain_peers), split(args.chain_time_models))
    if args.repulsion_stores:
        repulsion_section(split(args.repulsion_stores), args.layout_iterations, args.layout_every, lines)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
