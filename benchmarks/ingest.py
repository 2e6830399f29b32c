"""Affinity pipeline benchmark: streaming edge-list ingestion and kNN affinities, wall time and peak RSS.

Every measured step runs as its own child process (``scalemb affinity ...`` or a peer), timed from the parent;
its peak resident memory comes from ``os.wait4`` (the child's own ``ru_maxrss``).  Inputs are generated into
a temporary directory and deleted at the end.

1. Graph: synthetic co-authorship edge lists (``scalemb generate coauthor``) of 2e6 and 2e7 edge lines into
   an affinity store (``scalemb affinity --graph``), median of ``--repeats`` runs; beside it the in-memory path
   (``read_edge_list`` + ``coauthorship_affinity`` + ``write_affinity_store``) on the same file.
2. kNN: Gaussian-mixture features (``--knn-points`` x 50) into a perplexity-30 affinity store
   (``scalemb affinity --knn 90``); at 1e5 points also openTSNE's ``PerplexityBasedNN`` (same pynndescent,
   same k) on the same features, with the neighbour recall of both against exact neighbours of 1000 points.

Usage: ``python benchmarks/ingest.py --out benchmarks/results/ingest.md``
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, markdown_table  # noqa: E402

SCALEMB = [sys.executable, "-m", "scalemb"]
IN_MEMORY = """
import sys
from scalemb.affinity import coauthorship_affinity, write_affinity_store
from scalemb.io.edgelist import read_edge_list
write_affinity_store(sys.argv[2], coauthorship_affinity(read_edge_list(sys.argv[1])))
"""


def measure(cmd) -> tuple[float, float]:
    """Run ``cmd``; return (wall seconds, peak RSS in GB) of that child; raise if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{stderr}")
    return seconds, usage.ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def count_edge_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 24), b"")) - 3  # 3 header lines


def graph_section(report: Report, tmp: Path, sizes, repeats: int) -> None:
    report("## Edge list -> affinity store (co-authorship affinity, 8 partitions)")
    report()
    rows = []
    for n_edges in sizes:
        edges = tmp / f"coauthor-{n_edges}.txt"
        gen_s, _ = measure(SCALEMB + ["generate", "coauthor", "--authors", str(n_edges // 4), "--out", str(edges),
                                      "--quiet"])
        lines = count_edge_lines(edges)
        runs = []
        for _ in range(repeats):
            store = tmp / "P.zarr"
            runs.append(measure(SCALEMB + ["affinity", str(edges), "--out", str(store), "--graph", "--overwrite",
                                           "--quiet"]))
        from scalemb.affinity import AffinityStore

        meta = AffinityStore(tmp / "P.zarr")
        seconds = statistics.median(s for s, _ in runs)
        rss = max(r for _, r in runs)
        rows.append([f"{lines:.3g}", f"{meta.n_points:.3g}", f"{meta.nnz // 2:.3g}", "scalemb affinity (streaming)",
                     f"{seconds:.1f}", f"{lines / seconds / 1e6:.2f}", f"{rss:.2f}", f"{gen_s:.1f}"])
        mem_s, mem_rss = measure([sys.executable, "-c", IN_MEMORY, str(edges), str(tmp / "Q.zarr")])
        rows.append([f"{lines:.3g}", f"{meta.n_points:.3g}", f"{meta.nnz // 2:.3g}", "in-memory (read_edge_list)",
                     f"{mem_s:.1f}", f"{lines / mem_s / 1e6:.2f}", f"{mem_rss:.2f}", ""])
        for path in (edges, tmp / "P.zarr", tmp / "Q.zarr"):
            subprocess.run(["rm", "-rf", str(path)], check=True)
    report(markdown_table(["edge lines", "N", "undirected edges", "method", f"seconds (median of {repeats})",
                           "M edge lines/s", "peak RSS GB", "generate s"], rows))
    report()


def clustered_features(n: int, dims: int, seed: int = 0) -> np.ndarray:
    """``n`` points from a mixture of 20 Gaussians in ``dims`` dimensions (float32 halves the file)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(20, dims))
    X = centres[rng.integers(0, 20, n)] + rng.normal(size=(n, dims))
    return X.astype(np.float32)


def exact_neighbours(X: np.ndarray, queries: np.ndarray, k: int, batch: int = 50) -> np.ndarray:
    """Exact k nearest neighbours (self excluded) of the query rows, ``batch`` queries at a time."""
    Xd = X.astype(np.float64)
    norms = (Xd ** 2).sum(1)
    out = np.empty((queries.size, k), dtype=np.int64)
    for start in range(0, queries.size, batch):
        q = queries[start:start + batch]
        d2 = norms[q][:, None] - 2 * Xd[q] @ Xd.T + norms[None, :]
        d2[np.arange(q.size), q] = np.inf
        part = np.argpartition(d2, k, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(d2, part, axis=1), axis=1)
        out[start:start + batch] = np.take_along_axis(part, order, axis=1)
    return out


def recall(P_rows, truth: np.ndarray) -> float:
    """Fraction of the exact k neighbours present in the rows' affinity patterns."""
    hits = sum(np.isin(truth[r], P_rows[r].indices).sum() for r in range(truth.shape[0]))
    return hits / truth.size


def knn_section(report: Report, tmp: Path, sizes, threads: int, skip_opentsne: bool) -> None:
    from scalemb.affinity import AffinityStore

    report("## Features -> kNN affinity store (perplexity 30, k = 90, euclidean, pynndescent)")
    report()
    rows = []
    for n in sizes:
        X = clustered_features(n, 50)
        features = tmp / f"X-{n}.npy"
        np.save(features, X)
        queries = np.random.default_rng(1).choice(n, 1000, replace=False)
        truth = exact_neighbours(X, queries, 90)
        store = tmp / "P.zarr"
        seconds, rss = measure(SCALEMB + ["affinity", str(features), "--out", str(store), "--knn", "90",
                                          "--perplexity", "30", "--threads", str(threads), "--overwrite", "--quiet"])
        P = AffinityStore(store).to_affinity(verify=False).P
        ours = recall([P[int(q)] for q in queries], truth)
        rows.append([f"{n:.0e}", "scalemb affinity --knn 90", f"{seconds:.1f}", f"{rss:.2f}", f"{ours:.3f}"])
        print("  ", rows[-1], flush=True)
        if n <= 100_000 and not skip_opentsne:
            pattern = tmp / "opentsne.npy"
            code = ("import sys, numpy as np\nfrom openTSNE.affinity import PerplexityBasedNN\n"
                    "X = np.load(sys.argv[1])\n"
                    "aff = PerplexityBasedNN(X, perplexity=30, method='pynndescent', n_jobs=int(sys.argv[3]), "
                    "random_state=0)\n"
                    "q = np.load(sys.argv[4])\nP = aff.P.tocsr()\n"
                    "np.save(sys.argv[2], np.array([np.isin(t, P[int(i)].indices).sum() "
                    "for i, t in zip(q, np.load(sys.argv[5]))]))\n")
            np.save(tmp / "queries.npy", queries)
            np.save(tmp / "truth.npy", truth)
            o_seconds, o_rss = measure([sys.executable, "-c", code, str(features), str(pattern), str(threads),
                                        str(tmp / "queries.npy"), str(tmp / "truth.npy")])
            o_recall = np.load(pattern).sum() / truth.size
            rows.append([f"{n:.0e}", "openTSNE PerplexityBasedNN (k = 90)", f"{o_seconds:.1f}", f"{o_rss:.2f}",
                         f"{o_recall:.3f}"])
            print("  ", rows[-1], flush=True)
        subprocess.run(["rm", "-rf", str(store), str(features)], check=True)
    report(markdown_table(["points x 50 dims", "method", "seconds", "peak RSS GB",
                           "recall@90 (1000 queries)"], rows))
    report()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the Markdown report here")
    parser.add_argument("--edges", default="2000000,20000000", help="edge-line counts, comma separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--knn-points", default="100000,1000000", help="kNN sizes, comma separated")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-graph", action="store_true")
    parser.add_argument("--skip-knn", action="store_true")
    parser.add_argument("--skip-opentsne", action="store_true")
    args = parser.parse_args()
    report = Report.start("Affinity pipeline: streaming ingestion and kNN affinities")
    report("Each measured step is a separate child process; peak RSS is that process's maximum resident set "
           "(os.wait4). Targets (issue 5): 2e7 edge lines -> store with peak RSS <= 2 GB at >= 1e6 edge lines/s; "
           "1e6 x 50 kNN affinities <= 15 min.")
    report()
    with tempfile.TemporaryDirectory(prefix="scalemb-ingest-") as tmp:
        if not args.skip_graph:
            graph_section(report, Path(tmp), [int(s) for s in args.edges.split(",")], args.repeats)
        if not args.skip_knn:
            knn_section(report, Path(tmp), [int(s) for s in args.knn_points.split(",")], args.threads,
                        args.skip_opentsne)
    report.save(args.out)


if __name__ == "__main__":
    main()
