"""CPU time per evaluation of the data-determined row-block layout vs one block, on one thread, same process.

On a machine shared with other jobs wall times swing by more than the effect measured here; process CPU time
(``time.process_time``) on one thread counts only this evaluation's work.  For each graph the executor with
the data-determined layout (``LocalExecutor`` default, 16..64 blocks) and one with a single block (what the old
layout used on one thread; on two threads it used two) evaluate the same coordinates ``--evals`` times,
alternating; the table gives median CPU seconds per evaluation and their ratio.

Usage: ``python benchmarks/layout_cpu.py --out benchmarks/results/layout_cpu.md``
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
from common import Report, markdown_table  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors", type=int, default=100_000)
    parser.add_argument("--evals", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from scalemb.affinity import coauthorship_affinity
    from scalemb.datasets import grqc
    from scalemb.engine import LocalExecutor
    from scalemb.io.coauthor_generator import write_coauthor_edge_list
    from scalemb.io.edgelist import read_edge_list
    from scalemb.models import get_model

    report = Report.start("Fixed row-block layout: CPU time per evaluation vs one block (1 thread, same process)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        big = coauthorship_affinity(read_edge_list(write_coauthor_edge_list(Path(tmp) / "e.txt", args.authors, 1)))
        cases = [("GrQc", grqc(), "tsne", 2, 0), ("GrQc", grqc(), "snest", 2, 1),
                 (f"co-authors {args.authors:.0e}", big, "tsne", 2, 0),
                 (f"co-authors {args.authors:.0e}", big, "snest", 2, 1)]
        for name, affinity, model, ds, dt in cases:
            n = affinity.n_points
            rng = np.random.default_rng(0)
            coords = np.concatenate([rng.normal(size=(ds, n)) * max(1.0, np.sqrt(n) / 10),
                                     rng.normal(size=(dt, n)) * 0.3])
            fixed = LocalExecutor(affinity, get_model(model), ds, dt, n_threads=1)
            one = LocalExecutor(affinity, get_model(model), ds, dt, n_threads=1, n_blocks=1,
                                point_order=fixed.point_order)
            times = {"fixed": [], "one": []}
            for ex in (fixed, one):
                ex.evaluate(coords)
            for k in range(args.evals):
                for label, ex in (("fixed", fixed), ("one", one)) if k % 2 == 0 else (("one", one), ("fixed", fixed)):
                    t0 = time.process_time()
                    ex.evaluate(coords)
                    times[label].append(time.process_time() - t0)
            a, b = statistics.median(times["one"]), statistics.median(times["fixed"])
            rows.append([name, n, f"{model} ({ds},{dt})", fixed.repulsion, len(fixed.blocks), f"{a:.4f}", f"{b:.4f}",
                         f"{b / a:.3f}"])
            print(rows[-1], flush=True)
    report(markdown_table(["graph", "N", "model", "repulsion", "blocks", "1 block CPU s/eval",
                           "layout CPU s/eval", "ratio"], rows))
    report(f"\nmedian of {args.evals} evaluations each, alternating, after one warm-up evaluation each")
    report.save(args.out)


if __name__ == "__main__":
    main()
