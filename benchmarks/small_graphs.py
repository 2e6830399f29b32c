"""Small graphs, where the spectral direction factorises ``L(C) + mu I`` on every iteration (below 1024 points) or
every 10 (GrQc): the cost of an iteration next to its evaluation, and the resident memory of a CLI run, which
factorises on a helper thread (``optim.solvers.interruptible``).

``python benchmarks/small_graphs.py --lines 200,1000 --rounds 3``: for each sub-graph (the first LINES edges of
GrQc, ``../shared/data/ca-GrQc.txt``), SNEST R^{2,1} with defaults, in-process (``Embedder.fit``, after a JIT
warm-up): iterations, wall s, ms per iteration, KL; then ``scalemb embed`` (a subprocess, checkpoints on) on the
whole GrQc for ``--cli-iterations``: wall s and peak RSS.  Run it once per code version (``PYTHONPATH`` on an older
worktree) in alternation: same-run ratios only.
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_description  # noqa: E402

GRQC = Path(__file__).resolve().parents[2] / "shared" / "data" / "ca-GrQc.txt"


def sub_graph(lines: int, folder: Path) -> Path:
    """The first ``lines`` edges of GrQc as an edge list."""
    edges = [line for line in GRQC.read_text().splitlines() if line and not line.startswith("#")][:lines]
    path = folder / f"grqc_{lines}.txt"
    path.write_text("\n".join(edges) + "\n")
    return path


def in_process(path: Path, rounds: int) -> dict:
    import scalemb

    def fit():
        est = scalemb.Embedder(model="snest", random_state=0)
        start = time.perf_counter()
        est.fit(str(path))
        return time.perf_counter() - start, est

    fit()  # JIT warm-up
    runs = [fit() for _ in range(rounds)]
    wall = float(np.median([w for w, _ in runs]))
    est = runs[0][1]
    return {"points": est.embedding_.shape[0], "iterations": est.n_iter_, "wall": wall,
            "ms_per_iteration": 1e3 * wall / est.n_iter_, "kl": est.kl_divergence_}


def cli_run(iterations: int, folder: Path) -> dict:
    out = folder / "cli.zarr"
    start = time.perf_counter()
    subprocess.run(["scalemb", "embed", str(GRQC), "--out", str(out), "--iterations", str(iterations), "--tol", "0",
                    "--quiet", "--overwrite"], check=True, env=os.environ.copy())
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"wall": wall, "peak_mb": peak}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", default="200,1000", help="comma-separated sub-graph sizes (edges of GrQc)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cli-iterations", type=int, default=600, help="0: no CLI run")
    args = ap.parse_args()
    print(machine_description())
    print(f"load: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("\n| edges | points | iterations | median wall s | ms per iteration | KL |")
        print("|---|---|---|---|---|---|")
        for lines in [int(x) for x in args.lines.split(",")]:
            r = in_process(sub_graph(lines, tmp), args.rounds)
            print(f"| {lines} | {r['points']} | {r['iterations']} | {r['wall']:.2f} | {r['ms_per_iteration']:.3f} "
                  f"| {r['kl']:.6f} |", flush=True)
        if args.cli_iterations:
            r = cli_run(args.cli_iterations, tmp)
            print(f"\nCLI, GrQc SNEST, {args.cli_iterations} iterations: {r['wall']:.1f} s, "
                  f"peak RSS {r['peak_mb']:.0f} MB")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
