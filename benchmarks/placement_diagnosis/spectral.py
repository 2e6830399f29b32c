# ruff: noqa
"""The spectral placement direction (B = diag(h) - C_nn, solved) against the Jacobi one, with and without the free
phase, on diag.py's cached GrQc maps.  usage: DIAG_CACHE=... PYTHONPATH=. python benchmarks/placement_diagnosis/spectral.py tsne"""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diag import *  # noqa: E402,F401,F403 (the cached maps and splits of diag.py)
configs = [(d, h, fi, 300) for d in ("jacobi", "spectral") for h, fi in ((0, 30), (1, 30), (1, 60), (2, 30))]
if len(sys.argv) > 2:  # direction:hops:free iterations:first-phase iterations,...
    configs = [(d, int(h), int(fi), int(it)) for d, h, fi, it in (c.split(":") for c in sys.argv[2].split(","))]
for sname, (old, new_ids, P, Y_old) in out.items():
    m = len(new_ids); N = old.n_nodes
    combined = np.concatenate([old.node_ids, new_ids]); pos = np.searchsorted(full.node_ids, combined); placed_rows = pos[N:]
    Yo = np.ascontiguousarray(Y_old.T)
    np_full = neighbourhood_preservation(Y_full[:, :ds], adj, placed_rows)
    place(model, ds, Yo, P, PlacementOptimizer(iterations=1, direction="spectral"), free_hops=1, free_iterations=1)
    for direction, hops, fi, its in configs:
        t0, c0 = time.perf_counter(), time.process_time()
        r, _ = place(model, ds, Yo, P, PlacementOptimizer(iterations=its), free_hops=hops, free_iterations=fi,
                     free_direction=direction)
        t, c = time.perf_counter() - t0, time.process_time() - c0
        sc = Y_old.copy()
        if r.moved.size: sc[r.moved] = r.moved_coords.T
        Y = np.empty((n, ds + dt)); Y[pos] = np.concatenate([sc, r.coords.T])
        npl = neighbourhood_preservation(Y[:, :ds], adj, placed_rows)
        print(sname, direction, f"first {its} it., hops {hops} x {fi}", "CPU s", round(c, 2), "NP", round(npl, 3), f"({(npl / np_full - 1) * 100:+.1f} % vs {np_full:.3f})",
              "KL", round(r.kl, 4), "t", round(t, 2), "its", r.iterations, flush=True)
