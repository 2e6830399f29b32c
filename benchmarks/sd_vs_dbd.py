"""Issue 29's "the spectral direction needs >= 10x fewer iterations than delta-bar-delta to the same KL", optimiser
against optimiser from one start.

Per store: t-SNE R^2 from the default random start (seed 0) through the exaggeration phase of t-SNE's schedule at
scale (``models.tsne.SPECTRAL_THEN_POLISH``: 125 momentum steps at x12, lr N/12, momentum 0.8); from that one
layout, without exaggeration,

* ``sd``: the schedule's spectral steps and polish (its ``SPECTRAL_THEN_POLISH`` options, no exaggeration phase,
  no stopping rule), ``--sd-iterations`` iterations;
* ``sd only``: the same options with every iteration a spectral step (``spectral_iterations`` None: no
  delta-bar-delta polish), the spectral direction as an optimiser on its own;
* ``dbd``: delta-bar-delta as openTSNE runs after its exaggeration phase (``OPENTSNE_SCHEDULE``'s second phase:
  momentum 0.8, lr N/12, each point's step bounded by 5), ``--dbd-iterations`` iterations;

and per KL target -- the KL delta-bar-delta has after 50, 100, 200, ... iterations and at its end -- the first
iteration each reaches it and their ratio.  The iterations of the shared exaggeration phase are not counted (the
optimisers differ only after it), nor the evaluations per iteration (a spectral step costs 1.3-2.7 evaluations'
worth at these sizes: ``sd_scale.md`` stop 40; the wall seconds are in the table).

``python benchmarks/sd_vs_dbd.py --stores P200000.zarr,P1000000.zarr --out FILE.md``
"""
import argparse
import time

import numpy as np

from common import machine_description, run_description
from scale import executor_for
from sd_scale import warm_up

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


def run(ex, name, options, start, iterations):
    """``[(iteration, seconds, kl)]`` of ``iterations`` iterations of optimiser ``name`` from ``start``."""
    curve, t0 = [], time.perf_counter()
    make_optimizer(name, "tsne", ex.n_points, **options).optimize(
        ex, start.copy(), iterations, callback=lambda it, kl: curve.append((it, time.perf_counter() - t0, kl)))
    return curve


def first_reaching(curve, target):
    return next(((it, s) for it, s, kl in curve if kl <= target), None)


def measure(path, sd_iterations, dbd_iterations, report):
    with executor_for(path) as ex:
        coords = initial_coords(ex.n_points, 2, 0, np.random.default_rng(0))
        warm_up(ex, coords)
        phase = make_optimizer("sd", "tsne", ex.n_points, **PHASE, tol=0.0)
        t0 = time.perf_counter()
        start = np.array(phase.optimize(ex, coords, PHASE["exaggeration_iterations"]).coords)
        report(f"{path}: N = {ex.n_points:,}, exaggeration phase {PHASE['exaggeration_iterations']} steps in "
               f"{time.perf_counter() - t0:.1f} s")
        sd = run(ex, "sd", SD, start, sd_iterations)
        report(f"  sd: {sd_iterations} iterations in {sd[-1][1]:.1f} s, KL {sd[-1][2]:.4f}")
        only = run(ex, "sd", SD_ONLY, start, sd_iterations)
        report(f"  sd only: {sd_iterations} iterations in {only[-1][1]:.1f} s, KL {only[-1][2]:.4f}")
        dbd = run(ex, "dbd", DBD, start, dbd_iterations)
        report(f"  dbd: {dbd_iterations} iterations in {dbd[-1][1]:.1f} s, KL {dbd[-1][2]:.4f}")
    rows = []
    last = dbd[-1][0]
    for m in [m for m in (50, 100, 200, 300, 400, 500, 624, 750, 1000) if m < last] + [last]:
        target = next(kl for it, s, kl in dbd if it >= m)
        d = first_reaching(dbd, target)
        row = [f"{ex.n_points:,}", f"dbd's KL at {m}: {target:.4f}", f"{d[0]} ({d[1]:.0f} s)"]
        for curve in (sd, only):
            s = first_reaching(curve, target)
            row += [f"{s[0]} ({s[1]:.0f} s)" if s else f"> {sd_iterations}",
                    f"**{d[0] / s[0]:.1f}**" if s else f"< {d[0] / sd_iterations:.1f}",
                    f"{d[1] / s[1]:.2f}" if s else "-"]
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", required=True, help="comma-separated affinity stores")
    parser.add_argument("--sd-iterations", type=int, default=150)
    parser.add_argument("--dbd-iterations", type=int, default=625, help="openTSNE's 750 less its phase's 125")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lines = [f"# {__doc__.splitlines()[0]}", "", machine_description(), run_description(), ""]

    def report(line):
        print(line, flush=True)
        lines.append("    " + line)

    rows = []
    for path in args.stores.split(","):
        rows += measure(path, args.sd_iterations, args.dbd_iterations, report)
    head = ["points", "KL target", "dbd: first iteration (s)", "sd: first iteration (s)",
            "iterations, dbd / sd", "wall, dbd / sd", "sd only: first iteration (s)", "iterations, dbd / sd only",
            "wall, dbd / sd only"]
    table = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    print("\n".join(table))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines + table) + "\n")


if __name__ == "__main__":
    main()
