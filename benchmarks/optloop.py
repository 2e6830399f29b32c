"""The one optimiser loop (``scalemb.optim.loop``) against main's two loops: same numbers, same speed.

Usage: python benchmarks/optloop.py --main /work/main [--branch TREE] [--repeats 5]
       [--out benchmarks/results/optloop.md]

Paired runs: each repeat runs every configuration once with main's code and once with this tree's, each in a
fresh subprocess (``PYTHONPATH`` set to the tree), in alternating order (main first on even repeats, this tree
first on odd ones) so that drift in the shared machine's load hits both alike.  A run loads GrQc, warms the
kernels up with one evaluation (numba compilation is outside the timing) and times ``optimize`` alone, from
the same seed.  The table gives median times, the median of the per-pair time ratios (branch / main) and
whether the final KL and the coordinates (SHA-256 of their bytes) are identical in every pair.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

CONFIGS = {"sd": 100, "dbd": 300}  # optimizer -> iterations (GrQc, t-SNE R^2, seed 0)


def worker(name: str, n_iter: int) -> dict:
    """One timed run with whichever scalemb ``PYTHONPATH`` selects."""
    import scalemb
    from scalemb.datasets import grqc
    from scalemb.embedding import initial_coords
    from scalemb.engine import LocalExecutor
    from scalemb.models import get_model
    from scalemb.optim import make_optimizer

    affinity = grqc()
    with LocalExecutor(affinity, get_model("tsne"), 2, 0) as ex:
        coords = initial_coords(affinity.n_points, 2, 0, np.random.default_rng([0, 0]))
        ex.evaluate(coords)  # compile / warm up outside the timing
        optimizer = make_optimizer(name, "tsne", tol=0)
        t0 = time.perf_counter()
        result = optimizer.optimize(ex, coords, n_iter)
        seconds = time.perf_counter() - t0
    return {"kl": float(result.kl), "seconds": seconds, "iterations": int(result.iterations),
            "evaluations": int(result.evaluations), "sha": hashlib.sha256(result.coords.tobytes()).hexdigest(),
            "package": str(Path(scalemb.__file__).parent)}


def spawn(tree: str, name: str, n_iter: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.run([sys.executable, __file__, "--worker", name, str(n_iter)], env=env, capture_output=True,
                          text=True, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["package"].startswith(tree):
        raise RuntimeError(f"{tree}: the run imported scalemb from {out['package']}")
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--main", default="/work/main", help="checkout of the reference branch")
    parser.add_argument("--branch", default=None, help="tree to compare (default: the one holding this script)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]))))
        return
    from common import Report, machine_description, markdown_table

    branch = str(Path(args.branch or Path(__file__).resolve().parent.parent).resolve())
    trees = {"main": str(Path(args.main).resolve()), "branch": branch}
    report = Report()
    report("# One optimiser loop: main vs this branch (GrQc, t-SNE R^2, seed 0)")
    report()
    report(machine_description())
    report(f"uname: {' '.join(os.uname())}; nproc {os.cpu_count()}; load average at start "
           f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    report(f"main tree: {trees['main']}; branch tree: {branch}; {args.repeats} paired repeats, alternating order")
    report()
    results = {(name, side): [] for name in CONFIGS for side in trees}
    for repeat in range(args.repeats):
        order = ["main", "branch"] if repeat % 2 == 0 else ["branch", "main"]
        for name, n_iter in CONFIGS.items():
            for side in order:
                out = spawn(trees[side], name, n_iter)
                results[name, side].append(out)
                print(f"repeat {repeat} {name} {side}: KL {out['kl']:.10f} {out['seconds']:.2f} s", flush=True)
    rows = []
    for name, n_iter in CONFIGS.items():
        m, b = results[name, "main"], results[name, "branch"]
        same_kl = all(x["kl"] == y["kl"] for x, y in zip(m, b))
        same_coords = all(x["sha"] == y["sha"] for x, y in zip(m, b))
        ratios = [y["seconds"] / x["seconds"] for x, y in zip(m, b)]
        tm, tb = np.median([x["seconds"] for x in m]), np.median([y["seconds"] for y in b])
        rows.append([name, n_iter, f"{m[0]['kl']:.10f}", f"{b[0]['kl']:.10f}", "yes" if same_kl else "NO",
                     "yes" if same_coords else "NO", f"{m[0]['evaluations']} / {b[0]['evaluations']}",
                     f"{tm:.2f}", f"{tb:.2f}", f"{tb / tm:.3f}", f"{np.median(ratios):.3f}",
                     f"{min(ratios):.3f}-{max(ratios):.3f}"])
    report(markdown_table(["optimizer", "iterations", "KL main", "KL branch", "KL identical", "coords identical",
                           "evaluations main / branch", "median s main", "median s branch", "ratio of medians",
                           "median paired ratio", "paired ratio range"], rows))
    report()
    report(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        Path(args.out).write_text(report.text())


if __name__ == "__main__":
    main()
