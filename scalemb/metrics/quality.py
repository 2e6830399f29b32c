"""Method-independent quality measures of an embedding ``Y`` (N x d, rows are points, space columns first).

Neighbourhood preservation (graph input).  ``NP@deg = mean_i |G(i) ∩ E_deg(i)(i)| / deg(i)`` over the nodes
with at least one edge, ``G(i)`` the graph neighbours of ``i`` (non-zero pattern of the adjacency or of P,
diagonal ignored) and ``E_k(i)`` the ``k`` points most similar to ``i`` in the embedding, in the model's own
kernel order (``Model.similarity``: Euclidean for SNE and t-SNE, ``log(1 + |Δs|²) - |Δt|²`` ascending for
SNEST, the Poincaré distance for CO-SNE, on its ``ranking_coords``).  The Jaccard variant (DRGraph, Zhu et
al. 2020) is ``|G ∩ E| / |G ∪ E| = h / (2 deg - h)``.  A random embedding scores ``E[NP] = deg/(N - 1)``
per node.

Feature input (``X`` N x D, Euclidean; the embedding in the model's order, Euclidean by default), with
``r(i, j)`` the rank of j among i's neighbours in X and ``ρ(i, j)`` in Y (1 = nearest; ties by index):

* kNN precision@k: ``mean_i |N_k^X(i) ∩ N_k^Y(i)| / k``;
* trustworthiness (Venna & Kaski 2001): ``T(k) = 1 - 2/(N k (2N - 3k - 1)) sum_i sum_{j ∈ N_k^Y(i) \\ N_k^X(i)}
  (r(i, j) - k)``; continuity ``C(k)`` the same with X and Y exchanged;
* co-ranking (Lee & Verleysen 2009): ``Q_NX(K) = 1/(K N) sum_i |N_K^X(i) ∩ N_K^Y(i)|``, ``R_NX(K) = ((N - 1)
  Q_NX(K) - K)/(N - 1 - K)`` (0 for a random embedding, 1 for a perfect one) and its area under a
  log-K axis, ``AUC = sum_K R_NX(K)/K / sum_K 1/K`` over ``K = 1..k_max`` (Lee, Peluffo-Ordóñez & Verleysen
  2015);
* with labels: the leave-one-out 1-NN classification error in the embedding.

Every measure is a mean over rows of a per-row value, computed by the row-block kernels of
``scalemb.metrics.ranking`` (O(N d) time per row).  All rows are used up to ``EXACT_MAX_ROWS`` points (exact);
above, ``sample`` rows drawn uniformly (``select_rows``), and the ``Metric`` carries the standard error of the
sampled mean.
"""
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..models import Model, get_model
from .base import Metric, select_rows, summarise
from .ranking import feature_kernel, graph_kernel, map_rows, nearest_kernel, space


def resolve_model(model, n_columns: int, space_dims=None):
    """``(Model or None, space_dims)``: a model name or ``Model`` (``None``: Euclidean over all columns); a
    model with time takes ``n_columns - 1`` space columns unless ``space_dims`` says otherwise."""
    if model is None:
        return None, n_columns if space_dims is None else int(space_dims)
    model = get_model(model) if isinstance(model, str) else model
    if not isinstance(model, Model):
        raise TypeError(f"model must be a name or a scalemb Model, got {type(model).__name__}")
    if space_dims is None:
        space_dims = n_columns - 1 if model.has_time else n_columns
    space_dims = int(space_dims)
    model.check_dims(space_dims, n_columns - space_dims)
    return model, space_dims


def _points(Y, what="Y") -> np.ndarray:
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim == 1:
        Y = Y[:, None]
    if Y.ndim != 2 or Y.shape[0] < 3:
        raise ValueError(f"{what} must be an (N, d) array with N >= 3, got shape {Y.shape}")
    if not np.isfinite(Y).all():
        row = int(np.flatnonzero(~np.isfinite(Y).all(axis=1))[0])
        raise ValueError(f"{what} has non-finite coordinates (row {row})")
    return Y


def _output_space(Y, model, space_dims):
    model, space_dims = resolve_model(model, Y.shape[1], space_dims)
    if model is not None and model.ranking_coords is not None:
        Y = model.ranking_coords(Y)
    return space(Y, None if model is None else model.similarity, space_dims)


def _graph_pattern(graph, n_points: int) -> sp.csr_matrix:
    graph = getattr(graph, "P", graph)  # an Affinity
    if not sp.issparse(graph):
        raise TypeError(f"graph must be a scipy.sparse matrix or an Affinity, got {type(graph).__name__}")
    if graph.shape != (n_points, n_points):
        raise ValueError(f"graph has shape {graph.shape} but the embedding has {n_points} points")
    graph = sp.csr_matrix(graph)
    graph.sum_duplicates()
    graph.eliminate_zeros()
    return graph


def neighbourhood_preservation(graph, Y, model=None, space_dims=None, *, jaccard=False, sample=None, seed=0,
                               n_threads=None) -> Metric:
    """``NP@deg`` (or with ``jaccard`` its Jaccard variant) of embedding ``Y`` for ``graph`` (module docstring);
    ``model`` gives the embedding's similarity order (name or ``Model``)."""
    hits, deg, population = _graph_hits(graph, Y, model, space_dims, sample, seed, n_threads)
    values = hits / (2 * deg - hits) if jaccard else hits / deg
    return summarise("jaccard@deg" if jaccard else "np@deg", values, population)


def _hits(G, Y, model, space_dims, rows, n_threads):
    """For each of ``rows``: (graph neighbours among its deg most similar points, deg)."""
    Zt, sd, similarity = _output_space(Y, model, space_dims)
    kernel = graph_kernel(similarity)
    indptr, indices = G.indptr.astype(np.int64), G.indices.astype(np.int64)
    hits = np.zeros(rows.size, dtype=np.int64)
    deg = np.zeros(rows.size, dtype=np.int64)
    map_rows(lambda b0, b1: kernel(Zt, sd, rows, b0, b1, indptr, indices, hits, deg), rows.size, n_threads)
    return hits, deg


def _graph_hits(graph, Y, model, space_dims, sample, seed, n_threads):
    """Per sampled node with edges: (hits, degree), and the number of nodes with edges."""
    Y = _points(Y)
    n = Y.shape[0]
    G = _graph_pattern(graph, n)
    hits, deg = _hits(G, Y, model, space_dims, select_rows(n, sample, seed), n_threads)
    own = np.diff(G.indptr) - (G.diagonal() != 0)
    keep = deg > 0
    return hits[keep].astype(np.float64), deg[keep].astype(np.float64), int((own > 0).sum())


def node_preservation(graph, Y, model=None, space_dims=None, *, n_threads=None) -> np.ndarray:
    """Per node (all rows, exact): ``|G(i) ∩ E_deg(i)(i)| / deg(i)``, NaN for nodes without edges (for maps that
    colour nodes by how well their neighbourhood is kept)."""
    Y = _points(Y)
    G = _graph_pattern(graph, Y.shape[0])
    hits, deg = _hits(G, Y, model, space_dims, np.arange(Y.shape[0], dtype=np.int64), n_threads)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(deg > 0, hits / np.maximum(deg, 1), np.nan)


def graph_metrics(graph, Y, model=None, space_dims=None, *, sample=None, seed=0, n_threads=None) -> dict:
    """``{"np@deg": ..., "jaccard@deg": ...}`` from one pass over the rows."""
    hits, deg, population = _graph_hits(graph, Y, model, space_dims, sample, seed, n_threads)
    return {"np@deg": summarise("np@deg", hits / deg, population),
            "jaccard@deg": summarise("jaccard@deg", hits / (2 * deg - hits), population)}


@dataclass(frozen=True)
class CorankingCurve:
    """``q_nx[K - 1] = Q_NX(K)`` and ``r_nx[K - 1] = R_NX(K)`` for ``K = 1..k_max``, and ``auc`` (a Metric)."""

    q_nx: np.ndarray
    r_nx: np.ndarray
    auc: Metric

    @property
    def k(self) -> np.ndarray:
        return np.arange(1, self.q_nx.size + 1)


def feature_metrics(X, Y, k: int = 10, k_max: int = 50, model=None, space_dims=None, *, sample=None, seed=0,
                    n_threads=None) -> tuple:
    """One pass over the rows: ``({"trustworthiness@k", "continuity@k", "precision@k", "auc_rnx"}: Metric,
    CorankingCurve)``."""
    X = _points(X, "X")
    Y = _points(Y)
    n = Y.shape[0]
    if X.shape[0] != n:
        raise ValueError(f"X has {X.shape[0]} rows but the embedding has {n}")
    k, k_max = int(k), int(k_max)
    if not 1 <= k < n / 2:
        raise ValueError(f"k must be in [1, N/2) = [1, {n / 2:g}), got {k}")
    if not 1 <= k_max < n - 1:
        raise ValueError(f"k_max must be in [1, N - 1) = [1, {n - 1}), got {k_max}")
    rows = select_rows(n, sample, seed)
    Xt, sdx, similarity_x = space(X)
    Yt, sdy, similarity_y = _output_space(Y, model, space_dims)
    kernel = feature_kernel(similarity_x, similarity_y)
    trust, cont, prec, auc = (np.zeros(rows.size) for _ in range(4))

    def block(b0, b1):
        hist = np.zeros(k_max + 1)
        kernel(Xt, sdx, Yt, sdy, rows, b0, b1, k, k_max, trust, cont, prec, auc, hist)
        return hist

    hist = np.sum(map_rows(block, rows.size, n_threads), axis=0)
    scale = 2.0 / (k * (2.0 * n - 3.0 * k - 1.0))
    K = np.arange(1, k_max + 1)
    q_nx = np.cumsum(hist[1:]) / (K * rows.size)
    r_nx = ((n - 1) * q_nx - K) / (n - 1 - K)
    auc_metric = summarise("auc_rnx", auc, n)
    metrics = {f"trustworthiness@{k}": summarise(f"trustworthiness@{k}", 1.0 - scale * trust, n),
               f"continuity@{k}": summarise(f"continuity@{k}", 1.0 - scale * cont, n),
               f"precision@{k}": summarise(f"precision@{k}", prec, n),
               "auc_rnx": auc_metric}
    return metrics, CorankingCurve(q_nx, r_nx, auc_metric)


def trustworthiness(X, Y, k: int = 10, model=None, space_dims=None, *, sample=None, seed=0,
                    n_threads=None) -> Metric:
    """Trustworthiness ``T(k)`` of embedding ``Y`` for features ``X`` (module docstring)."""
    return feature_metrics(X, Y, k, 1, model, space_dims, sample=sample, seed=seed,
                           n_threads=n_threads)[0][f"trustworthiness@{k}"]


def continuity(X, Y, k: int = 10, model=None, space_dims=None, *, sample=None, seed=0, n_threads=None) -> Metric:
    """Continuity ``C(k)``: trustworthiness with the roles of X and Y exchanged."""
    return feature_metrics(X, Y, k, 1, model, space_dims, sample=sample, seed=seed,
                           n_threads=n_threads)[0][f"continuity@{k}"]


def knn_precision(X, Y, k: int = 10, model=None, space_dims=None, *, sample=None, seed=0,
                  n_threads=None) -> Metric:
    """kNN precision@k: the fraction of each point's k nearest input neighbours among its k nearest in Y."""
    return feature_metrics(X, Y, k, 1, model, space_dims, sample=sample, seed=seed,
                           n_threads=n_threads)[0][f"precision@{k}"]


def coranking_curve(X, Y, k_max: int = 50, model=None, space_dims=None, *, sample=None, seed=0,
                    n_threads=None) -> CorankingCurve:
    """``Q_NX(K)``, ``R_NX(K)`` for ``K = 1..k_max`` and the AUC of R_NX on a log-K axis."""
    Y = _points(Y)
    return feature_metrics(X, Y, 1, k_max, model, space_dims, sample=sample, seed=seed, n_threads=n_threads)[1]


def one_nn_error(Y, labels, model=None, space_dims=None, *, sample=None, seed=0, n_threads=None) -> Metric:
    """Leave-one-out 1-NN classification error of ``labels`` (any comparable values) in the embedding."""
    Y = _points(Y)
    labels = np.asarray(labels).ravel()
    if labels.size != Y.shape[0]:
        raise ValueError(f"{labels.size} labels for {Y.shape[0]} points")
    codes = np.unique(labels, return_inverse=True)[1].ravel()
    rows = select_rows(Y.shape[0], sample, seed)
    Zt, sd, similarity = _output_space(Y, model, space_dims)
    kernel = nearest_kernel(similarity)
    nearest = np.zeros(rows.size, dtype=np.int64)
    map_rows(lambda b0, b1: kernel(Zt, sd, rows, b0, b1, nearest), rows.size, n_threads)
    return summarise("1nn_error", (codes[nearest] != codes[rows]).astype(np.float64), Y.shape[0])
