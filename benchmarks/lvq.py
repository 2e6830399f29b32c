"""Supervised maps from learned LiRaM LVQ metrics: 1-NN error of 2-D maps and time, against baselines.

Data: the paper's Three Tip Star (``scalemb.lvq.three_tip_star``, generated from the description in section 3.1)
and Wine (scikit-learn's copy, z-scored).  Methods: PCA, LDA, scikit-learn NCA, unsupervised t-SNE (scalemb, same
engine, Euclidean affinities), sklvq's LGMLVQ (its local projections, Eq. 4), LiRaM LVQ's own Eq. (4) projection,
and scalemb SNE+ / t-SNE+ / SNEST+ (space R^2 for SNEST+) on affinities under the learned metric, rank M = 2, 4.

Two protocols, each repeated over seeds (mean +- std):
* transductive (as the paper): everything fitted on all points, leave-one-out 1-NN error of the 2-D map;
* honest: seed s holds out fold s of a stratified 10-fold split; every supervised step (LVQ, LDA, NCA, sklvq) sees
  only the training labels.  Linear maps and LVQ projections are fitted on the training fold and applied to the
  held-out points.  The neighbour-embedding maps are built on all points' features (placing new points into a
  stored map is not available yet), with affinities under the metric learned from the training labels only, so no
  held-out label enters; the error is the share of held-out points whose nearest training point in the map has
  another label.
Also a 1e5-point labelled Three Tip Star: LVQ epoch time (local, partitions 1 and 2; Dask with 2 workers and 2
partitions) and the end-to-end time to a supervised t-SNE+ map.

Run from the repository root:
``python benchmarks/lvq.py [--seeds 10] [--star-seeds 3] [--out benchmarks/results/lvq.md]``
"""
import argparse
import os
import sys
import time
import warnings

import numpy as np
from sklearn.datasets import load_wine
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.model_selection import StratifiedKFold
from sklearn.neighbors import NearestNeighbors, NeighborhoodComponentsAnalysis

from common import Report, markdown_table
from scalemb import Embedder
from scalemb.affinity import knn_affinity
from scalemb.lvq import LiRaMLVQ, supervised_affinity, three_tip_star

# the paper's LVQ settings (section 3.1: Three Tip Star, 3 prototypes per class, 500 epochs; section 3.2: Wine)
LVQ = {"star": dict(prototypes_per_class=3, epochs=500, lr_prototypes=0.01, lr_prototypes_decay=0.001,
                    lr_metric=0.001, lr_metric_decay=0.0001, metric_start=50),
       "wine": dict(prototypes_per_class=1, epochs=300, lr_prototypes=0.1, lr_prototypes_decay=0.01,
                    lr_metric=0.01, lr_metric_decay=0.001, metric_start=30)}
ITERATIONS = {"sne": 300, "tsne": 300, "snest": 300}


def loo_error(Z, y):
    idx = NearestNeighbors(n_neighbors=2).fit(Z).kneighbors(Z, return_distance=False)
    other = np.where(idx[:, 0] == np.arange(len(y)), idx[:, 1], idx[:, 0])
    return float(np.mean(y[other] != y))


def heldout_error(Z, y, train, test):
    idx = NearestNeighbors(n_neighbors=1).fit(Z[train]).kneighbors(Z[test], return_distance=False)[:, 0]
    return float(np.mean(y[train][idx] != y[test]))


def _sklvq_for_current_sklearn():
    """sklvq 0.1.2 calls ``self._validate_data(..., force_all_finite=...)``, removed in scikit-learn 1.6/1.8; route
    it to ``sklearn.utils.validation.validate_data`` (fitting then runs; its predict/score still fail, unused)."""
    from sklearn.utils.validation import validate_data
    from sklvq.models._base import LVQBaseClass

    def _validate(self, *args, **kwargs):
        if "force_all_finite" in kwargs:
            kwargs["ensure_all_finite"] = kwargs.pop("force_all_finite")
        return validate_data(self, *args, **kwargs)

    if not hasattr(LVQBaseClass, "_validate_data"):
        LVQBaseClass._validate_data = _validate


def sklvq_projection(X_fit, y_fit, X, ppc, seed):
    """sklvq's LGMLVQ (rank 2), points mapped by the matrix of their closest prototype (Eq. 4)."""
    from sklvq import LGMLVQ

    _sklvq_for_current_sklearn()

    model = LGMLVQ(prototype_n_per_class=ppc, relevance_n_components=2, random_state=seed).fit(X_fit, y_fit)
    W, O = model.prototypes_, model.omega_  # noqa: E741 - the paper's Omega
    d = np.stack([(((X - W[j]) @ O[j].T) ** 2).sum(axis=1) for j in range(W.shape[0])], axis=1)
    win = d.argmin(axis=1)
    return np.einsum("nd,nmd->nm", X, O[win])


def embed(affinity, model, seed):
    e = Embedder(model=model, space_dims=2, time_dims=1 if model == "snest" else 0, iterations=ITERATIONS[model],
                 seed=seed).fit(affinity)
    return e.embedding_[:, :2]


def run_method(name, X, y, fit_idx, seed, dataset):
    """2-D map of all points from a method fitted on rows ``fit_idx``; returns (map, seconds)."""
    t0 = time.perf_counter()
    Xf, yf = X[fit_idx], y[fit_idx]
    if name == "PCA":
        Z = PCA(2).fit(Xf).transform(X)
    elif name == "LDA":  # two classes give one discriminant: pad with zeros
        lda = LinearDiscriminantAnalysis(n_components=min(2, len(np.unique(y)) - 1)).fit(Xf, yf)
        Z = lda.transform(X)
        Z = np.hstack([Z, np.zeros((len(X), 2 - Z.shape[1]))])
    elif name == "NCA":
        Z = NeighborhoodComponentsAnalysis(2, random_state=seed).fit(Xf, yf).transform(X)
    elif name == "t-SNE (unsupervised)":
        Z = embed(knn_affinity(X, perplexity=30, random_state=seed), "tsne", seed)
    elif name == "sklvq LGMLVQ":
        Z = sklvq_projection(Xf, yf, X, LVQ[dataset]["prototypes_per_class"], seed)
    else:  # "LiRaM LVQ proj. M=2", "t-SNE+ M=4", ...
        label, M = name.rsplit(" M=", 1)
        lvq = LiRaMLVQ(rank=int(M), random_state=seed, **LVQ[dataset]).fit(Xf, yf)
        if label == "LiRaM LVQ proj.":
            Z = lvq.transform(X)
        else:
            model = {"SNE+": "sne", "t-SNE+": "tsne", "SNEST+": "snest"}[label]
            Z = embed(supervised_affinity(X, model=lvq, perplexity=30), model, seed)
    return Z, time.perf_counter() - t0


def evaluate(report, dataset, X, y, methods, seeds):
    folds = list(StratifiedKFold(10, shuffle=True, random_state=0).split(X, y))
    rows = []
    everything = np.arange(len(y))
    for name in methods:
        trans, honest, secs = [], [], []
        for seed in range(seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                Z, t = run_method(name, X, y, everything, seed, dataset)
                trans.append(loo_error(Z, y))
                secs.append(t)
                train, test = folds[seed % 10]
                Z, _ = run_method(name, X, y, train, seed, dataset)
                honest.append(heldout_error(Z, y, train, test))
        rows.append([name, f"{np.mean(trans):.3f} ± {np.std(trans):.3f}", f"{np.mean(honest):.3f} ± "
                     f"{np.std(honest):.3f}", f"{np.median(secs):.1f}"])
        print(dataset, rows[-1], flush=True)
    report(f"### {dataset}: N = {len(y)}, D = {X.shape[1]}, {len(np.unique(y))} classes, {seeds} seeds")
    report()
    report(markdown_table(["method", "1-NN error transductive (LOO)", "1-NN error honest (held-out fold)",
                           "time per map, s (median)"], rows))
    report()


def _time_fit(n_epochs_fit, X, y, **options):
    """(per-epoch seconds, model): a 1-epoch fit (initialisation, compilation) subtracted from an E-epoch fit."""
    params = dict(LVQ["star"], metric_start=5, **options)
    LiRaMLVQ(rank=2, random_state=0, **dict(params, epochs=1)).fit(X[:1000], y[:1000])  # warm-up
    t0 = time.perf_counter()
    LiRaMLVQ(rank=2, random_state=0, **dict(params, epochs=1)).fit(X, y)
    t1 = time.perf_counter()
    model = LiRaMLVQ(rank=2, random_state=0, **dict(params, epochs=n_epochs_fit)).fit(X, y)
    t2 = time.perf_counter()
    return ((t2 - t1) - (t1 - t0)) / (n_epochs_fit - 1), t2 - t1, model


def large(report, n, epochs):
    X, y = three_tip_star(n, random_state=0)
    rows = []
    for label, options in (("local, 1 partition (sequential SGD)", {}), ("local, 2 partitions", {"partitions": 2})):
        per_epoch, total, model = _time_fit(epochs, X, y, **options)
        rows.append([label, f"{per_epoch * 1e3:.0f}", f"{total:.1f}", f"{1 - model.score(X, y):.3f}"])
        print(rows[-1], flush=True)
    # this script's directory holds benchmarks/distributed.py, which would shadow the dask package
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.modules.pop("distributed", None)
    try:
        from distributed import LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            per_epoch, total, model = _time_fit(epochs, X, y, partitions=2, scheduler=cluster.scheduler_address)
            rows.append(["Dask, 2 workers x 1 thread, 2 partitions", f"{per_epoch * 1e3:.0f}", f"{total:.1f}",
                         f"{1 - model.score(X, y):.3f}"])
    except Exception as exc:  # noqa: BLE001 - report, keep the rest of the run
        rows.append(["Dask, 2 workers", f"failed: {exc}", "", ""])
    print(rows[-1], flush=True)
    report(f"### {n:,} points (Three Tip Star scaled up): LVQ epochs (6 prototypes, M = 2, metric from epoch 5)")
    report()
    report(markdown_table(["runner", "ms per epoch (E-epoch fit minus 1-epoch fit, / (E - 1))",
                           f"fit time, {epochs} epochs, s", "training error"], rows))
    report()
    t0 = time.perf_counter()
    model = LiRaMLVQ(rank=2, random_state=0, **dict(LVQ["star"], metric_start=5, epochs=epochs)).fit(X, y)
    t1 = time.perf_counter()
    aff = supervised_affinity(X, model=model, perplexity=30)
    t2 = time.perf_counter()
    e = Embedder(model="tsne", iterations=300, seed=0).fit(aff)
    t3 = time.perf_counter()
    report(f"End to end, {n:,} points to a t-SNE+ map (M = 2): LVQ {epochs} epochs {t1 - t0:.1f} s, affinities "
           f"({aff.provenance['knn']}, k = {aff.provenance['n_neighbors']}) {t2 - t1:.1f} s, t-SNE "
           f"{e.result_.iterations} iterations {t3 - t2:.1f} s; total {t3 - t0:.1f} s; LOO 1-NN error of the map "
           f"{loo_error(e.embedding_, y):.3f} (LVQ training error {1 - model.score(X, y):.3f}).")
    report()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--star-seeds", type=int, default=10)
    parser.add_argument("--star-n", type=int, default=3000)
    parser.add_argument("--large-n", type=int, default=100_000)
    parser.add_argument("--large-epochs", type=int, default=20)
    parser.add_argument("--skip", default="", help="comma list of: wine, star, large")
    parser.add_argument("--methods", default=None, help="comma list of method names (default: all)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = Report.start("Supervised maps from LiRaM LVQ metrics",
                          __doc__.split("\n\n", 1)[1].split("Run:")[0].strip())
    supervised = [f"{m} M={M}" for M in (2, 4) for m in ("LiRaM LVQ proj.", "SNE+", "t-SNE+", "SNEST+")]
    methods = ["PCA", "LDA", "NCA", "t-SNE (unsupervised)", "sklvq LGMLVQ"] + supervised
    if args.methods:
        methods = [m for m in methods if m in args.methods.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    if "wine" not in skip:
        X, y = load_wine(return_X_y=True)
        evaluate(report, "wine", (X - X.mean(axis=0)) / X.std(axis=0), y, methods, args.seeds)
    if "star" not in skip:
        X, y = three_tip_star(args.star_n, random_state=0)
        evaluate(report, "star", X, y, methods, args.star_seeds)
    if "large" not in skip:
        large(report, args.large_n, args.large_epochs)
    report.save(args.out)


if __name__ == "__main__":
    main()
