"""Issue 29: time-to-quality of t-SNE R^2 at scale -- KL and sampled NP@deg against wall time -- for scalemb's
default optimiser (``optimizer='auto'``), scalemb's previous default at scale (delta-bar-delta with openTSNE's
schedule, ``OPENTSNE_SCHEDULE``) and openTSNE's defaults on the same P (``PrecomputedAffinities``, one job per
usable core, in a child process).

Per store, all rows in one run (the machine is shared: compare within a table).  scalemb's runs are in this
process after a JIT warm-up (one evaluation, one curvature and one Laplacian product); their KL is the optimiser's
own, per iteration; the layout is copied every ``--every`` seconds (the copy is inside the clock, the metrics are
not).  openTSNE's layouts are taken by its callback every ``--opentsne-every`` iterations and scored afterwards with
the same KL (``scalemb.metrics.kl``, the t-SNE kernel with FFT repulsion) and NP@deg (``scalemb.metrics``,
``--sample`` rows, seed 0) as scalemb's.  openTSNE runs in a child process started with scalemb's runs (they
overlap: on a machine shared with other work that adds one process to the load; the results file says so).

``--model snest``: SNEST R^{2,1} instead (KL and NP@deg under SNEST's kernel; no openTSNE rows; the reference
column is the last candidate's, e.g. ``--candidates 'auto;snestdbd'`` for the old default).

``python benchmarks/sd_scale.py --stores grqc,P100000.zarr,P200000.zarr --candidates 'hybrid;dbd' --out
benchmarks/results/sd_scale.md`` (``--candidates``: which scalemb runs, ``candidate``)
(stores from ``scalemb generate coauthor --authors N --out eN.txt.gz && scalemb affinity eN.txt.gz --out
PN.zarr``; ``grqc``: the bundled ca-GrQc).
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import machine_description, option_overrides, run_description
from scale import executor_for

from scalemb.affinity.store import AffinityStore
from scalemb.embedding import initial_coords
from scalemb.engine.local import LocalExecutor
from scalemb.models import get_model
from scalemb.models.base import OPENTSNE_SCHEDULE
from scalemb.models.tsne import SPECTRAL_THEN_POLISH
from scalemb.optim import make_optimizer
from scalemb.repulsion.spec import FFTParams


# The spectral-direction candidate at scale measured here (issue 29), all of it ``LineSearchDescent`` options:
# openTSNE's exaggeration phase first (x12 for 250 iterations, bounded momentum steps, lr N/12, one evaluation each:
# the layout stays ~20 units wide, so they are cheap), then the spectral direction solved by 10 Jacobi-preconditioned
# CG iterations (a multigrid V-cycle costs about an evaluation at 1e5 points, 10 Laplacian products ~0.1) with every
# point's step bounded to norm 5 (openTSNE's ``max_step_norm``), stopping once the KL falls by less than 0.2 % per
# iteration over 10 iterations.
SPECTRAL_AT_SCALE = {"optimizer": "sd", "solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 10,
                     "cg_tol": 0.1, "max_point_step": 5.0, "exaggeration": 12.0, "exaggeration_iterations": 250,
                     "exaggeration_steps": "momentum", "tol": 2e-3, "window": 10}
# The hybrid (issue 29's next step): the same exaggeration phase and spectral steps, then after
# ``spectral_iterations`` of them delta-bar-delta momentum steps as openTSNE's (momentum 0.8, lr N/12, each point's
# step bounded by 5) for the neighbourhoods, until the KL falls by less than ``tol`` per iteration over ``window``.
HYBRID = {**SPECTRAL_AT_SCALE, "spectral_iterations": 10, "tol": 0.0, "window": 50}
# SNEST's default at scale before stop 42: delta-bar-delta with its own defaults (the SNEST paper's exaggeration x4
# for 100 iterations) and openTSNE's budget of 750 iterations.
SNEST_DBD = {"optimizer": "dbd", "max_iterations": 750}


def candidate(spec: str):
    """``(label, options)`` of a ``--candidates`` entry: ``auto``, ``dbd`` (openTSNE's schedule), ``sd``
    (``SPECTRAL_AT_SCALE``), ``hybrid`` (``HYBRID``), ``sd0`` (``LineSearchDescent``'s defaults), ``spt``
    (t-SNE's ``SPECTRAL_THEN_POLISH``) or ``snestdbd`` (SNEST's default at scale before stop 42), each
    optionally followed by ``:key=value,...`` overrides (JSON values), e.g.
    ``hybrid:spectral_iterations=10,tol=1e-4``; keys ``fft_points``, ``fft_box_width``, ``fft_accuracy`` set the
    run's FFT grid (``FFTParams``; the rest are the optimiser's)."""
    name, _, extra = spec.partition(":")
    base = {"auto": {"optimizer": "auto"}, "dbd": OPENTSNE_SCHEDULE, "sd": SPECTRAL_AT_SCALE, "hybrid": HYBRID,
            "sd0": {"optimizer": "sd"}, "spt": SPECTRAL_THEN_POLISH, "snestdbd": SNEST_DBD}[name]
    overrides = option_overrides(extra)
    labels = {"auto": "scalemb auto", "dbd": "scalemb dbd, openTSNE schedule (old default)",
              "sd": "scalemb sd, SPECTRAL_AT_SCALE", "hybrid": "scalemb hybrid, HYBRID",
              "sd0": "scalemb sd, its defaults", "spt": "scalemb sd, t-SNE's SPECTRAL_THEN_POLISH",
              "snestdbd": "scalemb dbd x4/100, 750 it. (SNEST's old default)"}
    label = labels[name] + (f" {extra}" if extra else "")
    return label, {**base, **overrides}


FFT_KEYS = {"fft_points": "points", "fft_box_width": "box_width", "fft_accuracy": "accuracy"}


def split_fft(options):
    """``(optimiser options, FFTParams or None)`` of a candidate's options (``FFT_KEYS``)."""
    fft = {FFT_KEYS[k]: v for k, v in options.items() if k in FFT_KEYS}
    rest = {k: v for k, v in options.items() if k not in FFT_KEYS}
    return rest, (FFTParams(**fft) if fft else None)


# --model: (space dims, time dims) of the embedding each model is measured in (t-SNE R^2, SNEST R^{2,1}).
MODEL_DIMS = {"tsne": (2, 0), "snest": (2, 1)}


def load(store, fft_params=None, model="tsne"):
    """``(affinity, executor factory)`` for a store path or ``grqc``; ``fft_params``: the executor's FFT grid
    (None: its defaults); ``model``: a key of ``MODEL_DIMS``."""
    space, time_ = MODEL_DIMS[model]
    if store == "grqc":
        from scalemb.datasets import grqc

        affinity = grqc()
        return affinity, lambda: LocalExecutor(affinity, get_model(model), space, time_, repulsion="auto",
                                               fft_params=fft_params)
    if model == "tsne":
        return AffinityStore(store).to_affinity(), lambda: executor_for(store, fft_params=fft_params)
    stored = AffinityStore(store)
    affinity = stored.to_affinity()
    return affinity, lambda: LocalExecutor(affinity, get_model(model), space, time_,
                                           partitions=stored.partitions, repulsion="auto", fft_params=fft_params)


def warm_up(ex, coords):
    ex.evaluate(coords)
    ex.set_curvature(coords)
    ex.laplacian_matvec(coords)


def run_scalemb(make, optimizer, iterations, every, progress=None):
    """One run from the default random start (seed 0): ``(curve [(iteration, seconds, kl)], snapshots
    [(iteration, seconds, coords)], result)``.  ``progress(label_free_row)``, if given, is called with each
    snapshot as it is taken (``(iteration, seconds, coords)``); the clock is stopped while it runs."""
    curve, snaps = [], []
    with make() as ex:
        coords = initial_coords(ex.n_points, ex.space_dims, ex.time_dims, np.random.default_rng(0))
        warm_up(ex, coords)
        start = [time.perf_counter()]
        cpu = [time.process_time()]
        last = [-np.inf]

        def callback(it, kl):
            curve.append((it, time.perf_counter() - start[0], kl))

        def checkpoint(it, export):
            now = time.perf_counter() - start[0]
            if now - last[0] >= every:
                last[0] = now
                snaps.append((it, now, np.array(export().coords)))
                if progress is not None:
                    paused, paused_cpu = time.perf_counter(), time.process_time()
                    progress(snaps[-1])
                    start[0] += time.perf_counter() - paused
                    cpu[0] += time.process_time() - paused_cpu

        result = optimizer.optimize(ex, coords, iterations, callback=callback, checkpoint=checkpoint)
        seconds = time.perf_counter() - start[0]
        result.cpu_seconds = time.process_time() - cpu[0]  # this process's CPU (all threads), scoring excluded
    snaps.append((result.iterations, seconds, np.array(result.coords)))
    curve.append((result.iterations, seconds, result.kl))
    return curve, snaps, result


def opentsne_child(store, out, every):
    """(Child process.)  openTSNE with its defaults on the store's P, one job per usable core, seed 0; layouts
    every ``every`` iterations with the seconds since ``fit`` began, saved to ``out`` (npz)."""
    from openTSNE import TSNE
    from openTSNE.affinity import PrecomputedAffinities

    affinity, _ = load(store)
    snaps, start = [], [0.0]

    def snapshot(iteration, error, embedding):
        snaps.append((iteration, time.perf_counter() - start[0], np.array(embedding)))

    tsne = TSNE(n_jobs=len(os.sched_getaffinity(0)), random_state=0, callbacks=snapshot,
                callbacks_every_iters=every)
    start[0] = time.perf_counter()
    cpu = time.process_time()
    Y = np.asarray(tsne.fit(affinities=PrecomputedAffinities(affinity.P)))
    seconds = time.perf_counter() - start[0]
    cpu = time.process_time() - cpu  # the fit's CPU, all its threads (the callback's copies included)
    # openTSNE counts the exaggeration phase's iterations and the rest separately: number them in one sequence
    its = [s[0] for s in snaps]
    offset = [0] * len(its)
    for k in range(1, len(its)):
        offset[k] = offset[k - 1] + (its[k - 1] if its[k] <= its[k - 1] else 0)
    numbered = [i + o for i, o in zip(its, offset)]
    keep = [k for k, i in enumerate(numbered) if i < 750]  # the last one is the fit's result, timed at its end
    np.savez(out, iterations=np.array([numbered[k] for k in keep] + [750]),
             seconds=np.array([snaps[k][1] for k in keep] + [seconds]),
             layouts=np.stack([snaps[k][2] for k in keep] + [Y]), cpu=cpu)


def score(affinity, coords_n2, sample, model="tsne"):
    """``(KL, sampled NP@deg, x extent)`` of the ``(N, d)`` layout under ``model``'s kernel (the space dimensions
    of ``MODEL_DIMS``)."""
    from scalemb.metrics import kl

    Y = np.ascontiguousarray(coords_n2)
    return (kl(affinity, Y, model, MODEL_DIMS[model][0]), *neighbourhoods(affinity, Y, sample, model))


def neighbourhoods(affinity, coords_n2, sample, model="tsne"):
    """``(sampled NP@deg, x extent)`` of the ``(N, d)`` layout (``score`` without the KL, for a caller that has it)."""
    from scalemb.metrics import graph_metrics

    Y = np.ascontiguousarray(coords_n2)
    npd = graph_metrics(affinity.P, Y, model, MODEL_DIMS[model][0], sample=sample)["np@deg"]
    return npd.value, float(np.ptp(Y[:, 0]))


def first_time_below(curve, target):
    """``(iteration, seconds)`` of the first entry with KL <= target, or None."""
    for it, seconds, kl in curve:
        if kl <= target:
            return it, seconds
    return None


def size_section(store, args, lines):
    affinity, make = load(store, model=args.model)
    n = affinity.n_points
    name = "ca-GrQc" if store == "grqc" else Path(store).name
    lines += [f"## {name}: N = {n}, nnz(P) = {affinity.P.nnz}", "", run_description(), ""]
    rows, finals, scored_curves, cpus = [], {}, {}, {}
    options = lambda schedule: {k: v for k, v in schedule.items() if k != "optimizer"}  # noqa: E731
    candidates = []
    for spec in args.candidates.split(";"):
        label, opts = candidate(spec)
        opts, fft_params = split_fft(opts)
        opt = make_optimizer(opts["optimizer"], args.model, n, **options(opts))
        candidates.append((f"{label} ({opt.name})" if spec == "auto" else label, opt, fft_params))
    runs = {}
    child = None
    # openTSNE (t-SNE only) alongside scalemb's runs (one more process on a machine loaded by others)
    if not args.skip_opentsne and args.model == "tsne":
        out = Path(args.workdir) / f"opentsne_{name}.npz"
        child = subprocess.Popen([sys.executable, __file__, "--opentsne-child", store, str(out),
                                  str(args.opentsne_every)])
    for index, (label, opt, fft_params) in enumerate(candidates):
        if any((opt, fft_params) == (other, fft) for _, other, fft in candidates[:index]):
            continue  # auto is one of the explicit schedules
        budget = args.sd_iterations if "SPECTRAL_AT_SCALE" in label else args.iterations
        scored = {}

        def progress(snap, label=label, scored=scored):
            it, seconds, coords = snap
            scored[it] = score(affinity, coords.T, args.sample, args.model)
            print(f"{label} | {it} | {seconds:.1f} | {scored[it][0]:.4f} | {scored[it][1]:.3f} | "
                  f"{scored[it][2]:.0f} | load {os.getloadavg()[0]:.1f}", flush=True)

        curve, snaps, result = run_scalemb(load(store, fft_params, args.model)[1], opt, budget, args.every, progress)
        runs[label] = curve
        cpus[label] = result.cpu_seconds
        print(label, result.iterations, curve[-1], f"cpu {result.cpu_seconds:.1f} s", flush=True)
        for it, seconds, coords in snaps:
            kl_value, np_deg, extent = scored.get(it) or score(affinity, coords.T, args.sample, args.model)
            rows.append((label, it, seconds, kl_value, np_deg, extent))
        finals[label] = rows[-1]
        scored_curves[label] = [r[1:] for r in rows if r[0] == label]
    if child is not None:
        if child.wait() != 0:
            raise RuntimeError(f"openTSNE failed ({child.returncode})")
        data = np.load(out)
        label = f"openTSNE 1.0.4 defaults ({len(os.sched_getaffinity(0))} jobs)"
        curve = []
        for it, seconds, Y in zip(data["iterations"], data["seconds"], data["layouts"]):
            kl_value, np_deg, extent = score(affinity, Y, args.sample)
            rows.append((label, int(it), float(seconds), kl_value, np_deg, extent))
            curve.append((int(it), float(seconds), kl_value))
        runs[label] = curve
        cpus[label] = float(data["cpu"]) if "cpu" in data else float("nan")
        scored_curves[label] = [r[1:] for r in rows if r[0] == label]
        finals[label] = rows[-1]
    lines += ["| run | iteration | wall s | KL | NP@deg (sampled) | x extent |", "|---|---|---|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.4f} | {r[4]:.3f} | {r[5]:.0f} |" for r in rows]
    lines += ["", "| run | final KL | final NP@deg | wall s | first reaches the reference's final KL at "
              "(iteration, s) | time ratio to the reference | first scored snapshot at or below it (iteration, s, "
              "NP@deg) | its time ratio | CPU s (whole run) |", "|---|---|---|---|---|---|---|---|---|"]
    reference = next((k for k in finals if k.startswith("openTSNE")), None) or list(finals)[-1]
    target, ref_seconds = finals[reference][3], finals[reference][2]
    for label, final in finals.items():
        hit = first_time_below(runs[label], target)
        reach = f"{hit[0]}, {hit[1]:.1f}" if hit else "not reached"
        ratio = f"{hit[1] / ref_seconds:.2f}" if hit else "-"
        snap = next((r for r in scored_curves[label] if r[2] <= target), None)
        at = f"{snap[0]}, {snap[1]:.1f}, {snap[3]:.3f}" if snap else "not reached"
        snap_ratio = f"{snap[1] / ref_seconds:.2f}" if snap else "-"
        lines.append(f"| {label} | {final[3]:.4f} | {final[4]:.3f} | {final[2]:.1f} | {reach} | {ratio} | {at} | "
                     f"{snap_ratio} | {cpus.get(label, float('nan')):.1f} |")
    lines += ["", f"reference: {reference} (final KL {target:.4f}); KL of scalemb's runs in the reach column: the "
              "optimiser's per-iteration value; NP@deg over "
              f"{args.sample} sampled rows (seed 0).", ""]
    print("\n".join(lines[-12:]), flush=True)


def combine(paths, step=0.0):
    """One run's tables from the outputs of its processes started together (``--out`` files, or the progress log
    of a process that did not finish): every snapshot (with ``step`` > 0 the first one in each ``step`` seconds
    and the last, openTSNE's all), then per run its last snapshot and the first ones at openTSNE's final KL and at
    that KL with NP@deg >= openTSNE's + 0.02 (issue 29's goal), with their time ratios to openTSNE's wall time."""
    import re

    rows = []
    for path in paths:
        for line in open(path):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if str(path).endswith(".log") and len(cells) == 7 and cells[6].startswith("load"):
                rows.append((cells[0], int(cells[1]), *map(float, cells[2:6])))
            elif (not str(path).endswith(".log") and len(cells) == 6 and re.fullmatch(r"\d+", cells[1])):
                rows.append((cells[0], int(cells[1]), *map(float, cells[2:6])))
    rows = list({(r[0], r[1]): r for r in rows}.values())
    labels = list(dict.fromkeys(r[0] for r in rows))
    ref = next(label for label in labels if label.startswith("openTSNE"))
    target, ref_seconds, ref_np = (lambda r: (r[3], r[2], r[4]))([r for r in rows if r[0] == ref][-1])
    out = ["| run | iteration | wall s | KL | NP@deg (sampled) | x extent |", "|---|---|---|---|---|---|"]
    for label in labels:
        mine = [r for r in rows if r[0] == label]
        for k, r in enumerate(mine):
            if step and not label.startswith("openTSNE") and 0 < k < len(mine) - 1 and \
                    int(mine[k - 1][2] // step) == int(r[2] // step):
                continue
            out.append(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.4f} | {r[4]:.3f} | {r[5]:.0f} |")
    out += ["", f"| run | last snapshot: iteration, wall s, KL, NP@deg | first snapshot with KL <= openTSNE's final "
            f"({target:.4f}): iteration, s, NP@deg | its time ratio | first with that KL and NP@deg >= openTSNE's + "
            f"0.02 ({ref_np + 0.02:.3f}): iteration, s | its time ratio |", "|---|---|---|---|---|---|"]
    for label in labels:
        mine = [r for r in rows if r[0] == label]
        hit = next((r for r in mine if r[3] <= target), None)
        both = next((r for r in mine if r[3] <= target and r[4] >= ref_np + 0.02 - 1e-9), None)
        last = mine[-1]
        reach = f"{hit[1]}, {hit[2]:.1f}, {hit[4]:.3f} | {hit[2] / ref_seconds:.2f}" if hit else "not reached | -"
        goal = f"{both[1]}, {both[2]:.1f} | {both[2] / ref_seconds:.2f}" if both else "not reached | -"
        out.append(f"| {label} | {last[1]}, {last[2]:.1f}, {last[3]:.4f}, {last[4]:.3f} | {reach} | {goal} |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stores", default="grqc")
    parser.add_argument("--model", default="tsne", choices=sorted(MODEL_DIMS),
                        help="tsne (R^2, against openTSNE) or snest (R^{2,1}; no openTSNE rows)")
    parser.add_argument("--candidates", default="auto;dbd;sd;hybrid",
                        help="scalemb runs, ';'-separated: auto, dbd, sd, hybrid, each with optional "
                             "':key=value,...' option overrides (JSON values)")
    parser.add_argument("--iterations", type=int, default=1000, help="budget of scalemb's runs")
    parser.add_argument("--sd-iterations", type=int, default=310, help="budget of the SPECTRAL_AT_SCALE run")
    parser.add_argument("--every", type=float, default=20.0, help="seconds between scalemb layout snapshots")
    parser.add_argument("--opentsne-every", type=int, default=50)
    parser.add_argument("--sample", type=int, default=5000)
    parser.add_argument("--skip-opentsne", action="store_true")
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--opentsne-child", nargs=3, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--combine", nargs="+", default=None,
                        help="print one run's tables from the --out files / progress logs of its processes")
    parser.add_argument("--combine-every", type=float, default=0.0, help="with --combine: a snapshot per this many s")
    args = parser.parse_args()
    if args.combine:
        return print(combine(args.combine, args.combine_every))
    if args.opentsne_child:
        store, out, every = args.opentsne_child
        return opentsne_child(store, out, int(every))
    title = "t-SNE R^2" if args.model == "tsne" else "SNEST R^{2,1}"
    lines = [f"# The spectral direction at every size: time to quality, {title} (issue 29)", "",
             machine_description() + "  ", ""]
    for store in [s for s in args.stores.split(",") if s]:
        size_section(store, args, lines)
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
