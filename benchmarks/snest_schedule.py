"""SNEST's schedule at scale, one lever at a time: each candidate from the same random start (seed 0), in-process,
scored (KL and NP@deg over sampled rows under SNEST's kernel, x extent, time std) at the given iterations.

``python benchmarks/snest_schedule.py --store P100000.zarr --candidates 'auto;auto:spectral_iterations=90'``;
``--stage1 'auto:time_rate=0,spectral_iterations=0,max_iterations=100' --stage1-iterations 100`` runs a first stage
(here: the exaggeration phase with the time coordinates frozen) and the candidate from its end.  Candidates as
``sd_scale.py``'s (``auto`` with ``:key=value`` overrides of the optimiser's options).
"""
import argparse
import time

import numpy as np
from sd_scale import candidate, load, score, split_fft, warm_up

from common import machine_description, run_description
from scalemb.embedding import initial_coords
from scalemb.optim import make_optimizer


def optimizer(options: dict, n_points: int):
    return make_optimizer(options["optimizer"], "snest", n_points,
                          **{k: v for k, v in options.items() if k != "optimizer"})


def run(store, spec, iterations, at, sample, stage1="", stage1_iterations=0):
    """``(wall s, CPU s, iterations, [(iteration, KL, NP@deg, x extent, time std)])`` of one candidate."""
    options, fft_params = split_fft(candidate(spec)[1])
    affinity, make = load(store, fft_params, model="snest")
    snaps = []
    with make() as ex:
        coords = initial_coords(ex.n_points, ex.space_dims, ex.time_dims, np.random.default_rng(0))
        warm_up(ex, coords)
        t0, c0, offset = time.perf_counter(), time.process_time(), 0
        if stage1:
            first = optimizer(split_fft(candidate(stage1)[1])[0], ex.n_points).optimize(ex, coords, stage1_iterations)
            coords, offset = np.array(first.coords), first.iterations

        def checkpoint(it, export):
            if it + offset in at:
                snaps.append((it + offset, np.array(export().coords)))

        result = optimizer(options, ex.n_points).optimize(ex, coords, iterations - offset, checkpoint=checkpoint)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    snaps.append((result.iterations + offset, np.array(result.coords)))
    rows = []
    for it, c in snaps:
        Y = np.ascontiguousarray(c.T)
        kl, npd, extent = score(affinity, Y, sample, model="snest")
        rows.append((it, kl, npd, extent, float(np.std(Y[:, 2]))))
    return wall, cpu, result.iterations + offset, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--candidates", default="auto")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--at", default="200,300", help="iterations at which a layout is scored")
    parser.add_argument("--sample", type=int, default=5000)
    parser.add_argument("--stage1", default="")
    parser.add_argument("--stage1-iterations", type=int, default=0)
    args = parser.parse_args()
    at = {int(x) for x in args.at.split(",")}
    print(machine_description(), "\n", run_description(), "\n", sep="")
    print("| candidate | first stage | iterations | wall s | CPU s | iteration | KL | NP@deg | x extent | time std |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for spec in args.candidates.split(";"):
        wall, cpu, iterations, rows = run(args.store, spec, args.iterations, at, args.sample, args.stage1,
                                          args.stage1_iterations)
        for it, kl, npd, extent, tstd in rows:
            print(f"| {spec} | {args.stage1 or '-'} | {iterations} | {wall:.1f} | {cpu:.1f} | {it} | {kl:.4f} | "
                  f"{npd:.3f} | {extent:.0f} | {tstd:.3f} |", flush=True)


if __name__ == "__main__":
    main()
