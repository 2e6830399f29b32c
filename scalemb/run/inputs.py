"""What a run reads: ``resolve(source, spec) -> InputPlan`` holds the one rule for what an input is, and
``InputPlan`` loads it (in-process P, or the affinity store Dask workers read).

Inputs: ``None`` (the bundled GrQc), a built-in dataset name, an affinity store (a Zarr group: P itself), an
edge-list file, a feature file (``.npy``, ``.csv``, ``.tsv``: kNN affinities), or an in-memory ``Affinity``; any
of the files or stores as an object-storage URL (``s3://bucket/key``), read from its local copy
(``scalemb.io.storage.local_input``).
``affinity='auto'`` (the only place it is decided): a store or an ``Affinity`` is P itself ('precomputed'), a
file that ``scalemb.affinity.knn.looks_like_features`` is features ('knn'), anything else a graph ('graph').  The
kNN settings (``perplexity``, ``n_neighbors``, ``metric``) apply to features only: given for another input they
are refused, not silently ignored.  A feature file's P is built once here, with ``n_neighbors`` defaulting to
``min(N - 1, 3 perplexity)`` (``scalemb.affinity.knn.default_neighbours``) and the perplexity lowered below it
for small inputs (``fitting_perplexity``, openTSNE's rule).
"""
import numbers
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..affinity import Affinity, AffinityStore, coauthorship_affinity, is_affinity_store, normalized_affinity
from ..affinity.store import check_source, content_hash, write_affinity_store
from ..affinity.knn import (FEATURE_SUFFIXES, PERPLEXITY, default_neighbours, knn_affinity, looks_like_features,
                           read_features)
from ..datasets import DATASETS, load_dataset
from ..io.edgelist import read_edge_list
from ..io.storage import is_url, local_input
from ..params import BY_NAME, DEFAULTS, GRAPH_AFFINITIES, KNN_PARAMS
from ..progress import phase
from .spec import front_name
from ..affinity.ingest import ingest_edge_list
from ..errors import InputError


def is_dataset(source, root=None) -> bool:
    """A built-in dataset's name (a file of that name in the working directory, or under ``root`` when the
    front reads names relative to a data root, is that file)."""
    return isinstance(source, str) and source in DATASETS and not (Path(root or ".") / source).exists()


def _is_anndata(X) -> bool:
    return type(X).__module__.split(".")[0] == "anndata" and hasattr(X, "obsp") and hasattr(X, "obsm")


def _is_networkx(X) -> bool:
    return type(X).__module__.split(".")[0] == "networkx"


OBJECT_KINDS = ("source", "affinity", "anndata", "networkx", "pair", "sparse", "array")


def object_kind(X) -> str:
    """What a Python caller's input object is, one of ``OBJECT_KINDS``: ``'source'`` (None, a path or a dataset
    name: ``resolve`` reads it as every front does), ``'affinity'`` (an ``Affinity``: P itself), ``'anndata'``,
    ``'networkx'`` (a graph), ``'pair'`` (a kNN ``(indices, distances)`` tuple), ``'sparse'`` (a SciPy sparse
    matrix: an adjacency or P) or ``'array'`` (anything else, array-like: features, an adjacency, distances or P
    as the estimator's ``affinity`` and ``metric`` say)."""
    import scipy.sparse as sp

    if X is None or isinstance(X, (str, Path)):
        return "source"
    if isinstance(X, Affinity):
        return "affinity"
    if _is_anndata(X):
        return "anndata"
    if _is_networkx(X):
        return "networkx"
    if isinstance(X, tuple) and len(X) == 2:
        return "pair"
    return "sparse" if sp.issparse(X) else "array"


def what_is(source) -> str:
    """The input in words (for messages)."""
    if source is None or is_dataset(source):
        return "a built-in dataset"
    if isinstance(source, Affinity):
        return "an in-memory affinity"
    return "an affinity store" if is_affinity_store(source) else "a file"


def input_kind(source, affinity: str = "auto", front: str = "python", shown=None) -> str:
    """``'precomputed'``, ``'knn'`` or ``'graph'``: how the run reads ``source`` under ``affinity``; the one
    'auto' rule (module docstring).  ``ValueError`` naming the setting as ``front`` spells it for a kind the
    input cannot take; ``shown``: the input as the user named it."""
    name, shown = front_name(BY_NAME["affinity"], front), shown or source or "grqc"
    store = isinstance(source, Affinity) or (isinstance(source, (str, Path)) and is_affinity_store(source))
    if not store and isinstance(source, (str, Path)) and not is_dataset(source) and Path(source).is_dir():
        raise ValueError(f"{shown} is a directory but not an affinity store (a Zarr group written by scalemb "
                         "affinity)")
    features = not store and source is not None and not is_dataset(source) and \
        isinstance(source, (str, Path)) and looks_like_features(source)
    kind = affinity
    if kind == "auto":
        kind = "precomputed" if store else "knn" if features else "graph"
    if kind == "precomputed" and not store:
        raise ValueError(f"{name}: 'precomputed' needs an affinity store (P itself); {shown} is {what_is(source)}")
    if kind == "knn" and (store or source is None or is_dataset(source)):
        raise ValueError(f"{name}: 'knn' needs a feature matrix ({', '.join(FEATURE_SUFFIXES)}); {shown} is "
                         f"{what_is(source)}")
    return kind


@dataclass(frozen=True)
class InputPlan:
    """A resolved input: ``kind`` ('precomputed', 'knn' or 'graph'), ``source`` (as given) and ``data``, what the
    runner loads (``source`` itself, or for features their kNN ``Affinity``), with ``graph_affinity``."""

    kind: str
    source: object
    data: object
    graph_affinity: str = "coauthorship"

    @property
    def store_path(self):
        """The affinity store the input is, or None."""
        data = self.data
        return Path(data) if isinstance(data, (str, Path)) and is_affinity_store(data) else None

    def load(self) -> tuple:
        """``(Affinity, partitions or None)`` in memory: a store's own row partitions are kept."""
        if self.store_path is not None:
            with phase("reading", f"affinity store {self.store_path}"):
                store = AffinityStore(self.store_path)
                return store.to_affinity(), store.partitions
        return load_affinity(self.data, self.graph_affinity), None

    @contextmanager
    def store(self, n_partitions: int | None = None):
        """Path of an affinity store holding P (what Dask workers read): the input itself if it is a store; an
        edge-list file is streamed into a temporary store (``ingest_edge_list``: the client never holds the edges
        or P); anything else through ``load_affinity``.  Temporary stores are removed on exit; with a remote
        cluster the input must be a store on storage the workers see (write one with ``scalemb affinity``)."""
        if self.store_path is not None:
            yield self.store_path
            return
        tmp = Path(tempfile.mkdtemp(prefix="scalemb-P-"))
        try:
            out = tmp / "P.zarr"
            self.write_store(out, n_partitions)
            yield out
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def write_store(self, out, n_partitions: int | None = None) -> None:
        """Write P into a new affinity store at ``out``: an edge-list file streamed (``ingest_edge_list``: the
        edges and P are never held whole), anything else through ``load_affinity``."""

        if isinstance(self.data, (str, Path)) and Path(self.data).is_file():
            ingest_edge_list(self.data, out, affinity=self.graph_affinity, n_partitions=n_partitions)
        else:
            write_affinity_store(out, load_affinity(self.data, self.graph_affinity), n_partitions=n_partitions)


def plan_of(data, graph_affinity: str = "coauthorship") -> InputPlan:
    """An ``InputPlan`` for what the engine-level runner is handed: a plan as is; anything else read as given
    (a feature file here is read as an edge list: ``resolve`` is where features become P; an object-storage URL
    as its local copy, as in ``resolve``)."""
    if isinstance(data, InputPlan):
        return data
    data = local_input(data)
    store = isinstance(data, Affinity) or (isinstance(data, (str, Path)) and is_affinity_store(data))
    return InputPlan("precomputed" if store else "graph", data, data, graph_affinity)


def resolve(source, spec, front: str = "python", shown=None) -> InputPlan:
    """The plan for ``source`` under ``spec`` (its ``affinity``, ``graph_affinity`` and kNN settings): the kind
    (``input_kind``), kNN settings given for a non-feature input refused, a feature file's kNN P built."""
    if spec.graph_affinity not in GRAPH_AFFINITIES:  # a spec is checked; a plain caller's value is not
        BY_NAME["graph_affinity"].check(spec.graph_affinity, front_name(BY_NAME["graph_affinity"], front))
    if is_url(source):  # an object-storage URL: its local copy (scalemb.io.storage), shown as the URL
        shown, source = shown or source, local_input(source)
    kind = input_kind(source, spec.affinity, front, shown)
    check_knn_settings(kind, spec, front, shown or source)
    if kind != "knn":
        return InputPlan(kind, source, source, spec.graph_affinity)

    with phase("reading", str(source)):
        features = read_features(source)
    affinity = knn_features_affinity(features, spec.perplexity, spec.n_neighbors, spec.metric,
                                     spec.seed, spec.threads, source=str(source))
    return InputPlan(kind, source, affinity, spec.graph_affinity)


def check_knn_settings(kind: str, spec, front: str = "python", shown=None) -> None:
    """``ValueError`` naming the kNN settings ``spec`` gives (not their defaults) when the input is read as
    ``kind`` other than 'knn': they would be silently ignored."""
    given = [front_name(BY_NAME[n], front) for n in KNN_PARAMS if getattr(spec, n) != DEFAULTS[n]]
    if kind != "knn" and given:
        affinity = front_name(BY_NAME["affinity"], front)
        raise ValueError(f"{', '.join(given)}: kNN settings apply to a feature matrix ({affinity} knn); "
                         f"{shown or 'grqc'} is read as {'P' if kind == 'precomputed' else 'a graph'}")


def load_affinity(data=None, graph_affinity: str = "coauthorship") -> Affinity:
    """P of a graph-like input: ``None`` (bundled GrQc), a built-in dataset name, an affinity store (Zarr), an
    edge-list path or an ``Affinity``."""
    if isinstance(data, Affinity):
        return data
    if data is None or is_dataset(data):
        with phase("reading", f"dataset {data or 'grqc'}"):
            return load_dataset(data or "grqc")
    if is_affinity_store(data):
        with phase("reading", f"affinity store {data}"):
            return AffinityStore(data).to_affinity()
    if graph_affinity not in GRAPH_AFFINITIES:
        raise ValueError(f"unknown graph affinity {graph_affinity!r}; choose one of {GRAPH_AFFINITIES}")
    with phase("reading", str(data)):
        graph = read_edge_list(data)
    with phase("graph affinity", f"{graph.n_nodes} nodes, {graph_affinity}"):
        return coauthorship_affinity(graph) if graph_affinity == "coauthorship" else normalized_affinity(graph)


def knn_features_affinity(X, perplexity, n_neighbors, metric: str, seed: int, n_jobs=None, source=None):
    """kNN affinities of a feature array ``X`` (N x d) or feature file: for an array, ``n_neighbors`` defaults to
    ``min(N - 1, 3 perplexity)`` and the perplexity is lowered below it (``fitting_perplexity``).  ``source``:
    the feature file ``X`` was read from, recorded in the provenance (placing new rows reads it)."""

    if not isinstance(perplexity, numbers.Real) or not perplexity >= 1:
        raise ValueError(f"perplexity must be a number >= 1, got {perplexity!r}")
    n = X.shape[0] if hasattr(X, "shape") else None
    perplexity = float(perplexity)
    if n is not None:
        n_neighbors = default_neighbours(n, perplexity, n_neighbors)
        perplexity = fitting_perplexity(perplexity, n_neighbors)
    return knn_affinity(X, perplexity=perplexity, n_neighbors=n_neighbors, metric=metric, random_state=seed,
                        n_jobs=n_jobs, source=source)


def fitting_perplexity(perplexity: float, neighbours: int) -> float:
    """``perplexity`` lowered below the number of neighbours a small input has (openTSNE does the same)."""
    return float(min(float(perplexity), max(1.0, neighbours - 1.0)))


def input_hash(provenance: dict, executor, node_ids) -> str:
    """The input's identity: an affinity store's recorded SHA-256 (in ``provenance``), else the same hash
    computed over the in-process executor's P and ``node_ids``."""
    recorded = provenance.get("content_hash")
    if recorded:
        return str(recorded)
    P = executor.affinity.P
    return content_hash(P.indptr, P.indices, P.data, node_ids)


def input_reference(data):
    """How ``resume`` finds the input again: a dataset name, an absolute path, or ``None`` (in memory)."""
    if data is None:
        return "grqc"
    if isinstance(data, (str, Path)):
        if isinstance(data, str) and data in DATASETS and not Path(data).exists():
            return data
        return str(Path(data).resolve())
    return None


def reopen(provenance: dict, graph_affinity: str = "coauthorship"):
    """``(Affinity or None, source name, features path or None)``: a finished run's input again, from its
    ``provenance`` (what metrics, reports and maps read; a file or store changed since the run is refused:
    ``check_source``, the store's content hash)."""

    check_source(provenance)
    if provenance.get("store"):
        store = provenance["store"]
        affinity = AffinityStore(store).to_affinity()
        recorded = provenance.get("content_hash")
        if recorded and affinity.provenance.get("content_hash") not in (None, recorded):
            raise InputError(store, "the affinity store changed since the run (content hash differs)")
        return affinity, str(store), provenance.get("source") if provenance.get("method") == "knn" else None
    if provenance.get("dataset") in DATASETS:
        return load_dataset(provenance["dataset"]), f"dataset {provenance['dataset']}", None
    source = provenance.get("source")
    if provenance.get("method") == "knn" and source:
        affinity = knn_affinity(source, perplexity=provenance.get("perplexity", PERPLEXITY)
                                if provenance.get("perplexity") != "uniform" else PERPLEXITY,
                                n_neighbors=provenance.get("n_neighbors"), metric=provenance.get("metric", "euclidean"),
                                method="uniform" if provenance.get("perplexity") == "uniform" else "gaussian",
                                random_state=provenance.get("seed", 0))
        return affinity, str(source), source
    if source and not str(source).startswith(("bundled:", "builtin:")):
        kind = provenance.get("affinity", graph_affinity)
        return load_affinity(source, kind if kind in GRAPH_AFFINITIES else graph_affinity), str(source), None
    return None, None, None
