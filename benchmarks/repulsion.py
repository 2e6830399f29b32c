"""FFT-accelerated interpolation repulsion (scalemb.repulsion) against the exact kernel and openTSNE.

Usage: python benchmarks/repulsion.py [--out benchmarks/results/repulsion.md] [--skip-grqc] [--skip-opentsne]
       [--skip-million] [--n-large 100000] [--n-million 1000000] [--grqc-only [--grqc-iterations N]]

Sections, one run:
(a) GrQc, default optimiser, default iterations, seed 0: t-SNE R^2 and SNEST R^{2,1} with --repulsion exact and
    fft; the exact KL of both final layouts; the accuracy of fft at the exact run's final layout.  With
    ``--grqc-iterations N`` both runs take exactly N iterations (no stopping rule), which separates the
    approximation's effect from where the stopping rule happens to end each trajectory.  The noise floor of
    the comparison: the exact run again from its start perturbed by a relative 1e-9 (two draws).
(b) Per-evaluation time (KL + gradient, all threads) exact vs fft over N on clustered layouts whose extent grows
    like sqrt(N) from GrQc's converged t-SNE extent; the crossover behind ``repulsion='auto'``.
(c) N = 1e5 kNN affinities of clustered random points: 300 delta-bar-delta iterations with fft (early
    exaggeration 12 for 100) vs openTSNE 1.0.4 ``TSNEEmbedding.optimize(negative_gradient_method="fft")`` on the
    same P from the same initialisation and schedule, with its defaults and at scalemb's node density; scalemb
    once with its defaults and once with openTSNE's: steps clipped to norm 5 (``max_step_norm``), the KL only
    every 25 iterations (``kl_every``; openTSNE computes it at its callbacks only).
    (c') Both gradients timed on the same layouts (snapshots of openTSNE's default run), since the two runs'
    trajectories differ.  openTSNE switches the process to flush-to-zero arithmetic when loaded, so it runs
    after every scalemb timing.
(d) N = 1e6 co-authorship graph from scalemb.io.coauthor_generator (~15 neighbours per row), t-SNE R^2 and
    SNEST R^{2,1} with fft: seconds per evaluation and per delta-bar-delta iteration on a clustered layout of
    the extent a converged run would have (the 1e5 run's final extent times sqrt(10)), peak RSS.  Each runs in
    a child process so that its peak RSS is its own.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import scalemb
from scalemb.affinity import Affinity
from scalemb.datasets import grqc
from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.models import get_model
from scalemb.optim import DeltaBarDelta, make_optimizer
from scalemb.repulsion import AUTO_FFT_MIN_POINTS, FFTParams, make_grid

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, timings, markdown_table  # noqa: E402

THREADS = len(os.sched_getaffinity(0))
CHILD_TIMEOUT = 600


def label(model, ds, dt):
    return f"{model} R^{ds}" + (f",{dt}" if dt else "")


def clustered_layout(n, ds, dt, extent, time_std, seed):
    """Gaussian clusters (unit spread, Pareto sizes) at uniform centres in a box of side ``extent``; time
    coordinates ~ N(0, time_std) clipped to +-2.8 time_std (GrQc SNEST R^{2,1}: std 0.64, extent 3.6)."""
    rng = np.random.default_rng(seed)
    n_clusters = max(1, n // 500)
    sizes = rng.pareto(1.5, n_clusters) + 1
    labels = rng.choice(n_clusters, n, p=sizes / sizes.sum())
    centres = (rng.random((n_clusters, ds)) - 0.5) * (extent - 6)
    S = centres[labels] + rng.normal(size=(n, ds))
    T = np.clip(rng.normal(size=(n, dt)), -2.8, 2.8) * time_std
    return np.ascontiguousarray(np.concatenate([S, T], axis=1).T)


def random_affinity(n, k, seed):
    """A symmetric P with ~2k non-zeros per row at random columns (the attraction's cost, not its values, matters)."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), k)
    cols = rng.integers(0, n, n * k)
    keep = rows != cols
    A = sp.csr_matrix((np.ones(keep.sum()), (rows[keep], cols[keep])), shape=(n, n))
    return Affinity(A + A.T, np.arange(n))


def timed_evaluations(executor, coords, repeats, with_kl=True):
    return timed_call(lambda: executor.evaluate(coords, with_kl=with_kl), repeats)


def accuracy_row(affinity, model, ds, dt, coords):
    exact = LocalExecutor(affinity, get_model(model), ds, dt, repulsion="exact").evaluate(coords)
    fast = LocalExecutor(affinity, get_model(model), ds, dt, repulsion="fft").evaluate(coords)
    grid = make_grid(model, ds, coords.min(1), coords.max(1), FFTParams(), affinity.n_points)
    rel = np.linalg.norm(fast.gradient - exact.gradient) / np.linalg.norm(exact.gradient)
    return (label(model, ds, dt), f"{abs(fast.z / exact.z - 1):.1e}", f"{rel:.1e}",
            f"{abs(fast.kl - exact.kl):.1e}", grid.describe())


def grqc_runs(report, iterations=None):
    affinity = grqc()
    run_options = {} if iterations is None else {"iterations": iterations, "optimizer": None}
    rows, accuracy, layouts = [], [], {}
    for model, ds, dt in [("tsne", 2, 0), ("snest", 2, 1)]:
        finals = {}
        for method in ("exact", "fft"):
            t0 = time.perf_counter()
            if iterations is not None:  # the default optimiser without its stopping rule
                run_options["optimizer"] = make_optimizer("auto", model, tol=0.0)
            res = scalemb.embed(affinity, model=model, space_dims=ds, time_dims=dt, seed=0, repulsion=method,
                                **run_options)
            wall = time.perf_counter() - t0
            coords = np.ascontiguousarray(res.embedding.T)
            exact_kl = LocalExecutor(affinity, get_model(model), ds, dt, repulsion="exact").evaluate(coords).kl
            finals[method] = exact_kl
            extent = " x ".join(f"{e:.1f}" for e in coords.max(1) - coords.min(1))
            rows.append((label(model, ds, dt), method, res.optimizer["optimizer"], res.iterations, f"{wall:.1f}",
                         f"{res.kl:.4f}", f"{exact_kl:.4f}", extent))
            layouts[model, method] = coords
        rows.append((label(model, ds, dt), "fft - exact", "", "", "", "", f"{finals['fft'] - finals['exact']:+.4f}",
                     ""))
        perturbed = []
        for seed in PERTURBATION_SEEDS:  # the comparison's noise floor: the same exact run from a start moved by 1e-9
            run, wall = perturbed_exact_run(affinity, model, ds, dt, seed, iterations)
            perturbed.append(run.kl)
            rows.append((label(model, ds, dt), f"exact, start x (1 + 1e-9 N(0,1)), seed {seed}", "", run.iterations,
                         f"{wall:.1f}", f"{run.kl:.4f}", f"{run.kl:.4f}", ""))
        rows.append((label(model, ds, dt), "perturbed exact - exact", "", "", "", "",
                     " / ".join(f"{kl - finals['exact']:+.4f}" for kl in perturbed), ""))
        accuracy.append(accuracy_row(affinity, model, ds, dt, layouts[model, "exact"]))
    runs = "default iterations" if iterations is None else f"{iterations} iterations, no stopping rule (tol 0)"
    report(f"## (a) GrQc (N = {affinity.n_points}), default optimiser, {runs}, seed 0, exact vs fft "
           "(default FFTParams)")
    report(markdown_table(["embedding", "repulsion", "optimizer", "iterations", "wall s", "run's KL",
                           "exact KL of final layout", "extent"], rows))
    report()
    report("Accuracy of fft at the exact run's final layout (relative error of Z and of the full gradient "
           "2(-A + R/Z), absolute error of KL):")
    report(markdown_table(["embedding", "Z rel. err.", "gradient rel. err.", "KL abs. err.", "grid"], accuracy))
    report()
    return layouts


PERTURBATION_SEEDS = (1, 2)


def perturbed_exact_run(affinity, model, ds, dt, seed, iterations):
    """The default run of ``scalemb.embed(seed=0, repulsion="exact")`` from its initial coordinates times
    ``1 + 1e-9 N(0, 1)`` (perturbation drawn with ``seed``): how far a run's end moves for reasons other than
    the repulsion's approximation (the optimiser's trajectory is chaotic)."""
    start = initial_coords(affinity.n_points, ds, dt, np.random.default_rng([0, 0]))  # Embedder's first restart
    start *= 1 + 1e-9 * np.random.default_rng(seed).standard_normal(start.shape)
    optimizer = make_optimizer("auto", model, **({} if iterations is None else {"tol": 0.0}))
    t0 = time.perf_counter()
    with LocalExecutor(affinity, get_model(model), ds, dt, repulsion="exact") as ex:
        run = optimizer.optimize(ex, start, iterations or scalemb.Embedder().iterations)
    return run, time.perf_counter() - t0


def crossover(report, extent_1e5, time_std):
    sizes = [2500, 5000, 10000, 20000, 40000, 80000]
    cases = [("tsne", 2, 0), ("snest", 2, 1), ("snest", 3, 1)]
    rows, found = [], {}
    for model, ds, dt in cases:
        for n in sizes:
            extent = extent_1e5 * np.sqrt(n / 1e5)
            coords = clustered_layout(n, ds, dt, extent, time_std, seed=n)
            affinity = random_affinity(n, 8, seed=n)
            times = {}
            for method in ("exact", "fft"):
                if method == "exact" and n > 40000:
                    continue
                with LocalExecutor(affinity, get_model(model), ds, dt, repulsion=method) as ex:
                    times[method] = timed_evaluations(ex, coords, 3 if n > 10000 else 7)
            faster = "exact" in times and times["fft"] < times["exact"]
            if faster and (model, ds, dt) not in found:
                found[model, ds, dt] = n
            elif "exact" in times and not faster:
                found.pop((model, ds, dt), None)
            grid = make_grid(model, ds, coords.min(1), coords.max(1), FFTParams(), n)
            rows.append((label(model, ds, dt), n, f"{extent:.0f}",
                         f"{1e3 * times['exact']:.1f}" if "exact" in times else "-", f"{1e3 * times['fft']:.1f}",
                         grid.describe()))
    report(f"## (b) One evaluation (KL + gradient), {THREADS} threads, median; clustered layouts of extent "
           f"{extent_1e5:.0f} sqrt(N / 1e5) (the (c) run's final extent), time std {time_std:.2f}")
    report(markdown_table(["embedding", "N", "extent", "exact ms", "fft ms", "fft grid"], rows))
    report()
    report("Crossover (smallest N of the sweep from which fft is faster at every larger measured N): "
           + ", ".join(f"{label(*case)} (d = {case[1] + case[2]}): {found.get(case, '> 40000')}" for case in cases)
           + f".  Used by repulsion='auto' (scalemb/repulsion/method.py): {AUTO_FFT_MIN_POINTS}.")
    report()


def large_problem(n):
    from scalemb.affinity.knn import knn_affinity

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(30, 20)) * 4
    X = centres[rng.integers(0, 30, n)] + rng.normal(size=(n, 20))
    t0 = time.perf_counter()
    affinity = knn_affinity(X, perplexity=10, random_state=0, n_jobs=THREADS)
    return affinity, time.perf_counter() - t0, initial_coords(n, 2, 0, np.random.default_rng(0))


N_EE, N_ITER = 100, 300


SNAPSHOT_EVERY = 25

# scalemb's runs in (c), as (max_step_norm, kl_every): its default delta-bar-delta (no step clipping, the KL at
# every iteration), and openTSNE's schedule: steps clipped to norm 5 (openTSNE's ``max_step_norm``) and the KL
# only where openTSNE's default run computes it (at its callbacks, every SNAPSHOT_EVERY iterations)
SCALEMB_RUNS = ((None, 1), (5.0, SNAPSHOT_EVERY))


def large_ours(affinity, coords, max_step_norm, kl_every):
    """One 300-iteration run of scalemb's delta-bar-delta with fft: (table row, s / iteration, final extent)."""
    n = affinity.n_points
    opt = DeltaBarDelta(learning_rate=max(1.0, n / 12), exaggeration=12.0, exaggeration_iterations=N_EE,
                        momentum_switch=(N_EE, 1000), tol=0.0, max_step_norm=max_step_norm, kl_every=kl_every)
    with LocalExecutor(affinity, get_model("tsne"), 2, 0, repulsion="fft") as ex:
        t0 = time.perf_counter()
        run = opt.optimize(ex, coords, N_ITER)
        ours_s = time.perf_counter() - t0
        eval_s = timed_evaluations(ex, run.coords, 5)
    final = run.coords
    grid = make_grid("tsne", 2, final.min(1), final.max(1), FFTParams(), n)
    extent = float((final.max(1) - final.min(1)).max())
    row = (f"scalemb fft (delta-bar-delta, {run_settings(max_step_norm, kl_every)})", run.iterations,
           f"{ours_s:.1f}", f"{ours_s / run.iterations:.3f}", f"{eval_s:.3f}", f"{run.kl:.4f}", f"{extent:.1f}",
           grid.describe())
    return row, ours_s / run.iterations, extent


def run_settings(max_step_norm, kl_every):
    steps = "no step clipping" if max_step_norm is None else f"steps clipped to norm {max_step_norm:g}"
    return steps + (", KL every iteration" if kl_every == 1 else f", KL every {kl_every} iterations")


def large_opentsne(report, affinity, coords, knn_s, ours):
    """openTSNE's full runs beside ours, then both gradients timed on the same layouts: openTSNE's own default
    run, every ``SNAPSHOT_EVERY`` iterations (the trajectories differ, even with the same step clipping: the
    two FFT approximations differ)."""
    n = affinity.n_points
    rows = [row for row, _, _ in ours.values()]
    import openTSNE
    from openTSNE import TSNEEmbedding
    from openTSNE.affinity import PrecomputedAffinities
    from openTSNE.tsne import kl_divergence_fft

    lr = max(1.0, n / 12)
    # openTSNE's defaults (3 points in unit boxes: ~1e-2 force error with the same scheme here) and the same
    # node density as scalemb's t-SNE R^2 default (6 points in unit boxes, ~3e-4)
    open_per_iter = None
    snapshots = []

    def keep(iteration, error, embedding):
        snapshots.append(np.array(embedding))

    for points, what in ((3, "defaults: 3 points, boxes <= 1 wide, >= 50 per dim"),
                         (6, "6 points in boxes <= 1 wide: scalemb's node density")):
        emb = TSNEEmbedding(np.ascontiguousarray(coords.T), PrecomputedAffinities(affinity.P, normalize=False),
                            negative_gradient_method="fft", n_interpolation_points=points, n_jobs=THREADS,
                            random_state=0)
        callbacks = dict(callbacks=keep, callbacks_every_iters=SNAPSHOT_EVERY) if points == 3 else {}
        t0 = time.perf_counter()
        emb = emb.optimize(n_iter=N_EE, exaggeration=12, momentum=0.5, learning_rate=lr, **callbacks)
        emb = emb.optimize(n_iter=N_ITER - N_EE, momentum=0.8, learning_rate=lr, **callbacks)
        open_s = time.perf_counter() - t0
        layout = np.ascontiguousarray(np.asarray(emb).T)
        open_kl = LocalExecutor(affinity, get_model("tsne"), 2, 0, repulsion="fft").evaluate(layout).kl
        rows.append((f"openTSNE {openTSNE.__version__} fft ({what})", N_ITER, f"{open_s:.1f}",
                     f"{open_s / N_ITER:.3f}", "-", f"{open_kl:.4f}",
                     f"{float((layout.max(1) - layout.min(1)).max()):.1f}", "-"))
        open_per_iter = open_per_iter or open_s / N_ITER
    report(f"## (c) N = {n}, kNN affinities (perplexity 10, {affinity.P.nnz} non-zeros; {knn_s:.0f} s) of 20-D "
           f"clustered points, t-SNE R^2, {N_ITER} iterations ({N_EE} with exaggeration 12, momentum 0.5 then "
           f"0.8), lr N/12, same initialisation, {THREADS} threads; final KL by scalemb fft")
    report(markdown_table(["method", "iterations", "wall s", "s / iteration", "s / evaluation at the end",
                           "final KL", "extent", "grid at the end"], rows))
    report()
    for settings, (_, ours_per_iter, _) in ours.items():
        report(f"Ratio scalemb ({run_settings(*settings)}) / openTSNE (defaults) per iteration: "
               f"{ours_per_iter / open_per_iter:.2f}; vs openTSNE at scalemb's node density: "
               f"{ours_per_iter / (open_s / N_ITER):.2f}  ")
    report()

    P = affinity.P
    timings = {"scalemb (KL + gradient, every iteration)": [],
               "scalemb, gradient only (kl_every's other iterations)": [],
               "openTSNE defaults, gradient only (its runs' usual iteration)": [],
               "openTSNE defaults, KL + gradient": [],
               "openTSNE at scalemb's node density, gradient only": []}
    with LocalExecutor(affinity, get_model("tsne"), 2, 0, repulsion="fft") as ex:
        for snapshot in snapshots:
            layout = np.ascontiguousarray(snapshot.T)
            timings["scalemb (KL + gradient, every iteration)"].append(timed_evaluations(ex, layout, 3))
            timings["scalemb, gradient only (kl_every's other iterations)"].append(
                timed_evaluations(ex, layout, 3, with_kl=False))
            for key, points, with_kl in (("openTSNE defaults, gradient only (its runs' usual iteration)", 3, False),
                                         ("openTSNE defaults, KL + gradient", 3, True),
                                         ("openTSNE at scalemb's node density, gradient only", 6, False)):
                params = dict(n_interpolation_points=points, min_num_intervals=50, ints_in_interval=1)
                timings[key].append(timed_call(lambda: kl_divergence_fft(
                    snapshot, P, 1, params, should_eval_error=with_kl, n_jobs=THREADS), 3))
    with_kl = np.array(timings["scalemb (KL + gradient, every iteration)"])
    gradient_only = np.array(timings["scalemb, gradient only (kl_every's other iterations)"])
    table = [(key, f"{1e3 * np.median(v):.1f}", f"{1e3 * np.sum(v):.0f}", f"{np.median(with_kl / np.array(v)):.2f}",
              f"{np.median(gradient_only / np.array(v)):.2f}") for key, v in timings.items()]
    extents = [float(np.ptp(snap, axis=0).max()) for snap in snapshots]
    report(f"### (c') One evaluation on the same layouts: openTSNE's default run every {SNAPSHOT_EVERY} iterations "
           f"({len(snapshots)} layouts, extents {min(extents):.0f}-{max(extents):.0f}), median of 3 per layout, "
           f"{THREADS} threads (openTSNE's FFT part runs on one)")
    report(markdown_table(["method", "median ms", "sum over layouts ms",
                           "scalemb KL + gradient / this (median over layouts)",
                           "scalemb gradient only / this (median over layouts)"], table))
    report()


def timed_call(fn, repeats):
    return float(np.median(timings(fn, repeats)))


def million_child(model, ds, dt, n, extent, time_std, out):
    """Runs in its own process: N-point generated co-authorship P, fft timings, peak RSS (JSON to ``out``)."""
    from scalemb.affinity import coauthorship_affinity
    from scalemb.io.coauthor_generator import generate_coauthor_edges
    from scalemb.io.edges import Graph

    t0 = time.perf_counter()
    src, dst = map(np.concatenate, zip(*generate_coauthor_edges(n, seed=0, edges_per_author=7.5)))
    a, b = np.minimum(src, dst), np.maximum(src, dst)
    key = np.unique(a * n + b)
    graph = Graph(np.arange(n), key // n, key % n, np.ones(key.size), "coauthor_generator")
    del src, dst, a, b, key
    affinity = coauthorship_affinity(graph)
    build_s = time.perf_counter() - t0
    coords = clustered_layout(affinity.n_points, ds, dt, extent, time_std, seed=1)
    with LocalExecutor(affinity, get_model(model), ds, dt, repulsion="fft") as ex:
        eval_s = timed_evaluations(ex, coords, 3)
        opt = DeltaBarDelta(exaggeration_iterations=0, tol=0.0)
        t0 = time.perf_counter()
        run = opt.optimize(ex, coords, 5)
        iter_s = (time.perf_counter() - t0) / run.iterations
    grid = make_grid(model, ds, coords.min(1), coords.max(1), FFTParams(), affinity.n_points)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    Path(out).write_text(json.dumps({"n": affinity.n_points, "nnz": int(affinity.P.nnz), "build_s": build_s,
                                     "eval_s": eval_s, "iter_s": iter_s, "rss_gb": rss, "grid": grid.describe(),
                                     "kl": run.kl}))


def million(report, n, extent, time_std, tmp, models):
    rows = []
    for model, ds, dt in [case for case in [("tsne", 2, 0), ("snest", 2, 1)] if case[0] in models]:
        out = Path(tmp) / f"{model}.json"
        try:
            subprocess.run([sys.executable, __file__, "--child", model, str(ds), str(dt), str(n), str(extent),
                            str(time_std), str(out)], check=True, timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            rows.append((label(model, ds, dt), n, "-", f"> {CHILD_TIMEOUT} s for P + 4 evaluations + 5 iterations",
                         "-", "-", "-", "-"))
            continue
        r = json.loads(out.read_text())
        rows.append((label(model, ds, dt), r["n"], r["nnz"], f"{r['eval_s']:.2f}", f"{r['iter_s']:.2f}",
                     f"{r['rss_gb']:.2f}", r["grid"], f"{r['build_s']:.0f}"))
    report(f"## (d) N = {n} generated co-authorship graph (edges_per_author 7.5), fft, {THREADS} threads; clustered "
           f"layout of extent {extent:.0f} (the (c) run's final extent x sqrt(N / 1e5)), time std {time_std:.2f}")
    report(markdown_table(["embedding", "N", "nnz(P)", "s / evaluation", "s / dbd iteration", "peak RSS GB",
                           "grid", "P build s"], rows))
    report("Targets: <= 3 s per iteration on 2 cores, <= 8 GB peak RSS.")
    report()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip-grqc", action="store_true")
    parser.add_argument("--skip-opentsne", action="store_true")
    parser.add_argument("--skip-million", action="store_true")
    parser.add_argument("--n-large", type=int, default=100_000)
    parser.add_argument("--n-million", type=int, default=1_000_000)
    parser.add_argument("--million-models", default="tsne,snest", help="models of section (d), comma separated")
    parser.add_argument("--time-std", type=float, default=0.64,
                        help="SNEST layouts' time spread when (a) is skipped (GrQc R^{2,1}, exact, seed 0: 0.64)")
    parser.add_argument("--grqc-only", action="store_true", help="run section (a) only")
    parser.add_argument("--grqc-iterations", type=int, default=None,
                        help="section (a): exactly this many iterations per run, no stopping rule")
    parser.add_argument("--child", nargs=7, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, ds, dt, n, extent, time_std, out = args.child
        million_child(model, int(ds), int(dt), int(n), float(extent), float(time_std), out)
        return
    report = Report.start("FFT-accelerated interpolation repulsion", f"Default FFTParams: {FFTParams().as_dict()}")
    time_std = args.time_std
    if not args.skip_grqc:
        layouts = grqc_runs(report, args.grqc_iterations)
        time_std = float(layouts["snest", "exact"][2].std())
    if args.grqc_only:
        report.save(args.out)
        return
    affinity, knn_s, coords = large_problem(args.n_large)
    ours = {settings: large_ours(affinity, coords, *settings) for settings in SCALEMB_RUNS}
    extent = ours[SCALEMB_RUNS[0]][2]
    crossover(report, extent, time_std)
    if not args.skip_million:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            million(report, args.n_million, extent * np.sqrt(args.n_million / args.n_large), time_std, tmp,
                    args.million_models.split(","))
    if not args.skip_opentsne:  # last: openTSNE switches the process to flush-to-zero arithmetic
        large_opentsne(report, affinity, coords, knn_s, ours)
    else:
        report(markdown_table(["method", "iterations", "wall s", "s / iteration", "s / evaluation at the end",
                               "final KL", "extent", "grid at the end"],
                              [row for row, _, _ in ours.values()]))
    report.save(args.out)


if __name__ == "__main__":
    main()
