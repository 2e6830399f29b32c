"""Placing held-out nodes into a stored map vs re-embedding everything (issue 20, deliverable 4).

GrQc: hold out 10 % of the nodes (at random, and separately the 10 % of highest id, "the newest authors");
nodes of the remaining graph left without an edge join the new ones.  Embed the rest, place the new nodes
(``scalemb.placement``), and compare with embedding all nodes at once: KL of the whole map (the full graph's
P), neighbourhood preservation (NP) of the placed nodes (fraction of each one's graph neighbours among its
deg nearest in the map, space coordinates), time to place (P' + start + optimisation) vs time to re-embed.

kNN: a Gaussian mixture in 50-D, 10 % held out at random; scalemb's placement and openTSNE's
``TSNEEmbedding.transform`` of the held-out rows into the SAME reference map (scalemb's t-SNE of the rest),
in one run, against a full re-embedding; NP there: each placed point's 15 nearest neighbours in feature space
(among all points) found among its 15 nearest in the map.

    python benchmarks/transform.py --out benchmarks/results/transform.md [--sections grqc,knn] [--knn-points N]
"""
import argparse
import time

import numpy as np
from scipy.spatial import cKDTree

from common import Report, adjacency_lists, markdown_table

from scalemb.affinity import coauthorship_affinity, knn_affinity
from scalemb.datasets import grqc_path
from scalemb.embedding import Embedder
from scalemb.engine import LocalExecutor
from scalemb.io.edges import graph_from_edges
from scalemb.io.edgelist import read_edge_list
from scalemb.models import get_model
from scalemb.placement import PlacementObjective, PlacementOptimizer, place, placement_repulsion
from scalemb.placement.affinity import _knn_against, extended_graph_affinity, extended_knn_affinity

DIMS = {"tsne": (2, 0), "sne": (2, 0), "snest": (2, 1)}
# placement settings compared: the default, and 50 iterations with the new rows' attraction exaggerated x4 first
# (since stop 39 the default exaggerates too: benchmarks/transform_defaults.py compares the defaults)
VARIANTS = {"default": lambda its: PlacementOptimizer(iterations=its),
            "exag. 4 x 50 it.": lambda its: PlacementOptimizer(iterations=its, exaggeration=4.0,
                                                               exaggeration_iterations=50, final_exaggeration=1.0)}
# GrQc only: then free the stored points within H hops of a new node for 30 iterations (``place(free_hops=H)``)
FREE_VARIANTS = {"free 1 hop, 30 it.": 1, "free 2 hops, 30 it.": 2}


def neighbourhood_preservation(Y_space: np.ndarray, neighbours: list, rows: np.ndarray) -> float:
    """Mean over ``rows`` of |graph neighbours among the deg nearest map points| / deg."""
    tree = cKDTree(Y_space)
    scores = []
    for i in rows:
        nb = neighbours[i]
        if len(nb) == 0:
            continue
        _, idx = tree.query(Y_space[i], k=len(nb) + 1)
        idx = [j for j in np.atleast_1d(idx) if j != i][:len(nb)]
        scores.append(len(set(idx) & set(nb)) / len(nb))
    return float(np.mean(scores))


def attached_mask(P, n_old: int) -> np.ndarray:
    """New points whose component of the new-new edges has an edge to a stored point."""
    from scipy.sparse.csgraph import connected_components

    rows = P[n_old:].tocsr()
    direct = np.asarray(rows[:, :n_old].sum(axis=1)).ravel() > 0
    n_comp, labels = connected_components(rows[:, n_old:], directed=False)
    return (np.bincount(labels, weights=direct, minlength=n_comp) > 0)[labels]


def whole_map_kl(affinity, model, ds, dt, Y) -> float:
    with LocalExecutor(affinity, get_model(model), ds, dt, repulsion="exact") as executor:
        return executor.evaluate(np.ascontiguousarray(Y)).kl


def split_graph(graph, held_ids):
    """Old graph without ``held_ids`` (its nodes left edgeless join the new ones) and the new edges, new id
    first."""
    ids = graph.node_ids
    held = np.isin(ids, held_ids)
    keep = ~held[graph.src] & ~held[graph.dst]
    old = graph_from_edges(ids[graph.src[keep]], ids[graph.dst[keep]], graph.weight[keep], "old")
    new_ids = np.setdiff1d(ids, old.node_ids)
    is_new = np.isin(ids, new_ids)
    a, b = graph.src[~keep], graph.dst[~keep]
    first_new = is_new[a]
    src = np.where(first_new, ids[a], ids[b])
    dst = np.where(first_new, ids[b], ids[a])
    both = is_new[a] & is_new[b]  # new-new edges: list both directions (either end may be first)
    src, dst = np.concatenate([src, ids[b[both]]]), np.concatenate([dst, ids[a[both]]])
    return old, new_ids, src, dst


def grqc_section(report, models, optimizer_iterations, only=None):
    graph = read_edge_list(grqc_path())
    full = coauthorship_affinity(graph)
    n = graph.n_nodes
    adjacency = adjacency_lists(graph)
    rng = np.random.default_rng(0)
    splits = {"random 10 %": np.sort(rng.choice(graph.node_ids, n // 10, replace=False)),
              "highest-id 10 %": np.sort(graph.node_ids)[-(n // 10):]}
    rows = []
    for model in models:
        ds, dt = DIMS[model]
        t0, c0 = time.perf_counter(), time.process_time()
        everything = Embedder(model=model, space_dims=ds, time_dims=dt, seed=0).fit(full)
        t_full, c_full = time.perf_counter() - t0, time.process_time() - c0
        Y_full = everything.embedding_
        for name, held in splits.items():
            old, new_ids, src, dst = split_graph(graph, held)
            stored = Embedder(model=model, space_dims=ds, time_dims=dt, seed=0).fit(coauthorship_affinity(old))
            old_coords = np.ascontiguousarray(stored.embedding_.T)
            combined_ids = np.concatenate([stored.result_.node_ids, new_ids])
            where = np.searchsorted(full.node_ids, combined_ids)
            placed_rows = where[len(stored.result_.node_ids):]
            attached = attached_mask(extended_graph_affinity(old, "coauthorship", stored.result_.node_ids, new_ids,
                                                             src, dst, np.ones(src.size)), old.n_nodes)
            runs = [(label, optimizer, 0, old_coords, "spectral") for label, optimizer in VARIANTS.items()
                    if dt == 0 or label == "default"]  # no exaggerated phase with time coordinates
            runs.append(("spectral direction", lambda its: PlacementOptimizer(iterations=its, direction="spectral"),
                         0, old_coords, "spectral"))
            runs += [(f"{label}, {free_direction}", VARIANTS["default"], hops, old_coords, free_direction)
                     for label, hops in FREE_VARIANTS.items() for free_direction in ("jacobi", "spectral")]
            # diagnostic: the same placement into the re-embedding's own rows of the stored nodes
            runs.append(("default, into the re-embedding's stored rows", VARIANTS["default"], 0,
                         np.ascontiguousarray(Y_full[where[:len(stored.result_.node_ids)]].T), "spectral"))
            runs = [run for run in runs if only is None or any(part in run[0] for part in only)]
            for label, optimizer, hops, into, free_direction in runs:
                P = extended_graph_affinity(old, "coauthorship", stored.result_.node_ids, new_ids, src, dst,
                                            np.ones(src.size))
                place(model, ds, into, P, PlacementOptimizer(iterations=1, direction="spectral"), free_hops=hops,
                      free_iterations=1)  # compile the kernels first
                t0, c0 = time.perf_counter(), time.process_time()
                P = extended_graph_affinity(old, "coauthorship", stored.result_.node_ids, new_ids, src, dst,
                                            np.ones(src.size))
                run, unattached = place(model, ds, into, P, optimizer(optimizer_iterations), free_hops=hops,
                                        free_direction=free_direction)
                t_place, c_place = time.perf_counter() - t0, time.process_time() - c0
                stored_coords = into.T.copy()
                if run.moved.size:
                    stored_coords[run.moved] = run.moved_coords.T
                Y = np.empty((n, ds + dt))
                Y[where] = np.concatenate([stored_coords, run.coords.T])
                kl_placed = whole_map_kl(full, model, ds, dt, Y.T)
                np_placed = neighbourhood_preservation(Y[:, :ds], adjacency, placed_rows)
                np_full = neighbourhood_preservation(Y_full[:, :ds], adjacency, placed_rows)
                split = [f"{neighbourhood_preservation(Y[:, :ds], adjacency, placed_rows[mask]):.3f}" + " / "
                         f"{neighbourhood_preservation(Y_full[:, :ds], adjacency, placed_rows[mask]):.3f}"
                         for mask in (attached, ~attached)]
                rows.append([model, name, label, len(new_ids), unattached, run.moved.size, f"{everything.kl_:.4f}",
                             f"{kl_placed:.4f}", f"{run.kl_history[0]:.4f}", f"{np_full:.3f}", f"{np_placed:.3f}",
                             f"{(np_placed / np_full - 1) * 100:+.1f} %", *split, f"{t_full:.1f}",
                             f"{t_place:.2f}", f"{t_full / t_place:.0f}x", f"{c_full:.1f}", f"{c_place:.2f}",
                             f"{c_full / c_place:.0f}x", run.iterations])
                print(rows[-1], flush=True)
    report("## GrQc: place the held-out 10 % vs re-embed all 5241 nodes")
    report()
    report("Stored map: the same model and defaults on the graph without the held-out nodes (nodes left edgeless "
           "are new too). KL: of the whole map under the full graph's P. NP: neighbourhood preservation of the "
           "placed nodes (same nodes in both maps). Place time: P' of the grown graph + start + optimisation; "
           "wall seconds and the process's CPU seconds (all its threads: less sensitive to a shared machine's "
           "load than wall time).")
    report()
    report(markdown_table(["model", "held out", "placement", "new nodes", "unattached", "stored moved",
                           "KL re-embed", "KL placed", "KL at start", "NP re-embed", "NP placed", "NP diff",
                           "NP attached placed / re-embed", "NP unattached placed / re-embed", "re-embed s",
                           "place s", "speed-up", "re-embed CPU s", "place CPU s", "CPU speed-up", "place iters"],
                          rows))
    report()


def gaussian_mixture(n: int, dims: int = 50, clusters: int = 20, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = 3.0 * rng.standard_normal((clusters, dims))
    labels = rng.integers(clusters, size=n)
    return centres[labels] + rng.standard_normal((n, dims))


def _cached(cache, name, fn):
    """``fn() -> (array, seconds, extra)``, or its earlier result from ``cache/name.npz`` (so a stopped run
    resumes; the seconds are those of the run that computed it)."""
    import os

    path = None if cache is None else os.path.join(cache, name + ".npz")
    if path is not None and os.path.exists(path):
        got = np.load(path)
        return got["coords"], float(got["seconds"]), float(got["extra"])
    coords, seconds, extra = fn()
    if path is not None:
        os.makedirs(cache, exist_ok=True)
        np.savez(path, coords=coords, seconds=seconds, extra=extra)
    return coords, seconds, extra


def knn_section(report, n_points: int, k_np: int = 15, cache: str | None = None):
    """Both libraries, in one run: each embeds the 90 % reference and re-embeds all points with its defaults;
    each places the 10 % into each reference map (scalemb ``place``, openTSNE ``TSNEEmbedding.transform``)."""
    import openTSNE

    X = gaussian_mixture(n_points)
    rng = np.random.default_rng(1)
    held = np.zeros(n_points, dtype=bool)
    held[rng.choice(n_points, n_points // 10, replace=False)] = True
    X_ref, X_new = X[~held], X[held]
    n, m = X_ref.shape[0], X_new.shape[0]
    X_all = np.concatenate([X_ref, X_new])
    t0 = time.perf_counter()
    reference = knn_affinity(X_ref, perplexity=30)
    t_ref_affinity = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = knn_affinity(X_all, perplexity=30)
    t_full_affinity = time.perf_counter() - t0
    print(f"affinities: reference {t_ref_affinity:.1f} s, all {t_full_affinity:.1f} s", flush=True)

    def scalemb_fit(affinity, seconds_before):
        def fit():
            t0 = time.perf_counter()
            run = Embedder(model="tsne", seed=0).fit(affinity)
            return run.embedding_, time.perf_counter() - t0 + seconds_before, run.kl_
        return fit

    def opentsne_fit(data):
        def fit():
            t0 = time.perf_counter()
            Y = np.asarray(openTSNE.TSNE(n_jobs=-1, random_state=0).fit(data))
            return Y, time.perf_counter() - t0, float("nan")
        return fit

    Y_ref, t_ref, kl_ref = _cached(cache, f"scalemb_ref_{n_points}", scalemb_fit(reference, t_ref_affinity))
    print(f"scalemb reference {t_ref:.1f} s", flush=True)
    Y_full, t_full, _ = _cached(cache, f"scalemb_all_{n_points}", scalemb_fit(full, t_full_affinity))
    print(f"scalemb re-embedding {t_full:.1f} s", flush=True)
    Y_otref, t_otref, _ = _cached(cache, f"opentsne_ref_{n_points}", opentsne_fit(X_ref))
    print(f"openTSNE reference {t_otref:.1f} s", flush=True)
    Y_otfull, t_otfull, _ = _cached(cache, f"opentsne_all_{n_points}", opentsne_fit(X_all))
    print(f"openTSNE re-embedding {t_otfull:.1f} s", flush=True)

    # ground truth neighbours of each new point among all points (feature space), in [ref, new] numbering
    truth, _ = _knn_against(X_new, X_all, k_np + 1, "euclidean")
    truth = [[j for j in row if j != n + i][:k_np] for i, row in enumerate(truth)]

    def np_of(Y_all):
        tree = cKDTree(Y_all)
        _, idx = tree.query(Y_all[n:], k=k_np + 1)
        return float(np.mean([len(set(r) - {n + i} & set(t)) / k_np for i, (r, t) in enumerate(zip(idx, truth))]))

    def kl_full(Y_all):  # the whole map under the kNN P of all points (FFT normaliser: exact within ~1e-5)
        with LocalExecutor(full, get_model("tsne"), 2, 0, repulsion="fft") as executor:
            return executor.evaluate(np.ascontiguousarray(Y_all.T)).kl

    P = extended_knn_affinity(reference, X_ref, X_new, reference.provenance["n_neighbors"], "euclidean", 30.0)
    # free_hops=0: the map fixed, as scalemb transform places feature rows (place's default frees graph neighbours)
    place("tsne", 2, np.ascontiguousarray(Y_ref.T), P, PlacementOptimizer(iterations=1), free_hops=0)  # compile
    t0 = time.perf_counter()
    ot_affinity = openTSNE.affinity.PerplexityBasedNN(X_ref, perplexity=30, n_jobs=-1, random_state=0)
    t_ot_index = time.perf_counter() - t0
    ot_reference = openTSNE.TSNEEmbedding(np.ascontiguousarray(Y_otref), ot_affinity, n_jobs=-1, random_state=0)
    maps = {"scalemb t-SNE": (Y_ref, openTSNE.TSNEEmbedding(np.ascontiguousarray(Y_ref), ot_affinity, n_jobs=-1,
                                                               random_state=0)),
            "openTSNE": (Y_otref, ot_reference)}
    np_full, np_otfull = np_of(Y_full), np_of(Y_otfull)
    rows = [["-", "re-embed all (scalemb t-SNE)", f"{kl_full(Y_full):.4f}", "-", f"{np_full:.3f}", "-",
             f"{t_full:.1f}", "-", "750 (auto)"],
            ["-", "re-embed all (openTSNE)", f"{kl_full(Y_otfull):.4f}", "-", f"{np_otfull:.3f}", "-",
             f"{t_otfull:.1f}", "-", "750 (250 EE + 500)"]]
    times = {}
    for map_name, (Y_map, ot_embedding) in maps.items():
        old_coords = np.ascontiguousarray(Y_map.T)
        for label, optimizer in VARIANTS.items():
            t0 = time.perf_counter()
            P = extended_knn_affinity(reference, X_ref, X_new, reference.provenance["n_neighbors"], "euclidean",
                                      30.0)
            run, _ = place("tsne", 2, old_coords, P, optimizer(300), free_hops=0)
            times[map_name, label] = t = time.perf_counter() - t0
            Y_all = np.concatenate([Y_map, run.coords.T])
            npl = np_of(Y_all)
            rows.append([map_name, f"scalemb transform ({label}, {run.settings['repulsion']})", f"{kl_full(Y_all):.4f}",
                         f"{run.kl:.4f}", f"{npl:.3f}", f"{(npl / np_full - 1) * 100:+.1f} %", f"{t:.2f}",
                         f"{t_full / t:.0f}x", f"{run.iterations} (start KL' {run.kl_history[0]:.4f})"])
            print(rows[-1], flush=True)
        t0 = time.perf_counter()
        Y_ot = np.asarray(ot_embedding.transform(X_new))
        times[map_name, "openTSNE"] = t = time.perf_counter() - t0
        with PlacementObjective(get_model("tsne"), 2, P, old_coords,
                                repulsion=placement_repulsion(get_model("tsne"), n, m)) as objective:
            kl_ot = objective.evaluate(np.ascontiguousarray(Y_ot.T)).kl
        Y_all = np.concatenate([Y_map, Y_ot])
        npl = np_of(Y_all)
        rows.append([map_name, "openTSNE transform", f"{kl_full(Y_all):.4f}", f"{kl_ot:.4f}", f"{npl:.3f}",
                     f"{(npl / np_otfull - 1) * 100:+.1f} %", f"{t:.2f}", f"{t_otfull / t:.0f}x", 250])
        print(rows[-1], flush=True)
    report(f"## kNN: Gaussian mixture, {n_points} points in 50-D (20 clusters), 10 % held out at random")
    report()
    report(f"Data: `gaussian_mixture({n_points})` (20 centres 3·N(0, I_50), unit-variance clusters, seed 0), "
           f"{m} rows held out at random (seed 1).  Reference maps of the other {n} points: scalemb t-SNE "
           f"(defaults, optimizer 'auto'; {t_ref:.1f} s with its kNN affinity, KL {kl_ref:.4f}) and openTSNE's "
           f"TSNE(n_jobs=-1).fit ({t_otref:.1f} s).  Re-embeddings of all {n + m} points: scalemb's (kNN "
           f"affinity {t_full_affinity:.1f} s + fit) and openTSNE's, each with its defaults.  Both placements go "
           "into each reference map.  KL: of the whole map under the kNN P of all points (the re-embedding's "
           "input; FFT normaliser); KL': under P' (the reference's P plus the new rows' conditional affinities "
           "on the reference, what the placement minimises).  NP@15: each placed point's 15 nearest points in "
           "feature space (among all points) found among its 15 nearest in the map; 'vs re-embed': against the "
           "same library's re-embedding (scalemb's placements against scalemb's, openTSNE's against openTSNE's). "
           "Seconds: scalemb = the new rows' exact kNN + calibration + start + optimisation; openTSNE = its "
           f"transform (its reference kNN index, built beforehand in {t_ot_index:.1f} s, not counted; 250 "
           "iterations, its defaults).  Speed-up: the same library's re-embedding time / placement time.")
    report()
    report(markdown_table(["reference map", "method", "KL", "KL'", f"NP@{k_np}", "NP vs re-embed", "seconds",
                           "speed-up vs re-embed", "iterations"], rows))
    report()
    report(f"scalemb's placement (default) over openTSNE's transform into the same map: "
           f"{times['scalemb t-SNE', 'openTSNE'] / times['scalemb t-SNE', 'default']:.1f}x faster (scalemb's map), "
           f"{times['openTSNE', 'openTSNE'] / times['openTSNE', 'default']:.1f}x (openTSNE's map).")
    report()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--sections", default="grqc,knn")
    parser.add_argument("--models", default="tsne,snest,sne")
    parser.add_argument("--iterations", type=int, default=300, help="placement iterations at most")
    parser.add_argument("--grqc-only", default=None, help="GrQc placements whose label contains one of these "
                                                            "';'-separated parts (default: all)")
    parser.add_argument("--knn-points", type=int, default=100_000)
    parser.add_argument("--cache", default=None, help="directory keeping the kNN section's four fits (resumable)")
    args = parser.parse_args()
    report = Report.start("Placing new nodes into a stored map (scalemb transform)")
    sections = args.sections.split(",")
    if "grqc" in sections:
        grqc_section(report, args.models.split(","), args.iterations,
                     args.grqc_only.split(";") if args.grqc_only else None)
    if "knn" in sections:
        knn_section(report, args.knn_points, cache=args.cache)
    report.save(args.out)


if __name__ == "__main__":
    main()
