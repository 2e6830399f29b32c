"""kNN placements (feature rows; the map fixed, as ``scalemb transform`` places them) with the placement defaults
against the previous ones (no exaggeration): NP@15 of the held-out 10 % against a re-embedding of all rows.

    python placement_diagnosis/knn_defaults.py digits|mixture      (from benchmarks/; mixture: 5000 x 50-D)
"""
import sys
import time

import numpy as np
from scipy.spatial import cKDTree
from sklearn.datasets import load_digits

sys.path.insert(0, ".")
from transform import gaussian_mixture  # noqa: E402

from scalemb.affinity import knn_affinity  # noqa: E402
from scalemb.embedding import Embedder  # noqa: E402
from scalemb.placement import PlacementOptimizer, place  # noqa: E402
from scalemb.placement.affinity import _knn_against, extended_knn_affinity  # noqa: E402

which = sys.argv[1]
X = load_digits().data.astype(float) if which == "digits" else gaussian_mixture(5000)
held = np.zeros(len(X), bool)
held[np.random.default_rng(1).choice(len(X), len(X) // 10, replace=False)] = True
X_ref, X_new = X[~held], X[held]
n, k = len(X_ref), 15


def fit(affinity):
    return Embedder(model="tsne", space_dims=2, time_dims=0, seed=0).fit(affinity).embedding_


reference = knn_affinity(X_ref, perplexity=30)
Y = fit(reference)
X_all = np.concatenate([X_ref, X_new])
Y_full = fit(knn_affinity(X_all, perplexity=30))
truth, _ = _knn_against(X_new, X_all, k + 1, "euclidean")
truth = [[j for j in row if j != n + i][:k] for i, row in enumerate(truth)]


def preservation(Y_all):
    _, idx = cKDTree(Y_all).query(Y_all[n:], k=k + 1)
    return np.mean([len(set(r) - {n + i} & set(t)) / k for i, (r, t) in enumerate(zip(idx, truth))])


P = extended_knn_affinity(reference, X_ref, X_new, reference.provenance["n_neighbors"], "euclidean", 30.0)
print(which, "re-embedding NP@15", round(preservation(Y_full), 3))
for label, optimizer in (("defaults", PlacementOptimizer()),
                         ("previous", PlacementOptimizer(exaggeration=1.0, final_exaggeration=1.0))):
    t = time.process_time()
    run, _ = place("tsne", 2, np.ascontiguousarray(Y.T), P, optimizer, free_hops=0)
    t = time.process_time() - t
    print(label, "NP@15", round(preservation(np.concatenate([Y, run.coords.T])), 3), "KL'", round(run.kl, 4),
          "iterations", run.iterations, "CPU s", round(t, 2))
