"""One CLI run with its processes' memory watched: wall time per iteration and the peak RSS of the client and of
each Dask worker (issue 30, part 6: a graph bigger than the client's memory should be).

Runs ``scalemb.embed(STORE, workers=W, iterations=K, out=RUN, model=...)`` (what ``scalemb embed STORE --workers
W`` runs) in a child process that prints the run's clock at every iteration (``EmbeddingResult.seconds``), samples
every process of the run every ``--every`` seconds (the client: that child; workers: its descendants), then
``scalemb metrics RUN --sample S`` gives the KL and sampled NP@deg.

Usage: ``python benchmarks/big_run.py --store P1e7.zarr --workers 2 --iterations 12 --out run.zarr --report F.md``
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
from common import Report, markdown_table  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=12, help="0: the model's defaults (its schedule and "
                        "stopping rule)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sample", type=int, default=10000)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--report", default=None)
    parser.add_argument("--model", default="tsne")
    args = parser.parse_args(argv)
    import psutil
    import numpy as np

    import scalemb

    iterations = f"iterations={args.iterations}, " if args.iterations else ""
    script = ("import json, scalemb; r = scalemb.embed({!r}, out={!r}, overwrite=True, workers={}, {}"
              "model={!r}); print(json.dumps([float(x) for x in r.seconds]))").format(
        args.store, args.out, args.workers, iterations, args.model)
    command = [sys.executable, "-c", script]
    report = Report.start("A run bigger than the client should hold: memory and time per iteration",
                          f"child: `python -c \"{script}\"`")
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    client = psutil.Process(proc.pid)
    peaks = {}
    while proc.poll() is None:
        try:
            procs = [client] + client.children(recursive=True)
            for p in procs:
                with p.oneshot():
                    name = "client" if p.pid == client.pid else ("worker" if "dask" in " ".join(p.cmdline()) or
                                                                  "multiprocessing" in " ".join(p.cmdline())
                                                                  else "other")
                    key = (name, p.pid)
                    peaks[key] = max(peaks.get(key, 0), p.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(args.every)
    wall = time.perf_counter() - start
    printed = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode})")
    result = scalemb.EmbeddingResult.load(args.out)
    seconds = np.asarray(json.loads(printed.strip().splitlines()[-1]))
    per_iteration = float(np.median(np.diff(seconds))) if seconds.size > 2 else float("nan")
    metrics = json.loads(subprocess.run([sys.executable, "-m", "scalemb", "metrics", args.out, "--sample",
                                         str(args.sample), "--json", "--quiet"], check=True, capture_output=True,
                                        text=True).stdout)
    metrics = {name: m["value"] for name, m in metrics.items()}
    rows = [[name, pid, f"{rss / 2**30:.2f}"] for (name, pid), rss in sorted(peaks.items()) if name != "other"]
    report(f"{result.embedding.shape[0]:,} points, {result.iterations} iterations, wall {wall:.0f} s (whole "
           f"command: store open, partitions loaded, start, iterations, result written), median "
           f"{per_iteration:.2f} s per iteration (the run's own clock), KL {result.kl:.4f}; metrics on "
           f"{args.sample} sampled rows: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                                                      if isinstance(v, (int, float))))
    report()
    report(markdown_table(["process", "pid", "peak RSS (GiB)"], rows))
    report.save(args.report)


if __name__ == "__main__":
    main()
