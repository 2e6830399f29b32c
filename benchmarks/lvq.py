"""Supervised maps from learned LiRaM LVQ metrics: 1-NN error of 2-D maps and time, against baselines.

Data: the paper's Three Tip Star (``scalemb.lvq.three_tip_star``, generated from the description in section 3.1)
and Wine (scikit-learn's copy, z-scored).  Methods: PCA, LDA, scikit-learn NCA, unsupervised t-SNE (scalemb, same
engine, Euclidean affinities), sklvq's LGMLVQ (its local projections, Eq. 4), LiRaM LVQ's own Eq. (4) projection,
and scalemb SNE+ / t-SNE+ / SNEST+ (space R^2 for SNEST+) on affinities under the learned metric, rank M = 2, 4.

Two protocols, each repeated over seeds (mean +- std):
* transductive (as the paper): everything fitted on all points, leave-one-out 1-NN error of the 2-D map;
* honest: seed s holds out fold s of a stratified 10-fold split (so 10 seeds = the 10 folds).  Every method is
  fitted on the training fold alone (LVQ, LDA, NCA, sklvq see only its labels; the neighbour-embedding maps are
  built on its points only) and the held-out points are mapped into it: linear maps and LVQ projections applied
  to them, neighbour-embedding maps place them with ``Embedder.transform`` (kNN under the same -- for SNE+ /
  t-SNE+ / SNEST+ the learned -- dissimilarity, the map's perplexity, KL against the fixed map).  The error is
  the share of held-out points whose nearest training point in the map has another label.  Per fold the number
  of held-out errors is compared with NCA's (folds better / equal / worse).
``--select``: the LVQ settings are chosen per training fold by inner 5-fold cross-validation on that fold
(``SELECT_GRIDS``; ``--select-grid basic``: the paper's schedule, with the -ln det regulariser 0.01 or 0.1, or one
global matrix; ``wide``: 1-3 prototypes per class x regulariser 0 / 0.01 / 0.1 x local or global matrices).
Also a 1e5-point labelled Three Tip Star: LVQ epoch time (local, partitions 1 and 2; Dask with 2 workers and 2
partitions) and the end-to-end time to a supervised t-SNE+ map (``--large-parts cli``: through ``scalemb affinity
--metric liram`` and ``scalemb embed``, the way a user runs it).

Run from the repository root:
``python benchmarks/lvq.py [--seeds 10] [--star-seeds 3] [--out benchmarks/results/lvq.md]``
"""
import argparse
import contextlib
import json
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
from scalemb.embedding import Embedder as EngineEmbedder
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
    """Share of the rows ``test`` whose nearest ``train`` row of ``Z`` has another label."""
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


def sklvq_projection(X_fit, y_fit, ppc, seed):
    """sklvq's LGMLVQ (rank 2) fitted on ``(X_fit, y_fit)``; returns the map ``X -> Omega_j x`` with ``j`` the
    closest prototype of ``x`` (Eq. 4)."""
    from sklvq import LGMLVQ

    _sklvq_for_current_sklearn()

    model = LGMLVQ(prototype_n_per_class=ppc, relevance_n_components=2, random_state=seed).fit(X_fit, y_fit)
    W, O = model.prototypes_, model.omega_  # noqa: E741 - the paper's Omega

    def project(X):
        d = np.stack([(((X - W[j]) @ O[j].T) ** 2).sum(axis=1) for j in range(W.shape[0])], axis=1)
        return np.einsum("nd,nmd->nm", X, O[d.argmin(axis=1)])

    return project


def embed(affinity, model, seed):
    """Engine-level runner fitted on ``affinity`` (its ``transform`` places new points into the map)."""
    return EngineEmbedder(model=model, space_dims=2, time_dims=1 if model == "snest" else 0,
                          iterations=ITERATIONS[model], seed=seed).fit(affinity)


NE = {"SNE+": "sne", "t-SNE+": "tsne", "SNEST+": "snest"}
DETERMINISTIC = ("PCA", "LDA", "NCA")  # no seed enters the transductive map (NCA's init='auto' is PCA or LDA)


def lvq_params(dataset, M, X_fit, y_fit, seed, select):
    """The LVQ settings of a fit on ``(X_fit, y_fit)``: the paper's schedule, or with ``select`` the one of the
    grid ``SELECT_GRIDS[select]`` (``True``: basic) whose inner 5-fold cross-validated 1-NN error of the Eq. (4)
    projection on the fit rows is lowest (ties: the first; only these rows and labels are seen)."""
    base = dict(LVQ[dataset], rank=int(M))
    if not select:
        return base, None
    grid = SELECT_GRIDS["basic" if select is True else select]
    key = (dataset, int(M), seed, str(select), hash(X_fit.tobytes()), hash(np.asarray(y_fit).tobytes()))
    if key not in _SELECTED:  # the choice depends only on these; the NE maps reuse their projection's choice
        _SELECTED[key] = _select(base, X_fit, y_fit, seed, grid)
    return _SELECTED[key]


_SELECTED = {}


def _select(base, X_fit, y_fit, seed, grid):
    inner = list(StratifiedKFold(5, shuffle=True, random_state=seed).split(X_fit, y_fit))
    scores = []
    for option in grid:
        wrong = 0
        for tr, te in inner:
            lvq = LiRaMLVQ(random_state=seed, **dict(base, **option)).fit(X_fit[tr], y_fit[tr])
            wrong += round(heldout_error(lvq.transform(X_fit), y_fit, tr, te) * len(te))
        scores.append(wrong / len(y_fit))
    best = int(np.argmin(scores))
    return dict(base, **grid[best]), {"choice": best, "setting": grid[best], "inner_errors": scores}


# candidate LVQ settings for --select (chosen per outer training fold by inner cross-validation); "wide": every
# combination of 1-3 prototypes per class, the -ln det regulariser 0 / 0.01 / 0.1, local or one global matrix
# (the paper's setting first, so ties keep it)
SELECT_GRIDS = {"basic": [{}, {"regularization": 0.01}, {"regularization": 0.1}, {"localized": False},
                          {"localized": False, "regularization": 0.01}],
                "wide": [dict(prototypes_per_class=p, regularization=r, localized=loc)
                         for loc in (True, False) for p in (1, 2, 3) for r in (0.0, 0.01, 0.1)]}


def run_method(name, X, y, train, test, seed, dataset, select=False):
    """2-D map of the rows ``train`` fitted on them alone, and the rows ``test`` mapped into it (linear maps and
    LVQ projections applied to them; neighbour-embedding maps place them by ``Embedder.transform``).
    Returns ``(Z_train, Z_test or None, seconds, notes)``."""
    t0 = time.perf_counter()
    Xf, yf = X[train], y[train]
    Xt = None if test is None else X[test]
    notes = None

    def both(f):
        return f(Xf), None if Xt is None else f(Xt)

    if name == "PCA":
        Zf, Zt = both(PCA(2).fit(Xf).transform)
    elif name.startswith("LDA"):  # two classes give one discriminant: pad with zeros
        lda = LinearDiscriminantAnalysis(n_components=min(2, len(np.unique(y)) - 1)).fit(Xf, yf)
        Zf, Zt = both(lambda A: np.hstack([lda.transform(A), np.zeros((len(A), 2 - lda.transform(A[:1]).shape[1]))]))
    elif name == "NCA":
        nca = NeighborhoodComponentsAnalysis(2, random_state=seed).fit(Xf, yf)
        Zf, Zt = both(nca.transform)
    elif name == "t-SNE (unsupervised)":
        e = embed(knn_affinity(Xf, perplexity=30, random_state=seed), "tsne", seed)
        Zf, Zt = e.embedding_[:, :2], None if Xt is None else e.transform(Xt, reference=Xf)[:, :2]
    elif name == "sklvq LGMLVQ":
        proj = sklvq_projection(Xf, yf, LVQ[dataset]["prototypes_per_class"], seed)
        Zf, Zt = both(proj)
    else:  # "LiRaM LVQ proj. M=2", "t-SNE+ M=4", ...
        label, M = name.rsplit(" M=", 1)
        params, notes = lvq_params(dataset, M, Xf, yf, seed, select)
        lvq = LiRaMLVQ(random_state=seed, **params).fit(Xf, yf)
        if label == "LiRaM LVQ proj.":
            Zf, Zt = both(lvq.transform)
        else:
            e = embed(supervised_affinity(Xf, model=lvq, perplexity=30), NE[label], seed)
            Zf, Zt = e.embedding_[:, :2], None if Xt is None else e.transform(Xt, reference=Xf)[:, :2]
    return Zf, Zt, time.perf_counter() - t0, notes


def evaluate(dataset, X, y, methods, seeds, raw, select=False, first_seed=0):
    """Run every method over seeds ``first_seed ..``; append one JSON line per (method, seed, protocol) to
    ``raw``: the error, and for the honest protocol the fold's wrong / held-out counts."""
    folds = list(StratifiedKFold(10, shuffle=True, random_state=0).split(X, y))
    everything = np.arange(len(y))
    done = {}  # deterministic transductive maps computed by an earlier run into the same raw file
    if os.path.exists(raw):
        for line in open(raw):
            r = json.loads(line)
            if r["dataset"] == dataset and r["protocol"] == "transductive" and r.get("computed") \
                    and r["method"] in DETERMINISTIC:
                done[r["method"]] = r["error"], r["seconds"]
    for name in methods:
        cached = done.get(name)
        for seed in range(first_seed, first_seed + seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if name in DETERMINISTIC and cached is not None:
                    err, t = cached
                else:
                    Z, _, t, notes = run_method(name, X, y, everything, None, seed, dataset, select)
                    err = loo_error(Z, y)
                    if name in DETERMINISTIC:
                        cached = err, t
                computed = not (name in DETERMINISTIC and (seed > first_seed or name in done))
                write_raw(raw, dict(dataset=dataset, method=name, protocol="transductive", seed=seed, error=err,
                                    seconds=t, select=select, computed=computed))
                train, test = folds[seed % 10]
                Zf, Zt, t, notes = run_method(name, X, y, train, test, seed, dataset, select)
                idx = NearestNeighbors(n_neighbors=1).fit(Zf).kneighbors(Zt, return_distance=False)[:, 0]
                wrong = int(np.sum(y[train][idx] != y[test]))
                write_raw(raw, dict(dataset=dataset, method=name, protocol="honest", seed=seed, fold=seed % 10,
                                    wrong=wrong, n_test=int(len(test)), error=wrong / len(test), seconds=t,
                                    select=select, notes=notes))
            print(dataset, name, seed, f"{err:.3f}", f"{wrong}/{len(test)}", f"{t:.1f}s", flush=True)


def write_raw(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def tables(report, raw_paths, datasets, against="NCA"):
    """Tables from the raw records (several runs' files may be merged; the last record of a (dataset, method,
    protocol, seed, select) key wins): mean +- std over seeds, and for the honest protocol the per-fold paired
    comparison against ``against`` (folds where the method has fewer / as many / more held-out errors)."""
    records = {}
    for path in raw_paths:
        for line in open(path):
            r = json.loads(line)
            label = {True: " (inner-CV LVQ settings)", "basic": " (inner-CV LVQ settings)",
                     "wide": " (inner-CV LVQ settings, wide grid)"}.get(r.get("select"), "")
            records[(r["dataset"], r["method"] + label,
                     r["protocol"], r["seed"])] = r
    for dataset in datasets:
        keys = [k for k in records if k[0] == dataset]
        if not keys:
            continue
        methods = list(dict.fromkeys(k[1] for k in keys))
        ref = {k[3]: records[k]["wrong"] for k in keys if k[1] == against and k[2] == "honest"}
        rows = []
        for m in methods:
            ho = [records[k] for k in keys if k[1] == m and k[2] == "honest"]
            seeds = {r["seed"] for r in ho}  # whole seeds only (a stopped run may leave one protocol of a seed)
            tr = [records[k] for k in keys if k[1] == m and k[2] == "transductive" and k[3] in seeds]
            te = np.array([r["error"] for r in tr])
            he = np.array([r["error"] for r in ho])
            wrong = sum(r["wrong"] for r in ho)
            total = sum(r["n_test"] for r in ho)
            paired = [(r["wrong"] > ref[r["seed"]]) - (r["wrong"] < ref[r["seed"]]) for r in ho if r["seed"] in ref]
            secs = [r["seconds"] for r in tr if r.get("computed", True)] + [r["seconds"] for r in ho]
            rows.append([m, len(ho), f"{te.mean():.3f} ± {te.std():.3f}" if te.size else "",
                         f"{he.mean():.3f} ± {he.std():.3f}" if he.size else "", f"{wrong}/{total}",
                         "" if m == against or not paired else
                         f"{paired.count(-1)}/{paired.count(0)}/{paired.count(1)}",
                         f"{np.median(secs):.1f}" if secs else ""])
        report(f"#### {dataset}: raw records {', '.join(raw_paths)}")
        report()
        report(markdown_table(["method", "seeds", "1-NN error transductive (LOO)", "1-NN error honest (held-out "
                               "fold)", "honest: wrong / held out, all folds",
                               f"folds better / equal / worse than {against}", "time per map, s (median)"], rows))
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


@contextlib.contextmanager
def dask_processes(n_workers, timeout=600):
    """A real ``dask scheduler`` and ``n_workers`` single-threaded ``dask worker`` processes (no nanny) on
    loopback; yields the scheduler address.  Generous start timeouts: on a loaded machine a LocalCluster's
    nanny can miss its default start limit."""
    import subprocess
    import tempfile

    from distributed import Client

    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=f"{timeout}s")
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        file = os.path.join(tmp, "scheduler.json")
        try:
            procs.append(subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                           "--no-dashboard", "--scheduler-file", file], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + timeout
            while not os.path.exists(file) or not open(file).read().strip():
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    raise RuntimeError("dask scheduler did not start")
                time.sleep(0.2)
            time.sleep(0.5)
            address = json.loads(open(file).read())["address"]
            for _ in range(n_workers):
                procs.append(subprocess.Popen(["dask", "worker", address, "--nthreads", "1", "--no-nanny",
                                               "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", "4GB"],
                                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            with Client(address, timeout=timeout) as client:
                client.wait_for_workers(n_workers, timeout=timeout)
            yield address
        finally:
            for proc in procs[::-1]:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs[::-1]:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def large(report, n, epochs, parts=("epochs", "e2e"), workdir="/tmp/scalemb_lvq"):
    X, y = three_tip_star(n, random_state=0)
    if "epochs" in parts:
        large_epochs(report, X, y, n, epochs)
    if "e2e" in parts:
        large_end_to_end(report, X, y, n, epochs)
    if "cli" in parts:
        large_cli(report, n, workdir)


def large_epochs(report, X, y, n, epochs):
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
        with dask_processes(2) as address:
            per_epoch, total, model = _time_fit(epochs, X, y, partitions=2, scheduler=address)
            rows.append(["Dask, 2 worker processes x 1 thread (dask scheduler / dask worker on loopback), "
                         "2 partitions", f"{per_epoch * 1e3:.0f}", f"{total:.1f}", f"{1 - model.score(X, y):.3f}"])
    except Exception as exc:  # noqa: BLE001 - report, keep the rest of the run
        rows.append(["Dask, 2 workers", f"failed: {exc}", "", ""])
    print(rows[-1], flush=True)
    report(f"### {n:,} points (Three Tip Star scaled up): LVQ epochs (6 prototypes, M = 2, metric from epoch 5)")
    report()
    report(markdown_table(["runner", "ms per epoch (E-epoch fit minus 1-epoch fit, / (E - 1))",
                           f"fit time, {epochs} epochs, s", "training error"], rows))
    report()


def large_end_to_end(report, X, y, n, epochs):
    """LVQ, supervised affinities and a t-SNE+ map at ``n`` points; every stage's time is printed as it ends
    (the map's progress too), so a stopped run still tells how far it got."""
    t0 = time.perf_counter()
    model = LiRaMLVQ(rank=2, random_state=0, **dict(LVQ["star"], metric_start=5, epochs=epochs)).fit(X, y)
    t1 = time.perf_counter()
    print(f"e2e: LVQ {epochs} epochs {t1 - t0:.1f} s", flush=True)
    aff = supervised_affinity(X, model=model, perplexity=30)
    t2 = time.perf_counter()
    print(f"e2e: affinities ({aff.provenance['knn']}, k = {aff.provenance['n_neighbors']}) {t2 - t1:.1f} s",
          flush=True)
    e = EngineEmbedder(model="tsne", iterations=300, seed=0, quiet=False).fit(aff)
    t3 = time.perf_counter()
    report(f"End to end, {n:,} points to a t-SNE+ map (M = 2): LVQ {epochs} epochs {t1 - t0:.1f} s, affinities "
           f"({aff.provenance['knn']}, k = {aff.provenance['n_neighbors']}) {t2 - t1:.1f} s, t-SNE "
           f"{e.result_.iterations} iterations {t3 - t2:.1f} s; total {t3 - t0:.1f} s; LOO 1-NN error of the map "
           f"{loo_error(e.embedding_, y):.3f} (LVQ training error {1 - model.score(X, y):.3f}).")
    report()


def large_cli(report, n, workdir, lvq_epochs=100, knn=90):
    """End to end through the command line, as a user runs it: ``scalemb affinity X.npy --labels y.npy --metric
    liram`` then ``scalemb embed P.zarr --model tsne`` with the engine's defaults (at this size
    ``optimizer='auto'`` picks delta-bar-delta with the 750-iteration schedule and FFT repulsion).  Each command's
    wall time (and child CPU time) is measured around its process; the LOO 1-NN error of the map is computed from
    the run's coordinates and the labels."""
    import resource
    import subprocess

    os.makedirs(workdir, exist_ok=True)
    X, y = three_tip_star(n, random_state=0)
    xf, yf = os.path.join(workdir, "X.npy"), os.path.join(workdir, "y.npy")
    np.save(xf, X)
    np.save(yf, y)
    store, run = os.path.join(workdir, "P.zarr"), os.path.join(workdir, "run.zarr")
    commands = [("affinity (LVQ + supervised kNN affinities)",
                 ["scalemb", "affinity", xf, "--knn", str(knn), "--labels", yf, "--metric", "liram",
                  "--prototypes-per-class", "3", "--rank", "2", "--lvq-epochs", str(lvq_epochs), "--threads", "1",
                  "--overwrite", "--out", store]),
                ("embed (t-SNE, engine defaults: optimizer auto)",
                 ["scalemb", "embed", store, "--model", "tsne", "--threads", "1", "--overwrite", "--out", run])]
    rows, total = [], 0.0
    for label, cmd in commands:
        print(" ".join(cmd), flush=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        total += wall
        rows.append([label, "`" + " ".join(os.path.basename(c) if os.sep in c else c for c in cmd) + "`",
                     f"{wall:.1f}", f"{cpu:.1f}", os.popen("uptime").read().split("load average:")[1].strip()])
        print(rows[-1], flush=True)
    from scalemb.store.results import read_result

    arrays, attrs = read_result(run)
    Z, ids = arrays["embedding"][:, :2], np.asarray(arrays["node_ids"]).astype(np.int64)
    rows.append(["total", "", f"{total:.1f}", "", ""])
    report(f"### {n:,} points end to end through the CLI (Three Tip Star scaled up, 3 prototypes per class, M = 2, "
           f"{lvq_epochs} LVQ epochs, k = {knn})")
    report()
    report(markdown_table(["stage", "command", "wall s", "CPU s", "load average after"], rows))
    report()
    kept = {k: attrs.get(k) for k in ("model", "iterations", "kl", "optimizer")}
    report(f"LOO 1-NN error of the map: {loo_error(Z, y[ids]):.3f}; run attributes: {json.dumps(kept, default=str)}")
    report()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--star-seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. (split runs over processes)")
    parser.add_argument("--star-n", type=int, default=3000)
    parser.add_argument("--large-n", type=int, default=100_000)
    parser.add_argument("--large-epochs", type=int, default=20)
    parser.add_argument("--large-parts", default="epochs,e2e", help="comma list of: epochs, e2e, cli")
    parser.add_argument("--workdir", default="/tmp/scalemb_lvq", help="data and stores of --large-parts cli")
    parser.add_argument("--skip", default="", help="comma list of: wine, star, large")
    parser.add_argument("--methods", default=None, help="comma list of method names (default: all)")
    parser.add_argument("--select", action="store_true",
                        help="LVQ settings chosen per training fold by inner 5-fold cross-validation (SELECT_GRIDS)")
    parser.add_argument("--select-grid", default="basic", choices=sorted(SELECT_GRIDS),
                        help="the candidate settings of --select (default basic: the paper's schedule, -ln det "
                             "0.01 / 0.1, one global matrix; wide: 1-3 prototypes per class x -ln det 0 / 0.01 / "
                             "0.1 x local or global)")
    parser.add_argument("--raw", default="lvq_raw.jsonl", help="JSON lines of per-seed results (appended)")
    parser.add_argument("--tables-from", default=None,
                        help="comma list of raw files: only build the tables from them (no runs)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.select and args.select_grid != "basic":
        args.select = args.select_grid
    report = Report.start("Supervised maps from LiRaM LVQ metrics",
                          __doc__.split("\n\n", 1)[1].split("Run from")[0].strip())
    if args.tables_from:
        tables(report, args.tables_from.split(","), ["wine", "star"])
        report.save(args.out)
        return
    supervised = [f"{m} M={M}" for M in (2, 4) for m in ("LiRaM LVQ proj.", "SNE+", "t-SNE+", "SNEST+")]
    methods = ["PCA", "LDA", "NCA", "t-SNE (unsupervised)", "sklvq LGMLVQ"] + supervised
    if args.methods:
        methods = [m for m in methods if m in args.methods.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    if "wine" not in skip:
        X, y = load_wine(return_X_y=True)
        evaluate("wine", (X - X.mean(axis=0)) / X.std(axis=0), y, methods, args.seeds, args.raw, args.select,
                 args.first_seed)
    if "star" not in skip:
        X, y = three_tip_star(args.star_n, random_state=0)
        evaluate("star", X, y, methods, args.star_seeds, args.raw, args.select, args.first_seed)
    if "wine" not in skip or "star" not in skip:
        tables(report, [args.raw], ["wine", "star"])
    if "large" not in skip:
        large(report, args.large_n, args.large_epochs, args.large_parts.split(","), args.workdir)
    report.save(args.out)


if __name__ == "__main__":
    main()
