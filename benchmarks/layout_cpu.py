"""CPU time per evaluation of the data-determined row-block layout vs one block, and of P's input row order vs
its reverse Cuthill-McKee (locality) order, on one thread, same process.

On a machine shared with other jobs wall times swing by more than the effects measured here; process CPU time
(``time.process_time``) on one thread counts only this evaluation's work.  For each graph three executors
evaluate the same coordinates ``--evals`` times each, in rotating order (round k starts with executor k mod 3):

* ``layout``: the data-determined layout (``LocalExecutor`` default, 16..64 blocks) in P's given row order --
  what every executor (threads, Dask, store or edge list input) evaluates;
* ``one block``: a single block in the given order (what the old thread-count layout used on one thread; on two
  threads it used two);
* ``locality``: the data-determined layout in P's reverse Cuthill-McKee order (``point_order='locality'``,
  ``scalemb.affinity.ordering``), which in-process runs used from 20 000 points on before it was dropped for
  bit-identity with the Dask executor.

The table gives median CPU seconds per evaluation and the ratios layout / one block (the fixed layout's cost)
and layout / locality (what giving up the locality order costs).  The 1e5 graphs use the repulsion
``repulsion='auto'`` picks (FFT interpolation); GrQc the exact kernel, as runs on it do.

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


def knn_problem(n: int, cache: Path | None = None):
    """kNN affinities (perplexity 10) of ``n`` points of 30 interleaved Gaussian clusters in 20-D, as
    ``benchmarks/repulsion.py`` section (c) (the row order is random with respect to the clusters); kept in the
    affinity store ``cache`` if given (the neighbour search takes minutes)."""
    from scalemb.affinity import AffinityStore, write_affinity_store
    from scalemb.affinity.knn import knn_affinity

    if cache is not None and cache.exists():
        return AffinityStore(cache).to_affinity()
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(30, 20)) * 4
    X = centres[rng.integers(0, 30, n)] + rng.normal(size=(n, 20))
    affinity = knn_affinity(X, perplexity=10, random_state=0, n_jobs=1)
    if cache is not None:
        write_affinity_store(cache, affinity)
    return affinity


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors", type=int, default=100_000)
    parser.add_argument("--knn-points", type=int, default=100_000)
    parser.add_argument("--evals", type=int, default=5)
    parser.add_argument("--skip-grqc", action="store_true")
    parser.add_argument("--knn-cache", type=Path, help="affinity store to keep the kNN P in between runs")
    parser.add_argument("--sweep", action="store_true",
                        help="only: GrQc t-SNE CPU s/eval for 1..32 equal blocks (the per-block overhead)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.sweep:
        return sweep(args)
    from scalemb.affinity import coauthorship_affinity
    from scalemb.datasets import grqc
    from scalemb.engine import LocalExecutor
    from scalemb.io.coauthor_generator import write_coauthor_edge_list
    from scalemb.io.edgelist import read_edge_list
    from scalemb.models import get_model

    report = Report.start("Fixed row-block layout and P's row order: CPU time per evaluation (1 thread, same process)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [] if args.skip_grqc else [("GrQc", grqc, "tsne", 2, 0, "exact"),
                                           ("GrQc", grqc, "snest", 2, 1, "exact")]
        coauthor = {}

        def big():
            if "a" not in coauthor:
                path = write_coauthor_edge_list(Path(tmp) / "e.txt", args.authors, 1)
                coauthor["a"] = coauthorship_affinity(read_edge_list(path))
            return coauthor["a"]

        knn = {}

        def knn_p():
            if "a" not in knn:
                knn["a"] = knn_problem(args.knn_points, args.knn_cache)
            return knn["a"]

        cases += [(f"co-authors {args.authors:.0e}", big, "tsne", 2, 0, "auto"),
                  (f"co-authors {args.authors:.0e}", big, "snest", 2, 1, "auto"),
                  (f"kNN {args.knn_points:.0e}", knn_p, "tsne", 2, 0, "auto")]
        for name, load, model, ds, dt, repulsion in cases:
            affinity = load()
            n = affinity.n_points
            rng = np.random.default_rng(0)
            coords = np.concatenate([rng.normal(size=(ds, n)) * max(1.0, np.sqrt(n) / 10),
                                     rng.normal(size=(dt, n)) * 0.3])
            common = dict(n_threads=1, repulsion=repulsion)
            executors = {"layout": LocalExecutor(affinity, get_model(model), ds, dt, point_order="given", **common),
                         "one block": LocalExecutor(affinity, get_model(model), ds, dt, n_blocks=1,
                                                    point_order="given", **common),
                         "locality": LocalExecutor(affinity, get_model(model), ds, dt, point_order="locality",
                                                   **common)}
            times = {label: [] for label in executors}
            for ex in executors.values():
                ex.evaluate(coords)
            labels = list(executors)
            for k in range(args.evals):
                for label in labels[k % 3:] + labels[:k % 3]:
                    t0 = time.process_time()
                    executors[label].evaluate(coords)
                    times[label].append(time.process_time() - t0)
            med = {label: statistics.median(t) for label, t in times.items()}
            layout = executors["layout"]
            method = layout.repulsion if layout.auto_repulsion is None else "auto (fft)"
            rows.append([name, n, affinity.P.nnz, f"{model} ({ds},{dt})", method, len(layout.blocks),
                         f"{med['one block']:.4f}", f"{med['layout']:.4f}", f"{med['locality']:.4f}",
                         f"{med['layout'] / med['one block']:.3f}", f"{med['layout'] / med['locality']:.3f}"])
            print(rows[-1], flush=True)
            for ex in executors.values():
                ex.close()
    report(markdown_table(["graph", "N", "nnz(P)", "model", "repulsion", "blocks", "one block CPU s/eval",
                           "layout CPU s/eval", "locality CPU s/eval", "layout / one block",
                           "layout / locality"], rows))
    report(f"\nmedian of {args.evals} evaluations per executor, rotating order, after one warm-up evaluation each")
    report.save(args.out)


def sweep(args, counts=(1, 2, 4, 8, 16, 32), rounds: int = 20):
    """GrQc t-SNE (exact) CPU seconds per evaluation with ``counts`` equal row blocks, one thread, rounds
    alternating in order and reverse order: the slope is the cost of one more block."""
    from scalemb.datasets import grqc
    from scalemb.engine import LocalExecutor
    from scalemb.models import get_model

    report = Report.start("GrQc t-SNE: CPU time per evaluation by block count (1 thread, same process)")
    affinity = grqc()
    coords = np.random.default_rng(0).normal(size=(2, affinity.n_points)) * 7
    executors = {k: LocalExecutor(affinity, get_model("tsne"), 2, 0, n_threads=1, n_blocks=k, repulsion="exact")
                 for k in counts}
    times = {k: [] for k in counts}
    for ex in executors.values():
        ex.evaluate(coords)
    for r in range(rounds):
        for k in (counts if r % 2 else counts[::-1]):
            t0 = time.process_time()
            executors[k].evaluate(coords)
            times[k].append(time.process_time() - t0)
    med = {k: statistics.median(t) for k, t in times.items()}
    slope = np.polyfit(list(counts), [med[k] for k in counts], 1)[0]
    report(markdown_table(["blocks", "CPU ms/eval", "vs 1 block"],
                          [[k, f"{1000 * med[k]:.2f}", f"{med[k] / med[counts[0]]:.3f}"] for k in counts]))
    report(f"\nmedian of {rounds} rounds; least-squares slope: {1e6 * slope:.0f} us per block")
    report.save(args.out)


if __name__ == "__main__":
    main()
