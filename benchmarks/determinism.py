"""Cost of the data-determined row-block layout per evaluation: paired, same-run A/B against an older scalemb.

``--old`` is a source tree of the commit before the layout change (e.g. ``git archive <commit> | tar -x -C
/tmp/old``), whose ``LocalExecutor`` split P into one block per thread from N >= 1024.  For each graph (GrQc,
and a synthetic co-authorship graph of ``--authors`` nodes) and each round, two child processes (old, new,
in alternating order) build ``LocalExecutor`` with the default settings on the same P (default threads:
every CPU usable) and time ``--evals`` KL+gradient evaluations at the same coordinates; the table gives each
side's median over rounds of its per-round median, and the median of the per-round ratios new/old.

Usage: ``python benchmarks/determinism.py --old /tmp/scalemb-old --out benchmarks/results/determinism.md``
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
from common import Report, markdown_table  # noqa: E402

NEW = HERE.parent


def child(edges: str, model: str, space: int, time_dims: int, evals: int) -> dict:
    import scalemb
    from scalemb.affinity import coauthorship_affinity
    from scalemb.engine import LocalExecutor
    from scalemb.io.edgelist import read_edge_list
    from scalemb.models import get_model

    affinity = coauthorship_affinity(read_edge_list(edges))
    n = affinity.n_points
    rng = np.random.default_rng(0)
    scale = max(1.0, np.sqrt(n) / 10)  # the extent of a converged map, roughly
    coords = np.concatenate([rng.normal(size=(space, n)) * scale, rng.normal(size=(time_dims, n)) * 0.3])
    with LocalExecutor(affinity, get_model(model), space, time_dims, repulsion="auto") as ex:
        ex.evaluate(coords)  # compile, plan caches
        times = []
        for _ in range(evals):
            t0 = time.perf_counter()
            ex.evaluate(coords)
            times.append(time.perf_counter() - t0)
        return {"median": statistics.median(times), "blocks": len(ex.blocks), "repulsion": ex.repulsion,
                "n": n, "threads": ex.n_threads, "source": str(Path(scalemb.__file__).parent.parent)}


def run_child(tree: Path, args: list) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="source tree of the old scalemb")
    parser.add_argument("--authors", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--evals", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        edges, model, space, time_dims, evals = args.child
        print(json.dumps(child(edges, model, int(space), int(time_dims), int(evals))))
        return
    report = Report.start("Fixed row-block layout: cost per evaluation (paired A/B, old vs new, same run)",
                          f"old tree: {args.old}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(NEW))
        from scalemb.datasets import grqc_path
        from scalemb.io.coauthor_generator import write_coauthor_edge_list

        big = write_coauthor_edge_list(Path(tmp) / "big.txt", args.authors, seed=1)
        cases = [("GrQc", str(grqc_path()), "snest", 2, 1), ("GrQc", str(grqc_path()), "tsne", 2, 0),
                 (f"co-authors {args.authors:.0e}", str(big), "snest", 2, 1),
                 (f"co-authors {args.authors:.0e}", str(big), "tsne", 2, 0)]
        for name, edges, model, space, time_dims in cases:
            child_args = [edges, model, str(space), str(time_dims), str(args.evals)]
            old_t, new_t, ratios = [], [], []
            for r in range(args.rounds):
                order = [("old", args.old), ("new", NEW)] if r % 2 == 0 else [("new", NEW), ("old", args.old)]
                got = {label: run_child(tree, child_args) for label, tree in order}
                old_t.append(got["old"]["median"])
                new_t.append(got["new"]["median"])
                ratios.append(got["new"]["median"] / got["old"]["median"])
            rows.append([name, got["new"]["n"], f"{model} ({space},{time_dims})", got["new"]["repulsion"],
                         got["new"]["threads"], got["old"]["blocks"], got["new"]["blocks"],
                         f"{statistics.median(old_t):.4f}", f"{statistics.median(new_t):.4f}",
                         f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}-{max(ratios):.3f}"])
            print(rows[-1], flush=True)
    report(markdown_table(["graph", "N", "model", "repulsion", "threads", "blocks old", "blocks new",
                           "old s/eval", "new s/eval", "median ratio new/old", "ratio range"], rows))
    report(f"\n{args.rounds} rounds x {args.evals} evaluations per side (after one warm-up evaluation), old and "
           "new alternating first; s/eval: median over rounds of each round's median.")
    report.save(args.out)


if __name__ == "__main__":
    main()
