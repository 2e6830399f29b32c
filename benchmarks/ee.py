"""Elastic embedding: spectral direction vs delta-bar-delta vs gradient descent on SCHOOL and GrQc.

Usage: python benchmarks/ee.py [--out benchmarks/results/ee.md] [--lam 1] [--datasets school,grqc]
       [--iterations school:1000,grqc:500] [--slow-factor 4] [--repulsion exact] [--threads 2]

Every optimiser starts from the same random start (``scalemb.init.random_coords``, seed 0) with its stopping
rule off (``tol = 0``); the spectral-direction runs get the ``--iterations`` budget, dbd and gd ``--slow-factor``
times it.  Targets: the best final E among the runs plus 1 % and 0.1 % of it (the local minima the optimisers end
in can differ by less than 1 %), and the final E of dbd and of gd (the paper's comparison: how much sooner the
spectral direction gets where the others end); the table gives the first iteration and wall time at which each
run is at or below a target and the ratios to the spectral direction.  Optimiser settings are the defaults (what
``--optimizer dbd|sd|gd`` gives) except ``tol``; "sd fixed" is the spectral direction on the constant curvature
``4 L(P)`` (EE's exact attractive Hessian: one factorisation per run), "sd exaggeration" the spectral direction
with dbd's default exaggeration (x4 for the first 100 iterations: EE at lam / 4 there), "sd homotopy" the lambda
homotopy of ``scalemb.models.ee.homotopy`` (5 stages from lam / 100) with sd's budget in total.
"""
import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from scalemb.datasets import load_dataset
from scalemb.engine import LocalExecutor
from scalemb.init import random_coords
from scalemb.models import get_model
from scalemb.models.ee import homotopy
from scalemb.optim import make_optimizer

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, machine_description, markdown_table  # noqa: E402

RUNS = ("sd", "sd fixed", "sd exaggeration", "sd homotopy", "dbd", "gd")
TOLERANCES = (0.01, 0.001)


def run_one(executor, kind, model, coords, n_iter):
    if kind == "sd homotopy":
        stages = 5
        return homotopy(make_optimizer("sd", model, tol=0.0), executor, coords, stages=stages,
                        iterations=max(1, n_iter // stages))
    name = kind.split()[0]
    optimizer = make_optimizer(name, model, tol=0.0)
    if kind == "sd fixed":
        optimizer = replace(optimizer, curvature="fixed")
    if kind == "sd exaggeration":  # dbd's default phase: EE at lam / 4 for the first 100 iterations
        optimizer = replace(optimizer, exaggeration=4.0, exaggeration_iterations=min(100, n_iter // 2))
    return optimizer.optimize(executor, coords, n_iter)


def first_at_or_below(history, seconds, target):
    hits = np.flatnonzero(history <= target)
    return (int(hits[0]), float(seconds[hits[0]])) if hits.size else (None, None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--lam", type=float, default=None, help="EE lambda (default: the model's)")
    parser.add_argument("--datasets", default="school,grqc")
    parser.add_argument("--iterations", default="school:1000,grqc:500",
                        help="iteration budget of the spectral-direction runs per dataset, name:count,...")
    parser.add_argument("--slow-factor", type=int, default=4,
                        help="dbd and gd get this many times the iteration budget")
    parser.add_argument("--repulsion", default="exact", choices=("exact", "fft"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", default=",".join(RUNS))
    args = parser.parse_args(argv)
    budgets = dict((k, int(v)) for k, v in (item.split(":") for item in args.iterations.split(",")))
    report = Report()
    report("# Elastic embedding: spectral direction vs delta-bar-delta vs gradient descent")
    report()
    report(machine_description())
    report()
    report(f"`uname -a`: {' '.join(os.uname())}; `nproc`: {os.cpu_count()}; load average at start: "
           f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    report()
    model = get_model("ee") if args.lam is None else get_model("ee", lam=args.lam)
    report(f"Model: {model.description}; repulsion {args.repulsion}; {args.threads} threads; same random start "
           "(seed 0) for every run; stopping rule off (tol = 0); targets: best final E + 1 % / 0.1 %, final E of dbd "
           "and of gd.")
    for name in args.datasets.split(","):
        affinity = load_dataset(name)
        n_iter = budgets[name]
        coords = random_coords(affinity.n_points, 2, 0, np.random.default_rng([0, 0]))
        results = {}
        with LocalExecutor(affinity, model, 2, 0, n_threads=args.threads, repulsion=args.repulsion) as ex:
            for kind in args.runs.split(","):  # compile (numba, solvers) outside the timings
                run_one(ex, kind, model, coords, 5)
            for kind in args.runs.split(","):
                t0 = time.perf_counter()
                budget = n_iter if kind.startswith("sd") else args.slow_factor * n_iter
                results[kind] = run_one(ex, kind, model, coords, budget)
                print(f"{name} {kind}: E {results[kind].kl:.6g} after {results[kind].iterations} iterations, "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
        best = min(r.kl for r in results.values())
        report()
        report(f"## {name} (N = {affinity.n_points}; sd runs {n_iter} iterations, dbd and gd "
               f"{args.slow_factor * n_iter}; best final E {best:.6g})")
        report()
        report(markdown_table(["run", "final E", "iterations", "evaluations", "seconds"],
                              [[kind, f"{r.kl:.6g}", r.iterations, r.evaluations, f"{r.seconds[-1]:.1f}"]
                               for kind, r in results.items()]))
        targets = {f"best final E + {t:.1%}": best + t * abs(best) for t in TOLERANCES}
        targets.update({f"{kind}'s final E": results[kind].kl for kind in ("dbd", "gd") if kind in results})
        header, rows = ["run"], {kind: [kind] for kind in results}
        for label, target in targets.items():
            hits = {kind: first_at_or_below(r.kl_history, r.seconds, target) for kind, r in results.items()}
            sd_it, sd_s = hits.get("sd", (None, None))
            header += [f"to {label} ({target:.5g}): iterations, seconds", "ratio to sd"]
            for kind, (it, sec) in hits.items():
                rows[kind] += ["not reached" if it is None else f"{it}, {sec:.2f}",
                               f"{it / sd_it:.1f}x, {sec / sd_s:.1f}x" if it is not None and sd_it else "-"]
        report()
        report("First iteration (and wall time) at which E is at or below each target; ratios to sd:")
        report()
        report(markdown_table(header, list(rows.values())))
        checkpoints = [i for i in (0, 1, 10, 30, 100, 300, 500, 1000, 2000, 4000) if i <= args.slow_factor * n_iter]
        report()
        report("E at iteration " + ", ".join(map(str, checkpoints)) + ":")
        report()
        report(markdown_table(["run"] + [str(i) for i in checkpoints],
                              [[kind] + [f"{r.kl_history[i]:.5g}" if i < r.kl_history.size else "-"
                                         for i in checkpoints]
                               for kind, r in results.items()]))
    if args.out:
        Path(args.out).write_text(report.text())


if __name__ == "__main__":
    main()
