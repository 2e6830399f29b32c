"""numba kernels of GLVQ with adaptive (global or local, limited-rank) matrices: GMLVQ / LiRaM LVQ.

Notation (Bunte et al., "Adaptive local dissimilarity measures for discriminative dimension reduction"):
prototypes ``w_j`` (rows of ``W``, ``m x D``) with labels ``c_j``; matrices ``Omega_r`` (``R x M x D``), and the
prototype -> matrix map ``omega_of[j]`` (``j`` for localized LiRaM LVQ, ``0`` for global GMLVQ).  Matrices are
indexed through ``omega_of`` -- by prototype, never by class label -- so several prototypes per class each adapt
their own matrix.  The distance is

    d_j(x) = |Omega_{omega_of[j]} (x - w_j)|^2 = (x - w_j)^T Lambda_j (x - w_j),   Lambda = Omega^T Omega,

and the GLVQ cost (identity Phi) sums ``mu(x) = (d_J - d_K) / (d_J + d_K)`` over the points, ``J`` the closest
prototype of the point's class and ``K`` the closest of another class.  With ``v_j = x - w_j``:

    d mu / d d_J =  2 d_K / (d_J + d_K)^2 =: psi_J,     d mu / d d_K = -2 d_J / (d_J + d_K)^2 =: -psi_K,
    d d_j / d w_j = -2 Lambda_j v_j,                     d d_j / d Omega = 2 Omega v_j v_j^T.

``batch_gradient`` sums cost and gradient over rows ``[r0, r1)`` (the row-block contract: a partition of
the data in, small partial sums out); ``sgd_sweep`` is the paper's stochastic epoch over a row range in a
given order.  Both take a point's term from ``_point_term``.  Both use float64 throughout and no fastmath.
"""
import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def _sq_dist(x, w, omega):
    """``|omega (x - w)|^2``."""
    total = 0.0
    for a in range(omega.shape[0]):
        s = 0.0
        for b in range(x.shape[0]):
            s += omega[a, b] * (x[b] - w[b])
        total += s * s
    return total


@njit(cache=True, nogil=True, parallel=True)
def prototype_distances(X, W, omegas, omega_of):
    """``out[i, j] = d_j(x_i)`` for all points and prototypes (``N x m``)."""
    n, m = X.shape[0], W.shape[0]
    out = np.empty((n, m))
    for i in prange(n):
        for j in range(m):
            out[i, j] = _sq_dist(X[i], W[j], omegas[omega_of[j]])
    return out


@njit(cache=True, nogil=True)
def _winners(dist_row, proto_labels, label):
    """``(J, K)``: the closest prototype of class ``label`` and the closest of any other class."""
    J = -1
    K = -1
    for j in range(dist_row.shape[0]):
        if proto_labels[j] == label:
            if J < 0 or dist_row[j] < dist_row[J]:
                J = j
        elif K < 0 or dist_row[j] < dist_row[K]:
            K = j
    return J, K


@njit(cache=True, nogil=True)
def _accumulate(x, W, omegas, omega_of, j, coef, gW, gO, v, Ov):
    """Add ``coef * d d_j / d(w_j, Omega)`` to ``(gW[j], gO[omega_of[j]])``; ``v``, ``Ov`` are scratch."""
    r = omega_of[j]
    omega = omegas[r]
    D = x.shape[0]
    M = omega.shape[0]
    for b in range(D):
        v[b] = x[b] - W[j, b]
    for a in range(M):
        s = 0.0
        for b in range(D):
            s += omega[a, b] * v[b]
        Ov[a] = s
    for b in range(D):  # d d_j / d w_j = -2 Omega^T (Omega v)
        s = 0.0
        for a in range(M):
            s += omega[a, b] * Ov[a]
        gW[j, b] -= 2.0 * coef * s
    for a in range(M):  # d d_j / d Omega = 2 (Omega v) v^T
        for b in range(D):
            gO[r, a, b] += 2.0 * coef * Ov[a] * v[b]


@njit(cache=True, nogil=True)
def _point_term(x, label, W, proto_labels, omegas, omega_of, dist, gW, gO, v, Ov):
    """One point's GLVQ term, shared by the batch gradient and the stochastic step: its distances to every
    prototype (into the scratch ``dist``), its winners ``J``, ``K``, and ``psi_J d d_J / d(w_J, Omega) -
    psi_K d d_K / d(w_K, Omega)`` added to ``(gW, gO)``.  Returns ``(mu, J, K)``; ``J = -1`` (nothing added)
    when ``x`` sits on both prototypes (``d_J + d_K = 0``: ``mu`` undefined, no gradient)."""
    for j in range(W.shape[0]):
        dist[j] = _sq_dist(x, W[j], omegas[omega_of[j]])
    J, K = _winners(dist, proto_labels, label)
    dJ, dK = dist[J], dist[K]
    den = dJ + dK
    if den <= 0.0:
        return 0.0, -1, -1
    _accumulate(x, W, omegas, omega_of, J, 2.0 * dK / (den * den), gW, gO, v, Ov)
    _accumulate(x, W, omegas, omega_of, K, -2.0 * dJ / (den * den), gW, gO, v, Ov)
    return (dJ - dK) / den, J, K


@njit(cache=True, nogil=True)
def _batch_block(X, y, r0, r1, W, proto_labels, omegas, omega_of):
    m, D = W.shape
    gW = np.zeros((m, D))
    gO = np.zeros(omegas.shape)
    v = np.empty(D)
    Ov = np.empty(omegas.shape[1])
    dist = np.empty(m)
    cost = 0.0
    for i in range(r0, r1):
        mu, J, K = _point_term(X[i], y[i], W, proto_labels, omegas, omega_of, dist, gW, gO, v, Ov)
        if J >= 0:
            cost += mu
    return cost, gW, gO


@njit(cache=True, nogil=True, parallel=True)
def batch_gradient(X, y, r0, r1, W, proto_labels, omegas, omega_of, n_chunks):
    """``(sum mu, d/dW, d/dOmega)`` over rows ``[r0, r1)``, summed over ``n_chunks`` fixed sub-ranges in order
    (the chunking depends on the row range only, so the result does not depend on the thread count)."""
    n = r1 - r0
    n_chunks = max(1, min(n_chunks, n))
    costs = np.zeros(n_chunks)
    gWs = np.zeros((n_chunks,) + W.shape)
    gOs = np.zeros((n_chunks,) + omegas.shape)
    for c in prange(n_chunks):
        a = r0 + (n * c) // n_chunks
        b = r0 + (n * (c + 1)) // n_chunks
        cost, gW, gO = _batch_block(X, y, a, b, W, proto_labels, omegas, omega_of)
        costs[c] = cost
        gWs[c] = gW
        gOs[c] = gO
    return costs.sum(), gWs.sum(axis=0), gOs.sum(axis=0)


@njit(cache=True, nogil=True)
def sgd_sweep(X, y, order, W, proto_labels, omegas, omega_of, lr_w, lr_omega):
    """One stochastic epoch over the rows ``order`` (updates ``W`` and ``omegas`` in place); ``lr_omega = 0``
    keeps the matrices fixed.  Per point: ``w <- w - lr_w d mu/dw`` for ``J`` and ``K`` and
    ``Omega <- Omega - lr_omega d mu/dOmega`` for their matrices, all from the parameters before the step.
    Returns the sum of ``mu`` over the sweep (each measured before its own step)."""
    m, D = W.shape
    dist = np.empty(m)
    gW = np.zeros((m, D))
    gO = np.zeros(omegas.shape)
    v = np.empty(D)
    Ov = np.empty(omegas.shape[1])
    cost = 0.0
    for t in range(order.shape[0]):
        i = order[t]
        # gW, gO are zero here: the point's term goes into the rows of J, K and their matrices only
        mu, J, K = _point_term(X[i], y[i], W, proto_labels, omegas, omega_of, dist, gW, gO, v, Ov)
        if J < 0:
            continue
        cost += mu
        rJ, rK = omega_of[J], omega_of[K]
        for b in range(D):
            W[J, b] -= lr_w * gW[J, b]
            W[K, b] -= lr_w * gW[K, b]
            gW[J, b] = 0.0
            gW[K, b] = 0.0
        _step_and_clear(omegas[rJ], gO[rJ], lr_omega)
        if rK != rJ:
            _step_and_clear(omegas[rK], gO[rK], lr_omega)
    return cost


@njit(cache=True, nogil=True)
def _step_and_clear(omega, g, lr):
    """``omega <- omega - lr g`` (nothing for ``lr = 0``: fixed matrices), then ``g <- 0``."""
    for a in range(omega.shape[0]):
        for b in range(omega.shape[1]):
            if lr > 0.0:
                omega[a, b] -= lr * g[a, b]
            g[a, b] = 0.0


@njit(cache=True, nogil=True, parallel=True)
def winner_projections(X, W, omegas, omega_of):
    """``(winner[i], Omega_{winner} x_i)``: Eq. (4) of the paper, the local projection of the closest prototype."""
    n, m = X.shape[0], W.shape[0]
    M, D = omegas.shape[1], omegas.shape[2]
    win = np.empty(n, dtype=np.int64)
    out = np.empty((n, M))
    for i in prange(n):
        best = 0
        best_d = np.inf
        for j in range(m):
            d = _sq_dist(X[i], W[j], omegas[omega_of[j]])
            if d < best_d:
                best_d = d
                best = j
        win[i] = best
        omega = omegas[omega_of[best]]
        for a in range(M):
            s = 0.0
            for b in range(D):
                s += omega[a, b] * X[i, b]
            out[i, a] = s
    return win, out


def partition_sweep(X, y, order, W, proto_labels, omegas, omega_of, lr_w, lr_omega):
    """One partition's epoch: ``(sum mu, W change, Omega change)`` of a sweep over ``X[order]`` started from
    ``(W, omegas)``, which are not modified (what a Dask worker runs on its rows)."""
    W1, O1 = W.copy(), omegas.copy()
    cost = sgd_sweep(X, y, order, W1, proto_labels, O1, omega_of, lr_w, lr_omega)
    return cost, W1 - W, O1 - omegas
