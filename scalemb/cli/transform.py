"""``scalemb transform RUN.zarr NEW --out placed.zarr``: place new nodes or points into a stored map."""


def add_parser(commands):
    from ..placement import (FREE_EXAGGERATION, FREE_HOPS, FREE_ITERATIONS, FREE_MAX_SHARE, FREE_STORED_ATTRACTION,
                             PRE_FREE_ITERATIONS, PlacementOptimizer)
    from ..placement.optimize import EXAGGERATION, FINAL_EXAGGERATION, ITERATIONS, KNN_FINAL_EXAGGERATION

    tra = commands.add_parser(
        "transform", help="place new nodes (edge list) or points (feature rows) into a stored map",
        description="The new points start at the weighted median of their old neighbours and are optimised against "
                    f"the stored map (the whole map's KL, their attraction exaggerated x{EXAGGERATION:g} at first, "
                    f"then x{FINAL_EXAGGERATION:g}, new feature rows x{KNN_FINAL_EXAGGERATION:g}); "
                    "then the stored points next to new graph nodes move with them for a few iterations "
                    "(--free-hops), the rest of the map staying fixed.  Graph "
                    "runs: NEW is an undirected edge list 'A B [weight]' of the new nodes' edges, in either "
                    "column order (the end not in the map is the new node).  kNN runs: NEW holds feature "
                    "rows (.npy, .csv, Zarr array) of the reference's width.  Writes the whole map (old rows "
                    "first) as a result group.")
    tra.add_argument("run", help="the stored run (an embed --out result group)")
    tra.add_argument("new", help="new nodes' edge list (graph runs) or new feature rows (kNN runs)")
    tra.add_argument("--out", required=True, help="output result group (Zarr)")
    tra.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    tra.add_argument("--iterations", type=int, default=None,
                     help=f"maximum placement iterations (default {ITERATIONS}, {PRE_FREE_ITERATIONS} before a free "
                          "phase)")
    tra.add_argument("--tol", type=float, default=PlacementOptimizer.tol,
                     help="stop when the KL falls by less than this (relative, per iteration; default %(default)g)")
    tra.add_argument("--seed", type=int, default=0, help="seed of the start's jitter")
    tra.add_argument("--threads", type=int, default=None, help="threads (default: all CPUs)")
    tra.add_argument("--refuse-unattached", action="store_true",
                     help="refuse new nodes with no edge path to the stored map instead of placing them at the rim")
    tra.add_argument("--free-hops", type=int, default=None,
                     help="then let the stored points within this many edges of a new node move too (0: the stored "
                          f"map stays fixed; default: {FREE_HOPS} for new graph nodes unless that frees more than "
                          f"{FREE_MAX_SHARE:g} of the stored map, else 0; 0 for feature rows)")
    tra.add_argument("--free-iterations", type=int, default=FREE_ITERATIONS,
                     help="iterations of that second phase at most (default %(default)s)")
    tra.add_argument("--free-exaggeration", type=float, default=None,
                     help="that phase's attraction of the pairs with a new point, times this (default "
                          f"{FREE_EXAGGERATION:g}; 1 with time coordinates)")
    tra.add_argument("--free-stored-attraction", type=float, default=None,
                     help="that phase's attraction of the moving stored points' other pairs, times this (default "
                          f"{FREE_STORED_ATTRACTION:g}; 1 with time coordinates; 1 with --free-exaggeration 1: the "
                          "plain KL)")
    tra.add_argument("--repulsion", choices=("auto", "exact", "fft"), default="auto",
                     help="repulsion from the stored points: exact sums or one frozen FFT grid of the stored map "
                          "(default auto: fft from 20000 stored points or 2e7 stored x new pairs)")
    where = tra.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="optimise on the Dask cluster of this scheduler (bit-identical to local threads)")
    where.add_argument("--workers", type=int, metavar="N", help="optimise on a local Dask cluster of N processes")
    tra.add_argument("--quiet", action="store_true")
    return tra


def run_transform(args) -> int:
    from ..errors import ScalembError
    from ..placement import PlacementOptimizer, transform_run

    if args.iterations is not None and args.iterations < 1:
        raise ScalembError(f"--iterations must be >= 1, got {args.iterations}")
    if args.free_hops is not None and args.free_hops < 0:
        raise ScalembError(f"--free-hops must be >= 0, got {args.free_hops}")
    if args.free_iterations < 1:
        raise ScalembError(f"--free-iterations must be >= 1, got {args.free_iterations}")
    for flag, value in (("--free-exaggeration", args.free_exaggeration),
                        ("--free-stored-attraction", args.free_stored_attraction)):
        if value is not None and not value > 0:
            raise ScalembError(f"{flag} must be > 0, got {value}")
    if args.workers is not None and args.workers < 1:
        raise ScalembError(f"--workers must be >= 1, got {args.workers}")
    if args.threads is not None and args.threads < 1:
        raise ScalembError(f"--threads must be >= 1, got {args.threads}")
    result = transform_run(args.run, args.new, args.out, overwrite=args.overwrite,
                           optimizer=PlacementOptimizer(iterations=args.iterations, tol=args.tol), seed=args.seed,
                           n_threads=args.threads, refuse_unattached=args.refuse_unattached,
                           free_hops=args.free_hops, free_iterations=args.free_iterations,
                           repulsion=args.repulsion, scheduler=args.scheduler, workers=args.workers,
                           free_exaggeration=args.free_exaggeration,
                           free_stored_attraction=args.free_stored_attraction)
    prov = result.provenance
    moved = f", {prov['n_moved']} stored points moved" if prov.get("n_moved") else ""
    print(f"wrote {args.out}: placed {prov['n_new']} new points into {prov['n_old']} "
          f"({prov['n_unattached']} unattached{moved}), KL {prov['start_kl']:.4f} -> {result.kl:.4f}, "
          f"{result.iterations} iterations, {result.wall_time:.1f} s")
    return 0
