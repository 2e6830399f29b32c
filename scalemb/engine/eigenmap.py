"""Laplacian eigenmaps through the executors' row-block Laplacian products, and their Nyström extension.

The graph eigenmap of Belkin & Niyogi (2002) (equation 1 of Brand 2003) solves ``W v = mu D v`` for the
largest ``mu`` below the trivial ones, with ``W = P`` and ``D = diag(P 1)``; equivalently the smallest
``lambda = 1 - mu`` of the normalised Laplacian ``L_sym = I - D^{-1/2} P D^{-1/2}``, with ``u = D^{1/2} v``.

P is touched only through the executors' Laplacian product (``engine.blocks.laplacian_block`` on every row
block, with the constant weights ``C = 4 P`` of ``set_curvature(..., fixed=True)``): ``L(C) V`` and its
diagonal.  ``L_sym = Dc^{-1/2} L(C) Dc^{-1/2}`` whatever the factor 4, so the same code runs on the local
threads and on Dask workers holding their partitions, and P is never formed on the client.

Disconnected graphs.  Each connected component ``c`` adds a zero eigenvalue of ``L_sym`` with eigenvector
``D^{1/2} 1_c`` (GrQc: 355 of them).  The components are found by min-label propagation over the row blocks
(``component_labels``), and the eigensolver works on
``A = Pi L_sym Pi + 2 (I - Pi)``, ``Pi`` the orthogonal projector off those known null vectors (applied in
O(N) with one ``bincount`` per component sum, no N x n_components matrix): the trivial eigenvectors are sent to
the top of the spectrum (``L_sym <= 2``), the wanted ones are the smallest of ``A``, found by Lanczos (ARPACK)
or LOBPCG from products with A only.
Components the returned eigenvectors do not reach (small ones, whose smallest non-zero eigenvalue is larger)
get coordinate 0 in every eigenvector.

Convention of the returned coordinates: ``v_k = D^{-1/2} u_k`` with ``v_k^T D v_k = 1`` (``sum D = 1``: unit
weighted variance), sorted by increasing ``lambda_k``; the residual of pair k is ``|L_sym u_k - lambda_k u_k|``.
"""
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.sparse.linalg import LinearOperator, eigsh, lobpcg

from ..affinity.affinity import RowBlock


# ------------------------------------------------------------------------------------------------ row blocks

@njit(cache=True, nogil=True)
def _min_label_rows(indptr, indices, r0, labels, out):
    """``out[row] = min(labels of row r0+row and its neighbours)``, updated in place within the block
    (Gauss-Seidel: a label crosses the whole block in one pass)."""
    r1 = r0 + indptr.shape[0] - 1
    changed = 0
    for row in range(indptr.shape[0] - 1):
        best = out[row]
        for idx in range(indptr[row], indptr[row + 1]):
            j = indices[idx]
            lj = out[j - r0] if r0 <= j < r1 else labels[j]
            if lj < best:
                best = lj
        if best < out[row]:
            out[row] = best
            changed += 1
        # the neighbours inside the block take the smaller label too
        for idx in range(indptr[row], indptr[row + 1]):
            j = indices[idx]
            if r0 <= j < r1 and out[j - r0] > best:
                out[j - r0] = best
                changed += 1
    return changed


def min_label_block(block: RowBlock, labels: np.ndarray) -> np.ndarray:
    """Rows ``[r0, r1)`` of one min-label propagation pass: each row's label becomes the smallest among itself
    and its neighbours (``labels`` is the full length-N vector of the previous pass)."""
    out = np.array(labels[block.r0:block.r1], dtype=np.int64)
    _min_label_rows(block.indptr, block.indices, block.r0, labels, out)
    return out


class _RowSpace:
    """Maps a row-block function over an executor's blocks, in the row order its blocks hold.

    Dask partitions hold P's rows in the input order; a ``LocalExecutor`` may hold them renumbered (locality
    order), so results are moved back to the input's order after a pass (``engine.base.Executor._to_input``)."""

    def __init__(self, executor):
        self.executor = executor

    def to_input(self, x):
        return self.executor._to_input(x[None, :])[0]

    def map(self, fn, x):
        return np.concatenate(self.executor.map_blocks(fn, x))


def component_labels(executor, max_passes: int = 100000) -> np.ndarray:
    """Connected components of P's graph as labels ``0 .. n_components - 1`` (input order), found by
    min-label propagation over the executor's row blocks (one pass per call: P stays where it is)."""
    space = _RowSpace(executor)
    n = executor.n_points
    labels = np.arange(n, dtype=np.int64)
    for _ in range(max_passes):
        new = space.map(min_label_block, labels)
        new = new[new]  # pointer jumping: labels are row numbers of the same space
        if np.array_equal(new, labels):
            break
        labels = new
    else:  # pragma: no cover - needs a path longer than max_passes blocks
        raise RuntimeError("component labelling did not converge")
    labels = space.to_input(labels)
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


# ------------------------------------------------------------------------------------------------ eigensolver

@dataclass
class EigenmapSolution:
    """Bottom non-trivial eigenpairs of ``L_sym``: ``coords`` ``(N, k)`` holds ``v_k = D^{-1/2} u_k``,
    ``eigenvalues`` ``lambda_k`` (of ``L_sym``; ``mu_k = 1 - lambda_k`` of ``D^{-1} P``), ``residuals``
    ``|L_sym u_k - lambda_k u_k|`` (``|u_k| = 1``), ``degrees`` ``D = P 1``, ``labels`` the components."""

    coords: np.ndarray
    eigenvalues: np.ndarray
    residuals: np.ndarray
    degrees: np.ndarray
    labels: np.ndarray
    iterations: int
    matvecs: int

    @property
    def n_components(self) -> int:
        return int(self.labels.max()) + 1


class _ProjectedLaplacian:
    """``A = Pi L_sym Pi + 2 (I - Pi)`` on ``(N, m)`` blocks, ``L_sym`` from the executor's ``L(4P)``."""

    def __init__(self, executor, labels, degrees):
        self.executor = executor
        self.labels = labels
        self.n_labels = int(labels.max()) + 1
        with np.errstate(divide="ignore"):
            self.isqrt = np.where(degrees > 0, 1.0 / np.sqrt(np.where(degrees > 0, degrees, 1.0)), 0.0)
        self.sqrt_d = np.sqrt(degrees)
        norm2 = np.bincount(labels, weights=degrees, minlength=self.n_labels)
        self.inv_norm2 = np.where(norm2 > 0, 1.0 / np.where(norm2 > 0, norm2, 1.0), 0.0)
        self.matvecs = 0

    def null_part(self, U):
        """``(I - Pi) U``: the part along the components' ``D^{1/2} 1_c``."""
        out = np.empty_like(U)
        for k in range(U.shape[1]):
            coef = np.bincount(self.labels, weights=self.sqrt_d * U[:, k], minlength=self.n_labels) * self.inv_norm2
            out[:, k] = coef[self.labels] * self.sqrt_d
        return out

    def project(self, U):
        return U - self.null_part(U)

    def l_sym(self, U):
        """``L_sym U`` through the executor's row-block product (``(d, N)`` layout there)."""
        self.matvecs += U.shape[1]
        V = np.ascontiguousarray((U * self.isqrt[:, None]).T)
        return (self.executor.laplacian_matvec(V) * (0.25 * self.isqrt)).T  # the executor's C is 4 P

    def __call__(self, U):
        U = np.asarray(U, dtype=np.float64)
        if U.ndim == 1:
            return self(U[:, None])[:, 0]
        null = self.null_part(U)
        return self.project(self.l_sym(U - null)) + 2.0 * null


EIGENSOLVERS = ("lanczos", "lobpcg")


def laplacian_eigenmap(executor, n_components: int = 2, method: str = "lanczos", seed: int = 0,
                       tol: float = 1e-10, max_iterations: int | None = None, labels: np.ndarray | None = None,
                       quiet: bool = True) -> EigenmapSolution:
    """The ``n_components`` smallest non-trivial eigenpairs of ``L_sym`` (see the module docstring).

    ``executor``: a ``LocalExecutor`` or ``DaskExecutor`` (its curvature is set to the constant ``4 P``).
    ``method``: ``'lanczos'`` (ARPACK's implicitly restarted Lanczos on ``A``, one product per step) or
    ``'lobpcg'`` (block LOBPCG, ``max(n_components, 4)`` extra vectors, one block product per step; without a
    preconditioner it needs more products on these small-gap spectra: docs/design/engine.md).
    ``tol``: the solver's tolerance; ``labels``: the components, if known.  Graphs with few more nodes
    than components are solved densely (through the same products)."""
    if method not in EIGENSOLVERS:
        raise ValueError(f"unknown eigensolver {method!r}; choose one of {', '.join(EIGENSOLVERS)}")
    n = executor.n_points
    if n_components < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components}")
    executor.set_curvature(np.zeros((1, n)), fixed=True)  # C = 4 P: L(C) = 4 (D - P), diagonal 4 D
    degrees = executor.curvature_diagonal() / 4.0
    if labels is None:
        labels = component_labels(executor)
    op = _ProjectedLaplacian(executor, labels, degrees)
    n_trivial = int(np.count_nonzero(np.bincount(labels, weights=degrees) > 0))
    available = n - n_trivial
    if n_components > available:
        raise ValueError(f"asked for {n_components} eigenvectors, but the graph has only {available} non-trivial "
                         f"ones ({n} nodes in {n_trivial} components)")
    rng = np.random.default_rng(seed)
    A = LinearOperator((n, n), matvec=op, matmat=op, dtype=np.float64)
    iterations = 0
    if n <= max(200, 10 * n_components):
        values, vectors = _dense_smallest(op, n, n_components)
    elif method == "lanczos":
        v0 = op.project(rng.standard_normal((n, 1)))[:, 0]
        ncv = min(n - 1, max(2 * n_components + 1, 40))
        values, vectors = eigsh(A, k=n_components, which="SA", ncv=ncv, tol=tol, v0=v0, maxiter=max_iterations)
        iterations = op.matvecs
    else:
        block = min(n_components + max(n_components, 4), available)
        X = op.project(rng.standard_normal((n, block)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if quiet else "default", UserWarning)  # "not reaching the tolerance"
            values, vectors, history = lobpcg(A, X, tol=tol, maxiter=max_iterations or 1000, largest=False,
                                              retResidualNormsHistory=True, verbosityLevel=0 if quiet else 1)
        iterations = len(history)
    order = np.argsort(values)[:n_components]
    values, U = values[order], op.project(vectors[:, order])
    U /= np.linalg.norm(U, axis=0)
    signs = np.sign(U[np.argmax(np.abs(U), axis=0), np.arange(U.shape[1])])  # deterministic sign: largest entry > 0
    U *= signs
    residuals = np.linalg.norm(op.l_sym(U) - U * values, axis=0)
    coords = U * op.isqrt[:, None]
    return EigenmapSolution(coords, values, residuals, degrees, labels, iterations, op.matvecs)


def _dense_smallest(op, n, k):
    """Smallest eigenpairs of a small projected operator, formed column by column from its products."""
    M = op(np.eye(n))
    values, vectors = np.linalg.eigh(0.5 * (M + M.T))
    return values[:k], vectors[:, :k]


# ------------------------------------------------------------------------------------------------ Nyström

def nystrom_extend(weights, coords: np.ndarray, eigenvalues: np.ndarray) -> np.ndarray:
    """Graph-eigenmap coordinates of new points from their affinities to the embedded ones (Nyström).

    ``y_k(x) = (1 / mu_k) sum_i [K(x, x_i) / sum_j K(x, x_j)] y_k(x_i)`` (Bengio et al. 2004), with
    ``mu_k = 1 - lambda_k`` the eigenvalues of the random walk ``D^{-1} P``: for a training row
    (``K(x_m, .) = P[m]``) this is ``(D^{-1} P v_k)_m / mu_k = v_k(m)``, the stored coordinate, exactly.

    ``weights``: ``(n_new, N)`` non-negative affinities (sparse or dense) of each new point to the N embedded
    points (edge weights for new graph nodes; edges among new nodes are not used); ``coords``: ``(N, k)``
    eigenmap coordinates ``v_k``; ``eigenvalues``: ``lambda_k`` of ``L_sym``.  Returns ``(n_new, k)``.
    Raises ``ValueError`` for rows without any weight (a new point linked to no embedded one has no place).
    """
    coords = np.asarray(coords, dtype=np.float64)
    mu = 1.0 - np.asarray(eigenvalues, dtype=np.float64)
    K = sp.csr_matrix(weights, dtype=np.float64)
    if K.ndim != 2 or K.shape[1] != coords.shape[0]:
        raise ValueError(f"weights must have one column per embedded point ({coords.shape[0]}), got shape {K.shape}")
    if K.nnz and (not np.all(np.isfinite(K.data)) or K.data.min() < 0):
        raise ValueError("weights must be finite and non-negative")
    if np.any(np.abs(mu) < 1e-12):
        raise ValueError("an eigenvalue mu_k = 1 - lambda_k is 0: the Nyström formula is undefined")
    sums = np.asarray(K.sum(axis=1)).ravel()
    lonely = np.flatnonzero(sums <= 0)
    if lonely.size:
        raise ValueError(f"{lonely.size} new point(s) have no weight to any embedded point (first: row {lonely[0]})")
    return np.asarray(sp.diags(1.0 / sums) @ K @ coords) / mu
