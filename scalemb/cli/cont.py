"""``scalemb continue RUN.zarr --iterations N``: N more iterations of a finished run (its best restart, from
its final optimiser state: the result equals one run of that many more iterations); the new result, again
continuable, replaces the old one.  ``scalemb resume`` is for an interrupted run."""


def add_parser(commands) -> None:
    con = commands.add_parser("continue", help="continue a finished embed run for more iterations",
                              description=__doc__.split("\n\n")[0])
    con.add_argument("run", help="the embed --out store of a finished run")
    con.add_argument("--iterations", type=int, required=True, help="iterations to add")
    con.add_argument("--quiet", action="store_true", help="no progress output")
    con.add_argument("--scheduler", metavar="ADDRESS",
                     help="the Dask scheduler to continue on (required for a run that used one: the address stored "
                          "in the run is never connected to on its own)")
    con.add_argument("--in-process", action="store_true",
                     help="continue a run that used a Dask cluster in this process (the same result, bit for bit)")


def run(args) -> int:
    from ..methods import method_of
    from ..run.resume import continue_finished

    result = continue_finished(args.run, args.iterations, quiet=args.quiet, scheduler=args.scheduler,
                                in_process=args.in_process)
    print(f"wrote {args.run}: {result.model}, N={len(result.node_ids)}, "
          f"{method_of(result.model).describe(result)}")
    return 0
