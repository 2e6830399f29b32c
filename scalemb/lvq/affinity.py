"""Supervised affinities: perplexity-calibrated neighbour affinities under a learned LiRaM LVQ dissimilarity.

The paper's Eq. (5) dissimilarity ``d(x_i, x) = (x_i - x)^T Lambda_j (x_i - x)`` (``j`` the winner of ``x_i``) is
asymmetric; we use its symmetrisation ``s(i, k) = (d(x_i, x_k) + d(x_k, x_i)) / 2`` and feed ``sqrt(s)`` as the
distance of the usual Gaussian-perplexity calibration (``scalemb.affinity.knn``), giving SNE+ / t-SNE+ / SNEST+
inputs.  ``d(x_i, .)`` is a squared Euclidean distance after the per-point transform ``x -> Omega_r x`` (``r`` the
matrix of ``x_i``'s winner), so neighbours are found in the ``M``-dimensional projected spaces:

* ``exact`` (default up to ``EXACT_MAX_POINTS`` points): all ``s(i, k)`` by row blocks, ``K`` smallest per row;
* ``tree``: for every matrix ``r`` a k-d tree on ``X Omega_r^T``; each point queries its own matrix's tree for
  ``candidates * K`` nearest points under ``d(x_i, .)``; every such pair is also offered to the other end (so
  ``k`` sees ``i`` when ``i`` found ``k``), ``s`` is computed exactly on these candidate pairs and each row keeps
  its ``K`` smallest.  O(N log N) per matrix for small ``M``; approximate only in that a neighbour under ``s``
  that is near under neither one-sided dissimilarity can be missed.
"""
import numpy as np
import scipy.sparse as sp

from ..affinity.affinity import row_partition
from ..affinity.knn import (EXACT_MAX_POINTS, PERPLEXITY, conditional_affinities, default_neighbours, joint_affinity,
                            k_smallest)
from .estimator import LiRaMLVQ, _check_X, check_labelled, squared_distances

_BLOCK_ENTRIES = 1 << 22


def _projections(model: LiRaMLVQ, X: np.ndarray):
    """``(r, Z)``: the matrix of every point's winner and ``Z[q] = X Omega_q^T`` for every matrix ``q``."""
    r = model.omega_of_[model.winners(X)]
    Z = np.einsum("nd,qmd->qnm", X, model.omegas_)
    return r, np.ascontiguousarray(Z)


def _exact(r, Z, k):
    """Every row's ``k`` nearest other rows under the symmetrised learned dissimilarity (``_learned_knn``)."""
    return _learned_knn(r, Z, r, Z, k, exclude_self=True)


def _learned_knn(r_new, Z_new, r_ref, Z_ref, k, exclude_self=False):
    """``(indices, s)`` of the ``k`` nearest reference rows of every new row, ``s(x, x_k) = (d(x, x_k) +
    d(x_k, x)) / 2`` with ``d(a, .)`` under the matrix of ``a``'s winner (``r``: winners' matrices, ``Z[q]``: the
    rows projected by matrix ``q``), exact by row blocks of the new rows; ``exclude_self``: new rows are the
    reference rows, each without itself."""
    m, n = Z_new.shape[1], Z_ref.shape[1]
    indices = np.empty((m, k), dtype=np.int64)
    values = np.empty((m, k))
    for r0, r1 in row_partition(m, -(-m * n // _BLOCK_ENTRIES)):
        S = np.empty((r1 - r0, n))
        for q in np.unique(r_new[r0:r1]):  # forward d(x_i, x_k): row i's matrix
            rows = np.flatnonzero(r_new[r0:r1] == q)
            S[rows] = squared_distances(Z_new[q, r0 + rows], Z_ref[q])
        for q in np.unique(r_ref):  # reverse d(x_k, x_i): column k's matrix
            cols = np.flatnonzero(r_ref == q)
            S[:, cols] += squared_distances(Z_new[q, r0:r1], Z_ref[q, cols])
        S *= 0.5
        if exclude_self:
            S[np.arange(r1 - r0), np.arange(r0, r1)] = np.inf
        indices[r0:r1], values[r0:r1] = k_smallest(S, k)
    return indices, values


def _pair_values(r, Z, a, b):
    """``s(a, b)`` for index arrays ``a``, ``b``."""
    fwd = ((Z[r[a], a] - Z[r[a], b]) ** 2).sum(axis=1)
    rev = ((Z[r[b], b] - Z[r[b], a]) ** 2).sum(axis=1)
    return 0.5 * (fwd + rev)


def _tree(r, Z, k, candidates):
    from scipy.spatial import cKDTree

    n = Z.shape[1]
    c = min(n, candidates * k + 1)
    found = np.empty((n, c), dtype=np.int64)
    for q in np.unique(r):
        rows = np.flatnonzero(r == q)
        found[rows] = cKDTree(Z[q]).query(Z[q, rows], k=c)[1]
    a = np.repeat(np.arange(n), c)
    b = found.ravel()
    a, b = np.concatenate([a, b]), np.concatenate([b, a])
    keep = a != b
    pairs = np.unique(a[keep] * n + b[keep])
    a, b = pairs // n, pairs % n
    s = _pair_values(r, Z, a, b)
    order = np.lexsort((b, s, a))
    a, b, s = a[order], b[order], s[order]
    start = np.searchsorted(a, np.arange(n))
    take = start[:, None] + np.arange(k)[None, :]
    counts = np.diff(np.append(start, a.size))
    if counts.min() < k:
        raise RuntimeError("fewer candidates than neighbours for some point; raise candidates")
    return b[take], s[take]


def neighbours_against(model: LiRaMLVQ, X_new, X_ref, n_neighbors: int):
    """``(indices, s)``: the ``n_neighbors`` nearest rows of ``X_ref`` of every row of ``X_new`` under the same
    symmetrised learned dissimilarity ``s(x, x_k) = (d(x, x_k) + d(x_k, x)) / 2`` (``d(a, .)`` under the matrix
    of ``a``'s winner), rows sorted by increasing ``s`` (ties: lower index).  Exact, by row blocks of ``X_new``:
    what placing new points into a map built on ``X_ref``'s supervised affinities uses (``scalemb.placement``),
    so a new point's neighbours are those it would have had as a row of the map's affinity."""
    X_new = _check_X(X_new, model.n_features_in_, "new rows")
    X_ref = _check_X(X_ref, model.n_features_in_, "reference rows")
    n_ref = X_ref.shape[0]
    k = int(n_neighbors)
    if not 1 <= k <= n_ref:
        raise ValueError(f"n_neighbors must be in 1..{n_ref} (the reference rows), got {n_neighbors}")
    r_new, Z_new = _projections(model, X_new)
    r_ref, Z_ref = _projections(model, X_ref)
    return _learned_knn(r_new, Z_new, r_ref, Z_ref, k)


def learned_neighbours(model: LiRaMLVQ, X, n_neighbors: int, algorithm: str = "auto", candidates: int = 2):
    """``(indices, s)`` of the ``n_neighbors`` nearest points of every row under the symmetrised learned
    dissimilarity ``s`` (self excluded, rows sorted by increasing ``s``); see the module docstring."""
    X = _check_X(X, model.n_features_in_)
    n = X.shape[0]
    k = int(n_neighbors)
    if not 1 <= k < n:
        raise ValueError(f"n_neighbors must be in 1..{n - 1} (fewer than the {n} points), got {n_neighbors}")
    if algorithm not in ("auto", "exact", "tree"):
        raise ValueError(f"algorithm must be 'auto', 'exact' or 'tree', got {algorithm!r}")
    r, Z = _projections(model, X)
    if algorithm == "exact" or (algorithm == "auto" and n <= EXACT_MAX_POINTS):
        return _exact(r, Z, k)
    return _tree(r, Z, k, int(candidates))


def supervised_affinity(X, y=None, perplexity: float = PERPLEXITY, n_neighbors: int | None = None, model=None,
                        algorithm: str = "auto", n_jobs: int | None = None, source=None, **lvq_params):
    """SNE+ input: ``P = (P_cond + P_cond^T) / (2N)`` with ``P_cond`` calibrated to ``perplexity`` on the
    ``n_neighbors`` (default ``min(N - 1, 3 perplexity)``) nearest neighbours under the learned dissimilarity.

    The metric comes from ``model`` (a fitted ``LiRaMLVQ``, then ``y`` is optional) or is learned here by
    ``LiRaMLVQ(**lvq_params).fit(X, y)``.  The model is kept in the provenance (``provenance['lvq']``,
    restored by ``LiRaMLVQ.from_dict``), so new points can be projected and compared with the same metric.
    """
    X = _check_X(X)
    if model is None:
        if y is None:
            raise ValueError("supervised_affinity needs labels y (or a fitted model)")
        model = LiRaMLVQ(**lvq_params)
        X, _, _, _ = check_labelled(X, y, model.prototypes_per_class, model.rank)
        model.fit(X, y)
    elif lvq_params:
        raise ValueError(f"LVQ parameters {sorted(lvq_params)} given together with a fitted model")
    n = X.shape[0]
    if n_neighbors is None:
        n_neighbors = default_neighbours(n, perplexity)
    if not 1.0 <= perplexity < n_neighbors:
        raise ValueError(f"perplexity ({perplexity}) must be at least 1 and below n_neighbors ({n_neighbors})")
    indices, s = learned_neighbours(model, X, n_neighbors, algorithm)
    k = indices.shape[1]
    D = sp.csr_matrix((np.sqrt(s).ravel(), indices.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    P_cond = conditional_affinities(D, perplexity, "gaussian", n_jobs)
    provenance = {"source": None if source is None else str(source), "method": "knn", "metric": "liram",
                  "n_neighbors": int(k), "knn": "exact" if algorithm == "exact" or (
                      algorithm == "auto" and n <= EXACT_MAX_POINTS) else "tree",
                  "perplexity": float(perplexity), "lvq": model.to_dict()}
    return joint_affinity(P_cond, provenance)
