"""Spectral vs random initialisation (issue 20.3): final KL and time, medians over seeds, on GrQc and a kNN set.

    python benchmarks/init.py --out benchmarks/results/init.md

Models with their default optimiser (t-SNE and SNEST: spectral direction, SNE: delta-bar-delta); the same
iteration budget for both starts.  "s to target": wall seconds (the start's eigenmap included) until the KL
first reaches the random start's median final KL (plus 0.1 %), "-" if it never does.
"""
import argparse
import time

import numpy as np

from common import Report, markdown_table

import scalemb
from scalemb.affinity.knn import knn_affinity


def digits_affinity():
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float64)
    return knn_affinity(X, perplexity=30.0, random_state=0)


def run(data, model, space, time_dims, init, seed, iterations):
    start = time.perf_counter()
    result = scalemb.embed(data, model=model, space_dims=space, time_dims=time_dims, iterations=iterations,
                           seed=seed, init=init)
    wall = time.perf_counter() - start
    # seconds of each history entry, shifted by the part of the wall time before the first iteration (the start)
    seconds = np.asarray(result.seconds, dtype=float)
    offset = wall - (seconds[-1] if seconds.size else 0.0)
    return result.kl, wall, result.kl_history, seconds + offset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=300, help="t-SNE / SNEST (spectral direction)")
    parser.add_argument("--sne-iterations", type=int, default=1000, help="SNE (delta-bar-delta)")
    parser.add_argument("--datasets", default="grqc,digits")
    parser.add_argument("--models", default="tsne,snest,sne")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = Report.start("Spectral vs random initialisation",
                          f"seeds 0..{args.seeds - 1}; t-SNE/SNEST {args.iterations} iterations (sd), SNE "
                          f"{args.sne_iterations} iterations (dbd)")
    datasets = {"grqc": lambda: "grqc", "digits": digits_affinity}
    configs = [("tsne", 2, 0, args.iterations), ("snest", 2, 1, args.iterations), ("sne", 2, 0, args.sne_iterations)]
    rows = []
    for name in args.datasets.split(","):
        data = datasets[name]()
        for model, space, time_dims, iterations in configs:
            if model not in args.models.split(","):
                continue
            runs = {init: [run(data, model, space, time_dims, init, seed, iterations) for seed in range(args.seeds)]
                    for init in ("random", "spectral")}
            target = float(np.median([r[0] for r in runs["random"]])) * 1.001
            for init, results in runs.items():
                kls = [r[0] for r in results]
                walls = [r[1] for r in results]
                reach = []
                for _, _, history, seconds in results:
                    hit = np.flatnonzero(np.asarray(history) <= target)
                    reach.append(seconds[hit[0]] if hit.size else np.inf)
                reach_median = float(np.median(reach))
                dims = f"R^{space}" + (f",{time_dims}" if time_dims else "")
                row = [name, f"{model} {dims}", init, f"{np.median(kls):.4f}", f"{min(kls):.4f}", f"{max(kls):.4f}",
                       f"{np.median(walls):.1f}", "-" if not np.isfinite(reach_median) else f"{reach_median:.1f}",
                       " ".join(f"{k:.4f}" for k in kls)]
                rows.append(row)
                print(row, flush=True)
    header = ["data", "model", "init", "median KL", "min KL", "max KL", "median wall s", "median s to target",
              "KL per seed"]
    report(markdown_table(header, rows))
    report.save(args.out)


if __name__ == "__main__":
    main()
