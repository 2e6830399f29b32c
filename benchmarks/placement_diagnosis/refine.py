# ruff: noqa
"""Diagnosis of the placement quality gap on GrQc (issue 20; benchmarks/results/transform.md, "Why"). Kept as run;
usage: PYTHONPATH=. python benchmarks/placement_diagnosis/NAME.py tsne (diag.py caches the maps in $DIAG_CACHE)."""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diag import *  # noqa: E402,F401,F403 (the cached maps and splits of diag.py)
from scalemb.placement.objective import PlacementObjective
from scalemb.models import get_model
for sname, (old, new_ids, P, Y_old) in out.items():
    m = len(new_ids); N = old.n_nodes
    combined = np.concatenate([old.node_ids, new_ids]); pos = np.searchsorted(full.node_ids, combined); placed_rows = pos[N:]
    place(model, ds, Y_old.T, P, PlacementOptimizer(iterations=1))
    t0 = time.perf_counter()
    P = extended_graph_affinity(old, "coauthorship", old.node_ids, new_ids, src, dst, np.ones(src.size)) if False else P
    r, _ = place(model, ds, np.ascontiguousarray(Y_old.T), P, PlacementOptimizer(iterations=300))
    tp = time.perf_counter() - t0
    Y = np.empty((n, ds + dt)); Y[pos] = np.concatenate([Y_old, r.coords.T])
    print(sname, "placed", round(neighbourhood_preservation(Y[:, :ds], adj, placed_rows), 3), "KL", round(r.kl, 4), "t", round(tp, 2), flush=True)
    for K in (10, 30, 100):
        t0 = time.perf_counter()
        e = Embedder(model=model, space_dims=ds, time_dims=dt, seed=0, iterations=K, init=Y).fit(full)
        tr = time.perf_counter() - t0
        print(sname, "refine", K, round(neighbourhood_preservation(e.embedding_[:, :ds], adj, placed_rows), 3), "KL", round(e.kl_, 4), "t", round(tr, 2), "its", e.result_.iterations, flush=True)
