# ruff: noqa
"""Diagnosis of the placement quality gap on GrQc (issue 20; benchmarks/results/transform.md, "Why"). Kept as run;
usage: PYTHONPATH=. python benchmarks/placement_diagnosis/NAME.py tsne (diag.py caches the maps in $DIAG_CACHE)."""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np, scipy.sparse as sp
from transform import split_graph, neighbourhood_preservation, whole_map_kl
from scalemb.affinity import coauthorship_affinity
from scalemb.datasets import grqc_path
from scalemb.embedding import Embedder
from scalemb.io.edgelist import read_edge_list
from scalemb.placement import place, PlacementOptimizer
from scalemb.placement.affinity import extended_graph_affinity
from scalemb.placement.optimize import initial_positions
D = os.environ.get("DIAG_CACHE", "/work/data/placement")
model = sys.argv[1] if len(sys.argv) > 1 else "tsne"
ds, dt = {"tsne": (2, 0), "snest": (2, 1)}[model]
graph = read_edge_list(grqc_path()); full = coauthorship_affinity(graph); n = graph.n_nodes
adj = [[] for _ in range(n)]
for a, b in zip(graph.src, graph.dst):
    adj[a].append(b); adj[b].append(a)
rng = np.random.default_rng(0)
splits = {"random": np.sort(rng.choice(graph.node_ids, n // 10, replace=False)),
          "newest": np.sort(graph.node_ids)[-(n // 10):]}
def cached(name, fn):
    p = f"{D}/{model}_{name}.npy"
    if os.path.exists(p): return np.load(p)
    t0 = time.perf_counter(); Y = fn(); print(name, "embed", time.perf_counter() - t0, flush=True); np.save(p, Y); return Y
Y_full = cached("full", lambda: Embedder(model=model, space_dims=ds, time_dims=dt, seed=0).fit(full).embedding_)
out = {}
for sname, held in splits.items():
    old, new_ids, src, dst = split_graph(graph, held)
    oa = coauthorship_affinity(old)
    if os.environ.get("DIAG_SPLITS_ONLY"):  # snest_oracle.py: the full map only
        out[sname] = (old, new_ids, extended_graph_affinity(old, "coauthorship", old.node_ids, new_ids, src, dst,
                                                            np.ones(src.size)), None)
        continue
    Y_old = cached(f"stored_{sname}", lambda: Embedder(model=model, space_dims=ds, time_dims=dt, seed=0).fit(oa).embedding_)
    P = extended_graph_affinity(old, "coauthorship", old.node_ids, new_ids, src, dst, np.ones(src.size))
    out[sname] = (old, new_ids, P, Y_old)
np.save(f"{D}/splits.npy", np.array([0]))
