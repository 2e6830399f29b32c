"""Input affinities for points in the Poincaré ball (CO-SNE, Guo, Guo & Yu 2022) and synthetic data.

* ``hyperbolic_affinity``: the hyperbolic normal similarities ``p_j|i ∝ exp(-β_i d_B(x_i, x_j)²)`` on the
  ``k`` nearest neighbours in the Poincaré distance ``d_B(x, z) = arcosh(1 + 2|x - z|²/((1 - |x|²)(1 - |z|²)))``,
  ``β_i`` calibrated to the perplexity and ``P = (P_cond + P_condᵀ)/(2N)`` exactly as for Euclidean kNN
  (``knn.conditional_affinities``, same bisection); neighbours by brute force up to ``knn.EXACT_MAX_POINTS``
  points, by NN-descent with the Poincaré distance as a numba metric above.  ``radii = |x_i|`` (CO-SNE's norm
  loss targets).
* ``wrapped_normal_clusters``: the paper's synthetic data: wrapped normal clusters ``x = μ ⊕ exp_0(v)``,
  ``v ~ N(0, σ² I)`` (the tangent sample at the origin, transported to ``μ``; ``⊕`` Möbius addition).
"""
import numpy as np
import scipy.sparse as sp
from numba import njit

from ..methods import AffinityMetric
from .affinity import Affinity
from .knn import EXACT_MAX_POINTS, PERPLEXITY, conditional_affinities, default_neighbours, exact_knn, joint_affinity

# the paper's five cluster means in the 5-D ball (sec. 4.1)
PAPER_MEANS = np.array([[0, 0, 0, 0, 0], [0.1, 0, 0, 0, 0], [0, -0.2, 0, 0, 0], [0, 0, 0.9, 0, 0],
                        [0, 0, 0, -0.9, 0]], dtype=np.float64)


@njit(fastmath=False)
def poincare_distance(x, z):
    """``d_B(x, z)`` for two points (1-D arrays) inside the unit ball (a pynndescent metric)."""
    d2 = 0.0
    nx = 0.0
    nz = 0.0
    for k in range(x.shape[0]):
        d2 += (x[k] - z[k]) ** 2
        nx += x[k] * x[k]
        nz += z[k] * z[k]
    delta = 2.0 * d2 / ((1.0 - nx) * (1.0 - nz))
    return np.log1p(delta + np.sqrt(delta * (delta + 2.0)))


def poincare_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """All Poincaré distances between the rows of ``A`` and of ``B`` (dense, ``len(A) x len(B)``)."""
    na = np.sum(A * A, axis=1)
    nb = np.sum(B * B, axis=1)
    d2 = np.maximum(na[:, None] + nb[None, :] - 2.0 * A @ B.T, 0.0)
    delta = 2.0 * d2 / np.outer(1.0 - na, 1.0 - nb)
    return np.log1p(delta + np.sqrt(delta * (delta + 2.0)))


def check_ball(X, source: str = "X") -> np.ndarray:
    """``X`` as an (N, d) float64 array of finite points strictly inside the unit ball, else ValueError naming
    the first bad row."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1:
        raise ValueError(f"{source} must be a 2-D array with at least 2 rows and 1 column, got shape {X.shape}")
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        raise ValueError(f"{source} has a non-finite value in row {int(np.flatnonzero(~finite)[0])} (0-based)")
    norms = np.linalg.norm(X, axis=1)
    if norms.max() >= 1.0:
        i = int(np.argmax(norms >= 1.0))
        raise ValueError(f"{source}: row {i} (0-based) has norm {norms[i]:.6g}; Poincaré-ball points must lie "
                         "strictly inside the unit ball (norm < 1)")
    return X


def hyperbolic_knn(X, n_neighbors: int = 15, random_state: int | None = 0, n_jobs: int | None = None,
                   algorithm: str = "auto"):
    """``(indices, distances)`` of the ``n_neighbors`` nearest rows of ``X`` in the Poincaré distance, self
    excluded, rows sorted by increasing distance (exact up to ``EXACT_MAX_POINTS`` points or with
    ``algorithm="exact"``, NN-descent above)."""
    X = check_ball(X)
    n = X.shape[0]
    k = int(n_neighbors)
    if not 1 <= k < n:
        raise ValueError(f"n_neighbors must be in 1..{n - 1} (fewer than the {n} points), got {n_neighbors}")
    if algorithm == "exact" or (algorithm == "auto" and n <= EXACT_MAX_POINTS):
        return exact_knn(X, k, poincare_distances)
    from pynndescent import NNDescent

    index = NNDescent(X, metric=poincare_distance, n_neighbors=k + 1, random_state=random_state, n_jobs=n_jobs,
                      verbose=False)
    indices, distances = index.neighbor_graph
    keep = indices != np.arange(n)[:, None]
    keep[keep.all(axis=1), -1] = False
    return indices[keep].reshape(-1, k).astype(np.int64), distances[keep].reshape(-1, k).astype(np.float64)


def hyperbolic_affinity(X, perplexity: float = PERPLEXITY, n_neighbors: int | None = None, random_state: int | None = 0,
                        n_jobs: int | None = None, source=None) -> Affinity:
    """CO-SNE's input affinity of points ``X`` (N x d, inside the unit ball), with ``radii = |x_i|`` (module
    docstring); ``n_neighbors`` defaults to ``min(N - 1, 3 perplexity)`` as for Euclidean kNN."""
    X = check_ball(X, "X" if source is None else str(source))
    n = X.shape[0]
    if n_neighbors is None:
        n_neighbors = default_neighbours(n, perplexity)
    if not 1.0 <= perplexity < n_neighbors:
        raise ValueError(f"perplexity ({perplexity}) must be at least 1 and below n_neighbors ({n_neighbors})")
    indices, distances = hyperbolic_knn(X, n_neighbors, random_state, n_jobs)
    k = indices.shape[1]
    D = sp.csr_matrix((distances.ravel(), indices.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    affinity = joint_affinity(conditional_affinities(D, perplexity, "gaussian", n_jobs),
                              {"source": None if source is None else str(source), "method": "knn",
                               "metric": "poincare", "n_neighbors": int(k), "perplexity": float(perplexity),
                               "knn": "exact" if n <= EXACT_MAX_POINTS else "nndescent", "seed": random_state})
    affinity.radii = np.linalg.norm(X, axis=1)
    return affinity


def mobius_add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Möbius addition ``x ⊕ y`` of rows (curvature -1)."""
    xy = np.sum(x * y, axis=-1, keepdims=True)
    nx = np.sum(x * x, axis=-1, keepdims=True)
    ny = np.sum(y * y, axis=-1, keepdims=True)
    return ((1 + 2 * xy + ny) * x + (1 - nx) * y) / (1 + 2 * xy + nx * ny)


def wrapped_normal_clusters(means=PAPER_MEANS, n_per_cluster: int = 20, sigma: float = 0.25, seed: int = 0):
    """``(X, labels)``: ``n_per_cluster`` points around each mean (rows of ``means``, inside the ball), each
    ``μ ⊕ exp_0(v)``, ``exp_0(v) = tanh(|v|) v/|v|``, ``v ~ N(0, σ² I)`` (module docstring); points are
    clipped to norm ``1 - 1e-6`` at most (a draw can round to the boundary near a mean at 0.9)."""
    means = check_ball(np.asarray(means, dtype=np.float64), "means")
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(means.shape[0]), n_per_cluster)
    v = rng.normal(scale=sigma, size=(labels.size, means.shape[1]))
    nv = np.linalg.norm(v, axis=1, keepdims=True)
    X = mobius_add(means[labels], np.tanh(nv) * v / np.maximum(nv, 1e-300))
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    X *= np.minimum(1.0, (1 - 1e-6) / norms)
    return X, labels


def _affinity(X, labels=None, *, perplexity, n_neighbors, random_state=0, n_jobs=None, source=None, **options):
    if labels is not None or options:
        raise ValueError("metric 'poincare' takes no labels and no metric settings")
    return hyperbolic_affinity(X, perplexity=perplexity, n_neighbors=n_neighbors, random_state=random_state,
                               n_jobs=n_jobs, source=source)


# placing new rows of a Poincaré-ball run is not offered (neighbours=None): its P' would need the new rows' radii
POINCARE = AffinityMetric("poincare", "points in the Poincaré ball, hyperbolic distance; the norms are CO-SNE's "
                          "target radii", learns_from_labels=False, affinity=_affinity)
