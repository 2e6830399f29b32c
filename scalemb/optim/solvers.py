"""Iterative solves of the spectral direction ``(L(C) + mu I) P = -G``, one right-hand side per coordinate row.

The factorisations of ``L(C) + mu I`` (sparse LU, multigrid) are the executor's to build where the blocks are:
``scalemb.engine.factor``.

* ``pcg``: matrix-free preconditioned conjugate gradient; only needs ``matvec(V) = L V`` (row blocks) and a
  preconditioner: ``jacobi_preconditioner`` (the diagonal of L), a ``MultigridPreconditioner`` or a
  ``FactorizedSolver`` of a recent L, which CG then only corrects for the change since.  All d right-hand
  sides are iterated together, each with its own step sizes, so one Laplacian product per CG iteration serves
  every coordinate.
* ``interruptible``: runs a long set-up (a factorisation, a multigrid hierarchy) on a factor thread
  while the calling thread polls a stop flag, so SIGINT/SIGTERM handlers run and a checkpoint can be taken without
  waiting for it (SciPy's ``splu`` is one C call that the main thread could not leave otherwise).
"""
from dataclasses import dataclass

import numpy as np

from ..engine.factor import on_factor_thread, submit_setup


class SetupInterrupted(Exception):
    """``interruptible`` (or ``pcg``) gave up because a stop was requested (the result is discarded)."""


def interruptible(build, should_stop=None, poll: float = 0.1):
    """``build()``, run on an idle factor thread (``engine.factor.submit_setup``) while this thread checks
    ``should_stop()`` every ``poll`` seconds; ``SetupInterrupted`` as soon as it returns True (the abandoned
    set-up finishes on that thread, which then frees what it built).  Without ``should_stop``, or when already on
    that thread, simply ``build()``.  Exceptions of ``build`` are re-raised.

    Why long-lived factor threads and not a new thread per set-up: SuperLU frees a factor only in the thread that
    built it (``engine.factor``'s module docstring), so a factor built in a thread that has ended could never be
    freed (measured: +18 MB of resident memory per factorisation, 1.8 GB after 100); and starting and joining a
    thread cost a small graph, which factorises on every iteration, ~0.2 ms each time."""
    if should_stop is None or on_factor_thread():
        return build()
    future = submit_setup(build)
    while True:
        try:
            return future.result(timeout=poll)
        except TimeoutError:
            if should_stop():
                raise SetupInterrupted("stop requested during the solver set-up") from None


@dataclass
class CGResult:
    x: np.ndarray
    iterations: int
    relative_residual: float


def jacobi_preconditioner(diagonal: np.ndarray, mu: float):
    """``r -> r / (diag(L) + mu)``."""
    inv_diag = 1.0 / (diagonal + mu)
    return lambda r: r * inv_diag


def cg_coefficients(gamma, delta, gamma_old=None, alpha_old=None) -> tuple:
    """Chronopoulos & Gear's CG step and direction coefficients (``pcg_one_reduction``), per system (row):
    ``beta = gamma / gamma_old``, ``alpha = gamma / (delta - beta gamma / alpha_old)`` (the denominator is
    ``p . A p``; on the first iteration, without ``gamma_old``, ``beta = 0`` and ``alpha = gamma / delta``), 0
    where a denominator is not positive (a converged or degenerate system stops moving)."""
    if gamma_old is None:
        beta = np.zeros_like(gamma)
        denom = delta
    else:
        beta = np.where(gamma_old > 0, gamma / np.where(gamma_old > 0, gamma_old, 1.0), 0.0)
        denom = delta - np.where(alpha_old != 0, beta * gamma / np.where(alpha_old != 0, alpha_old, 1.0), 0.0)
    alpha = np.where(denom > 0, gamma / np.where(denom > 0, denom, 1.0), 0.0)
    return alpha, beta


def pcg_one_reduction(matvec, rhs: np.ndarray, precondition, mu: float, x0=None, tol: float = 1e-3,
                      maxiter: int = 100, should_stop=None) -> CGResult:
    """``pcg`` with one reduction per iteration (Chronopoulos & Gear 1989): the products ``w = (L + mu) u`` of
    the preconditioned residual ``u = M r``, and ``s = w + beta s`` in place of ``A p``, so that ``r . u``,
    ``w . u`` and ``|r|^2`` come from the same vectors after the same product.

    Why: where the rows live on Dask workers each reduction is a client round trip; standard PCG needs two per
    iteration (``p . Ap`` after the product, ``r . z`` after the step), this one (``_HeldDescentRun._solve``:
    the step, ``u = M r`` and the product in one task round).  In exact arithmetic the iterates are PCG's; in
    floating point they differ in the last bits.  The last iteration steps without a product; the stop test is
    ``pcg``'s (every row's residual below ``tol`` times its right-hand side's norm, at most ``maxiter``)."""
    x = np.zeros_like(rhs) if x0 is None else np.array(x0, dtype=np.float64)
    r = rhs - (matvec(x) + mu * x) if x0 is not None else rhs.copy()
    rhs_norm = np.maximum(np.linalg.norm(rhs, axis=1), np.finfo(float).tiny)
    u = precondition(r)
    w = matvec(u) + mu * u
    gamma, delta = np.einsum("kn,kn->k", r, u), np.einsum("kn,kn->k", w, u)
    residual = np.linalg.norm(r, axis=1) / rhs_norm
    it, alpha, gamma_old, p, s = 0, None, None, None, None
    while it < maxiter and residual.max() > tol:
        if should_stop is not None and should_stop():
            raise SetupInterrupted("stop requested during the CG solve")
        alpha, beta = cg_coefficients(gamma, delta, gamma_old, alpha)
        if it == 0:
            p, s = u.copy(), w.copy()
        else:
            p = u + beta[:, None] * p
            s = w + beta[:, None] * s
        x += alpha[:, None] * p
        r -= alpha[:, None] * s
        u = precondition(r)
        it += 1
        residual = np.linalg.norm(r, axis=1) / rhs_norm
        if it < maxiter and residual.max() > tol:
            w = matvec(u) + mu * u
            gamma_old = gamma
            gamma, delta = np.einsum("kn,kn->k", r, u), np.einsum("kn,kn->k", w, u)
    return CGResult(x, it, float(residual.max()))


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
