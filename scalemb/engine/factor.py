"""Factorisations of the spectral direction's system ``L(C) + mu I`` (``L(C) = diag(C 1) - C``, the curvature's
graph Laplacian plus ``mu`` times the identity), built by an executor where its blocks are
(``Executor.factorize_curvature``) and applied by the optimiser as ``solve(G)``, one right-hand side per
coordinate row.

* ``FactorizedSolver``: sparse LU (SuperLU, minimum-degree ordering of ``A + A^T``) of ``L + mu I``, then two
  triangular solves per right-hand side.  Needs the whole matrix in one process.
* ``MultigridPreconditioner``: one V-cycle of aggregation algebraic multigrid (pyamg) of
  ``L + mu I``: built in near-linear time and memory, where the LU of a small-world graph's Laplacian fills
  in super-linearly (co-authorship graphs: 0.2 s at N = 7.7e3, not finished in minutes at 7.7e4).

Linear algebra of the executor's matrix, not optimiser logic: the optimisers (``scalemb.optim``) ask the executor
for a factorisation and never build one themselves, so the engine needs nothing of theirs.
"""
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
