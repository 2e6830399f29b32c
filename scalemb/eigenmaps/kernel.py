"""Kernel eigenmaps (Brand 2003): a continuous map ``y(x) = V^T z(x)`` from a small generalised eigenproblem.

Graph.  ``W`` from the ``n_neighbors`` nearest neighbours of every point (``scalemb.affinity.knn.knn_graph``:
NN-descent above its exact-search size), weights the inverse distance ``w_ij = 1/|x_i - x_j|`` (the paper's
choice, section 3: the similarity that reconstructs flat manifolds exactly), symmetrised by the maximum and
scaled so that the largest is 1; ``D = diag(W 1)``.  ``regularize = r`` adds ``r I`` to W (and D): the paper's
``W + I``, "more isometric" when neighbourhoods are alike.

Basis.  Gaussian kernels of one bandwidth ``sigma`` on ``n_centres`` landmark points drawn at random from the
data; ``p(k | x)`` their posteriors; the kernel-weighted local homogeneous coordinates
``z_k(x) = p(k | x) [(x - c_k) / sigma; 1]`` stacked into ``z(x)`` of length ``n_centres (D + 1)`` (equations
14-15; the optional local projections are the identity here).

Eigenproblem (equation 8).  ``(Z W Z^T) v = mu (Z D Z^T) v``, ``Z = [z(x_1) ... z(x_N)]``, largest ``mu``,
solved densely (``scipy.linalg.eigh``, ``Z D Z^T`` plus ``1e-10`` of its mean diagonal for rank deficiency):
the problem is ``n_centres (D + 1)`` square whatever N is; forming it costs ``O(N m^2)`` with the sparse W.

The first eigenvector should be the uniform one (the homogeneous coordinates sum to 1 over the kernels, so a
constant map is in the span, with ``mu = 1``), but numerically it is not isolated; the paper's corrections:

- ``raw``: drop ``v_1``; ``y(x) = [v_2 .. v_{d+1}]^T z(x)``.
- ``affine``: append a constant 1 to ``z`` (the uniform vector is then exactly in the span), solve, drop the top
  eigenvector.
- ``reweighted`` (the paper's recommended one, equation 18): divide by the first map,
  ``y(x) = [v_2 .. v_{d+1}]^T z(x) / (v_1^T z(x))``, whose first coordinate is then uniform by construction.
- ``stochastic``: reweight the basis per point, ``z~(x) = z(x) / (v_1^T z(x))``, re-solve equation 8 with
  ``z~`` (equation 12: now the uniform vector is exactly ``v~_1^T z~``, the problem stochastic) and drop its top
  eigenvector: ``y(x) = [v~_2 .. v~_{d+1}]^T z~(x)``.

(The extraction of the paper garbles equations 12 and 18; this is our reading of the text around them.)
Every correction gives a map defined on the whole ambient space: ``transform`` applies it to new points.
"""
import time

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from ..affinity.knn import knn_graph
from ..params import BY_NAME
from ..store.results import EmbeddingResult

CORRECTIONS = ("reweighted", "affine", "stochastic", "raw")


def inverse_distance_graph(X: np.ndarray, n_neighbors: int = 12, random_state: int | None = 0,
                           n_jobs: int | None = None) -> sp.csr_matrix:
    """Symmetric kNN graph with weights ``1/distance`` scaled to a maximum of 1 (zero distances: the largest)."""

    indices, distances = knn_graph(X, n_neighbors=n_neighbors, random_state=random_state, n_jobs=n_jobs)
    n = X.shape[0]
    positive = distances[distances > 0]
    floor = positive.min() if positive.size else 1.0
    weights = 1.0 / np.maximum(distances, floor)
    W = sp.csr_matrix((weights.ravel(), indices.ravel(), np.arange(0, n * n_neighbors + 1, n_neighbors)),
                      shape=(n, n))
    W = W.maximum(W.T).tocsr()
    W.data /= W.data.max()
    return W


def kernel_features(X: np.ndarray, centres: np.ndarray, bandwidth: float) -> np.ndarray:
    """``Z^T``: ``(N, K (D + 1))`` rows ``z(x) = [p(k | x) ((x - c_k) / sigma, 1)]_k``, posteriors of equal-width
    Gaussians on the ``K`` centres (computed in log space: far points keep their nearest kernel)."""
    X = np.asarray(X, dtype=np.float64)
    n, dim = X.shape
    sq = (np.sum(X ** 2, axis=1)[:, None] - 2.0 * X @ centres.T + np.sum(centres ** 2, axis=1)[None, :])
    logits = -np.maximum(sq, 0.0) / (2.0 * bandwidth ** 2)
    logits -= logits.max(axis=1, keepdims=True)
    post = np.exp(logits)
    post /= post.sum(axis=1, keepdims=True)
    local = np.empty((n, centres.shape[0], dim + 1))
    local[:, :, :dim] = (X[:, None, :] - centres[None, :, :]) / bandwidth
    local[:, :, dim] = 1.0
    return (local * post[:, :, None]).reshape(n, -1)


def _top_eigenvectors(Zt: np.ndarray, W: sp.csr_matrix, degrees: np.ndarray, count: int):
    """Eigenpairs of ``(Z W Z^T) v = mu (Z D Z^T) v`` with the ``count`` largest ``mu`` (decreasing)."""
    A = Zt.T @ (W @ Zt)
    B = Zt.T @ (Zt * degrees[:, None])
    A = 0.5 * (A + A.T)
    B = 0.5 * (B + B.T) + 1e-10 * np.trace(B) / B.shape[0] * np.eye(B.shape[0])
    m = A.shape[0]
    values, vectors = scipy.linalg.eigh(A, B, subset_by_index=[m - count, m - 1])
    return values[::-1], vectors[:, ::-1]


class KernelEigenmap:
    """Kernel eigenmap of feature rows: a continuous map to ``n_components`` dimensions (module docstring).

    Parameters: ``n_components``, ``n_centres`` (landmark kernels, drawn from the data with ``random_state``),
    ``n_neighbors`` (of the graph W), ``bandwidth`` (kernel sigma; default: the median distance from a centre to
    its nearest other centre), ``correction`` (one of ``CORRECTIONS``), ``regularize`` (mass on W's diagonal),
    ``random_state`` (None: 0; ``seed`` is its deprecated alias), ``n_jobs`` (NN-descent threads), ``centres``
    (given kernel centres, ``K x D``: overrides ``n_centres`` and the draw).
    After ``fit(X)``: ``embedding_`` (the map at the training points), ``centres_``, ``bandwidth_``,
    ``eigenvalues_``, ``vectors_`` (the map's coefficients), ``first_`` (``v_1`` of the reweighting);
    ``transform(X_new)`` applies the stored map.
    """

    def __init__(self, n_components: int = 2, n_centres: int = 64, n_neighbors: int = 12, bandwidth=None,
                 correction: str = "reweighted", regularize: float = 0.0, random_state: int | None = None,
                 n_jobs: int | None = None, centres=None, seed: int | None = None):
        self.n_components = n_components
        self.n_centres = n_centres
        self.n_neighbors = n_neighbors
        self.bandwidth = bandwidth
        self.correction = correction
        self.regularize = regularize
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.centres = centres
        self.seed = seed

    def _seed(self) -> int:
        """``random_state`` (or the deprecated ``seed``, FutureWarning) checked by its table row; None: 0."""
        import warnings

        value = self.random_state
        if self.seed is not None:
            if self.random_state is not None:
                raise ValueError("seed and random_state are one setting; give random_state only")
            warnings.warn("seed is a deprecated alias of random_state; use random_state", FutureWarning,
                          stacklevel=3)
            value = self.seed
        value = BY_NAME["random_state"].check(value, "random_state")
        return 0 if value is None else int(value)

    def _check(self, X):
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 3 or X.shape[1] < 1:
            raise ValueError(f"X must be a 2-D array with at least 3 rows, got shape {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains NaN or infinite values")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"unknown correction {self.correction!r}; choose one of {', '.join(CORRECTIONS)}")
        if self.centres is None and not 1 <= int(self.n_centres) <= X.shape[0]:
            raise ValueError(f"n_centres must be in 1..{X.shape[0]}, got {self.n_centres}")
        n_centres = int(self.n_centres) if self.centres is None else len(self.centres)
        if int(self.n_components) < 1 or int(self.n_components) >= n_centres * (X.shape[1] + 1):
            raise ValueError(f"n_components must be in 1..{n_centres * (X.shape[1] + 1) - 1}")
        if self.regularize < 0:
            raise ValueError(f"regularize must be >= 0, got {self.regularize}")
        return X

    def _centres(self, X, rng) -> np.ndarray:
        """The given ``centres`` (checked), else ``n_centres`` rows of ``X`` drawn with ``rng``, in row order."""
        if self.centres is None:
            return X[np.sort(rng.choice(X.shape[0], int(self.n_centres), replace=False))]
        centres = np.asarray(self.centres, dtype=np.float64)
        if centres.ndim != 2 or centres.shape[1] != X.shape[1] or not len(centres):
            raise ValueError(f"centres must be (K, {X.shape[1]}), got shape {centres.shape}")
        return centres

    def _bandwidth(self, X) -> float:
        """``bandwidth``, else the median distance from a centre to its nearest other centre (one centre: the
        data's root-mean-square distance from their mean)."""
        if self.bandwidth is not None:
            return float(self.bandwidth)
        if self.centres_.shape[0] > 1:
            d2 = np.sum((self.centres_[:, None, :] - self.centres_[None, :, :]) ** 2, axis=2)
            np.fill_diagonal(d2, np.inf)
            return float(np.median(np.sqrt(d2.min(axis=1))))
        return float(np.sqrt(np.mean(np.sum((X - X.mean(axis=0)) ** 2, axis=1))))

    def fit(self, X, graph: sp.spmatrix | None = None) -> "KernelEigenmap":
        """Fit the map on ``X`` (``N x D``); ``graph``: a precomputed symmetric W (default: inverse-distance kNN)."""
        X = self._check(X)
        seed = self._seed()
        start = time.perf_counter()
        n, k = X.shape[0], int(self.n_components)
        self.centres_ = self._centres(X, np.random.default_rng(seed))
        self.bandwidth_ = self._bandwidth(X)
        if not self.bandwidth_ > 0:
            raise ValueError("the kernel bandwidth must be > 0 (duplicate centres? pass bandwidth=)")
        self.seed_ = seed
        W = (inverse_distance_graph(X, int(self.n_neighbors), random_state=seed, n_jobs=self.n_jobs)
             if graph is None else sp.csr_matrix(graph, dtype=np.float64))
        if W.shape != (n, n):
            raise ValueError(f"graph must be {n} x {n}, got {W.shape}")
        if self.regularize:
            W = (W + self.regularize * sp.eye(n)).tocsr()
        degrees = np.asarray(W.sum(axis=1)).ravel()
        Zt = kernel_features(X, self.centres_, self.bandwidth_)
        self.first_ = None
        if self.correction == "affine":
            Zt = np.hstack([Zt, np.ones((n, 1))])
        values, vectors = _top_eigenvectors(Zt, W, degrees, k + 1)
        if self.correction in ("reweighted", "stochastic"):
            first = Zt @ vectors[:, 0]
            self.first_ = vectors[:, 0] * (1.0 if np.median(first) >= 0 else -1.0)  # v_1^T z > 0 on the data
        if self.correction == "stochastic":
            Zt = Zt / (Zt @ self.first_)[:, None]
            values, vectors = _top_eigenvectors(Zt, W, degrees, k + 1)
        self.eigenvalues_ = values
        self.vectors_ = vectors[:, 1:]
        self.embedding_ = self._apply(X)
        self.wall_time_ = time.perf_counter() - start
        return self

    def map_params(self) -> dict:
        """The fitted map as JSON values (stored in a result's ``optimizer["map"]``)."""
        return {"centres": self.centres_.tolist(), "bandwidth": self.bandwidth_, "correction": self.correction,
                "vectors": self.vectors_.tolist(), "first": None if self.first_ is None else self.first_.tolist()}

    def to_result(self, source=None):
        """An ``EmbeddingResult`` (``save`` writes the embed-run store) holding the map in ``optimizer``."""

        params = {**{k: getattr(self, k) for k in ("n_centres", "n_neighbors", "bandwidth", "regularize")},
                  "seed": self.seed_}
        optimizer = {"name": "kernel-eigenmap", **params, "eigenvalues": [float(v) for v in self.eigenvalues_],
                     "map": self.map_params()}
        n = self.embedding_.shape[0]
        return EmbeddingResult(np.ascontiguousarray(self.embedding_), np.arange(n, dtype=np.int64), float("nan"),
                               np.zeros(0), "kernel-eigenmap", int(self.n_components), 0, 0, int(self.seed_),
                               wall_time=self.wall_time_, optimizer=optimizer,
                               provenance={"source": None if source is None else str(source), "method": "features"})

    @classmethod
    def from_result(cls, result) -> "KernelEigenmap":
        """The fitted map stored in a ``kernel-eigenmap`` result (``EmbeddingResult`` or its store path), ready
        for ``transform``."""

        if not isinstance(result, EmbeddingResult):
            result = EmbeddingResult.load(result)
        if result.model != "kernel-eigenmap" or "map" not in result.optimizer:
            raise ValueError(f"not a kernel-eigenmap result (model {result.model!r})")
        stored, options = result.optimizer["map"], result.optimizer
        model = cls(result.space_dims, n_centres=options.get("n_centres", 64),
                    n_neighbors=options.get("n_neighbors", 12),
                    bandwidth=options.get("bandwidth"), correction=stored["correction"],
                    regularize=options.get("regularize", 0.0), random_state=result.seed)
        model.seed_ = int(result.seed)
        model.centres_ = np.asarray(stored["centres"], dtype=np.float64)
        model.bandwidth_ = float(stored["bandwidth"])
        model.vectors_ = np.asarray(stored["vectors"], dtype=np.float64)
        model.first_ = None if stored["first"] is None else np.asarray(stored["first"], dtype=np.float64)
        model.eigenvalues_ = np.asarray(options.get("eigenvalues", []), dtype=np.float64)
        model.embedding_ = np.asarray(result.embedding)
        return model

    def _apply(self, X: np.ndarray) -> np.ndarray:
        Zt = kernel_features(X, self.centres_, self.bandwidth_)
        if self.correction == "affine":
            Zt = np.hstack([Zt, np.ones((X.shape[0], 1))])
        if self.first_ is not None:
            Zt = Zt / (Zt @ self.first_)[:, None]
        return Zt @ self.vectors_

    def fit_transform(self, X, graph=None) -> np.ndarray:
        return self.fit(X, graph).embedding_

    def transform(self, X_new) -> np.ndarray:
        """The stored continuous map at new points ``X_new`` (``M x D``, the training width): ``(M, k)``."""
        if not hasattr(self, "vectors_"):
            raise ValueError("fit the KernelEigenmap before transform")
        X_new = np.ascontiguousarray(X_new, dtype=np.float64)
        if X_new.ndim != 2 or X_new.shape[1] != self.centres_.shape[1]:
            raise ValueError(f"X_new must have {self.centres_.shape[1]} columns (the training width), "
                             f"got shape {X_new.shape}")
        if not np.all(np.isfinite(X_new)):
            raise ValueError("X_new contains NaN or infinite values")
        return self._apply(X_new)
