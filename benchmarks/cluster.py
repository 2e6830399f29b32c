"""Per-iteration time and client traffic of delta-bar-delta or the spectral direction on Dask workers, against the
in-process executor.

For each affinity store (``--stores``) and model (``--models``: ``tsne`` R^2, ``snest`` R^{2,1}), from one start
layout (a Gaussian cloud with the extent of a converged t-SNE map, as ``halo_traffic.py`` uses; SNEST: space std
5, time N(0, 0.5²), so that its 3-D grid is not capped), ``--iterations`` iterations of delta-bar-delta (learning
rate 1, no exaggeration: the layout, hence the grid and the cost of an evaluation, stays the start's) with FFT
repulsion run

* ``local``: ``LocalExecutor`` with 2 threads on the store's partitions;
* ``dask held``: ``DaskExecutor`` on a ``LocalCluster`` of 2 worker processes x 1 thread, the optimiser's
  per-point state held on the workers (``scalemb.engine.held_dask``, the default);
* ``dask client``: the same executor with the state held on the client (``engine.held.LocalHeld``: what every
  Dask run did before; all of Y out and the gradient back per iteration);

in rotated order for ``--rounds`` rounds.  ``--optimizer sd``: the spectral steps of the schedule at scale
(``models.tsne.SPECTRAL_THEN_POLISH``: Jacobi-CG of at most 5 iterations to relative tolerance 0.1 on the current
iterate's curvature, each point's step bounded by 2, a backtracking line search) without its exaggeration and polish
phases, whose momentum steps cost what a delta-bar-delta step costs; held on the workers, its CG vectors and line
search points stay there and each Laplacian product's halo travels worker to worker (``engine.held_dask``); held on
the client, every product sends the vector's halo-compact columns and gathers the rows, the curvature sends Y.
Per iteration: the median over rounds of (time from the end of
iteration 1 to the end of the last) / (iterations - 2), so the start (holding the state) and the end (gathering
it) are outside; the client's bytes per iteration from the executor's counters over the same span (payloads
sent and gathered; pickled sizes of the small ones).  Every Dask run's final coordinates are checked equal to
the local run's, bit for bit.

``--start-after K`` starts every run instead from the layout after the first K iterations of the model's default
run at the store's size (``optimizer='auto'``, its random start of seed 0, in-process), computed once and kept as
``<workdir>/start-<store>-<model>-<K>.npy``: e.g. SNEST's spectral steps measured where its schedule at scale takes
them, after its 100 momentum steps, not from the synthetic cloud (whose time rows the first spectral direction
throws past ``exp(dt^2)``'s range, so that the line search backs off ~8 times per step).

``--modes`` picks some of the executors (local always); ``--convolving-workers K`` has K workers share each
evaluation's convolution, 0 as many as it has shares (default: the executor's, ``dask_halo.CONVOLVING_WORKERS``).

Usage: ``python benchmarks/cluster.py --stores P2e5.zarr,P1e6.zarr --iterations 12 --rounds 3 --out FILE.md``
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
from common import Report, markdown_table  # noqa: E402

MODES = ("local", "dask held", "dask client")


def _start(n: int, dims: int, seed: int = 0) -> np.ndarray:
    Y = np.random.default_rng(seed).normal(size=(dims, n)) * min(30.0, 0.1 * np.sqrt(n))
    if dims > 2:  # SNEST: a smaller map (its 3-D grid is capped past ~30 units at 2e5), time N(0, 0.5²)
        Y[:2] *= 5.0 / 30.0
        Y[2:] = np.random.default_rng(seed + 1).normal(size=(dims - 2, n)) * 0.5
    return np.ascontiguousarray(Y)


def _schedule_start(store, st, model, time_dims: int, after: int, workdir: Path, report) -> np.ndarray:
    """The layout after the first ``after`` iterations of the model's default run on ``st`` (module docstring),
    read from ``workdir`` if an earlier run computed it."""
    from scalemb.engine import LocalExecutor
    from scalemb.init import random_coords
    from scalemb.optim import make_optimizer

    path = workdir / f"start-{Path(store).name}-{model.name}-{after}.npy"
    if path.exists():
        return np.load(path)
    n = st.n_points
    executor = LocalExecutor(st.to_affinity(), model, 2, time_dims, n_threads=2, partitions=st.partitions,
                             repulsion="fft")
    optimizer = make_optimizer("auto", model, n)
    t0 = time.perf_counter()
    with executor:
        result = optimizer.optimize(executor, random_coords(n, 2, time_dims, np.random.default_rng(0)), after)
    coords = np.ascontiguousarray(result.coords)
    report(f"  start: {after} iterations of the default run in {time.perf_counter() - t0:.0f} s, "
           f"KL {result.kl:.4f}; kept as {path}")
    workdir.mkdir(parents=True, exist_ok=True)
    np.save(path, coords)
    return coords


# the spectral steps of the schedule at scale (module docstring)
SD_OPTIONS = {"solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 5, "cg_tol": 0.1, "max_point_step": 2.0,
              "tol": 0.0}


def _run(executor, model, start, iterations, optimizer_name="dbd"):
    """``(seconds per iteration, client bytes per iteration, client waits per iteration, final coords)`` of one
    run (waits: the executor's count of dependent client round trips; NaN for an executor without it)."""
    from scalemb.optim import make_optimizer

    if optimizer_name == "sd":
        optimizer = make_optimizer("sd", model, **SD_OPTIONS)
    else:
        # the at-scale delta-bar-delta with a small learning rate: the layout (so the grid, so the cost of an
        # evaluation) stays that of the start, a converged map's extent, in every round and executor
        optimizer = make_optimizer("dbd", model, learning_rate=1.0, exaggeration_iterations=0)
    marks = {}
    stats = getattr(executor, "stats", None)

    def callback(it, kl):
        if it in (1, iterations - 1):
            marks[it] = (time.perf_counter(), 0 if stats is None else stats["bytes_sent"] + stats["bytes_received"],
                         float("nan") if stats is None else stats.get("waits", float("nan")))

    result = optimizer.optimize(executor, start, iterations, callback=callback)
    (t1, b1, w1), (t2, b2, w2) = marks[1], marks[iterations - 1]
    span = iterations - 2
    return (t2 - t1) / span, (b2 - b1) / span, (w2 - w1) / span, result.coords


def measure(store, model_name, iterations, rounds, report, optimizer_name="dbd", modes=MODES, start_after=0,
            workdir=Path(".")):
    from distributed import Client, LocalCluster

    from scalemb.affinity import AffinityStore
    from scalemb.engine import LocalExecutor
    from scalemb.engine.distributed import DaskExecutor
    from scalemb.engine.held import LocalHeld
    from scalemb.models import get_model

    st = AffinityStore(store)
    n = st.n_points
    model = get_model(model_name)
    time_dims = model.default_time_dims()
    start = _schedule_start(store, st, model, time_dims, start_after, workdir, report) if start_after else \
        _start(n, 2 + time_dims)
    affinity = st.to_affinity()
    times = {m: [] for m in modes}
    traffic = {m: [] for m in modes}
    waits = {m: [] for m in modes}
    reference = None
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for r in range(rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                if mode == "local":
                    executor = LocalExecutor(affinity, model, 2, time_dims, n_threads=2, partitions=st.partitions,
                                             repulsion="fft")
                else:
                    executor = DaskExecutor(store, model, 2, time_dims, client, repulsion="fft")
                    if mode == "dask client":
                        executor.hold = lambda arrays, ex=executor: LocalHeld(ex, arrays)
                with executor:
                    seconds, nbytes, nwaits, coords = _run(executor, model, start, iterations, optimizer_name)
                if reference is None:
                    reference = coords
                identical = np.array_equal(reference, coords)
                if not identical:
                    raise SystemExit(f"{mode} run differs from the first run ({store}, {model_name})")
                times[mode].append(seconds)
                traffic[mode].append(nbytes)
                waits[mode].append(nwaits)
                report(f"  round {r + 1} {mode}: {seconds:.3f} s per iteration, {nbytes / 1e3:.1f} KB client bytes "
                       f"and {_count(nwaits)} client waits per iteration, final coordinates identical")
    local = statistics.median(times["local"])
    rows = []
    for mode in modes:
        med = statistics.median(times[mode])
        rows.append([f"{n:,}", model_name, optimizer_name, mode, f"{med:.3f}", f"{med / local:.2f}",
                     f"{statistics.median(traffic[mode]) / 1e3:,.1f}", _count(statistics.median(waits[mode]))])
    return rows


def _count(value: float) -> str:
    """A per-iteration count for the tables: ``-`` where the executor does not count it (in-process: no waits)."""
    return "-" if np.isnan(value) else f"{value:.1f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", required=True, help="comma-separated affinity stores")
    parser.add_argument("--models", default="tsne,snest")
    parser.add_argument("--optimizer", default="dbd", choices=("dbd", "sd"))
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--convolving-workers", type=int, default=None,
                        help="workers sharing an evaluation's convolution (0: as many as it has shares; default: "
                             "the executor's)")
    parser.add_argument("--fft-threads", type=int, default=None,
                        help="FFT threads of a Dask worker's convolution (default: the executor's, -1: every CPU)")
    parser.add_argument("--start-after", type=int, default=0,
                        help="start from the layout after this many iterations of the model's default run (module "
                             "docstring; 0: the synthetic start)")
    parser.add_argument("--workdir", default=".", help="where --start-after keeps its layouts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(","))
    if "local" not in modes or not set(modes) <= set(MODES):
        parser.error(f"--modes must include local and name only {', '.join(MODES)}")
    from scalemb.engine import dask_halo

    if args.convolving_workers is not None:
        dask_halo.CONVOLVING_WORKERS = args.convolving_workers or None
    if args.fft_threads is not None:
        from scalemb.engine.distributed import DaskExecutor

        DaskExecutor._fft_workers = args.fft_threads
    name = {"dbd": "Delta-bar-delta", "sd": "The spectral direction"}[args.optimizer]
    report = Report.start(f"{name} on two Dask workers: state held on the workers vs the client",
                          "Per iteration, median of rotated rounds; ratio = time / in-process time of the same "
                          "round set; client KB = bytes the client sent and gathered per iteration; waits = "
                          "the client's dependent round trips per iteration.")
    rows = []
    for store in args.stores.split(","):
        for model in args.models.split(","):
            report(f"{store}, {model}:")
            rows += measure(store, model, args.iterations, args.rounds, report, args.optimizer, modes,
                            args.start_after, Path(args.workdir))
    report()
    report(markdown_table(["points", "model", "optimizer", "executor", "s / iteration", "vs local",
                           "client KB / iteration", "client waits / iteration"], rows))
    report.save(args.out)


if __name__ == "__main__":
    main()
