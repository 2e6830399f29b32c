"""The client's memory during a delta-bar-delta run (or ``--optimizer auto``: the model's schedule) on two Dask
workers, for two source trees side by side.

Each round runs, in rotated order, for every tree (``--trees NAME=PATH,...``: a scalemb source tree put first on
``PYTHONPATH``, so the client and the ``LocalCluster`` workers it starts import it)::

    scalemb embed STORE --out TMP/run.zarr --scheduler ADDRESS --optimizer OPT --repulsion fft --iterations K
                        --checkpoint-every C --seed 0 --quiet

on a ``dask scheduler`` and two ``dask worker --nthreads 1`` processes started for the run (the client process
holds the client only: no in-process scheduler),

twice: once plain, sampling the client's resident set (``VmRSS``, every 0.1 s) and its peak (``VmHWM``), and once
tracing its Python allocations (``tracemalloc``, which costs time and memory of its own: its run's resident set is
not reported), sampling every 4 s the NumPy buffers alive (``numpy.lib.tracemalloc_domain``) of at least
``4 N`` bytes (half a float64 row of N points: every O(N) array of the optimiser) with where each was allocated.
Both split the run into phases by the output store and the loop: ``set-up`` (input, executor, start, until the
first checkpoint is current), ``run`` (iterations and checkpoints, until the loop's last KL) and ``end`` (the final
state gathered, or written by the workers, and the result written); the bytes the client's executor sent and
received in the ``end`` phase are counted too.  Reported per tree, medians over rounds: the peak resident set per
phase and overall, and the most O(N) bytes alive at once per phase, also as (d x N) float64 arrays.  The final
embeddings are checked equal.

Usage: ``python benchmarks/client_rss.py --store P200000.zarr --trees before=/tmp/old,after=. --rounds 2``
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/distributed.py is no module

NUMPY_DOMAIN = 389047  # numpy.lib.tracemalloc_domain: NumPy's data buffers in tracemalloc
PHASES = ("set-up", "run", "end")


def _client(argv: list, samples_path: str, out: str, min_bytes: int) -> int:
    """The client process: ``scalemb`` ``argv``, sampled (module docstring); ``min_bytes`` > 0: traced."""
    import tracemalloc

    if min_bytes:
        tracemalloc.start(6)
    samples, done, ending = [], threading.Event(), threading.Event()
    import scalemb.optim.dbd as dbd

    final_kl = dbd._DBDRun.final_kl

    def marked_final_kl(self, *args):  # the loop's end: the final state is exported right after
        if not ending.is_set():
            at_end.update(traffic())
        ending.set()
        return final_kl(self, *args)

    dbd._DBDRun.final_kl = marked_final_kl
    import scalemb.engine.distributed as distributed

    executors, at_end = [], {}
    init = distributed.DaskExecutor.__init__

    def recorded_init(self, *args, **kwargs):  # the run's executor, whose stats count the client's Dask bytes
        init(self, *args, **kwargs)
        executors.append(self)

    distributed.DaskExecutor.__init__ = recorded_init

    def traffic() -> dict:
        return {key: sum(ex.stats.get(key, 0) for ex in executors) for key in ("bytes_sent", "bytes_received")}

    def phase() -> str:
        if ending.is_set():
            return "end"
        try:
            attrs = json.loads((Path(out) / "zarr.json").read_text()).get("attributes", {})
        except (OSError, ValueError):
            return "set-up"
        return "run" if (attrs.get("scalemb_checkpoint") or {}).get("current") else "set-up"

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    def where(traceback) -> str:
        """The innermost scalemb frame of an allocation (else the innermost frame)."""
        frames = [f for f in traceback if "/scalemb/" in f.filename] or list(traceback)
        return f"scalemb/{frames[-1].filename.split('/scalemb/')[-1]}:{frames[-1].lineno}"

    def big_arrays() -> list:
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, NUMPY_DOMAIN)])
        return sorted(((t.size, where(t.traceback)) for t in snapshot.traces if t.size >= min_bytes), reverse=True)

    def sample():
        while not done.wait(4.0 if min_bytes else 0.1):
            samples.append((phase(), big_arrays() if min_bytes else status("VmRSS:")))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    from scalemb.cli.main import main

    code = main(argv)
    done.set()
    thread.join()
    total = traffic()
    end = {key: total[key] - at_end.get(key, 0) for key in total}
    Path(samples_path).write_text(json.dumps({"samples": samples, "hwm": status("VmHWM:"), "code": code,
                                              "end_bytes": end}))
    return code


def _one(tree: str, store: str, iterations: int, every: int, workdir: Path, min_bytes: int,
         optimizer: str = "dbd") -> dict:
    """One run on a scheduler and two single-threaded workers started here (processes of their own, importing
    ``tree``: the client process holds the client alone)."""
    out = workdir / "run.zarr"
    samples = workdir / "samples.json"
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    from common import local_dask_cluster  # main() puts benchmarks/ at the end of the path

    with local_dask_cluster(2, memory_limit="6GB", env=env) as address:
        argv = ["embed", store, "--out", str(out), "--scheduler", address, "--optimizer", optimizer, "--repulsion",
                "fft", "--iterations", str(iterations), "--checkpoint-every", str(every), "--seed", "0", "--quiet",
                "--overwrite"]
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--client", str(samples), str(out),
                        str(min_bytes), *argv], env=env, check=True)
    data = json.loads(samples.read_text())
    import numpy as np
    import zarr

    result = {"embedding": np.asarray(zarr.open_group(store=str(out), mode="r")["embedding"][:])}
    if min_bytes:
        big = {}
        for phase, arrays in data["samples"]:
            if sum(b for b, _ in arrays) >= sum(b for b, _ in big.get(phase, [])):
                big[phase] = arrays
        result["big"] = big
    else:
        peaks = {}
        for phase, rss in data["samples"]:
            peaks[phase] = max(peaks.get(phase, 0), rss)
        result.update(rss=peaks, hwm=data["hwm"], end_bytes=data.get("end_bytes", {}))
    return result


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--client":
        sys.exit(_client(argv[4:], argv[1], argv[2], int(argv[3])))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--trees", required=True, help="NAME=PATH,... (scalemb source trees)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--optimizer", default="dbd", help="dbd, or auto: the model's schedule (at scale: the "
                        "spectral direction's steps held on the workers)")
    parser.add_argument("--out", help="append the report to this Markdown file")
    args = parser.parse_args(argv)
    import numpy as np
    import zarr

    sys.path.append(str(HERE))
    from common import markdown_table, run_description

    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    n = zarr.open_group(store=args.store, mode="r")["indptr"].shape[0] - 1
    plain, traced = {name: [] for name in trees}, {name: [] for name in trees}
    names = list(trees)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for kind, runs in ((0, plain), (4 * n, traced)):
                with tempfile.TemporaryDirectory(dir=Path(args.store).resolve().parent) as tmp:
                    runs[name].append(_one(trees[name], args.store, args.iterations, args.checkpoint_every,
                                           Path(tmp), kind, args.optimizer))
                got = runs[name][-1]
                if kind:
                    for phase, arrays in got["big"].items():
                        print(f"{name} {phase}: O(N) NumPy buffers: " + ", ".join(
                            f"{b / 2**20:.2f} MB {at}" for b, at in arrays), flush=True)
                else:
                    print(name, {k: f"{v / 2**20:.0f} MB" for k, v in got["rss"].items()},
                          f"VmHWM {got['hwm'] / 2**20:.0f} MB", "Dask bytes at the end", got["end_bytes"], flush=True)
    first = plain[names[0]][0]["embedding"]
    d = first.shape[1]
    array = d * n * 8  # one (d, N) float64 array: coordinates, increments, best iterate
    identical = all(np.array_equal(run["embedding"], first) for runs in (plain, traced) for rs in runs.values()
                    for run in rs)
    rows, held = [], []
    for name in names:
        rss = {p: statistics.median(run["rss"].get(p, 0) for run in plain[name]) for p in PHASES}
        big = {p: statistics.median(sum(b for b, _ in run["big"].get(p, [])) for run in traced[name])
               for p in PHASES}
        hwm = statistics.median(run["hwm"] for run in plain[name])
        end_in, end_out = (statistics.median(run["end_bytes"].get(key, 0) for run in plain[name])
                           for key in ("bytes_received", "bytes_sent"))
        rows.append([name, *[f"{rss[p] / 2**20:.0f}" for p in PHASES], f"{hwm / 2**20:.0f}",
                     f"{end_in / 2**10:,.1f} / {end_out / 2**10:,.1f}",
                     *[f"{big[p] / 2**20:.1f} ({big[p] / array:.1f})" for p in PHASES]])
        for phase in ("run", "end"):
            last = traced[name][-1]["big"].get(phase, [])
            held.append(f"* {name}, {phase}: " + (", ".join(f"{b / 2**20:.2f} MB from `{at}`" for b, at in last)
                                                  or "none"))
    text = "\n".join([
        f"## Client memory during a run: {Path(args.store).name} (N = {n:,}), 2 Dask workers, {args.iterations} "
        f"{'delta-bar-delta' if args.optimizer == 'dbd' else args.optimizer + ' optimiser'} iterations, a checkpoint "
        f"every {args.checkpoint_every}",
        "",
        run_description() + "  ",
        f"command: `python benchmarks/client_rss.py {' '.join(argv)}`",
        "",
        markdown_table(["tree", *[f"peak RSS MB, {p}" for p in PHASES], "VmHWM MB", "client KB in / out, end",
                        *[f"O(N) NumPy MB, {p} ({d} x N arrays)" for p in PHASES]], rows),
        "",
        f"Medians of {args.rounds} rounds.  Client KB in / out, end: what the client received from and sent to "
        "the Dask workers after the loop's last KL (the executor's byte counts: pickled task arguments and "
        "results).  O(N) NumPy: the most bytes in NumPy buffers of at least 4 N bytes alive "
        f"at once (traced runs, sampled every 4 s), in brackets as ({d} x N) float64 arrays of {array / 2**20:.2f} MB. "
        f" Final embeddings {'identical' if identical else 'DIFFERENT'} across trees, rounds and runs.  The O(N) "
        f"buffers of the last traced round's fullest sample, with where they were allocated:",
        "",
        *held,
        ""])
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
