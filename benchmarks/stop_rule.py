"""Issue 29, item 2: where should t-SNE's spectral schedule at scale stop?  One long run per store of the schedule
(``optimizer='auto'``, ``SPECTRAL_THEN_POLISH``) with its stall test off and its budget raised to ``--cap``
iterations, the KL of every iteration and the layout every ``--snapshot-every`` iterations after the exaggeration
phase; then, for each relative-KL rule (``tol`` per iteration averaged over ``window`` iterations, the optimisers'
own ``optim.base.stalled``, as opt-SNE's "KL fell by less than KL/5000 in an iteration"), the iteration and wall
time where it would have stopped and the map's sampled NP@deg there, against the fixed budget it replaces
(``--fixed``) and the end of the long run.  Stopping earlier must not cost neighbourhoods: the rule is judged by
NP@deg, not by the KL it watches.

``python benchmarks/stop_rule.py --stores P100000.zarr,P200000.zarr --cap 1000 --out stop_rule.md``
(stores from ``scalemb generate coauthor --authors N --out eN.txt.gz && scalemb affinity eN.txt.gz --out
PN.zarr``; ``grqc``: the bundled ca-GrQc).
"""
import argparse
import os
import time
from pathlib import Path

import numpy as np

from common import machine_description, run_description
from sd_scale import load, score, warm_up

from scalemb.embedding import initial_coords
from scalemb.optim import make_optimizer
from scalemb.optim.base import stalled

RULES = [(tol, window) for window in (25, 50) for tol in (5e-5, 1e-4, 2e-4, 5e-4)]


def long_run(store, cap, every, start):
    """The schedule without its stall test for ``cap`` iterations: ``(history, seconds, snapshots {it: coords},
    cpu seconds, optimiser)``; snapshots from iteration ``start`` every ``every`` iterations (copied inside the
    clock: a copy costs far less than an evaluation)."""
    affinity, make = load(store)
    n = affinity.n_points
    opt = make_optimizer("auto", "tsne", n, tol=0.0, max_iterations=cap)
    snaps = {}
    with make() as ex:
        coords = initial_coords(ex.n_points, 2, 0, np.random.default_rng(0))
        warm_up(ex, coords)

        def checkpoint(it, export):
            if it >= start and it % every == 0:
                snaps[it] = np.array(export().coords)

        cpu = time.process_time()
        result = opt.optimize(ex, coords, cap, checkpoint=checkpoint)
        cpu = time.process_time() - cpu
    snaps[result.iterations] = np.array(result.coords)
    return affinity, result.kl_history, result.seconds, snaps, cpu, opt


def stop_of(history, start, tol, window):
    """The iteration the stall test ends the run at (None: it never fires within the history)."""
    for it in range(len(history)):
        if stalled(history, it, start, window, tol):
            return it
    return None


def section(store, args, lines):
    affinity, history, seconds, snaps, cpu, opt = long_run(store, args.cap, args.snapshot_every, args.start)
    n = affinity.n_points
    name = "ca-GrQc" if store == "grqc" else Path(store).name
    start = opt.exaggeration_iterations
    cache = {}

    def at(it):
        """(iteration of the snapshot at or before ``it``, KL there, wall s there, sampled NP@deg)."""
        keys = [k for k in snaps if k <= it]
        k = max(keys) if keys else min(snaps)
        if k not in cache:
            cache[k] = score(affinity, snaps[k].T, args.sample)[1]
        kl = history[k] if np.isfinite(history[k]) else np.nan
        return k, kl, seconds[min(k, len(seconds) - 1)], cache[k]

    lines += [f"## {name}: N = {n}, nnz(P) = {affinity.P.nnz}", "", run_description(),
              f"Long run: {len(history) - 1} iterations, {seconds[-1]:.1f} s wall, {cpu:.1f} s CPU, final KL "
              f"{history[-1]:.4f}; load at its end {os.getloadavg()[0]:.1f}.", "",
              "| stop | iteration | wall s | KL | NP@deg (sampled) | NP@deg - long run's end |",
              "|---|---|---|---|---|---|"]
    end = at(len(history) - 1)
    rows = [(f"fixed budget {args.fixed} (stop 41's default)", args.fixed)]
    rows += [(f"tol {tol:g}, window {window}", stop_of(history, start, tol, window)) for tol, window in RULES]
    rows += [(f"long run's end ({args.cap})", len(history) - 1)]
    for label, it in rows:
        if it is None:
            lines.append(f"| {label} | not before {args.cap} | - | - | - | - |")
            continue
        k, kl, wall, npd = at(it)
        lines.append(f"| {label} | {it} (snapshot {k}) | {wall:.1f} | {kl:.4f} | {npd:.3f} | {npd - end[3]:+.3f} |")
    curve = sorted(k for k in snaps if k % 50 == 0 or k == max(snaps))
    lines += ["", "NP@deg along the run: " + ", ".join(f"{k}: {at(k)[3]:.3f}" for k in curve), ""]
    print("\n".join(lines[-(len(rows) + 8):]), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="grqc")
    parser.add_argument("--cap", type=int, default=1000, help="iterations of the long run")
    parser.add_argument("--fixed", type=int, default=370, help="the fixed budget the rule replaces")
    parser.add_argument("--start", type=int, default=300, help="first snapshot iteration")
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--sample", type=int, default=5000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lines = ["# Where the spectral schedule at scale should stop: relative-KL rules against NP@deg (issue 29)", "",
             machine_description(), f"load at start {os.getloadavg()[0]:.1f}", ""]
    for store in args.stores.split(","):
        section(store, args, lines)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
