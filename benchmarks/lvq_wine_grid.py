"""Wine, honest protocol, LVQ level: for every outer fold of ``lvq.py``'s stratified 10-fold split and every LVQ
setting of ``lvq.SELECT_GRIDS['wide']`` (1-3 prototypes per class x -ln det regulariser 0 / 0.01 / 0.1 x local or
global matrices; rank M from the command line), the inner 5-fold cross-validated errors on the training fold and
the held-out points the fitted model misses, by four rules:

* ``proj``: 1-NN in the Eq. (4) projection (``LiRaMLVQ.transform``; what ``lvq.py --select`` scores);
* ``dis``: 1-NN under the symmetrised learned dissimilarity (``scalemb.lvq.neighbours_against``; what the
  SNE+ / t-SNE+ / SNEST+ maps are built from and how held-out points are placed into them);
* ``rdis``: the same, among the training points the LVQ assigns to the held-out point's predicted class (a map
  whose affinities join only points of the same predicted class would place it there);
* ``cls``: the LVQ's own nearest-prototype classification.

Then, per rule, the setting chosen on each outer training fold by the lowest inner error (ties: the first in grid
order, the paper's setting first) and the outer misses it gives.  Only the selection uses the inner folds; the
per-setting outer totals are a diagnosis (nothing is chosen from them).

Restarts (``run M OUT.jsonl R``): every fit is the lowest-cost of ``R`` LVQ runs from seeds ``s, s + 1000, ...``
(cost on that fit's own training rows, ``LiRaMLVQ.cost``: the GLVQ objective plus the regulariser).

Run from ``benchmarks/``: ``python lvq_wine_grid.py run M OUT.jsonl [R]`` (M = 2, 4; R restarts, default 1), then
``python lvq_wine_grid.py summary OUT.jsonl``.
"""
import json
import sys
import time
import warnings

import numpy as np
from sklearn.datasets import load_wine
from sklearn.model_selection import StratifiedKFold
from sklearn.neighbors import NearestNeighbors

from lvq import LVQ, SELECT_GRIDS
from scalemb.lvq import LiRaMLVQ, neighbours_against

RULES = ("dis", "rdis", "cls", "proj")


def misses(m, Xtr, ytr, Xte, yte):
    """Held-out rows missed by each rule (indices into the held-out rows), and the held-out cost."""
    ctr, cte = m.predict(Xtr), m.predict(Xte)
    nb = neighbours_against(m, Xte, Xtr, len(ytr))[0]
    same = ctr[nb] == cte[:, None]
    first = nb[np.arange(len(yte)), same.argmax(axis=1)]
    Zf, Zt = m.transform(Xtr), m.transform(Xte)
    idx = NearestNeighbors(n_neighbors=1).fit(Zf).kneighbors(Zt, return_distance=False)[:, 0]
    return {"dis": np.flatnonzero(ytr[nb[:, 0]] != yte), "rdis": np.flatnonzero(ytr[first] != yte),
            "cls": np.flatnonzero(cte != yte), "proj": np.flatnonzero(ytr[idx] != yte)}, m.cost(Xte, yte)


def fit(X, y, M, opt, seed, restarts):
    """The lowest training-cost model of ``restarts`` LVQ fits on ``(X, y)``."""
    best = None
    for r in range(restarts):
        m = LiRaMLVQ(random_state=seed + 1000 * r, **dict(LVQ["wine"], rank=M, **opt)).fit(X, y)
        cost = m.cost(X, y)
        if best is None or cost < best[0]:
            best = (cost, m)
    return best[1]


def run(M, out_path, restarts=1):
    warnings.simplefilter("ignore")
    X, y = load_wine(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    folds = list(StratifiedKFold(10, shuffle=True, random_state=0).split(X, y))
    with open(out_path, "w") as out:
        for s, (tr, te) in enumerate(folds):
            inner = list(StratifiedKFold(5, shuffle=True, random_state=s).split(X[tr], y[tr]))
            for g, opt in enumerate(SELECT_GRIDS["wide"]):
                t0 = time.time()
                inner_errors, inner_cost = dict.fromkeys(RULES, 0), []
                for itr, ite in inner:
                    a, b = tr[itr], tr[ite]
                    m = fit(X[a], y[a], M, opt, s, restarts)
                    missed, cost = misses(m, X[a], y[a], X[b], y[b])
                    inner_cost.append(cost)
                    for rule in RULES:
                        inner_errors[rule] += len(missed[rule])
                m = fit(X[tr], y[tr], M, opt, s, restarts)
                missed, _ = misses(m, X[tr], y[tr], X[te], y[te])
                rec = dict(fold=s, g=g, opt=opt, inner_cost=float(np.mean(inner_cost)), seconds=time.time() - t0,
                           **{f"inner_{r}": inner_errors[r] for r in RULES},
                           **{f"outer_{r}": [int(i) for i in te[missed[r]]] for r in RULES})
                out.write(json.dumps(rec) + "\n")
                out.flush()
            print("fold", s, flush=True)


def summary(path):
    R = [json.loads(line) for line in open(path)]
    folds = sorted({r["fold"] for r in R})
    print(f"{path}: {len(folds)} folds")
    print("per setting (diagnosis): outer misses dis / rdis / cls / proj, then inner errors dis / rdis / cls / proj")
    for g in sorted({r["g"] for r in R}):
        rs = [r for r in R if r["g"] == g]
        print(g, rs[0]["opt"], "outer", *(sum(len(r[f"outer_{x}"]) for r in rs) for x in RULES),
              "inner", *(sum(r[f"inner_{x}"] for r in rs) for x in RULES),
              "missed (dis)", sorted(p for r in rs for p in r["outer_dis"]))
    print("selection by the inner error of a rule -> outer misses of each rule (points), chosen setting per fold")
    for crit in RULES:
        chosen = [min((r for r in R if r["fold"] == s), key=lambda r: (r[f"inner_{crit}"], r["g"])) for s in folds]
        print(f"select by inner {crit}:", "; ".join(
            f"{x} {sum(len(r[f'outer_{x}']) for r in chosen)} {sorted(p for r in chosen for p in r[f'outer_{x}'])}"
            for x in RULES), [r["g"] for r in chosen])


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    else:
        summary(sys.argv[2])
