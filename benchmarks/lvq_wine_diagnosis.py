"""Diagnosis of the honest Wine protocol of ``lvq.py`` (which held-out points each method misses, and the LVQ
classification errors, per setting of the LVQ).  It looks at the outer folds, so it is a diagnosis only: nothing
in ``lvq.py`` is chosen from it (``lvq.py --select`` chooses by inner cross-validation on the training folds).

Run from ``benchmarks/``: ``python lvq_wine_diagnosis.py``
"""
import warnings

import numpy as np

from sklearn.datasets import load_wine
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.model_selection import StratifiedKFold
from sklearn.neighbors import NearestNeighbors, NeighborhoodComponentsAnalysis

from lvq import LVQ
from scalemb.lvq import LiRaMLVQ

warnings.simplefilter("ignore")
X, y = load_wine(return_X_y=True)
X = (X - X.mean(0)) / X.std(0)
folds = list(StratifiedKFold(10, shuffle=True, random_state=0).split(X, y))


def missed(fit_map):
    per_fold, points = [], []
    for s, (tr, te) in enumerate(folds):
        Zf, Zt = fit_map(tr, te, s)
        idx = NearestNeighbors(n_neighbors=1).fit(Zf).kneighbors(Zt, return_distance=False)[:, 0]
        bad = y[tr][idx] != y[te]
        per_fold.append(int(bad.sum()))
        points += [int(p) for p in te[bad]]
    return per_fold, sorted(points)


def linear(make):
    def f(tr, te, s):
        m = make(s).fit(X[tr], y[tr])
        return m.transform(X[tr]), m.transform(X[te])
    return f


def lvq(**options):
    def f(tr, te, s):
        m = LiRaMLVQ(random_state=s, **dict(LVQ["wine"], **options)).fit(X[tr], y[tr])
        f.classification += int((m.predict(X[te]) != y[te]).sum())
        return m.transform(X[tr]), m.transform(X[te])
    f.classification = 0
    return f


rows = [("NCA", linear(lambda s: NeighborhoodComponentsAnalysis(2, random_state=s))),
        ("LDA", linear(lambda s: LinearDiscriminantAnalysis(n_components=2))),
        ("13-D Euclidean 1-NN", lambda tr, te, s: (X[tr], X[te]))]
for options in [dict(rank=2), dict(rank=4), dict(rank=2, regularization=0.01), dict(rank=2, regularization=0.1),
                dict(rank=2, localized=False), dict(rank=4, localized=False),
                dict(rank=2, localized=False, regularization=0.01), dict(rank=2, epochs=1000),
                dict(rank=2, prototypes_per_class=2)]:
    rows.append((f"LiRaM LVQ proj. {options}", lvq(**options)))
for name, f in rows:
    per_fold, points = missed(f)
    extra = f" (LVQ classification errors {f.classification})" if hasattr(f, "classification") else ""
    print(f"{name}: held-out 1-NN errors per fold {per_fold}, total {sum(per_fold)}, points {points}{extra}")

# the points the maps miss, seen in the full 13-D space of their training fold: LDA's class posterior (all 13
# dimensions, not the 2-D map) and the labels / distances of the 7 nearest training points
print("point: label, fold, LDA posterior (13-D), labels and distances of its 7 nearest training points (13-D)")
for p in (68, 96, 130, 59, 38, 121):
    s = next(i for i, (_, te) in enumerate(folds) if p in te)
    tr = folds[s][0]
    post = LinearDiscriminantAnalysis().fit(X[tr], y[tr]).predict_proba(X[[p]])[0]
    d = np.linalg.norm(X[tr] - X[p], axis=1)
    near = np.argsort(d)[:7]
    print(f"{p}: label {y[p]}, fold {s}, LDA posterior {np.round(post, 3).tolist()}, neighbours {y[tr][near].tolist()} "
          f"at {np.round(d[near], 2).tolist()}")
