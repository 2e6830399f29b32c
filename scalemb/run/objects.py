"""P from the in-memory objects the estimators take (``scalemb.run.inputs.object_kind``): a square weighted adjacency,
a ``(indices, distances)`` kNN pair (umap-learn's ``precomputed_knn``), a square distance matrix
(``metric='precomputed'``) and feature rows under a callable metric.  Paths, dataset names and stores are
``scalemb.run.inputs.resolve``'s."""
import numbers

import numpy as np
import scipy.sparse as sp
from scipy.spatial.distance import cdist

from ..affinity import coauthorship_affinity, normalized_affinity
from ..affinity.knn import affinity_from_distances, default_neighbours, exact_knn
from ..errors import InputError
from ..io.edges import graph_from_edges
from ..io.nodeids import as_node_ids, check_node_ids
from ..progress import phase
from .inputs import fitting_perplexity


def graph_affinity(A, kind: str, source: str, node_names=None):
    """P from a square weighted adjacency ``A`` (symmetrised by the larger of ``A_ij``, ``A_ji``)."""
    A = sp.coo_matrix(A, dtype=np.float64)
    if A.shape[0] != A.shape[1]:
        raise InputError(source, f"an adjacency matrix must be square, got shape {A.shape}")
    if A.nnz and (not np.all(np.isfinite(A.data)) or A.data.min() < 0):
        raise InputError(source, "adjacency weights must be finite and non-negative")
    keep = A.data > 0
    graph = graph_from_edges(A.row[keep].astype(np.uint64), A.col[keep].astype(np.uint64), A.data[keep], source)
    if graph.n_nodes != A.shape[0]:
        missing = np.setdiff1d(np.arange(A.shape[0]), graph.node_ids)
        where = node_names[missing[0]] if node_names is not None else int(missing[0])
        raise InputError(source, f"{missing.size} of {A.shape[0]} nodes have no edge (e.g. node {where!r}); "
                                 "every node needs a neighbour to be embedded")
    affinity = coauthorship_affinity(graph) if kind == "coauthorship" else normalized_affinity(graph)
    return affinity, graph


def knn_pair_affinity(pair, perplexity, n_jobs):
    """P from a ``(indices, distances)`` kNN pair (umap-learn's ``precomputed_knn``; a self column is dropped)."""

    indices, distances = (np.asarray(a) for a in pair)
    if indices.ndim != 2 or distances.shape != indices.shape:
        raise ValueError(f"a kNN pair needs indices and distances of one shape (N, k); got {indices.shape} and "
                         f"{distances.shape}")
    n, k = indices.shape
    if not np.issubdtype(indices.dtype, np.integer) or (indices.size and (indices.min() < 0 or indices.max() >= n)):
        raise ValueError(f"kNN indices must be integers in 0..{n - 1}")
    if not np.all(np.isfinite(distances)) or (distances.size and distances.min() < 0):
        raise ValueError("kNN distances must be finite and non-negative")
    D = sp.csr_matrix((distances.astype(np.float64).ravel(), indices.astype(np.int64).ravel(),
                       np.arange(0, n * k + 1, k)), shape=(n, n))
    neighbours = k - int(np.all(indices[:, 0] == np.arange(n)))
    return affinity_from_distances(D, fitting_perplexity(perplexity, neighbours), n_jobs=n_jobs,
                                   source="precomputed_knn")


def distance_matrix_affinity(D, perplexity, n_neighbors, n_jobs):
    """kNN affinities of a square distance matrix ``D`` (``metric='precomputed'``, as scikit-learn's TSNE
    takes it): each row's ``n_neighbors`` nearest other points (None: ``min(N - 1, 3 perplexity)``) and their
    distances, calibrated to the perplexity as for features (``knn_pair_affinity``)."""
    n = D.shape[0]
    if D.shape[1] != n:
        raise ValueError(f"metric='precomputed' needs a square distance matrix, got shape {D.shape}")
    if D.min() < 0:
        raise ValueError("metric='precomputed': distances must be non-negative")
    if not isinstance(perplexity, numbers.Real) or not perplexity >= 1:
        raise ValueError(f"perplexity must be a number >= 1, got {perplexity!r}")
    k = default_neighbours(n, float(perplexity), n_neighbors)
    ranked = D.copy()
    np.fill_diagonal(ranked, -1.0)  # each row's own point first, then its k nearest others (stable order)
    indices = np.argsort(ranked, axis=1, kind="stable")[:, :k + 1]
    distances = np.take_along_axis(D, indices, axis=1)
    return knn_pair_affinity((indices, distances), perplexity, n_jobs)


def callable_metric_affinity(X, f, perplexity, n_neighbors, n_jobs):
    """kNN affinities of the feature rows ``X`` under ``metric=f``, a callable ``f(u, v) -> distance`` of two
    feature rows (as scikit-learn's ``NearestNeighbors(metric=f)`` takes it): the exact ``n_neighbors`` nearest
    rows (``N^2`` calls of ``f``, in row blocks; ties to the lower index), calibrated to the perplexity as for a
    named metric.  ``f`` is tried on the first two rows first, so a bad callable fails in one line naming
    ``metric``; a non-finite or negative distance anywhere is refused."""
    name = getattr(f, "__name__", type(f).__name__)
    try:
        first = f(X[0], X[1])
        first = float(first)
    except Exception as exc:  # noqa: BLE001 - the user's function: any failure is reported in one line
        raise ValueError(f"metric: the callable {name} fails on two feature rows ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); it must take two 1-D rows and "
                         "return their distance") from None
    if not np.isfinite(first) or first < 0:
        raise ValueError(f"metric: the callable {name} must return a finite distance >= 0, got {first!r}")
    if not isinstance(perplexity, numbers.Real) or not perplexity >= 1:
        raise ValueError(f"perplexity must be a number >= 1, got {perplexity!r}")
    n = X.shape[0]
    k = default_neighbours(n, float(perplexity), n_neighbors)
    with phase("kNN", f"{n} points x {X.shape[1]} features, {k} neighbours, exact, metric {name}"):
        try:
            indices, distances = exact_knn(X, k, lambda rows, ref: cdist(rows, ref, metric=f))
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"metric: the callable {name} fails ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    bad = ~np.isfinite(distances) | (distances < 0)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"metric: the callable {name} returned {float(distances[i, j])!r} for rows {i} and "
                         f"{indices[i, j]}; distances must be finite and >= 0")
    affinity = knn_pair_affinity((indices, distances), perplexity, n_jobs)
    affinity.provenance.update(method="knn", metric=f"callable:{name}", n_neighbors=int(k), knn="exact")
    return affinity


def networkx_adjacency(G):
    """``(A, names)``: the weighted adjacency of a networkx graph (CSR, ``weight`` attributes, 1 without) in the
    order of ``G.nodes()``, and the node names as node ids (``InputError`` for names that cannot be)."""
    import networkx as nx

    nodes = list(G.nodes())
    names = np.empty(len(nodes), dtype=object)
    names[:] = nodes
    check_node_ids(names, "networkx graph", unit="nodes")  # before <U, which would drop trailing NULs
    try:
        names = as_node_ids(names, "node names")
    except ValueError as exc:  # mixed or other node types
        raise InputError("networkx graph", str(exc)) from None
    return nx.to_scipy_sparse_array(G, nodelist=nodes, weight="weight", format="csr"), names

