"""Placement with its defaults against a re-embedding: the goal of issue 35 (NP of the placed nodes within 5 % of
a full re-embedding's, at >= 20x less time), on GrQc and a generated co-authorship graph of ~1e4 nodes, each
with a random 10 % and a highest-id 10 % ("newest authors") held out.

For each graph: re-embed all nodes with t-SNE's defaults (timed: wall and process CPU seconds); for each
split: embed the rest (not timed), then place the held-out nodes with ``place``'s defaults (timed: P' of the
grown graph + start + optimisation, as ``scalemb transform`` does after reading the run), and compare the
placed nodes' neighbourhood preservation (``transform.neighbourhood_preservation``: fraction of each one's graph
neighbours among its deg nearest in the map) with the re-embedding's; "NP all": the same over every node of the
map (the stored nodes a free phase moved among them), KL of the whole map under the full graph's P.  Both times
come from the same run; the ratios are the figures to quote on a shared machine.

    python benchmarks/transform_defaults.py --coauthor-authors 13000 --out /tmp/defaults.md
    # a sweep of placement settings against the same maps (cached), e.g.
    python benchmarks/transform_defaults.py --cache DIR --variants "free_hops=1,iterations=50;free_hops=2"
"""
import argparse
import os
import time

import numpy as np

from common import Report, adjacency_lists, markdown_table
from transform import neighbourhood_preservation, split_graph, whole_map_kl

from scalemb.affinity import coauthorship_affinity
from scalemb.datasets import grqc_path
from scalemb.embedding import Embedder
from scalemb.io.edgelist import read_edge_list
from scalemb.placement import PlacementOptimizer, place, placement_defaults
from scalemb.placement.affinity import extended_graph_affinity

GOAL_NP = -5.0  # % of the re-embedding's NP
GOAL_SPEED = 20.0  # re-embedding time / placement time


def _fit(affinity, cache, name):
    """``(embedding (N, 2), node_ids, wall s, cpu s)`` of t-SNE's defaults on ``affinity`` (or the cached
    ones)."""
    path = None if cache is None else os.path.join(cache, name + ".npz")
    if path is not None and os.path.exists(path):
        got = np.load(path)
        return got["Y"], got["ids"], float(got["wall"]), float(got["cpu"])
    t0, c0 = time.perf_counter(), time.process_time()
    run = Embedder(model="tsne", space_dims=2, time_dims=0, seed=0).fit(affinity)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    Y, ids = run.embedding_, np.asarray(run.result_.node_ids)
    if path is not None:
        os.makedirs(cache, exist_ok=True)
        np.savez(path, Y=Y, ids=ids, wall=wall, cpu=cpu)
    return Y, ids, wall, cpu


def parse_variant(text: str) -> dict:
    """``"free_hops=1,iterations=50"`` -> place() keyword settings (``iterations``/``tol``/``direction``...
    go to the first phase's ``PlacementOptimizer``)."""
    out = {}
    for part in filter(None, text.split(",")):
        key, value = part.split("=")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


OPTIMIZER_KEYS = ("iterations", "tol", "direction", "exaggeration", "exaggeration_iterations", "final_exaggeration",
                  "mu", "window")


def _place(old_coords, P, settings: dict):
    opt = {k: v for k, v in settings.items() if k in OPTIMIZER_KEYS}
    rest = {k: v for k, v in settings.items() if k not in OPTIMIZER_KEYS}
    optimizer = PlacementOptimizer(**opt) if opt else None
    return place("tsne", 2, old_coords, P, optimizer, **rest)


def graph_rows(name, graph, variants, cache):
    full = coauthorship_affinity(graph)
    n = graph.n_nodes
    adjacency = adjacency_lists(graph)
    Y_full, full_ids, t_full, c_full = _fit(full, cache, f"{name}_all")
    assert np.array_equal(full_ids, full.node_ids)
    kl_full = whole_map_kl(full, "tsne", 2, 0, Y_full.T)
    np_full_all = neighbourhood_preservation(Y_full, adjacency, np.arange(n))
    print(f"{name}: re-embedding {t_full:.1f} s wall, {c_full:.1f} s CPU, KL {kl_full:.4f}", flush=True)
    rng = np.random.default_rng(0)
    splits = {"random 10 %": np.sort(rng.choice(graph.node_ids, n // 10, replace=False)),
              "highest-id 10 % (newest)": np.sort(graph.node_ids)[-(n // 10):]}
    rows = []
    for split, held in splits.items():
        old, new_ids, src, dst = split_graph(graph, held)
        Y_old, old_ids, _, _ = _fit(coauthorship_affinity(old), cache, f"{name}_{split.split()[0]}_stored")
        old_coords = np.ascontiguousarray(Y_old.T)
        where = np.searchsorted(full.node_ids, np.concatenate([old_ids, new_ids]))
        placed_rows = where[len(old_ids):]
        np_full = neighbourhood_preservation(Y_full, adjacency, placed_rows)
        P = extended_graph_affinity(old, "coauthorship", old_ids, new_ids, src, dst, np.ones(src.size))
        _place(old_coords, P, dict(variants[0][1], iterations=1, free_iterations=1))  # compile the kernels
        for label, settings in variants:
            t0, c0 = time.perf_counter(), time.process_time()
            P = extended_graph_affinity(old, "coauthorship", old_ids, new_ids, src, dst, np.ones(src.size))
            run, unattached = _place(old_coords, P, settings)
            t_place, c_place = time.perf_counter() - t0, time.process_time() - c0
            stored = Y_old.copy()
            if run.moved.size:
                stored[run.moved] = run.moved_coords.T
            Y = np.empty((n, 2))
            Y[where] = np.concatenate([stored, run.coords.T])
            np_placed = neighbourhood_preservation(Y, adjacency, placed_rows)
            np_all = neighbourhood_preservation(Y, adjacency, np.arange(n))
            kl_placed = whole_map_kl(full, "tsne", 2, 0, Y.T)
            diff = (np_placed / np_full - 1) * 100
            speed, cpu_speed = t_full / t_place, c_full / c_place
            met = diff >= GOAL_NP and speed >= GOAL_SPEED and cpu_speed >= GOAL_SPEED
            rows.append([name, split, label, len(new_ids), unattached, run.moved.size, f"{t_full:.1f}",
                         f"{t_place:.2f}", f"{speed:.0f}x", f"{c_full:.1f}", f"{c_place:.2f}", f"{cpu_speed:.0f}x",
                         f"{np_full:.3f}", f"{np_placed:.3f}", f"{diff:+.1f} %", f"{kl_full:.4f}",
                         f"{kl_placed:.4f}", f"{np_full_all:.3f}", f"{np_all:.3f}", run.iterations,
                         "met" if met else "missed"])
            print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--graphs", default="grqc,coauthor")
    parser.add_argument("--coauthor-authors", type=int, default=13000,
                        help="authors of the generated graph (13000: ~1e4 nodes with an edge)")
    parser.add_argument("--coauthor-seed", type=int, default=0)
    parser.add_argument("--variants", default="", help="';'-separated placement settings besides the defaults, "
                                                       "e.g. 'free_hops=1,iterations=50'")
    parser.add_argument("--cache", default=None, help="keep the fits here (a sweep reuses them; the re-embedding "
                                                      "times are then those of the run that made them)")
    args = parser.parse_args()
    variants = [("defaults", {})] + [(v, parse_variant(v)) for v in filter(None, args.variants.split(";"))]
    report = Report.start("Placement defaults against a re-embedding")
    rows = []
    for name in args.graphs.split(","):
        if name == "grqc":
            graph = read_edge_list(grqc_path())
        else:
            from scalemb.io.coauthor_generator import write_coauthor_edge_list

            path = os.path.join(args.cache or "/tmp", f"coauthor{args.coauthor_authors}_{args.coauthor_seed}.txt")
            if not os.path.exists(path):
                write_coauthor_edge_list(path, args.coauthor_authors, seed=args.coauthor_seed)
            graph = read_edge_list(path)
            name = f"coauthor {args.coauthor_authors} authors ({graph.n_nodes} nodes)"
        rows += graph_rows(name, graph, variants, args.cache)
    report(f"Placement defaults: {placement_defaults()}")
    report()
    report(markdown_table(["graph", "held out", "placement", "new nodes", "unattached", "stored moved",
                           "re-embed s", "place s", "speed-up", "re-embed CPU s", "place CPU s", "CPU speed-up",
                           "NP re-embed", "NP placed", "NP diff", "KL re-embed", "KL placed", "NP all re-embed",
                           "NP all placed", "place iters", "goal"],
                          rows))
    report()
    report.save(args.out)


if __name__ == "__main__":
    main()
