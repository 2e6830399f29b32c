"""Quality of the maps on co-authorship graphs: scalemb t-SNE R^2 and SNEST R^{2,1} (defaults) against
openTSNE (defaults, on the same P through ``openTSNE.affinity.PrecomputedAffinities``) and UMAP (defaults, on the
same graph), all in one run.

Per layout: wall time of the fit, NP@deg and its Jaccard variant (scalemb.metrics; Euclidean order for the 2-D
layouts, SNEST's own order ``log(1+|Δs|²) - |Δt|²`` for the SNEST layout, and its space columns alone in the
Euclidean order), KL(P||Q) of every layout under the t-SNE kernel (SNEST's space columns) and of SNEST's under
its own, and the time the metrics took.  Trustworthiness needs input features (input-space ranks); a graph
input has none, so it is not defined here (see tests/test_metrics.py for the feature metrics).

UMAP: ``umap.umap_.simplicial_set_embedding`` on P scaled to max 1 as the fuzzy graph (the graph path of
``UMAP.fit``, after its kNN and fuzzy-set steps), with UMAP's defaults: min_dist 0.1, spread 1 (a, b from
``find_ab_params``), learning rate 1, repulsion strength 1, 5 negative samples, its default epochs (500 up to
10 000 points, else 200) and spectral initialisation (components placed at random, as UMAP does without data).
``metric='precomputed'`` was not used: it would rebuild a 15-NN fuzzy graph of its own from graph distances,
so UMAP would not see the same graph as the others.

    python benchmarks/quality.py --authors 10000 --out benchmarks/results/quality.md
"""
import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from scalemb.affinity import coauthorship_affinity
from scalemb.datasets import grqc
from scalemb.embedding import Embedder
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.io.edgelist import read_edge_list
from scalemb.metrics import graph_metrics, kl

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, markdown_table  # noqa: E402

THREADS = len(os.sched_getaffinity(0))


def run_scalemb(affinity, model):
    start = time.perf_counter()
    result = Embedder(model=model, space_dims=2, seed=0, n_threads=THREADS).fit(affinity).result_
    extra = f"{result.iterations} it., {result.repulsion.get('method')}"
    return result.embedding, time.perf_counter() - start, extra


def run_opentsne(affinity):
    from openTSNE import TSNE
    from openTSNE.affinity import PrecomputedAffinities

    start = time.perf_counter()
    embedding = TSNE(n_jobs=THREADS, random_state=0).fit(affinities=PrecomputedAffinities(affinity.P))
    return np.asarray(embedding), time.perf_counter() - start, "750 it. (250 EE + 500), spectral init"


def run_umap(affinity):
    import umap.umap_ as umap_

    start = time.perf_counter()
    graph = (affinity.P / affinity.P.max()).tocoo()
    a, b = umap_.find_ab_params(1.0, 0.1)
    n_epochs = 500 if affinity.n_points <= 10_000 else 200
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        embedding = umap_.simplicial_set_embedding(None, graph, 2, 1.0, a, b, 1.0, 5, None, "spectral",
                                                   np.random.RandomState(0), "euclidean", {}, False, {}, False,
                                                   parallel=True)[0]
    kept = int((graph.data >= graph.data.max() / n_epochs).sum())
    return embedding, time.perf_counter() - start, f"{n_epochs} epochs, {kept}/{graph.nnz} edges kept"


def warm_up():
    """Compile every numba kernel the timed runs use (scalemb's, the metrics', UMAP's) on the SCHOOL graph, so
    that fit and metrics times do not include compilation."""
    from scalemb.datasets import school

    affinity = school()
    for model in ("tsne", "snest"):
        for repulsion in ("exact", "fft"):
            Embedder(model=model, space_dims=2, iterations=5, repulsion=repulsion).fit(affinity)
    layouts = {"t": run_scalemb(affinity, "tsne"), "s": run_scalemb(affinity, "snest"), "o": run_opentsne(affinity),
               "u": run_umap(affinity)}
    for Y, _, _ in layouts.values():
        graph_metrics(affinity.P, Y[:, :2], "tsne")
        if Y.shape[1] == 3:
            graph_metrics(affinity.P, Y, "snest", 2)


def score(report, name, affinity, layouts):
    P = affinity.P
    deg = np.diff(P.indptr)
    n = affinity.n_points
    report(f"\n## {name}: N = {n}, {P.nnz // 2} edges, mean degree {deg.mean():.2f}; random layout NP@deg = "
           f"mean deg/(N-1) = {np.mean(deg / (n - 1)):.2e}\n")
    rows = []
    for label, (Y, seconds, extra) in layouts.items():
        t0 = time.perf_counter()
        space = Y[:, :2]
        euclid = graph_metrics(P, space, "tsne")
        kl_tsne = kl(affinity, space, "tsne")
        row = [label, f"{seconds:.1f}", extra, f"{euclid['np@deg'].value:.4f}", f"{euclid['jaccard@deg'].value:.4f}",
               f"{kl_tsne:.4f}"]
        if Y.shape[1] == 3:
            own = graph_metrics(P, Y, "snest", 2)
            row += [f"{own['np@deg'].value:.4f}", f"{own['jaccard@deg'].value:.4f}", f"{kl(affinity, Y, 'snest'):.4f}"]
        else:
            row += ["", "", ""]
        row.append(f"{time.perf_counter() - t0:.1f}")
        rows.append(row)
        print(row, flush=True)
    report(markdown_table(["layout", "fit s", "run", "NP@deg (Eucl.)", "Jaccard (Eucl.)", "KL t-SNE kernel",
                           "NP@deg (own)", "Jaccard (own)", "KL own kernel", "metrics s"], rows))
    return rows


def kl_fft_error(report, affinity, layouts):
    """KL of each layout with the exact and the FFT-interpolated normaliser (the docstring of scalemb.metrics.kl)."""
    rows = []
    for label, (Y, _, _) in layouts.items():
        for model, Z in (("tsne", Y[:, :2]),) + ((("snest", Y),) if Y.shape[1] == 3 else ()):
            t0 = time.perf_counter()
            exact = kl(affinity, Z, model, 2, repulsion="exact")
            t1 = time.perf_counter()
            fft = kl(affinity, Z, model, 2, repulsion="fft")
            t2 = time.perf_counter()
            rows.append([label, model, f"{exact:.6f}", f"{fft - exact:+.1e}", f"{t1 - t0:.1f}", f"{t2 - t1:.1f}"])
    report(f"\nKL with the exact and the FFT-interpolated normaliser, N = {affinity.n_points}:\n")
    report(markdown_table(["layout", "kernel", "exact KL", "fft - exact", "exact s", "fft s"], rows))


def cached(directory, name, label, run):
    """``run()`` -> ``(Y, seconds, extra)``, kept in ``directory`` (if given) under the input and layout names, so a
    run that dies later (or is stopped) keeps the layouts it finished; a cached layout is reused as measured.
    ``run`` None: the cached layout or None."""
    if directory is None:
        return None if run is None else run()
    path = Path(directory) / ("".join(c if c.isalnum() else "_" for c in f"{name}-{label}") + ".npz")
    if path.exists():
        kept = np.load(path, allow_pickle=False)
        return kept["Y"], float(kept["seconds"]), str(kept["extra"])
    if run is None:
        return None
    Y, seconds, extra = run()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, Y=Y, seconds=seconds, extra=extra)
    return Y, seconds, extra


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors", type=int, default=100_000, help="authors of the generated graph")
    parser.add_argument("--skip-grqc", action="store_true")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the warm-up: numba compilation then counts in the first scalemb and UMAP fits")
    parser.add_argument("--cache", default=None, help="directory keeping each finished layout (reused when present)")
    parser.add_argument("--only", type=lambda v: [x for x in v.split(",") if x], default=None,
                        help="comma-separated layout labels to run (e.g. 'openTSNE,UMAP'); the others come from "
                             "--cache where it has them")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = Report.start("Map quality: NP@deg and KL, scalemb against openTSNE and UMAP on the same P")
    total = time.perf_counter()
    if args.no_warm_up:
        report("no warm-up: the scalemb and UMAP fit times include numba compilation")
    else:
        warm_up()
        report(f"warm-up (numba compilation, not in the times below): {time.perf_counter() - total:.0f} s")
    inputs = []
    if not args.skip_grqc:
        inputs.append(("GrQc", grqc()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "coauthor.txt"
        write_coauthor_edge_list(path, args.authors, seed=0)
        inputs.append((f"generated co-authorship graph, {args.authors} authors (seed 0)",
                       coauthorship_affinity(read_edge_list(path))))
    runners = {"scalemb t-SNE R^2": lambda a: run_scalemb(a, "tsne"),
               "scalemb SNEST R^2,1": lambda a: run_scalemb(a, "snest"),
               "openTSNE": run_opentsne, "UMAP": run_umap}
    for name, affinity in inputs:
        layouts = {}
        for label, runner in runners.items():
            if args.only and label not in args.only:  # not run here: taken from the cache if it has it
                kept = cached(args.cache, name, label, None)
                if kept is not None:
                    layouts[label] = kept
                continue
            layouts[label] = cached(args.cache, name, label, lambda: runner(affinity))
            print(f"{label}: {layouts[label][1]:.1f} s, {layouts[label][2]}", flush=True)
        score(report, name, affinity, layouts)
        if name != "GrQc":  # GrQc's: benchmarks/results/repulsion_grqc.md
            kl_fft_error(report, affinity, layouts)
    report(f"\ntotal {time.perf_counter() - total:.0f} s")
    report.save(args.out)


if __name__ == "__main__":
    main()
