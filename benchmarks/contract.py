"""Does the model contract (issue 19) cost anything?  Paired per-evaluation timings of two source trees.

Two long-lived worker processes, one importing scalemb from ``--main`` (default /work/main) and one from this
tree (each through PYTHONPATH), evaluate the same GrQc layouts with the same executor settings (one
``LocalExecutor.evaluate`` = attraction + repulsion + reduction).  Each round asks both for ``--evals``
evaluations of every configuration, alternating which tree goes first, and records the median seconds per
evaluation; the table gives the median over rounds of each tree and the median of the per-round ratios
(branch / main), which cancels the slow drift of a machine shared with other jobs.  Compilation happens before
the first round (one warm-up evaluation per configuration).

Configurations: t-SNE R^2 and SNEST R^{2,1}, exact and fft repulsion, on GrQc (N = 5241), coordinates
``scale * N(0, 1)`` from a fixed seed (scale 3: an uncapped fft grid).

    python benchmarks/contract.py [--rounds 7] [--evals 15] [--threads 2] [--out benchmarks/results/contract.md]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import Report, machine_description, markdown_table  # noqa: E402

CONFIGS = [("tsne", 2, 0, "exact"), ("tsne", 2, 0, "fft"), ("snest", 2, 1, "exact"), ("snest", 2, 1, "fft")]

WORKER = r"""
import json, sys, time
import numpy as np
import scalemb
from scalemb.datasets import grqc
from scalemb.engine import LocalExecutor
from scalemb.models import get_model

threads, scale = int(sys.argv[1]), float(sys.argv[2])
affinity = grqc()
executors, layouts = {}, {}
for line in sys.stdin:
    cmd = json.loads(line)
    key = (cmd["model"], cmd["ds"], cmd["dt"], cmd["repulsion"])
    if key not in executors:
        executors[key] = LocalExecutor(affinity, get_model(cmd["model"]), cmd["ds"], cmd["dt"], n_threads=threads,
                                       repulsion=cmd["repulsion"])
        layouts[key] = np.random.default_rng(0).normal(size=(cmd["ds"] + cmd["dt"], affinity.n_points)) * scale
        executors[key].evaluate(layouts[key])  # compile
    ex, Y = executors[key], layouts[key]
    times, kl = [], None
    for _ in range(cmd["evals"]):
        t = time.perf_counter()
        kl = ex.evaluate(Y).kl
        times.append(time.perf_counter() - t)
    print(json.dumps({"median": float(np.median(times)), "kl": kl, "file": scalemb.__file__}), flush=True)
"""


class Tree:
    """A worker process importing scalemb from ``root``."""

    def __init__(self, root: str, threads: int, scale: float):
        env = dict(os.environ, PYTHONPATH=root)
        self.root = root
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(threads), str(scale)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)

    def time(self, config, evals: int) -> dict:
        model, ds, dt, repulsion = config
        self.proc.stdin.write(json.dumps({"model": model, "ds": ds, "dt": dt, "repulsion": repulsion,
                                          "evals": evals}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker of {self.root} died")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(60)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", default="/work/main")
    parser.add_argument("--branch", default=str(HERE.parent))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--evals", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", type=float, default=3.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    report = Report()
    trees = {"main": Tree(args.main, args.threads, args.scale), "branch": Tree(args.branch, args.threads, args.scale)}
    results = {(c, t): [] for c in CONFIGS for t in trees}
    start = time.perf_counter()
    try:
        for c in CONFIGS:  # warm-up: compile, and check both trees compute the same KL
            kls = {t: trees[t].time(c, 1) for t in trees}
            if kls["main"]["kl"] != kls["branch"]["kl"]:
                report(f"warning: {c}: KL differs, main {kls['main']['kl']!r} branch {kls['branch']['kl']!r}")
        files = {t: trees[t].time(CONFIGS[0], 1)["file"] for t in trees}
        for r in range(args.rounds):
            order = ("main", "branch") if r % 2 == 0 else ("branch", "main")
            for c in CONFIGS:
                for t in order:
                    results[c, t].append(trees[t].time(c, args.evals)["median"])
    finally:
        for tree in trees.values():
            tree.close()
    rows = []
    for c in CONFIGS:
        m, b = np.array(results[c, "main"]), np.array(results[c, "branch"])
        ratios = b / m
        rows.append([f"{c[0]} R^{c[1]}" + (f",{c[2]}" if c[2] else ""), c[3], f"{1e3 * np.median(m):.2f}",
                     f"{1e3 * np.median(b):.2f}", f"{np.median(ratios):.3f}",
                     f"{ratios.min():.3f} - {ratios.max():.3f}"])
    report("# Model contract refactor: per-evaluation time, main vs branch (paired)")
    report()
    report(machine_description())
    report(f"uname: {' '.join(os.uname())}; nproc {os.cpu_count()}; load average at the end "
           f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    report(f"trees: main = {files['main']}, branch = {files['branch']}")
    report(f"GrQc (N = 5241), coordinates {args.scale:g} N(0,1) (seed 0), LocalExecutor with {args.threads} threads; "
           f"{args.rounds} rounds x {args.evals} evaluations per tree and configuration, alternating which tree "
           f"goes first; {time.perf_counter() - start:.0f} s in all")
    report()
    report(markdown_table(["model", "repulsion", "main ms/eval (median of rounds)", "branch ms/eval",
                           "ratio branch/main (median of rounds)", "ratio range"], rows))
    report()
    report("Both trees compute the same KL at the warm-up evaluation of every configuration unless a warning is "
           "printed above (the refactor is bit-identical: tests/test_determinism.py).")
    if args.out:
        Path(args.out).write_text(report.text())


if __name__ == "__main__":
    main()
