# ruff: noqa
"""Diagnosis of the placement quality gap on GrQc (issue 20; benchmarks/results/transform.md, "Why"). Kept as run;
usage: PYTHONPATH=. python benchmarks/placement_diagnosis/NAME.py tsne (diag.py caches the maps in $DIAG_CACHE)."""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diag import *  # noqa: E402,F401,F403 (the cached maps and splits of diag.py)
for sname, (old, new_ids, P, Y_old) in out.items():
    m = len(new_ids); N = old.n_nodes
    combined = np.concatenate([old.node_ids, new_ids]); pos = np.searchsorted(full.node_ids, combined); placed_rows = pos[N:]
    Yo = np.ascontiguousarray(Y_old.T)
    for lab, opt, hops, fi in [("exag+free1x30", PlacementOptimizer(exaggeration=4, exaggeration_iterations=50), 1, 30),
                               ("free1x60", PlacementOptimizer(), 1, 60),
                               ("exag+free1x60", PlacementOptimizer(exaggeration=4, exaggeration_iterations=50), 1, 60),
                               ("it100+free1x30", PlacementOptimizer(iterations=100), 1, 30)]:
        t0 = time.perf_counter()
        r, _ = place(model, ds, Yo, P, opt, free_hops=hops, free_iterations=fi)
        t = time.perf_counter() - t0
        sc = Y_old.copy(); sc[r.moved] = r.moved_coords.T
        Y = np.empty((n, ds + dt)); Y[pos] = np.concatenate([sc, r.coords.T])
        print(sname, lab, "NP", round(neighbourhood_preservation(Y[:, :ds], adj, placed_rows), 3), "KL", round(r.kl, 4), "t", round(t, 2), "its", r.iterations, flush=True)
