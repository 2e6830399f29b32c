"""Delta-bar-delta vs spectral direction vs gradient descent on GrQc (t-SNE R^2, SNEST R^{2,1}).

Usage: python benchmarks/optimizers.py [--out benchmarks/results/optimizers.md]
       [--png benchmarks/results/optimizers.png]
       [--dbd-iterations 5000] [--sd-iterations 1000] [--skip-tuning]

For each embedding: dbd runs ``--dbd-iterations``; its final KL is the target.  sd and gd run from the same
start; the table gives the iteration and wall time at which each first reaches the target and the ratios
to dbd.  The overhead of the spectral direction (solve + extra line-search trials) is measured against the
mean time of one KL + gradient evaluation within the same run.  A tuning section records the settings behind
sd's defaults (solver, curvature, mu, line-search constants, early exaggeration).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

from scalemb.datasets import grqc
from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.models import get_model
from scalemb.optim import make_optimizer

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, timings, markdown_table  # noqa: E402

EMBEDDINGS = [("tsne", 2, 0), ("snest", 2, 1)]


def label(model, ds, dt):
    return f"{model} R^{ds}" + (f",{dt}" if dt else "")


def run(affinity, model, ds, dt, optimizer, n_iter, seed=0):
    """The optimiser's result, with ``eval_seconds``: the mean time of one evaluation within the run."""
    with LocalExecutor(affinity, get_model(model), ds, dt) as ex:
        coords = initial_coords(affinity.n_points, ds, dt, np.random.default_rng([seed, 0]))
        ex.evaluate(coords)  # compile / warm up outside the timing
        evaluate, timings = ex.evaluate, []

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = evaluate(*args, **kwargs)
            timings.append(time.perf_counter() - t0)
            return result

        ex.evaluate = timed
        result = optimizer.optimize(ex, coords, n_iter)
        result.eval_seconds = float(np.mean(timings))
        return result


def evaluation_time(affinity, model, ds, dt, coords):
    with LocalExecutor(affinity, get_model(model), ds, dt) as ex:
        return float(np.median(timings(lambda: ex.evaluate(coords), 20)))


def reach(result, target):
    hits = np.nonzero(result.kl_history <= target)[0]
    if not hits.size:
        return None, None
    return int(hits[0]), float(result.seconds[hits[0]])


def compare(report, affinity, dbd_iterations, sd_iterations):
    runs = {}
    rows = []
    for model, ds, dt in EMBEDDINGS:
        dbd = run(affinity, model, ds, dt, make_optimizer("dbd", tol=0), dbd_iterations)
        sd = run(affinity, model, ds, dt, make_optimizer("sd", tol=0), sd_iterations)
        gd = run(affinity, model, ds, dt, make_optimizer("gd", tol=0), sd_iterations)
        runs[(model, ds, dt)] = {"dbd": dbd, "sd": sd, "gd": gd}
        target = dbd.kl
        t_eval = evaluation_time(affinity, model, ds, dt, sd.coords)
        for name, res in (("dbd", dbd), ("sd", sd), ("gd", gd)):
            it, sec = reach(res, target)
            per_iter = res.seconds[-1] / max(res.iterations, 1)
            overhead = per_iter / res.eval_seconds - 1.0
            rows.append((label(model, ds, dt), name, f"{res.kl:.4f}", res.iterations,
                         f"{res.seconds[-1]:.1f}", "-" if it is None else it,
                         "-" if sec is None else f"{sec:.1f}",
                         "-" if it is None or name == "dbd" else f"{dbd.iterations / max(it, 1):.1f}x",
                         "-" if sec is None or name == "dbd" else f"{dbd.seconds[-1] / max(sec, 1e-9):.1f}x",
                         f"{res.evaluations / max(res.iterations, 1):.2f}", f"{1e3 * res.eval_seconds:.1f}",
                         f"{1e3 * per_iter:.1f}", f"{100 * overhead:+.0f}%"))
        report(f"- {label(model, ds, dt)}: target = dbd KL after {dbd_iterations} iterations = {target:.4f}; "
               f"one KL+gradient evaluation = {1e3 * t_eval:.1f} ms (median of 20)")
    report()
    report(markdown_table(["embedding", "optimizer", "final KL", "iterations", "wall s", "iter. to target",
                           "s to target", "fewer iter. vs dbd", "less time vs dbd", "evals / iter.",
                           "ms / eval. in the run", "ms / iter.", "overhead vs 1 eval"], rows))
    report("Overhead = time per iteration / time of one evaluation in the same run - 1: the direction's solve and "
           "factorisations plus the line search's extra evaluations (the machine's speed drifts between runs, "
           "so both are taken from the same run).")
    report()
    return runs


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 4.2 * len(runs)), squeeze=False)
    for row, ((model, ds, dt), results) in enumerate(runs.items()):
        for name, res in results.items():
            axes[row, 0].plot(np.arange(res.kl_history.size), res.kl_history, label=name)
            axes[row, 1].plot(res.seconds, res.kl_history, label=name)
        for col, xlabel in enumerate(("iteration", "seconds")):
            ax = axes[row, col]
            ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("exact KL(P||Q)")
            ax.set_title(f"GrQc, {label(model, ds, dt)}")
            finals = [r.kl for r in results.values()]
            ax.set_ylim(min(finals) - 0.05, max(max(finals) + 0.3, min(finals) + 1.5))
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def tuning(report, affinity, n_iter=300):
    report(f"## Settings behind sd's defaults (GrQc, {n_iter} iterations, seed 0)")
    settings = [("sd", {}), ("sd", {"refactor_every": 1}), ("sd", {"refactor_every": 5}),
                ("sd", {"growth": 1.0})]
    settings += [("sd", {"solver": "cg"}), ("sd", {"solver": "cg", "cg_tol": 1e-2}),
                 ("sd", {"solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 200})]
    settings += [("sd", {"curvature": "fixed"}), ("sd", {"curvature": "fixed", "solver": "cg"})]
    settings += [("sd", {"mu": mu}) for mu in (1e-7, 1e-3)]
    settings += [("sd", {"max_step": np.inf, "growth": 1.5}), ("sd", {"rho": 0.8, "c": 0.1, "growth": 1.5,
                                                                     "max_step": np.inf})]
    settings += [("sd", {"exaggeration": 4.0, "exaggeration_iterations": 100})]
    rows = []
    for model, ds, dt in EMBEDDINGS:
        for name, kw in settings:
            try:
                res = run(affinity, model, ds, dt, make_optimizer(name, tol=0, **kw), n_iter)
                kl, evals, sec = f"{res.kl:.4f}", f"{res.evaluations / max(res.iterations, 1):.2f}", \
                    f"{res.seconds[-1]:.1f}"
                at100 = f"{res.kl_history[min(100, res.iterations)]:.3f}"
            except FloatingPointError as exc:
                kl, evals, sec, at100 = f"diverged ({exc})", "-", "-", "-"
            setting = ", ".join(f"{k}={v}" for k, v in kw.items()) or "defaults"
            rows.append((label(model, ds, dt), setting, at100, kl, evals, sec))
    report(markdown_table(["embedding", "sd setting", "KL@100", f"KL@{n_iter}", "evals / iter.", "wall s"], rows))
    report()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--png", default=None)
    parser.add_argument("--dbd-iterations", type=int, default=5000)
    parser.add_argument("--sd-iterations", type=int, default=1000)
    parser.add_argument("--skip-tuning", action="store_true")
    args = parser.parse_args()
    report = Report.start("Optimisers on GrQc: delta-bar-delta (dbd), spectral direction (sd), gradient descent (gd)")
    affinity = grqc()
    runs = compare(report, affinity, args.dbd_iterations, args.sd_iterations)
    if args.png:
        plot(runs, args.png)
        report(f"Plot: {Path(args.png).name} (KL vs iteration and vs seconds, log x).")
        report()
    if not args.skip_tuning:
        tuning(report, affinity)
    report.save(args.out)


if __name__ == "__main__":
    main()
