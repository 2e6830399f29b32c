"""Bytes and time per evaluation of the Dask executor: halo exchange against broadcasting Y, at W workers.

For each affinity store (``--stores``) and worker count (``--workers``), a ``LocalCluster`` of W single-threaded
worker processes runs t-SNE R^2 evaluations with FFT repulsion at a fixed layout (``--layout FILE.npy``, ``(2, N)``
or ``(N, 2)`` in the store's order; default: a Gaussian cloud with the extent of a converged layout) through
``DaskExecutor(halo=True)`` and ``DaskExecutor(halo=False)``, and a ``LocalExecutor`` (2 threads, same partitions)
gives the reference.  Every Dask gradient is checked equal to the local one, bit for bit.  Per evaluation it
reports:

* client -> workers and workers -> client: the payload the executor sends and gathers (``DaskExecutor.stats``);
* worker -> worker, **measured**: the sum over workers of Dask's ``transfer_outgoing_bytes_total`` (dependencies
  fetched by one worker from another: halo pieces, grids of the tree reduction, potentials of the broadcast);
* worker -> worker, **model**: ``docs/scaling.md``: ``sum_w h_w d 8 + K (W - 1) G 8 + (W - 1) G c_p s_p`` (W <= 4,
  K = min(W, c_p) workers sharing the convolution) with the plan's halos h_w, G grid nodes and c_p potential
  columns of s_p bytes;
* the median wall time of ``--evals`` evaluations (and of Laplacian products, ``--matvecs``).

``--simulate W1,W2,..`` adds the many-worker loopback check: one small store (``--sim-authors``, 32 partitions)
on 2..16 worker processes, halo exchange only, to see how the measured bytes scale with W against the model.

Usage: ``python benchmarks/halo_traffic.py --stores P2e5.zarr,P1e6.zarr --workers 2,3,4 --out results.md``
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


def _outgoing(client) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())


def _layout(path, n, seed=0):
    if path:
        Y = np.load(path)
        Y = Y if Y.shape[0] == 2 else Y.T
        if Y.shape[1] != n:
            raise SystemExit(f"{path}: {Y.shape[1]} points, the store has {n}")
        return np.ascontiguousarray(Y, dtype=np.float64)
    # the extent of converged t-SNE layouts under openTSNE's schedule (~210 units at 7.7e4 and 7.7e5 points),
    # narrower for small N so that the grid stays below its 64 N node cap (a capped grid broadcasts Y)
    return np.random.default_rng(seed).normal(size=(2, n)) * min(30.0, 0.1 * np.sqrt(n))


def measure_store(store, layout, workers_list, evals, matvecs, halo_modes=(True, False)):
    from distributed import Client, LocalCluster

    from scalemb.affinity import AffinityStore
    from scalemb.engine import LocalExecutor
    from scalemb.engine.dask_halo import CONVOLVING_WORKERS, _summed_grid_transfers
    from scalemb.engine.distributed import DaskExecutor
    from scalemb.models import get_model
    from scalemb.repulsion import FFTParams, make_grid
    from scalemb.repulsion.convolution import convolution_shares, fft_dtype

    meta = AffinityStore(store)
    n = meta.n_points
    Y = _layout(layout, n)
    model = get_model("tsne")
    grid = make_grid(model, 2, Y.min(1), Y.max(1), FFTParams(), n)
    V = np.random.default_rng(1).normal(size=Y.shape)
    rows = []
    with LocalExecutor(meta.to_affinity(verify=False), model, 2, 0, n_threads=2, partitions=meta.partitions,
                       repulsion="fft") as local:
        reference = local.evaluate(Y)
        local_times = [_timed(lambda: local.evaluate(Y)) for _ in range(evals)]
        local.set_curvature(Y)
        local_products = local.laplacian_matvec(V)
        local_mv = [_timed(lambda: local.laplacian_matvec(V)) for _ in range(matvecs)]
    local_s, local_mv_s = statistics.median(local_times), statistics.median(local_mv)
    rows.append(dict(store=Path(store).name, n=n, nnz=meta.nnz, partitions=len(meta.partitions) - 1, W="local",
                     mode="-", grid=grid.n_nodes, eval_s=local_s, mv_s=local_mv_s))
    for W in workers_list:
        with LocalCluster(n_workers=W, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            for halo in halo_modes:
                with DaskExecutor(store, model, 2, 0, client, repulsion="fft", halo=halo) as ex:
                    got = ex.evaluate(Y)  # warm-up (numba caches, the halo plan), then the measured evaluations
                    assert got.kl == reference.kl and np.array_equal(got.gradient, reference.gradient)
                    before, out_before = dict(ex.stats), _outgoing(client)
                    times = [_timed(lambda: ex.evaluate(Y)) for _ in range(evals)]
                    after, out_after = dict(ex.stats), _outgoing(client)
                    row = dict(store=Path(store).name, n=n, nnz=meta.nnz, partitions=len(meta.partitions) - 1, W=W,
                               mode="halo" if halo else "broadcast", grid=grid.n_nodes,
                               eval_s=statistics.median(times),
                               sent=(after["bytes_sent"] - before["bytes_sent"]) / evals,
                               received=(after["bytes_received"] - before["bytes_received"]) / evals,
                               w2w=(out_after - out_before) / evals)
                    if halo:
                        plan = ex._halo[0]
                        halos = plan.halo_rows()
                        row["halo_max"] = max(halos.values()) / n
                        row["halo_sum"] = sum(halos.values()) / n
                        w = len(plan.workers)
                        k = min(w, convolution_shares(grid)) if CONVOLVING_WORKERS is None else CONVOLVING_WORKERS
                        row["w2w_model"] = (sum(halos.values()) * 2 * 8  # halo rows, d = 2 float64
                                            + _summed_grid_transfers(w, k) * grid.n_nodes * 8  # int64 grids
                                            + (w - 1) * grid.n_nodes  # the convolution's shares
                                            * grid.n_potentials * np.dtype(fft_dtype(2)).itemsize)
                    ex.set_curvature(Y)
                    assert np.array_equal(ex.laplacian_matvec(V), local_products)
                    out_before = _outgoing(client)
                    sent_before = ex.stats["bytes_sent"]
                    mv = [_timed(lambda: ex.laplacian_matvec(V)) for _ in range(matvecs)]
                    row["mv_s"] = statistics.median(mv)
                    row["mv_sent"] = (ex.stats["bytes_sent"] - sent_before) / matvecs
                    row["mv_w2w"] = (_outgoing(client) - out_before) / matvecs
                    rows.append(row)
    return rows


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def table(rows) -> str:
    header = ["store", "N", "partitions", "workers", "Y sent as", "grid nodes", "s / evaluation", "vs local",
              "client -> workers MB", "workers -> client MB", "worker -> worker MB measured", "model MB",
              "largest halo / N", "sum of halos / N", "s / Laplacian product", "vs local",
              "product: client -> workers MB / worker -> worker MB"]
    local = {}
    out = []
    for r in rows:
        if r["W"] == "local":
            local[r["store"]] = r
        ref = local[r["store"]]
        out.append([r["store"], r["n"], r["partitions"], r["W"], r["mode"], r["grid"], f"{r['eval_s']:.3f}",
                    f"{r['eval_s'] / ref['eval_s']:.2f}", _mb(r.get("sent")), _mb(r.get("received")),
                    _mb(r.get("w2w")), _mb(r.get("w2w_model")),
                    f"{r['halo_max']:.3f}" if "halo_max" in r else "-",
                    f"{r['halo_sum']:.3f}" if "halo_sum" in r else "-", f"{r['mv_s']:.3f}",
                    f"{r['mv_s'] / ref['mv_s']:.2f}",
                    f"{_mb(r.get('mv_sent'))} / {_mb(r.get('mv_w2w'))}" if "mv_sent" in r else "-"])
    return markdown_table(header, out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="", help="affinity stores, comma separated")
    parser.add_argument("--layouts", default="", help="layout .npy per store (comma separated; empty: Gaussian)")
    parser.add_argument("--workers", default="2,3,4")
    parser.add_argument("--evals", type=int, default=5)
    parser.add_argument("--matvecs", type=int, default=5)
    parser.add_argument("--simulate", default="", help="worker counts for the many-worker loopback check")
    parser.add_argument("--sim-authors", type=int, default=26_000)
    parser.add_argument("--sim-dir", default="/tmp/scalemb-halo-sim")
    parser.add_argument("--out")
    args = parser.parse_args()
    report = Report.start("Dask halo exchange: bytes and time per evaluation (t-SNE R^2, FFT repulsion)",
                          "Command: python benchmarks/halo_traffic.py " + " ".join(sys.argv[1:]))
    stores = [s for s in args.stores.split(",") if s]
    layouts = args.layouts.split(",") if args.layouts else [""] * len(stores)
    rows = []
    for store, layout in zip(stores, layouts):
        rows += measure_store(store, layout or None, [int(w) for w in args.workers.split(",")], args.evals,
                              args.matvecs)
        print(table(rows), flush=True)
    if rows:
        report(table(rows))
        report()
    if args.simulate:
        from scalemb.affinity import coauthorship_affinity, write_affinity_store
        from scalemb.io.coauthor_generator import write_coauthor_edge_list
        from scalemb.io.edgelist import read_edge_list

        sim = Path(args.sim_dir)
        sim.mkdir(parents=True, exist_ok=True)
        store = sim / f"P{args.sim_authors}_32.zarr"
        if not store.exists():
            edges = write_coauthor_edge_list(sim / "edges.txt", args.sim_authors, seed=0)
            write_affinity_store(store, coauthorship_affinity(read_edge_list(edges)), n_partitions=32)
        sim_rows = measure_store(store, None, [int(w) for w in args.simulate.split(",")], args.evals, args.matvecs,
                                 halo_modes=(True,))
        report("Many-worker loopback simulation (halo exchange only; all worker processes share the 2 cores, so "
               "the times say little, the bytes are what the model predicts):")
        report()
        report(table(sim_rows))
        print(table(sim_rows), flush=True)
    if args.out:
        report.save(args.out)
    print(report.text())


if __name__ == "__main__":
    main()
