"""``scalemb affinity X.npy --labels y.npy --metric liram --knn K --out P.zarr``: supervised affinities.

LiRaM LVQ is fitted on the features and labels, neighbours and perplexity-calibrated affinities are computed
under the learned dissimilarity (``scalemb.lvq.supervised_affinity``), and the store gets the fitted model in its
provenance (``lvq``) and the labels as the array ``labels`` (class indices into ``provenance.lvq.classes``).
Bad input (unreadable files, labels of the wrong length, one class, NaN features, a class smaller than
``--prototypes-per-class``, ``--rank`` above the feature dimension) is one error line, exit 2, nothing written.
"""
from pathlib import Path

import numpy as np

from ..errors import InputError, ScalembError
from ..affinity.knn import read_features
from ..affinity.store import write_affinity_store
from ..methods import label_metric_names


def add_arguments(parser):
    """LiRaM options of ``scalemb affinity`` (used with ``--metric liram``)."""
    group = parser.add_argument_group("supervised metric (--metric liram)")
    group.add_argument("--labels", help="labels file (.npy 1-D, or text: one label per line)")
    group.add_argument("--prototypes-per-class", type=int, default=1, help="LVQ prototypes per class (default 1)")
    group.add_argument("--rank", type=int, default=2, help="rank M of every local matrix (default 2)")
    group.add_argument("--global-metric", action="store_true", help="one global matrix (GMLVQ) instead of one "
                                                                    "per prototype")
    group.add_argument("--lvq-epochs", type=int, default=500, help="LVQ epochs (default 500)")
    group.add_argument("--lvq-regularization", type=float, default=0.0,
                       help="weight of -ln det(Omega Omega^T) (default 0: off)")


def read_labels(path) -> np.ndarray:
    """Labels from ``.npy`` (1-D, or N x 1) or text (one label per line, ``#`` comments, blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "no such file")
    return _npy_labels(path) if path.suffix.lower() == ".npy" else _text_labels(path)


def _npy_labels(path: Path) -> np.ndarray:
    try:
        y = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(path, f"cannot read as .npy ({exc.__class__.__name__}: {exc})") from None
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or y.dtype.kind not in "biufUS":
        raise InputError(path, f"expected a 1-D array of labels, got shape {y.shape} dtype {y.dtype}")
    bad = np.flatnonzero(~np.isfinite(y)) if y.dtype.kind == "f" else ()
    if len(bad):
        raise InputError(path, f"non-finite label at position {int(bad[0])} (0-based)")
    return y


def _text_labels(path: Path) -> np.ndarray:
    """One label per line: integers if every label is one, else strings."""
    try:
        with open(path, encoding="utf-8") as handle:
            labels = [text for text in (line.split("#", 1)[0].strip() for line in handle) if text]
    except (UnicodeDecodeError, OSError) as exc:
        raise InputError(path, f"cannot read as UTF-8 text ({exc.__class__.__name__}: {exc})") from None
    if not labels:
        raise InputError(path, "no labels")
    try:
        return np.array([int(v) for v in labels])
    except ValueError:
        return np.array(labels)


def learned_affinity(args, metric) -> None:
    """Fit, build and write the store for ``scalemb affinity --metric M --labels FILE``, ``M`` a metric learned
    from labels (``scalemb.methods.AffinityMetric``, e.g. liram; ``metric``: it, or None); validates everything
    first."""

    if metric is None or not metric.learns_from_labels:
        raise ScalembError(f"--labels is used with --metric {' or '.join(label_metric_names())} (got --metric "
                           f"{args.metric})")
    if not args.knn:
        raise ScalembError(f"--metric {metric.name} needs feature input: pass --knn K")
    if not args.labels:
        raise ScalembError(f"--metric {metric.name} needs --labels FILE")
    if args.uniform:
        raise ScalembError(f"--metric {metric.name} calibrates a perplexity Gaussian; --uniform is not supported "
                           "with it")
    X = read_features(args.input)
    y = read_labels(args.labels)
    try:
        affinity = metric.affinity(
            X, y, perplexity=args.perplexity, n_neighbors=args.knn, n_jobs=args.threads, source=args.input,
            prototypes_per_class=args.prototypes_per_class, rank=args.rank, localized=not args.global_metric,
            epochs=args.lvq_epochs, regularization=args.lvq_regularization, random_state=args.seed)
    except ValueError as exc:
        raise ScalembError(f"{args.input} with labels {args.labels}: {exc}") from None
    affinity.provenance["labels"] = str(args.labels)
    classes = np.asarray(affinity.provenance["lvq"]["classes"])
    write_affinity_store(args.out, affinity, n_partitions=args.partitions, overwrite=args.overwrite,
                         point_order=args.point_order,
                         extra_arrays={"labels": np.searchsorted(classes, y).astype(np.int64)})
