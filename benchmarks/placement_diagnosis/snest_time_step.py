# ruff: noqa
"""SNEST placement with the time coordinates' own Armijo step (``time_step="separate"``) against the joint step,
into the full re-embedding's own stored rows (random split; snest_oracle.py's set-up).
usage: DIAG_CACHE=... PYTHONPATH=. python benchmarks/placement_diagnosis/snest_time_step.py snest [time_step:ratio:its,...]"""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["DIAG_SPLITS_ONLY"] = "1"
from diag import *  # noqa
configs = [("joint", 0.01, 300), ("separate", 0.01, 300), ("separate", 0.1, 300), ("separate", 1.0, 300)]
if len(sys.argv) > 2:
    configs = [(a, float(b), int(c)) for a, b, c in (x.split(":") for x in sys.argv[2].split(","))]
for sname in sys.argv[3].split(",") if len(sys.argv) > 3 else ["random"]:
    old, new_ids, P, _ = out[sname]
    N = old.n_nodes
    combined = np.concatenate([old.node_ids, new_ids]); pos = np.searchsorted(full.node_ids, combined); placed_rows = pos[N:]
    Yfo = np.ascontiguousarray(Y_full[pos[:N]].T)
    for ts, ratio, its in configs:
        t0 = time.perf_counter()
        r, _ = place(model, ds, Yfo, P, PlacementOptimizer(iterations=its, time_ratio=ratio, time_step=ts))
        t = time.perf_counter() - t0
        Y = np.empty((n, ds + dt)); Y[pos] = np.concatenate([Yfo.T, r.coords.T])
        print(sname, ts, ratio, its, "KL", round(r.kl, 4), "NP", round(neighbourhood_preservation(Y[:, :ds], adj, placed_rows), 3),
              "its", r.iterations, "evals", r.evaluations, "conv", r.converged, "t", round(t, 1), flush=True)
