"""scalemb, openTSNE and umap with their defaults through the same scikit-learn calls (issue 35, "Measure").

Per data set -- scikit-learn's digits (1797 x 64), a 2e4 x 50 Gaussian mixture of 20 clusters, and scanpy's
``pbmc68k_reduced`` (700 cells, read from the scanpy wheel; the features are ``obsm['X_pca']``, 50 PCs, what
``sc.tl.tsne`` uses, labels ``obs['bulk_labels']``) -- the rows are split 80 / 20 (stratified, seed 0).  Each
estimator, built with its defaults (``random_state=0`` only), runs

    Y_fit = est.fit_transform(X_fit)        # fit: CPU (process) and wall seconds
    Y_new = est.transform(X_new)            # transform: CPU and wall seconds of the held-out 20 %

and is scored by trustworthiness@10 of ``Y_fit`` against ``X_fit`` (exact, ``scalemb.metrics.trustworthiness``)
and the 10-NN accuracy of the transformed rows (``KNeighborsClassifier(10)`` trained on ``(Y_fit, y_fit)``, scored
on ``(Y_new, y_new)``), i.e. ``make_pipeline(est, KNeighborsClassifier(10)).fit(X_fit, y_fit).score(X_new, y_new)``.
The estimators: ``scalemb.TSNE``, ``openTSNE.sklearn.TSNE`` (openTSNE's scikit-learn wrapper) and ``umap.UMAP``;
beside scalemb's default a second scalemb row: ``optimizer=`` what 'auto' picks from ``AUTO_SCALE_MIN_POINTS``
(2e4) points on, openTSNE's schedule (delta-bar-delta, 250 exaggerated + 500 iterations), at every size.
Every estimator is warmed up first on 300 digits, and pynndescent (scalemb's and umap's kNN above 4096 points) on
5000 mixture rows: numba's compilation is not timed.  CPU seconds count every
thread of the process (openTSNE's default is one thread, umap and scalemb use every core); with ``--rounds R``
each data set is run R times, the estimators in rotated order, and the medians are reported.

With ``--splits S`` (S > 1) the data sets of at most 1e4 rows are also split with seeds 1 .. S - 1 (one run of each
estimator per split, after the timed rounds): a table of every split's transformed-row accuracy and
trustworthiness@10 and their medians over the S splits, seed 0's being the timed rounds' median, so that a gap of
a row or two is told from a systematic one.

    python benchmarks/users.py --out benchmarks/results/users.md [--sets digits,pbmc,mixture] [--rounds 3]
        [--large-rounds 1] [--splits 10]
"""
import argparse
import statistics
import sys
import time
import warnings

import numpy as np
from common import Report, markdown_table

SETS = ("digits", "mixture", "pbmc")


def gaussian_mixture(n: int = 20_000, dims: int = 50, clusters: int = 20, seed: int = 0):
    """``(X, labels)``: ``clusters`` centres 3 N(0, I) in ``dims`` dimensions, unit-variance points around them (the
    mixture of ``benchmarks/transform.py``, with its labels)."""
    rng = np.random.default_rng(seed)
    centres = 3.0 * rng.standard_normal((clusters, dims))
    labels = rng.integers(clusters, size=n)
    return centres[labels] + rng.standard_normal((n, dims)), labels


def load(name: str):
    if name == "digits":
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        return X.astype(np.float64), y
    if name == "mixture":
        return gaussian_mixture()
    if name == "pbmc":
        import scanpy as sc

        adata = sc.datasets.pbmc68k_reduced()
        return np.asarray(adata.obsm["X_pca"], dtype=np.float64), adata.obs["bulk_labels"].cat.codes.to_numpy()
    raise ValueError(f"unknown data set {name!r}; choose from {', '.join(SETS)}")


PREVIOUS = "scalemb.TSNE, spectral direction (previous default)"
PREVIOUS_MAX_ROWS = 10_000  # above this the previous default is not re-run (its mixture figure: an earlier table)


def estimators():
    """``{name: factory}``: each library's estimator with its defaults (``random_state=0``)."""
    import umap
    from openTSNE.sklearn import TSNE as OpenTSNE

    import scalemb

    from scalemb.optim import make_optimizer

    return {"scalemb.TSNE": lambda: scalemb.TSNE(random_state=0),
            # what optimizer='auto' ran on features below 2e4 points before it took openTSNE's schedule for P
            # made from points at every size: the spectral direction after a momentum exaggeration phase
            PREVIOUS: lambda: scalemb.TSNE(random_state=0, optimizer=make_optimizer("auto", "tsne", n_points=5000)),
            "openTSNE.sklearn.TSNE": lambda: OpenTSNE(random_state=0),
            "umap.UMAP": lambda: umap.UMAP(random_state=0)}


def timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    value = fn()
    return value, time.process_time() - cpu, time.perf_counter() - wall


def one(factory, X_fit, y_fit, X_new, y_new):
    from sklearn.neighbors import KNeighborsClassifier

    from scalemb.metrics import trustworthiness

    est = factory()
    Y_fit, fit_cpu, fit_wall = timed(lambda: np.asarray(est.fit_transform(X_fit)))
    Y_new, tr_cpu, tr_wall = timed(lambda: np.asarray(est.transform(X_new)))
    trust = float(trustworthiness(X_fit, Y_fit, k=10).value)
    accuracy = KNeighborsClassifier(10).fit(Y_fit, y_fit).score(Y_new, y_new)
    return {"fit_cpu": fit_cpu, "fit_wall": fit_wall, "tr_cpu": tr_cpu, "tr_wall": tr_wall, "trust": trust,
            "acc": accuracy}


def split_table(report, set_name, X, y, factories, names, runs, splits):
    """Transformed-row accuracy and trustworthiness@10 over ``splits`` stratified 80/20 splits (seed 0: the timed
    rounds' medians, seeds 1 ..: one run each), per split and their medians."""
    from sklearn.model_selection import train_test_split

    acc = {name: [statistics.median(run["acc"] for run in runs[name])] for name in names}
    trust = {name: [statistics.median(run["trust"] for run in runs[name])] for name in names}
    for seed in range(1, splits):
        X_fit, X_new, y_fit, y_new = train_test_split(X, y, test_size=0.2, random_state=seed, stratify=y)
        for name in names:
            run = one(factories[name], X_fit, y_fit, X_new, y_new)
            acc[name].append(run["acc"])
            trust[name].append(run["trust"])
            print(f"  {set_name} split {seed} {name}: acc {run['acc']:.4f} trust {run['trust']:.4f}", flush=True)
    n_new = len(y) - len(train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)[2])
    report(f"\n{set_name}, {splits} random splits (seeds 0-{splits - 1}; {n_new} transformed rows each): "
           "transformed-row 10-NN accuracy per split, medians of accuracy and trustworthiness@10\n")
    report(markdown_table(["estimator"] + [f"split {s}" for s in range(splits)]
                          + ["median accuracy", "median trustworthiness@10"],
                          [[name] + [f"{a:.4f}" for a in acc[name]] + [f"{statistics.median(acc[name]):.4f}",
                                                                       f"{statistics.median(trust[name]):.4f}"]
                           for name in names]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the Markdown report here")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--large-rounds", type=int, default=1, help="rounds for data sets of more than 1e4 rows")
    parser.add_argument("--splits", type=int, default=1,
                        help="random 80/20 splits (seeds 0 .. S-1) scored on data sets of at most 1e4 rows")
    args = parser.parse_args(argv)
    from sklearn.model_selection import train_test_split

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*n_jobs value.*")
    report = Report.start(
        "Users' estimators side by side: scalemb, openTSNE, umap with their defaults (issue 35)",
        f"`{' '.join(['python'] + sys.argv)}`; rounds per data set: {args.rounds}, above 1e4 rows {args.large_rounds} "
        "(medians; estimators in rotated order).  Fit on 80 % of the rows, `transform` of the other 20 %; "
        "trustworthiness@10 of the fitted rows, 10-NN accuracy of the transformed rows against the fitted ones' "
        "labels.  CPU: process seconds (all threads).")
    factories = estimators()
    Xw, yw = load("digits")
    for name, factory in factories.items():  # numba compilation and caches, untimed
        one(factory, Xw[:240], yw[:240], Xw[240:300], yw[240:300])
    from scalemb.affinity.knn import knn_graph

    knn_graph(gaussian_mixture(5000)[0], 15, algorithm="nndescent")  # pynndescent's compilation (scalemb, umap)
    for set_name in args.sets.split(","):
        X, y = load(set_name)
        names = [name for name in factories if name != PREVIOUS or X.shape[0] <= PREVIOUS_MAX_ROWS]
        X_fit, X_new, y_fit, y_new = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
        runs = {name: [] for name in names}
        rounds = args.rounds if X.shape[0] <= 10_000 else args.large_rounds
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                runs[name].append(one(factories[name], X_fit, y_fit, X_new, y_new))
                print(f"  {set_name} round {r + 1} {name}: {runs[name][-1]}", flush=True)
        rows = []
        for name in names:
            med = {key: statistics.median(run[key] for run in runs[name]) for key in runs[name][0]}
            rows.append([name, f"{med['fit_cpu']:.1f}", f"{med['fit_wall']:.1f}", f"{med['tr_cpu']:.2f}",
                         f"{med['tr_wall']:.2f}", f"{med['trust']:.4f}", f"{med['acc']:.4f}"])
        report(f"\n## {set_name}: {X.shape[0]} x {X.shape[1]}, {len(np.unique(y))} classes; fit {X_fit.shape[0]}, "
               f"transform {X_new.shape[0]}; {rounds} round{'s' if rounds > 1 else ''}\n")
        report(markdown_table(["estimator", "fit CPU s", "fit wall s", "transform CPU s", "transform wall s",
                               "trustworthiness@10", "10-NN accuracy (transformed)"], rows))
        if args.splits > 1 and X.shape[0] <= 10_000:
            split_table(report, set_name, X, y, factories, names, runs, args.splits)
    report()
    report(f"load after the run: {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
    report.save(args.out)


if __name__ == "__main__":
    main()
