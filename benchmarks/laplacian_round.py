"""Time per Laplacian product ``L(C) V`` (the spectral direction's CG step): in-process against Dask workers,
the one-round product against the three-round one it replaced, in the same run.

For each affinity store (``--stores``) a ``LocalExecutor`` (2 threads, the store's partitions) and a
``DaskExecutor`` on a ``LocalCluster`` of ``--workers`` single-threaded worker processes set the t-SNE curvature
at a Gaussian layout, then, in ``--rounds`` rotated rounds (the order of the variants shifts by one each round),
time one product of each variant:

* ``local``: ``LocalExecutor.laplacian_matvec``;
* ``dask one round``: ``DaskExecutor.laplacian_matvec`` (the client sends each worker its compact columns, own
  rows and halo, and one task per worker multiplies);
* ``dask three rounds``: the product before (reproduced here, ``three_rounds``): the client scatters each
  worker's own rows, each worker cuts the pieces of the others' halos, each assembles and multiplies;
* ``dask empty round``: one task per worker doing nothing with the partitions' views, gathered: the latency floor
  of any one-round product on this cluster;
* ``local held`` / ``dask held``: the product as the spectral direction's CG takes it since its vectors are held
  where the rows are (``engine.held``: ``LocalHeld`` / ``DaskHeld.laplacian``): ``w <- L(C) u + mu u`` and the
  blocks' ``r . u``, ``w . u``, ``|r|^2`` (``optim.held_rows.cg1_product``), with ``u`` held on the workers and its
  halo cut and sent
  worker to worker -- the client sends a few names and receives ``d`` numbers per partition.

Every product is checked equal to the local one bit for bit.  Medians per variant and their ratio to ``local``.

Usage: ``python benchmarks/laplacian_round.py --stores P2e5.zarr,P1e6.zarr --rounds 15 --out results.md``
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


def _three_round_product(view, own, n_pieces, *pieces_and_weights):
    """The worker side of the replaced product: assemble the compact columns from the own rows and the halo
    pieces, then multiply (shipped by value: workers cannot import this script)."""
    from scalemb.engine import halo
    from scalemb.engine.blocks import laplacian_block

    V = halo.assemble(view, own, *pieces_and_weights[:n_pieces])
    return [laplacian_block(b, w, V) for b, w in zip(view.blocks, pieces_and_weights[n_pieces:])]


def _nothing(view):
    return None


def three_rounds(ex, V):
    """The product as it was: own rows scattered per worker, halo pieces cut on their owners, then the product."""
    plan, views, _ = ex._halo_state()
    own, pieces = ex._exchange(V)
    futures = [ex._submit(_three_round_product, views[w], own[w], len(plan.sources(w)),
                          *[pieces[v, w] for v in plan.sources(w)], *[ex._weights[k] for k in plan.parts[w]],
                          worker=w) for w in plan.workers]
    out = np.empty_like(V)
    for w, batch in zip(plan.workers, ex._gather(futures)):
        for k, rows in zip(plan.parts[w], batch):
            r0, r1 = ex.partitions[k]
            out[:, r0:r1] = rows
    return out


def empty_round(ex):
    plan, views, _ = ex._halo_state()
    return ex._gather([ex._submit(_nothing, views[w], worker=w) for w in plan.workers])


def measure(store, workers, rounds):
    from distributed import Client, LocalCluster

    from scalemb.affinity import AffinityStore
    from scalemb.engine import LocalExecutor
    from scalemb.engine.distributed import DaskExecutor
    from scalemb.engine.held import LocalHeld
    from scalemb.models import get_model
    from scalemb.optim.held_rows import cg1_product

    meta = AffinityStore(store)
    n = meta.n_points
    Y = np.random.default_rng(0).normal(size=(2, n)) * 30
    V = np.random.default_rng(1).normal(size=(2, n))
    model = get_model("tsne")
    with LocalExecutor(meta.to_affinity(verify=False), model, 2, 0, n_threads=2, partitions=meta.partitions,
                       repulsion="fft") as local, \
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client, \
            DaskExecutor(store, model, 2, 0, client, repulsion="fft") as dask:
        local.set_curvature(Y)
        dask.set_curvature(Y)
        reference = local.laplacian_matvec(V)
        mu = 1e-3
        # the held products: their own curvature, set by the holders at the same coordinates (the same weights)
        R = np.random.default_rng(2).normal(size=(2, n))
        held = {"local held": LocalHeld(local, {"coords": Y, "u": V, "r": R, "gradient": R}),
                "dask held": dask.hold({"coords": Y, "u": V, "r": R, "gradient": R})}
        for h in held.values():
            h.ensure({"w": 2})
            h.set_curvature(1.0, False)
        variants = {"local": lambda: local.laplacian_matvec(V), "dask one round": lambda: dask.laplacian_matvec(V),
                    "dask three rounds": lambda: three_rounds(dask, V), "dask empty round": lambda: empty_round(dask),
                    **{name: (lambda h=h: h.laplacian("u", "w", after=(cg1_product, (2, mu, False)))) for name, h in
                       held.items()}}
        for name in ("dask one round", "dask three rounds"):  # warm-up and the bit-for-bit check
            assert np.array_equal(variants[name](), reference), name
        dots = [variants[name]() for name in held]
        assert all(np.array_equal(a, b) for x, y in zip(*dots) for a, b in zip(x, y)), "held r . u, w . u, |r|^2"
        products = [h.gather("w")["w"] for h in held.values()]
        assert np.array_equal(products[0], products[1]) and np.array_equal(products[0], reference + mu * V), "held w"
        empty_round(dask)
        plan = dask._halo[0]
        halo_rows = sum(plan.halo_rows().values())
        sent = dask.stats["bytes_sent"]
        dask.laplacian_matvec(V)
        one_round_sent = dask.stats["bytes_sent"] - sent
        sent = dask.stats["bytes_sent"]
        variants["dask held"]()
        held_sent = dask.stats["bytes_sent"] - sent
        times = {name: [] for name in variants}
        names = list(variants)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - t0)
        for h in held.values():
            h.close()
    local_s = statistics.median(times["local"])
    client_mb = {"local": "-", "dask one round": f"{one_round_sent / 1e6:.2f}",
                 "dask three rounds": f"{n * 2 * 8 / 1e6:.2f}", "dask empty round": "0", "local held": "-",
                 "dask held": f"{held_sent / 1e6:.4f}"}
    return [[Path(store).name, n, len(meta.partitions) - 1, "-" if name.startswith("local") else workers, name,
             f"{statistics.median(times[name]):.4f}", f"{statistics.median(times[name]) / local_s:.2f}",
             f"{min(times[name]):.4f}", client_mb[name], f"{halo_rows / n:.3f}"] for name in names]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", required=True, help="affinity stores, comma separated")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out")
    args = parser.parse_args()
    report = Report.start("Laplacian product: in-process against Dask, one task round against three",
                          "Command: python benchmarks/laplacian_round.py " + " ".join(sys.argv[1:]))
    header = ["store", "N", "partitions", "workers", "product", "median s", "vs local", "min s",
              "client -> workers MB", "sum of halos / N"]
    rows = []
    for store in args.stores.split(","):
        rows += measure(store, args.workers, args.rounds)
        print(markdown_table(header, rows), flush=True)
    report(markdown_table(header, rows))
    report()
    report.save(args.out)


if __name__ == "__main__":
    main()
