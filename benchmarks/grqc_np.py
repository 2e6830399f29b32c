"""GrQc t-SNE R^2: KL, NP@deg and the layout's radii through a run, for 'auto' (the spectral direction after a
momentum exaggeration phase), delta-bar-delta with openTSNE's schedule, and candidates given as LineSearchDescent
options (issue 29: which optimiser keeps the graph's neighbourhoods, and how far components are thrown).

``python benchmarks/grqc_np.py --runs 'auto;dbd' --iterations 600 --out results.md`` (``--runs``: ``auto``,
``dbd``, or ``auto:key=value,...`` with JSON values of optimiser options).  In-process, 2 threads, exact repulsion,
the default random start (seed ``--seed``); NP@deg over all rows (``scalemb.metrics``); radii: distance of each
point from the layout's median, quantiles 50 / 99 / max.
"""
import argparse
import json
import time

import numpy as np

from common import Report, machine_description, markdown_table, run_description

from scalemb.datasets import grqc
from scalemb.embedding import initial_coords
from scalemb.engine.local import LocalExecutor
from scalemb.metrics.quality import neighbourhood_preservation
from scalemb.models import get_model
from scalemb.models.base import OPENTSNE_SCHEDULE
from scalemb.optim import make_optimizer


def optimizer_of(spec: str, model, n_points: int):
    name, _, extra = spec.partition(":")
    options = {k: json.loads(v) for k, v in (item.partition("=")[::2] for item in extra.split(",") if item)}
    if name == "dbd":
        options = {**{k: v for k, v in OPENTSNE_SCHEDULE.items() if k != "optimizer"}, **options}
    return make_optimizer(name, model, n_points, **options)


def run(spec: str, iterations: int, every: int, seed: int) -> list:
    affinity, model = grqc(), get_model("tsne")
    rows = []
    with LocalExecutor(affinity, model, 2, 0, repulsion="exact") as ex:
        coords = initial_coords(ex.n_points, 2, 0, np.random.default_rng([seed, 0]))
        ex.evaluate(coords)  # compilation, untimed
        optimizer = optimizer_of(spec, model, ex.n_points)
        snaps, kls = {}, {}

        def checkpoint(it, export):
            if it % every == 0:
                snaps[it] = np.array(export().coords)

        start = time.perf_counter()
        result = optimizer.optimize(ex, coords, iterations, checkpoint=checkpoint,
                                    callback=lambda it, kl: kls.__setitem__(it, kl))
        wall = time.perf_counter() - start
        snaps[result.iterations] = np.array(result.coords)
    for it in sorted(snaps):
        Y = snaps[it]
        radius = np.linalg.norm(Y - np.median(Y, axis=1, keepdims=True), axis=0)
        np_deg = neighbourhood_preservation(affinity.P, Y.T).value
        kl = kls.get(it - 1, result.kl) if it < result.iterations else result.kl
        rows.append([spec, it, f"{kl:.4f}", f"{np_deg:.4f}", f"{np.quantile(radius, 0.5):.0f}",
                     f"{np.quantile(radius, 0.99):.0f}", f"{radius.max():.0f}",
                     f"{wall:.1f}" if it == result.iterations else ""])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="auto;dbd")
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = [row for spec in args.runs.split(";") for row in run(spec, args.iterations, args.every, args.seed)]
    report = Report()
    report(run_description())
    report()
    report(machine_description())
    report()
    report(markdown_table(["run", "iteration", "KL", "NP@deg", "radius q50", "radius q99", "radius max",
                           "wall s (end)"], rows))
    report.save(args.out)

if __name__ == "__main__":
    main()
