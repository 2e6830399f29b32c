"""Many hosts on one machine: Dask workers in their own network namespaces behind rate-limited links.

Each of W workers runs in a network namespace ``smb-wI`` joined to the root namespace (scheduler and client) by a
veth pair; both ends of every link are shaped with ``tc qdisc ... tbf`` to ``--rates`` (e.g. ``10gbit,1gbit``), so
every byte between a worker and the client, or between two workers (routed through the root namespace: two
shaped links), crosses a link of that rate.  This kernel has ``tbf`` but not ``netem``: no latency is added
(loopback latency, ~50 us per hop, is what remains).  Needs root; every namespace, link and process it creates
is removed at the end, also on errors and Ctrl-C.

For each rate it runs ``--iterations`` of delta-bar-delta (t-SNE R^2, FFT, learning rate 1 so the layout and the
grid stay the start's, as ``benchmarks/cluster.py``) with the optimiser's state held on the workers and with it
held on the client, and reports per iteration: wall time, the bytes the model of ``docs/scaling.md`` predicts
(client payload from the executor's counters; worker to worker: the grids through the convolving worker's link,
packed as the boxes each worker's rows occupy, ``_critical_bytes``; the model with whole grids beside it), the
communication time those bytes take at the link rate (the model), and the measured excess over the same run on
unshaped links (the measurement).

Usage (root): ``python benchmarks/netns_cluster.py --store P2e5.zarr --workers 2 --rates 10gbit,1gbit``
"""
import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
from common import Report, markdown_table  # noqa: E402

PREFIX = "smb-w"
# tbf's bucket on every shaped interface ("burst 1mb": tc's sizes are binary).  A link idle for longer than the
# bucket takes to refill (8 ms at 1 Gb/s, 84 ms at 100 Mb/s; an iteration is ~0.35 s) passes this many bytes of the
# next transfer at the veth's own speed: the model charges each transfer through a link its bytes beyond it.
BURST = 1 << 20


def _sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Namespaces:
    """W namespaces with veth links to the root namespace (10.77.I.1 root side, 10.77.I.2 worker side)."""

    def __init__(self, n: int):
        self.n = n
        self.made = []
        _sh("sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        for i in range(1, n + 1):
            ns, host, peer = f"{PREFIX}{i}", f"smbh{i}", f"smbp{i}"
            _sh("ip", "netns", "add", ns)
            self.made.append(ns)
            _sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            _sh("ip", "link", "set", peer, "netns", ns)
            _sh("ip", "addr", "add", f"10.77.{i}.1/24", "dev", host)
            _sh("ip", "link", "set", host, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.77.{i}.2/24", "dev", peer)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", f"10.77.{i}.1")

    def shape(self, rate: str | None) -> None:
        """Both ends of every link at ``rate`` (None: unshaped)."""
        for i in range(1, self.n + 1):
            ns = f"{PREFIX}{i}"
            for prefix, dev in (((), f"smbh{i}"), (("ip", "netns", "exec", ns), f"smbp{i}")):
                _sh(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                if rate:
                    _sh(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", str(BURST),
                        "latency", "100ms")

    def close(self) -> None:
        for i, ns in enumerate(self.made, start=1):
            _sh("ip", "link", "del", f"smbh{i}", check=False)
            _sh("ip", "netns", "del", ns, check=False)
        self.made = []


class Cluster:
    """A scheduler in the root namespace and one ``dask worker`` per namespace."""

    def __init__(self, namespaces: Namespaces, scratch: Path):
        self.file = scratch / "scheduler.json"
        self.file.unlink(missing_ok=True)
        self.procs = [subprocess.Popen(["dask", "scheduler", "--host", "0.0.0.0", "--port", "0", "--no-dashboard",
                                        "--scheduler-file", str(self.file)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
        deadline = time.monotonic() + 60
        while not self.file.exists() or not self.file.read_text().strip():
            if time.monotonic() > deadline:
                raise SystemExit("dask scheduler did not start")
            time.sleep(0.1)
        port = json.loads(self.file.read_text())["address"].rsplit(":", 1)[1]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent),
                                                                      os.environ.get("PYTHONPATH")])))
        for i in range(1, namespaces.n + 1):
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}{i}", "dask", "worker", f"tcp://10.77.{i}.1:{port}", "--host",
                 f"10.77.{i}.2", "--nthreads", "1", "--no-nanny", "--no-dashboard"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True))
        from distributed import Client

        self.client = Client(f"tcp://127.0.0.1:{port}")
        self.client.wait_for_workers(namespaces.n, timeout=120)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _run(executor, model, start, iterations):
    from cluster import _run as run

    return run(executor, model, start, iterations)


def _critical_bytes(executor, grid, start) -> tuple:
    """Worker-to-worker bytes on an evaluation's critical path, the model of docs/scaling.md, as ``(now,
    whole)``: the largest halo piece (pieces travel in parallel on different links; d = 2, 8 B) plus the grids
    through the convolving worker's link -- with ``dask_halo.CONVOLVING_WORKERS`` = 1 and W <= 4 it fetches the
    other W - 1 workers' int64 charges, since stop 55 packed (each worker's charges at the boxes its own rows
    occupy, ``repulsion.packed``: an 8-byte box index and the box's nodes each), and sends each its float32
    potentials, packed alike with ``dask_halo.PACK_POTENTIALS`` (the default), else whole
    (``--whole-potentials``); beyond 4 workers whole grids in log2(W) rounds of a pairwise tree.  ``whole``: the
    same with whole grids at every W <= 4 (the model of stops 47-54).  ``grid``: the run's grid at the start
    layout ``start`` (the layout barely moves at learning rate 1), from which each worker's boxes are counted.

    The charges in and the potentials out cross the convolving worker's link one after the other (its two
    directions), each ``BURST`` bytes the sooner (the shaper's bucket, full after the idle time before it): each
    direction's bytes count beyond ``BURST``."""
    from scalemb.engine import dask_halo
    from scalemb.repulsion.packed import pack_charges

    plan = executor._halo[0]
    piece = max(plan.pieces.values(), default=0) * 2 * 8
    w = max(2, len(plan.workers))
    rounds = int(np.ceil(np.log2(w)))

    def shaped(*directions):  # each direction's bytes beyond the bucket
        return sum(max(0, b - BURST) for b in directions)

    whole_in, whole_out = (w - 1) * grid.n_nodes * 8, (w - 1) * grid.n_nodes * 4 * grid.n_potentials
    if w > 4:
        tree = rounds * shaped(grid.n_nodes * 8, grid.n_nodes * 4 * grid.n_potentials)
        return piece + tree, piece + tree
    per_box = int(np.prod(grid.counts))
    charges = potentials = 0
    for v in plan.workers[1:]:  # the workers that do not convolve
        own = np.concatenate([np.arange(*executor.partitions[k]) for k in plan.parts[v]])
        boxes = pack_charges(grid, np.zeros(grid.n_nodes, dtype=np.int64),
                             np.ascontiguousarray(start[:, own])).boxes.size
        charges += boxes * (per_box * 8 + 8)
        potentials += boxes * (per_box * 4 * grid.n_potentials + 8) if dask_halo.PACK_POTENTIALS else \
            grid.n_nodes * 4 * grid.n_potentials
    return piece + shaped(charges, potentials), piece + shaped(whole_in, whole_out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rates", default="10gbit,1gbit")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scratch", default="/tmp/scalemb-netns")
    parser.add_argument("--whole-potentials", action="store_true",
                        help="send the potentials whole (dask_halo.PACK_POTENTIALS = False)")
    parser.add_argument("--held", default="workers,client",
                        help="where the optimiser's state is held, comma-separated of workers, client")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.whole_potentials:
        from scalemb.engine import dask_halo

        dask_halo.PACK_POTENTIALS = False
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces and tc)")
    from cluster import _start

    from scalemb.affinity import AffinityStore
    from scalemb.engine.distributed import DaskExecutor
    from scalemb.engine.held import LocalHeld
    from scalemb.models import get_model
    from scalemb.repulsion import FFTParams, grid_for

    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    report = Report.start(f"Dask workers in {args.workers} network namespaces behind tbf-shaped links",
                          "Per iteration of delta-bar-delta (t-SNE R^2, FFT), median of rounds; comm. model = "
                          "(client bytes / W + the grids through the convolving worker's link) / link rate; measured "
                          "comm. = time at the rate - time unshaped (same run).  No latency added (no netem).")
    st = AffinityStore(args.store)
    model = get_model("tsne")
    start = _start(st.n_points, 2)
    grid = grid_for(model, 2, start, FFTParams().resolved(model.fft, 2, st.n_points))
    namespaces = Namespaces(args.workers)
    rows = []
    try:
        cluster = Cluster(namespaces, scratch)
        try:
            # rounds rotate the rates (unshaped among them), so that each rate's median and the unshaped one
            # are taken over the same stretch of a drifting host's time
            rates = [None] + args.rates.split(",")
            runs = {(rate, held): ([], [], None) for rate in rates for held in args.held.split(",")}
            for r in range(args.rounds):
                for rate in rates[r % len(rates):] + rates[:r % len(rates)]:
                    namespaces.shape(rate)
                    for held in args.held.split(","):
                        with DaskExecutor(args.store, model, 2, 0, cluster.client, repulsion="fft") as ex:
                            if held == "client":
                                ex.hold = lambda arrays, ex=ex: LocalHeld(ex, arrays)
                            seconds, nbytes, _ = _run(ex, model, start, args.iterations)
                            between = _critical_bytes(ex, grid, start)
                        times, traffic, _ = runs[rate, held]
                        times.append(seconds)
                        traffic.append(nbytes)
                        runs[rate, held] = (times, traffic, between)
                        report(f"  round {r + 1}, {rate or 'unshaped'}, state on the {held}: {seconds:.3f} s per "
                               f"iteration, client {nbytes / 1e6:.3f} MB, workers {between[0] / 1e6:.2f} MB on the "
                               f"critical path ({between[1] / 1e6:.2f} MB with whole grids)")
            results = {key: (statistics.median(times), statistics.median(traffic), between)
                       for key, (times, traffic, between) in runs.items()}
            for rate in args.rates.split(","):
                bits = float(rate.replace("gbit", "e9").replace("mbit", "e6"))
                for held in args.held.split(","):
                    t, client_bytes, between = results[rate, held]
                    base = results[None, held][0]
                    # the client's bytes cross its W links in parallel (~1/W each); the workers' critical path
                    now, before = ((client_bytes / args.workers + b) * 8 / bits for b in between)
                    rows.append([rate, held, f"{t:.3f}", f"{base:.3f}", f"{t - base:.3f}", f"{now:.3f}",
                                 f"{(t - base) / now:.2f}", f"{before:.3f}", f"{client_bytes / 1e3:,.1f}",
                                 f"{between[0] / 1e6:.2f}"])
        finally:
            cluster.close()
    finally:
        namespaces.shape(None)
        namespaces.close()
    report()
    report(markdown_table(["link rate", "state held on", "s / iteration", "unshaped", "measured comm.",
                           "model comm.", "measured / model", "model with whole grids", "client KB / it.",
                           "worker-worker critical MB / it."], rows))
    report.save(args.out)


if __name__ == "__main__":
    main()
