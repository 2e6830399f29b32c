"""NP of placements into the stored 90 % map and into the full re-embedding's own coordinates of the stored
nodes, by degree of the placed node, from the maps ``benchmarks/transform_defaults.py --cache DIR`` kept.

    python placement_diagnosis/into_reembedding.py DIR grqc|COAUTHOR_EDGE_LIST random|highest-id [VARIANT ...]

(run from ``benchmarks/``; a variant as ``transform_defaults.py --variants`` spells one, "" for the defaults).
"""
import sys
import time

import numpy as np

sys.path.insert(0, ".")
from common import adjacency_lists  # noqa: E402
from transform import neighbourhood_preservation, split_graph  # noqa: E402
from transform_defaults import _fit, _place, parse_variant  # noqa: E402

from scalemb.affinity import coauthorship_affinity  # noqa: E402
from scalemb.datasets import grqc_path  # noqa: E402
from scalemb.io.edgelist import read_edge_list  # noqa: E402
from scalemb.placement.affinity import extended_graph_affinity  # noqa: E402

cache, which, split = sys.argv[1:4]
graph = read_edge_list(grqc_path() if which == "grqc" else which)
authors = which.split("coauthor")[-1].split("_")[0]  # transform_defaults.py's file name: coauthorN_SEED.txt
name = "grqc" if which == "grqc" else f"coauthor {authors} authors ({graph.n_nodes} nodes)"
full = coauthorship_affinity(graph)
n = graph.n_nodes
adjacency = adjacency_lists(graph)
Y_full, _, _, _ = _fit(full, cache, f"{name}_all")
rng = np.random.default_rng(0)
held = (np.sort(rng.choice(graph.node_ids, n // 10, replace=False)) if split == "random"
        else np.sort(graph.node_ids)[-(n // 10):])
old, new_ids, src, dst = split_graph(graph, held)
Y_old, old_ids, _, _ = _fit(coauthorship_affinity(old), cache, f"{name}_{split}_stored")
where = np.searchsorted(full.node_ids, np.concatenate([old_ids, new_ids]))
rows = where[len(old_ids):]
degree = np.array([len(adjacency[r]) for r in rows])
groups = (degree == 1, (degree > 1) & (degree < 5), degree >= 5)
print("NP re-embedding", round(neighbourhood_preservation(Y_full, adjacency, rows), 3), "by degree 1 / 2-4 / >=5",
      [round(neighbourhood_preservation(Y_full, adjacency, rows[g]), 3) for g in groups], flush=True)
P = extended_graph_affinity(old, "coauthorship", old_ids, new_ids, src, dst, np.ones(src.size))
for variant in sys.argv[4:]:
    for label, stored in (("90 % map", Y_old), ("re-embedding's stored rows", Y_full[where[:len(old_ids)]])):
        c0 = time.process_time()
        run, _ = _place(np.ascontiguousarray(stored.T), P, parse_variant(variant))
        cpu = time.process_time() - c0
        moved = stored.copy()
        if run.moved.size:
            moved[run.moved] = run.moved_coords.T
        Y = np.empty((n, 2))
        Y[where] = np.concatenate([moved, run.coords.T])
        print(variant or "defaults", "|", label, "| NP", round(neighbourhood_preservation(Y, adjacency, rows), 3),
              "by degree", [round(neighbourhood_preservation(Y, adjacency, rows[g]), 3) for g in groups],
              "| CPU s", round(cpu, 2), "| iterations", run.iterations, flush=True)
