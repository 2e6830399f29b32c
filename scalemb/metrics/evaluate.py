"""``evaluate_run``: every metric that applies to a stored run (or an ``EmbeddingResult``).

* the run's affinity P (given, or found from the run's ``provenance``: its affinity store, built-in dataset, edge
  list or kNN features): KL(P||Q) under the run's own model, and NP@deg with its Jaccard variant on P's
  non-zero pattern, in the model's similarity order;
* features X (given, or the source of a kNN affinity): trustworthiness, continuity and kNN precision at k, and
  the AUC of the co-ranking curve's R_NX up to k_max;
* labels: the leave-one-out 1-NN error.

Bad input (node ids of run and affinity that differ, labels or features of the wrong length, non-finite
coordinates, a path that is not a result) raises ``InputError`` naming the file.
"""
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..affinity import Affinity, read_features
from ..store.results import EmbeddingResult
from ..run.inputs import is_dataset, load_affinity, reopen as affinity_from_provenance
from ..errors import InputError, ScalembError
from ..io.nodeids import as_node_ids, is_string_ids
from ..models.registry import model_of
from .base import Metric
from .kl import kl
from .quality import feature_metrics, graph_metrics, one_nn_error


def load_run(run) -> tuple:
    """``(EmbeddingResult, name)`` for a result path or an ``EmbeddingResult``; checks the coordinates."""
    if isinstance(run, EmbeddingResult):
        result, name = run, "<run>"
    else:
        name = str(run)
        if not Path(run).exists():
            raise InputError(name, "no such run")
        try:
            result = EmbeddingResult.load(run)
        except ScalembError:
            raise
        except Exception as exc:  # noqa: BLE001 - zarr raises many types for what is not a finished result
            raise InputError(name, f"not a finished scalemb result ({type(exc).__name__}: {exc})") from None
    Y = np.asarray(result.embedding, dtype=np.float64)
    if Y.ndim != 2 or Y.shape[0] != np.asarray(result.node_ids).shape[0]:
        raise InputError(name, f"embedding of shape {Y.shape} does not match {len(result.node_ids)} node ids")
    bad = ~np.isfinite(Y).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InputError(name, f"{int(bad.sum())} points have non-finite coordinates (first: row {row}, node id "
                               f"{np.asarray(result.node_ids)[row].item()!r})")
    return result, name


def _resolve_affinity(affinity, graph_affinity: str):
    """``(Affinity, name)`` for an ``Affinity``, a sparse matrix (node ids 0..N-1), an affinity store, an edge
    list or a built-in dataset name (read as ``scalemb.run.inputs`` reads them)."""
    if isinstance(affinity, Affinity):
        return affinity, "<affinity>"
    if sp.issparse(affinity):
        return Affinity(affinity, np.arange(affinity.shape[0])), "<affinity>"
    name = str(affinity)
    if is_dataset(affinity):
        return load_affinity(affinity), f"dataset {affinity}"
    if not Path(name).exists():
        raise InputError(name, "no such file")
    return load_affinity(name, graph_affinity), name


def align_affinity(affinity: Affinity, node_ids: np.ndarray, name: str) -> Affinity:
    """``affinity`` with its rows in the run's node order; ``InputError`` naming ``name`` if the ids differ."""
    ids = as_node_ids(node_ids)
    if is_string_ids(ids) != is_string_ids(affinity.node_ids):
        kinds = ("integers", "strings")
        raise InputError(name, f"node ids are {kinds[is_string_ids(affinity.node_ids)]} here but "
                               f"{kinds[is_string_ids(ids)]} in the run")
    if affinity.node_ids.shape == ids.shape and np.array_equal(affinity.node_ids, ids):
        return affinity
    found = None
    if affinity.n_points == ids.size:
        order = np.argsort(affinity.node_ids, kind="stable")
        position = np.minimum(np.searchsorted(affinity.node_ids, ids, sorter=order), ids.size - 1)
        found = order[position]
    if found is None or not np.array_equal(affinity.node_ids[found], ids):
        missing = np.setdiff1d(ids, affinity.node_ids)
        extra = np.setdiff1d(affinity.node_ids, ids)
        detail = (f"first run id missing here: {missing[0].item()!r}" if missing.size else
                  f"first id not in the run: {extra[0].item()!r}" if extra.size else "repeated ids")
        raise InputError(name, f"node ids differ from the run's ({affinity.n_points} nodes here, {ids.size} in the "
                               f"run; {detail})")
    return affinity.permuted(found)


def read_labels(labels, n_points: int):
    """Labels as a 1-D array of ``n_points``: an array, a ``.npy`` file or a text file (one label per line)."""
    name = "<labels>"
    if isinstance(labels, (str, Path)):
        name = str(labels)
        path = Path(labels)
        if not path.is_file():
            raise InputError(name, "no such file")
        try:
            if path.suffix.lower() == ".npy":
                labels = np.load(path, allow_pickle=False)
            else:
                labels = np.array([line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                                   if line.strip()])
        except (ValueError, OSError, UnicodeDecodeError) as exc:
            raise InputError(name, f"cannot read labels ({type(exc).__name__}: {exc})") from None
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.shape[0] != n_points:
        raise InputError(name, f"labels have shape {labels.shape}; the run has {n_points} points")
    return labels


def _read_X(X, n_points: int):
    name = "<features>"
    if isinstance(X, (str, Path)):
        name = str(X)
        X = read_features(X)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] != n_points:
        raise InputError(name, f"features have shape {X.shape}; the run has {n_points} points")
    if not np.isfinite(X).all():
        raise InputError(name, "features have non-finite values")
    return X


def _run_inputs(result, affinity, X, graph_affinity: str):
    """``(affinity, its source name, features)``: the given ones, or the run's own from its provenance (the
    features a kNN run was built from, where they still exist)."""
    if affinity is not None:
        return (*_resolve_affinity(affinity, graph_affinity), X)
    affinity, source, features_source = affinity_from_provenance(dict(result.provenance), graph_affinity)
    if X is None and features_source is not None and Path(features_source).exists():
        X = features_source
    return affinity, source, X


def evaluate_run(run, affinity=None, X=None, labels=None, *, sample=None, seed=0, k: int = 10, k_max: int = 50,
                 graph_affinity: str = "coauthorship", n_threads=None) -> dict:
    """Every metric that applies to ``run`` (an output-store path or an ``EmbeddingResult``), as
    ``{key: Metric}`` (module docstring).  ``affinity``: an ``Affinity``, sparse P, affinity store, edge list
    (``graph_affinity`` turns it into P) or dataset name; ``None`` finds the run's input from its provenance.
    ``X``: features (array or file), ``labels``: array or file.  ``sample``: rows per metric (default all up to
    ``EXACT_MAX_ROWS``)."""
    result, run_name = load_run(run)
    Y = np.asarray(result.embedding, dtype=np.float64)
    n = Y.shape[0]
    affinity, source, X = _run_inputs(result, affinity, X, graph_affinity)
    if labels is not None:
        labels = read_labels(labels, n)
    if X is not None:
        X = _read_X(X, n)
    if affinity is None and X is None and labels is None:
        raise ScalembError(f"{run_name}: the run's input cannot be found from its provenance; pass the affinity "
                           "(--input), features or labels")
    metrics = {}
    options = {"sample": sample, "seed": seed, "n_threads": n_threads}
    # the run's model with its parameters (EE's lambda); None for an eigenmap run: no objective to report, and
    # its neighbours are ranked by Euclidean distance
    model = model_of(result)
    if affinity is not None:
        affinity = align_affinity(affinity, result.node_ids, source)
        if model is not None:  # the objective's value under its own name ("kl" for the KL models, "E" for ee)
            name = model.objective.name
            metrics[name] = Metric(kl(affinity, Y, model, result.space_dims, n_threads=n_threads), None, n, name)
        metrics.update(graph_metrics(affinity.P, Y, model, result.space_dims, **options))
    if X is not None:
        metrics.update(feature_metrics(X, Y, k, min(k_max, n - 2), model, result.space_dims, **options)[0])
    if labels is not None:
        metrics["1nn_error"] = one_nn_error(Y, labels, model, result.space_dims, **options)
    return metrics
