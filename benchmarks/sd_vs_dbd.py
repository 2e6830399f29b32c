"""Issue 29's "the spectral direction needs >= 10x fewer iterations than delta-bar-delta to the same KL", optimiser
against optimiser from one start.

Per store: t-SNE R^2 from the default random start (seed 0) through the exaggeration phase of t-SNE's schedule at
scale (``models.tsne.SPECTRAL_THEN_POLISH``: 125 momentum steps at x12, lr N/12, momentum 0.8); from that one
layout, without exaggeration,

* ``sd``: the schedule's spectral steps and polish (its ``SPECTRAL_THEN_POLISH`` options, no exaggeration phase,
  no stopping rule), ``--sd-iterations`` iterations, with each ``--radii`` entry as its trust radius;
* ``sd only, radius r``: the same options with every iteration a spectral step (``spectral_iterations`` None: no
  delta-bar-delta polish), the spectral direction as an optimiser on its own, each point's step bounded by ``r``
  (``max_point_step``; one row per ``--radii`` entry, the schedule's 3 by default);
* ``dbd``: delta-bar-delta as openTSNE runs after its exaggeration phase (``OPENTSNE_SCHEDULE``'s second phase:
  momentum 0.8, lr N/12, each point's step bounded by 5), ``--dbd-iterations`` iterations;

and per KL target -- the KL delta-bar-delta has after 50, 100, 200, ... iterations and at its end -- the first
iteration each reaches it, their ratio, and the map there: sampled NP@deg and x extent (a lower KL bought by
spreading the layout shows as a lower NP@deg and a wider extent).  The iterations of the shared exaggeration
phase are not counted (the optimisers differ only after it), nor the evaluations per iteration (a spectral step
costs 1.3-2.7 evaluations' worth at these sizes: ``sd_scale.md`` stop 40; the wall seconds are in the table).

``python benchmarks/sd_vs_dbd.py --stores P200000.zarr,P1000000.zarr --radii 2,3 --out FILE.md``
"""
import argparse
import time

import numpy as np

from common import machine_description, run_description
from scale import executor_for
from sd_scale import neighbourhoods, warm_up

from scalemb.embedding import initial_coords
from scalemb.models.base import OPENTSNE_SCHEDULE
from scalemb.models.tsne import SPECTRAL_THEN_POLISH
from scalemb.optim import make_optimizer

PHASE = {k: SPECTRAL_THEN_POLISH[k] for k in ("exaggeration", "exaggeration_iterations", "exaggeration_steps")}
SD = {**{k: v for k, v in SPECTRAL_THEN_POLISH.items() if k not in PHASE and k not in ("optimizer", "max_iterations")},
      "exaggeration_iterations": 0, "tol": 0.0}
SD_ONLY = {**SD, "spectral_iterations": None}  # None: every iteration a spectral step
DBD = {"exaggeration_iterations": 0, "momentum": OPENTSNE_SCHEDULE["momentum"][1:], "momentum_switch": (),
       "max_step_norm": OPENTSNE_SCHEDULE["max_step_norm"]}


def run(ex, name, options, start, iterations, keep=None):
    """``([(iteration, seconds, kl)], {iteration: coords})`` of ``iterations`` iterations of optimiser ``name`` from
    ``start``; ``keep(it, kl)`` True keeps that iteration's coordinates (copied at the step, for scoring later)."""
    curve, kept, t0 = [], {}, time.perf_counter()

    def snapshot(it, kl, coords):
        if keep is not None and keep(it, kl):
            kept[it] = np.array(coords)
        return False

    result = make_optimizer(name, "tsne", ex.n_points, **options).optimize(
        ex, start.copy(), iterations, callback=lambda it, kl: curve.append((it, time.perf_counter() - t0, kl)),
        stop=snapshot)
    kept.setdefault(curve[-1][0], np.array(result.coords))  # the last iteration's: a target when it is dbd's
    return curve, kept


def first_reaching(curve, target):
    return next(((it, s) for it, s, kl in curve if kl <= target), None)


def marks(last):
    """delta-bar-delta's iterations whose KLs are the targets: 50 ... 1000 below its last, and its last."""
    return [m for m in (50, 100, 200, 300, 400, 500, 624, 750, 1000) if m < last] + [last]


def measure(path, sd_iterations, dbd_iterations, radii, sample, report):
    """Rows ``[points, KL target, optimiser, first iteration (s), iterations dbd / it, wall dbd / it, NP@deg, extent]``
    of one store: delta-bar-delta first (its KLs are the targets), then the schedule and the steps alone per radius,
    each scored (sampled NP@deg, x extent) at the first iteration reaching each target."""
    with executor_for(path) as ex:
        affinity = ex.affinity
        coords = initial_coords(ex.n_points, 2, 0, np.random.default_rng(0))
        warm_up(ex, coords)
        phase = make_optimizer("sd", "tsne", ex.n_points, **PHASE, tol=0.0)
        t0 = time.perf_counter()
        start = np.array(phase.optimize(ex, coords, PHASE["exaggeration_iterations"]).coords)
        report(f"{path}: N = {ex.n_points:,}, exaggeration phase {PHASE['exaggeration_iterations']} steps in "
               f"{time.perf_counter() - t0:.1f} s")
        wanted = set(marks(dbd_iterations))
        dbd, dbd_kept = run(ex, "dbd", DBD, start, dbd_iterations, keep=lambda it, kl: it in wanted)
        report(f"  dbd: {dbd_iterations} iterations in {dbd[-1][1]:.1f} s, KL {dbd[-1][2]:.4f}")
        targets = [(m, next(kl for it, s, kl in dbd if it >= m)) for m in marks(dbd[-1][0])]
        runs = [("dbd", dbd, dbd_kept)]
        candidates = [(f"sd (the schedule){'' if r == SD['max_point_step'] else f', radius {r:g}'}",
                       {**SD, "max_point_step": r}) for r in radii]
        candidates += [(f"sd only, radius {r:g}", {**SD_ONLY, "max_point_step": r}) for r in radii]
        for label, options in candidates:
            pending = sorted(kl for _, kl in targets)[::-1]  # highest KL first: reached first

            def keep(it, kl, pending=pending):
                hit = False
                while pending and kl <= pending[0]:
                    pending.pop(0)
                    hit = True
                return hit
            curve, kept = run(ex, "sd", options, start, sd_iterations, keep=keep)
            report(f"  {label}: {sd_iterations} iterations in {curve[-1][1]:.1f} s, KL {curve[-1][2]:.4f}")
            runs.append((label, curve, kept))
        rows = []
        for m, target in targets:
            d = first_reaching(dbd, target)
            for label, curve, kept in runs:
                # dbd's row is scored at the iteration whose KL is the target (its first at or after m)
                s = (next((it, sec) for it, sec, _ in dbd if it >= m) if label == "dbd"
                     else first_reaching(curve, target))
                if s is None:
                    rows.append([f"{ex.n_points:,}", f"dbd's KL at {m}: {target:.4f}", label, f"> {sd_iterations}",
                                 f"< {d[0] / sd_iterations:.1f}", "-", "-", "-"])
                    continue
                np_deg, extent = neighbourhoods(affinity, kept[s[0]].T, sample)  # its KL is in the curve
                rows.append([f"{ex.n_points:,}", f"dbd's KL at {m}: {target:.4f}", label, f"{s[0]} ({s[1]:.0f} s)",
                             "1" if label == "dbd" else f"**{d[0] / s[0]:.1f}**",
                             "1" if label == "dbd" else f"{d[1] / s[1]:.2f}", f"{np_deg:.3f}", f"{extent:.0f}"])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", required=True, help="comma-separated affinity stores")
    parser.add_argument("--sd-iterations", type=int, default=150)
    parser.add_argument("--dbd-iterations", type=int, default=625, help="openTSNE's 750 less its phase's 125")
    parser.add_argument("--radii", default="3", help="comma-separated trust radii (max_point_step) of the 'sd' and "
                        "'sd only' rows (the schedule's: 3)")
    parser.add_argument("--sample", type=int, default=10000, help="rows sampled for NP@deg")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lines = [f"# {__doc__.splitlines()[0]}", "", machine_description(), run_description(), ""]

    def report(line):
        print(line, flush=True)
        lines.append("    " + line)

    rows = []
    for path in args.stores.split(","):
        rows += measure(path, args.sd_iterations, args.dbd_iterations,
                        [float(r) for r in args.radii.split(",")], args.sample, report)
    head = ["points", "KL target", "optimiser", "first iteration (s)", "iterations, dbd / this", "wall, dbd / this",
            "NP@deg there (sampled)", "x extent there"]
    table = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    print("\n".join(table))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines + table) + "\n")


if __name__ == "__main__":
    main()
