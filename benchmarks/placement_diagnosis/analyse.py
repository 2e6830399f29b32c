# ruff: noqa
"""Diagnosis of the placement quality gap on GrQc (issue 20; benchmarks/results/transform.md, "Why"). Kept as run;
usage: PYTHONPATH=. python benchmarks/placement_diagnosis/NAME.py tsne (diag.py caches the maps in $DIAG_CACHE)."""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diag import *  # noqa: E402,F401,F403 (the cached maps and splits of diag.py)
from scalemb.placement.objective import PlacementObjective
from scalemb.models import get_model
from scipy.sparse.csgraph import connected_components

def run_place(Y_oldT, P, X0=None, opt=None):
    opt = opt or PlacementOptimizer(iterations=300)
    if X0 is None:
        r, un = place(model, ds, Y_oldT, P, opt)
        return r
    with PlacementObjective(get_model(model), ds, P, Y_oldT) as obj:
        return opt.optimize(obj, X0, ds)

for sname, (old, new_ids, P, Y_old) in out.items():
    m = len(new_ids); N = old.n_nodes
    combined = np.concatenate([old.node_ids, new_ids])
    pos = np.searchsorted(full.node_ids, combined)        # row in full of each combined index
    placed_rows = pos[N:]
    X0, un = initial_positions(P[N:], Y_old.T, ds, 0)
    # attached mask
    Pn = sp.csr_matrix(P)[N:]
    # unattached: no path to old. reproduce: BFS
    has_old = np.asarray(Pn[:, :N].sum(axis=1)).ravel() > 0
    E = Pn[:, N:]
    nc, lab = connected_components(E, directed=False)
    comp_att = np.bincount(lab, weights=has_old, minlength=nc) > 0
    attached = comp_att[lab]
    deg = np.array([len(adj[r]) for r in placed_rows])
    def npsplit(Y):
        res = {}
        for nm, mask in [("all", np.ones(m, bool)), ("attached", attached), ("unatt", ~attached),
                         ("deg1", deg == 1), ("deg2-4", (deg >= 2) & (deg <= 4)), ("deg5+", deg >= 5),
                         ("direct-old", has_old)]:
            res[nm] = neighbourhood_preservation(Y[:, :ds], adj, placed_rows[mask]) if mask.any() else np.nan
        return res
    def assemble(Yo, Xn):
        Y = np.empty((n, ds + dt)); Y[pos] = np.concatenate([Yo, Xn]); return Y
    print(f"== {sname}: m={m} unattached={(~attached).sum()} direct-old={has_old.sum()}")
    print("full       ", {k: round(v, 3) for k, v in npsplit(Y_full).items()})
    r = run_place(Y_old.T, P)
    print("placed     ", {k: round(v, 3) for k, v in npsplit(assemble(Y_old, r.coords.T)).items()}, "KL", round(r.kl, 4), "its", r.iterations, "conv", r.converged)
    r2 = run_place(Y_old.T, P, opt=PlacementOptimizer(iterations=2000, tol=1e-9))
    print("placed long", {k: round(v, 3) for k, v in npsplit(assemble(Y_old, r2.coords.T)).items()}, "KL", round(r2.kl, 4), "its", r2.iterations)
    # oracle: old = full map's old rows
    Yfo = Y_full[pos[:N]]
    Xopt = np.ascontiguousarray(Y_full[placed_rows].T)
    with PlacementObjective(get_model(model), ds, P, np.ascontiguousarray(Yfo.T)) as obj:
        print("oracle full KL", round(obj.evaluate(Xopt).kl, 4))
    r3 = run_place(np.ascontiguousarray(Yfo.T), P)
    print("oracle map, median start", {k: round(v, 3) for k, v in npsplit(assemble(Yfo, r3.coords.T)).items()}, "KL", round(r3.kl, 4), "start", round(r3.kl_history[0], 4), "its", r3.iterations)
    r4 = run_place(np.ascontiguousarray(Yfo.T), P, X0=Xopt)
    print("oracle map, optimum start", {k: round(v, 3) for k, v in npsplit(assemble(Yfo, r4.coords.T)).items()}, "KL", round(r4.kl, 4), "its", r4.iterations)
    sys.stdout.flush()
