"""Solvers for the spectral direction ``(L(C) + mu I) P = -G``, one right-hand side per coordinate row.

* ``FactorizedSolver``: sparse LU (SuperLU, minimum-degree ordering of ``A + A^T``) of ``L + mu I``, then two
  triangular solves per right-hand side.  Needs the whole matrix in one process.
* ``MultigridPreconditioner``: one V-cycle of aggregation algebraic multigrid (pyamg) of
  ``L + mu I``: built in near-linear time and memory, where the LU of a small-world graph's Laplacian fills
  in super-linearly (co-authorship graphs: 0.2 s at N = 7.7e3, not finished in minutes at 7.7e4).
* ``pcg``: matrix-free preconditioned conjugate gradient; only needs ``matvec(V) = L V`` (row blocks) and a
  preconditioner: ``jacobi_preconditioner`` (the diagonal of L), a ``MultigridPreconditioner`` or a
  ``FactorizedSolver`` of a recent L, which CG then only corrects for the change since.  All d right-hand
  sides are iterated together, each with its own step sizes, so one Laplacian product per CG iteration serves
  every coordinate.
* ``interruptible``: runs a long set-up (a factorisation, a multigrid hierarchy) in a helper thread while the
  calling thread polls a stop flag, so SIGINT/SIGTERM handlers run and a checkpoint can be taken without
  waiting for it (SciPy's ``splu`` is one C call that the main thread could not leave otherwise).
"""
import threading
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla


class FactorizedSolver:
    """``solve(G)`` returns X with ``(L + mu I) X^T = G^T`` for G of shape ``(d, N)``.

    The first factorisation computes a fill-reducing ordering (minimum degree on ``A + A^T``); pass it back
    as ``ordering`` when the sparsity pattern is unchanged (the curvature always has P's pattern) to skip
    the ordering step, which halves the factorisation time on GrQc.
    """

    _OPTIONS = {"diag_pivot_thresh": 0.0, "options": {"SymmetricMode": True}}  # SPD: no pivoting

    def __init__(self, laplacian: sp.spmatrix, mu: float, ordering: np.ndarray | None = None):
        B = (laplacian + mu * sp.identity(laplacian.shape[0])).tocsc()
        if ordering is None:
            self._lu = sla.splu(B, permc_spec="MMD_AT_PLUS_A", **self._OPTIONS)
            self._order = None
            self.ordering = np.argsort(self._lu.perm_c)
        else:
            self._lu = sla.splu(B[ordering][:, ordering].tocsc(), permc_spec="NATURAL", **self._OPTIONS)
            self._order = self.ordering = ordering

    def solve(self, G: np.ndarray) -> np.ndarray:
        rhs = np.ascontiguousarray(G.T)
        if self._order is None:
            return np.ascontiguousarray(self._lu.solve(rhs).T)
        x = np.empty_like(rhs)
        x[self._order] = self._lu.solve(rhs[self._order])
        return np.ascontiguousarray(x.T)


class MultigridPreconditioner:
    """``solve(G)``: one symmetric V-cycle of aggregation AMG (pyamg) for ``L + mu I`` applied to each row of G,
    an SPD approximation of ``(L + mu I)^-1`` for ``pcg`` (not an exact solve).

    Aggregation multigrid suits graph Laplacians: aggregates follow the graph's strong connections and the
    near-null space is the constant vector per aggregate (L's null space is constant per connected component).
    The prolongator is left unsmoothed: the coarse operators are then contracted graphs, as sparse as the
    graph, where smoothing fills them in on small-world graphs (a set-up ~40x cheaper at the same CG iterations:
    docs/design/optimisation.md).  The coarsest level is factorised
    sparsely (it keeps one block per connected component).  ``ordering`` exists for the ``FactorizedSolver``
    interface and is always None.
    """

    ordering = None

    def __init__(self, laplacian: sp.spmatrix, mu: float, ordering: np.ndarray | None = None):
        import pyamg

        B = (laplacian + mu * sp.identity(laplacian.shape[0])).tocsr()
        self.hierarchy = pyamg.smoothed_aggregation_solver(B, symmetry="hermitian", smooth=None, max_coarse=500,
                                                           coarse_solver="splu")
        self._cycle = self.hierarchy.aspreconditioner(cycle="V")

    def solve(self, G: np.ndarray) -> np.ndarray:
        G = np.atleast_2d(np.asarray(G, dtype=np.float64))
        return np.stack([self._cycle.matvec(np.ascontiguousarray(g)) for g in G]).reshape(G.shape)


FACTORIZATIONS = {"lu": FactorizedSolver, "amg": MultigridPreconditioner}


def factorize(kind: str, laplacian: sp.spmatrix, mu: float, ordering: np.ndarray | None = None):
    """``FACTORIZATIONS[kind](laplacian, mu, ordering)``: ``'lu'`` (exact solve) or ``'amg'`` (preconditioner)."""
    if kind not in FACTORIZATIONS:
        raise ValueError(f"unknown factorization {kind!r}; choose one of {', '.join(FACTORIZATIONS)}")
    return FACTORIZATIONS[kind](laplacian, mu, ordering)


class SetupInterrupted(Exception):
    """``interruptible`` (or ``pcg``) gave up because a stop was requested (the result is discarded)."""


def interruptible(build, should_stop=None, poll: float = 0.1):
    """``build()``, run in a daemon thread while this thread checks ``should_stop()`` every ``poll`` seconds;
    ``SetupInterrupted`` as soon as it returns True (the abandoned thread finishes in the background, or ends
    with the process).  Without ``should_stop``, simply ``build()``.  Exceptions of ``build`` are re-raised."""
    if should_stop is None:
        return build()
    outcome = {}

    def target():
        try:
            outcome["value"] = build()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="scalemb-solver-setup", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(poll)
        if thread.is_alive() and should_stop():
            raise SetupInterrupted("stop requested during the solver set-up")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@dataclass
class CGResult:
    x: np.ndarray
    iterations: int
    relative_residual: float


def jacobi_preconditioner(diagonal: np.ndarray, mu: float):
    """``r -> r / (diag(L) + mu)``."""
    inv_diag = 1.0 / (diagonal + mu)
    return lambda r: r * inv_diag


def pcg(matvec, rhs: np.ndarray, precondition, mu: float, x0=None, tol: float = 1e-3,
        maxiter: int = 100, should_stop=None) -> CGResult:
    """Preconditioned CG for ``(L + mu I) X = rhs`` (rows of ``rhs`` are independent systems).

    ``precondition(R)`` applies an SPD approximation of ``(L + mu I)^-1`` to each row of R.  Stops when every
    row's residual norm is below ``tol`` times its right-hand side's norm.  ``should_stop()``, if given, is
    checked before every iteration: ``SetupInterrupted`` once it is True (a long solve stays interruptible).
    """
    x = np.zeros_like(rhs) if x0 is None else np.array(x0, dtype=np.float64)
    r = rhs - (matvec(x) + mu * x) if x0 is not None else rhs.copy()
    rhs_norm = np.maximum(np.linalg.norm(rhs, axis=1), np.finfo(float).tiny)
    z = precondition(r)
    p = z.copy()
    rz = np.einsum("kn,kn->k", r, z)
    it = 0
    residual = np.linalg.norm(r, axis=1) / rhs_norm
    while it < maxiter and residual.max() > tol:
        if should_stop is not None and should_stop():
            raise SetupInterrupted("stop requested during the CG solve")
        Ap = matvec(p) + mu * p
        pAp = np.einsum("kn,kn->k", p, Ap)
        alpha = np.where(pAp > 0, rz / np.where(pAp > 0, pAp, 1.0), 0.0)
        x += alpha[:, None] * p
        r -= alpha[:, None] * Ap
        z = precondition(r)
        rz_new = np.einsum("kn,kn->k", r, z)
        beta = np.where(rz > 0, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
        p = z + beta[:, None] * p
        rz = rz_new
        it += 1
        residual = np.linalg.norm(r, axis=1) / rhs_norm
    return CGResult(x, it, float(residual.max()))
