"""Feature-matrix inputs of service jobs: which affinity a job's input takes, the submission-time checks, and the
kNN affinity a feature job embeds (built as ``scalemb.Embedder(affinity='knn')`` builds it).

``affinity='auto'`` decides by the file (``scalemb.affinity.knn.looks_like_features``, as ``scalemb embed``):
``.npy`` is a feature matrix; a ``.csv`` / ``.tsv`` is one when its
first data line (after comments and a header of names) holds only numbers and either more than three columns or a
non-integer in its first two (an edge list is ``SOURCE TARGET [weight]`` with integer or string ids); anything
else (an edge list, ``.gz``, a built-in dataset) is a graph, and an affinity store is P itself.  A feature matrix
this rule reads as an edge list (two or three integer columns) needs ``affinity='knn'``.
"""
from pathlib import Path

from ..affinity.knn import FEATURE_SUFFIXES, looks_like_features  # noqa: F401 - the rule lives there
from ..affinity.knn import read_features
from ..errors import InputError
from ..run.inputs import knn_features_affinity


def check_features(path: Path, shown: str) -> int:
    """The number of rows of feature file ``path``; ``ValueError`` naming ``shown`` (the path the user gave) and
    the line for a file ``scalemb.affinity.knn.read_features`` refuses, or one of fewer than 2 rows."""

    try:
        X = read_features(path)
    except InputError as exc:
        where = f"{shown}:{exc.line}" if exc.line is not None else shown
        raise ValueError(f"{where}: {exc.reason}") from None
    if X.shape[0] < 2:
        raise ValueError(f"{shown}: a feature matrix needs at least 2 rows (points), got {X.shape[0]}")
    return int(X.shape[0])


def knn_settings(params: dict) -> dict | None:
    """The kNN settings of a job record (``None`` unless the job embeds features); the store key hashes them."""
    if params.get("affinity") != "knn":
        return None
    return {"perplexity": params["perplexity"], "n_neighbors": params["n_neighbors"], "metric": params["metric"],
            "seed": params["seed"]}


def knn_affinity_of(path, settings: dict, n_jobs=None):
    """The kNN ``Affinity`` of feature file ``path`` (``scalemb.estimator.knn_features_affinity``)."""

    return knn_features_affinity(read_features(path), settings["perplexity"], settings["n_neighbors"],
                                 settings["metric"], settings["seed"], n_jobs, source=path)
