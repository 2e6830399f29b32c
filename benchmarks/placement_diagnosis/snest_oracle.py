# ruff: noqa
"""SNEST placement convergence on GrQc (issue 20): place the random 10 % into the full re-embedding's own stored
rows with different time step ratios / iteration budgets.  usage: PYTHONPATH=. python .../snest_oracle.py snest"""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["DIAG_SPLITS_ONLY"] = "1"
from diag import *  # noqa
from scalemb.placement.objective import PlacementObjective
from scalemb.models import get_model
old, new_ids, P, _ = out["random"]
N = old.n_nodes
combined = np.concatenate([old.node_ids, new_ids]); pos = np.searchsorted(full.node_ids, combined); placed_rows = pos[N:]
Yfo = np.ascontiguousarray(Y_full[pos[:N]].T)
for lab, opt in [("default", PlacementOptimizer()), ("1000 it.", PlacementOptimizer(iterations=1000)),
                 ("time_ratio 0.1", PlacementOptimizer(time_ratio=0.1)), ("time_ratio 1", PlacementOptimizer(time_ratio=1.0)),
                 ("time_ratio 0.1, 1000 it.", PlacementOptimizer(time_ratio=0.1, iterations=1000))]:
    t0 = time.perf_counter()
    r, _ = place(model, ds, Yfo, P, opt)
    t = time.perf_counter() - t0
    Y = np.empty((n, ds + dt)); Y[pos] = np.concatenate([Yfo.T, r.coords.T])
    print(lab, "KL", round(r.kl, 4), "NP", round(neighbourhood_preservation(Y[:, :ds], adj, placed_rows), 3), "its", r.iterations, "conv", r.converged, "t", round(t, 1), flush=True)
