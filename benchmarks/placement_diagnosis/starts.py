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
    P = sp.csr_matrix(P); Yo = np.ascontiguousarray(Y_old.T)
    X0, _ = initial_positions(P[N:], Yo, ds, 0)
    B = P[N:, :N]; deg_old = np.asarray(B.sum(axis=1)).ravel()
    Xmean = X0.copy(); has = deg_old > 0
    Xmean[:, has] = (B[has] @ Y_old).T / deg_old[has]
    Xbest = X0.copy(); heavy = np.asarray(B.argmax(axis=1)).ravel(); Xbest[:, has] = Y_old[heavy[has]].T
    spread = Y_old.std()
    rng = np.random.default_rng(5)
    starts = {"median": X0, "mean": Xmean, "heaviest": Xbest, "median+jit0.3": X0 + 0.3 * spread * rng.standard_normal(X0.shape)}
    for nm, X in starts.items():
        with PlacementObjective(get_model(model), ds, P, Yo) as obj:
            for lab, opt in (("plain", PlacementOptimizer(iterations=500)), ("exag4x50", PlacementOptimizer(iterations=500, exaggeration=4, exaggeration_iterations=50)), ("exag12x100", PlacementOptimizer(iterations=600, exaggeration=12, exaggeration_iterations=100))):
                r = opt.optimize(obj, np.ascontiguousarray(X), ds)
                Y = np.empty((n, ds + dt)); Y[pos] = np.concatenate([Y_old, r.coords.T])
                print(sname, nm, lab, "start KL", round(r.kl_history[0], 4), "KL", round(r.kl, 4), "NP", round(neighbourhood_preservation(Y[:, :ds], adj, placed_rows), 3), "its", r.iterations, flush=True)
