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
    P = sp.csr_matrix(P)
    r, _ = place(model, ds, np.ascontiguousarray(Y_old.T), P, PlacementOptimizer(iterations=300))
    for hops in (1, 2):
        free = np.zeros(N + m, bool); free[N:] = True
        for _ in range(hops):
            free = free | (np.asarray(P[free].sum(axis=0)).ravel() > 0)
        fo = np.flatnonzero(free[:N]); fixed = np.flatnonzero(~free[:N])
        order = np.concatenate([fixed, fo, np.arange(N, N + m)])
        Pp = P[order][:, order].tocsr()
        X0 = np.ascontiguousarray(np.concatenate([Y_old[fo].T, r.coords], axis=1))
        for its in (30, 100, 300):
            t0 = time.perf_counter()
            with PlacementObjective(get_model(model), ds, Pp, np.ascontiguousarray(Y_old[fixed].T)) as obj:
                rr = PlacementOptimizer(iterations=its).optimize(obj, X0, ds)
            t = time.perf_counter() - t0
            Yc = np.empty((N + m, ds + dt)); Yc[order] = np.concatenate([Y_old[fixed], rr.coords.T])
            Y = np.empty((n, ds + dt)); Y[pos] = Yc
            print(sname, "hops", hops, "freed old", fo.size, "its", its, rr.iterations, "NP", round(neighbourhood_preservation(Y[:, :ds], adj, placed_rows), 3), "KL", round(rr.kl, 4), "t", round(t, 2), flush=True)
