"""The spectral direction's sparse factorisation of ``L(C) + mu I`` on a Dask worker: built and kept on one worker
from every partition's curvature weights (``factorize_partitions``, a picklable ``WorkerFactor``), its solves
pinned there (``RemoteFactorization``, the client's handle, which ``DaskExecutor.factorize_curvature`` returns),
so the client never holds P; see ``scalemb.engine.distributed``'s module docstring."""
import logging

import numpy as np

from .factor import factor_thread, factorize, on_factor_thread, run_on_factor_thread
from .faults import SchedulerLostError
from .faults import WorkerLeft as _WorkerLeft
from .laplacian import laplacian_matrix

logger = logging.getLogger("scalemb")

# --------------------------------------------------------------------------- on the worker holding the factor


class WorkerFactor:
    """A factorisation of ``L(C) + mu I`` (``factor.factorize(kind, laplacian, mu, ordering)``) that can be
    pickled: it pickles as its inputs (the sparse matrix, ``mu``, the ordering it was given, ``kind``) and
    factorises again where it is unpickled.

    Why: scipy's ``SuperLU`` (and pyamg's hierarchy, whose coarsest level is one) cannot be pickled, and Dask may
    move any task result between workers -- work stealing, a dependent task placed on another worker, the Active
    Memory Manager, a retiring worker.  An unpicklable result then fails every transfer and the dependent task is
    retried for ever (seen: several jobs on one 2-worker cluster, ``cannot pickle 'SuperLU'`` logged thousands of
    times, the jobs stuck).  The executor keeps the factor's dependents on its worker (``RemoteFactorization``),
    so a move should not happen; if one does, it costs one factorisation and gives the same numbers (the same
    inputs to the same deterministic factorisation), never a hang.  ``__sizeof__`` counts the arrays, so the
    scheduler's cost of moving it is not a few bytes (which would invite work stealing).

    The solver is built, used and freed on the process's one factor thread only (``factor.factor_thread``: SuperLU
    frees a block only in the thread that allocated it, and a Dask worker runs tasks in its executor's threads but
    drops a released key's value in its event-loop thread); the same calls in the same order, so the same
    numbers."""

    def __init__(self, kind: str, laplacian, mu: float, ordering):
        self.kind, self.laplacian, self.mu, self.given_ordering = kind, laplacian, float(mu), ordering
        self._solver = None

    def _build(self):
        if self._solver is None:
            self._solver = factorize(self.kind, self.laplacian, self.mu, self.given_ordering)
        return self._solver

    @property
    def solver(self):
        if self._solver is None:
            run_on_factor_thread(self._build)
        return self._solver

    @property
    def ordering(self):
        return self.solver.ordering

    def solve(self, G: np.ndarray) -> np.ndarray:
        solver = self.solver
        return run_on_factor_thread(solver.solve, G)

    def free(self) -> None:
        """Free the solver now, on the factor thread that built it (also when the factor is garbage: ``__del__``)."""
        box = [self.__dict__.pop("_solver", None)]
        self._solver = None
        if box[0] is not None and not on_factor_thread():
            factor_thread().release(box)

    def __del__(self):
        self.free()

    def __getstate__(self):
        return {"kind": self.kind, "laplacian": self.laplacian, "mu": self.mu, "given_ordering": self.given_ordering}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._solver = None

    def __sizeof__(self) -> int:
        A = self.laplacian
        size = A.data.nbytes + A.indices.nbytes + A.indptr.nbytes
        lu = getattr(self._solver, "_lu", None)
        if lu is not None:  # the factors' fill, which a move would rebuild
            size += 12 * (lu.L.nnz + lu.U.nnz)
        return size + 1024


def factorize_partitions(n_points: int, mu: float, ordering, kind, *blocks_and_weights) -> WorkerFactor:
    """``factor.factorize(kind, ...)`` of ``L(C) + mu I`` from every partition's (block, weights) (runs on one
    worker), as a picklable ``WorkerFactor``."""
    import scipy.sparse as sp

    blocks, weights = blocks_and_weights[0::2], blocks_and_weights[1::2]
    indptr = np.concatenate([[0], np.cumsum([b.indptr[-1] for b in blocks])])
    row_ptr = np.concatenate([b.indptr[:-1] + indptr[k] for k, b in enumerate(blocks)] + [[indptr[-1]]])
    C = sp.csr_matrix((np.concatenate(weights), np.concatenate([b.indices for b in blocks]), row_ptr),
                      shape=(n_points, n_points))
    factor = WorkerFactor(kind, laplacian_matrix(C), mu, ordering)
    factor.solver  # noqa: B018 - factorise here, in this task, not in the first solve
    return factor


def solve_factorized(factor, G: np.ndarray) -> np.ndarray:
    return factor.solve(G)


def factor_ordering(factor) -> np.ndarray:
    return factor.ordering


# --------------------------------------------------------------------------- client

class RemoteFactorization:
    """A ``FactorizedSolver`` living on a worker: ``solve(G)`` ships G there and the direction back
    (``executor``: the ``scalemb.engine.distributed.DaskExecutor`` whose partitions and weights it factorises).

    Its dependents (``solve_factorized``, ``factor_ordering``) are pinned to the worker holding the factor
    (``workers=[holder]``, no other worker allowed, so neither work stealing nor the scheduler's placement
    moves the factor); a wait for them also fails as soon as that worker has left (``DaskExecutor._wait_for``'s
    ``pinned``), and ``solve`` then recovers and factorises again on a live worker."""

    def __init__(self, executor, mu: float, ordering, kind: str = "lu"):
        self._executor = executor
        self._mu = mu
        self._ordering = ordering
        self._kind = kind
        self._future = None
        self._holder = None
        self.ordering = None
        self._build()

    def _build(self):
        """Factorise on a worker (and fetch the ordering, the first time), as one unit under the fault handling:
        a retry after a recovery reads the partitions and curvature weights the recovery left (the lost ones were
        recomputed under new keys: the old futures only fail again, "lost dependencies") and factorises again (an
        ordering asked of a factor lost with its worker would fail every time)."""
        ex = self._executor

        def build():
            parts = [f for pair in zip(ex._blocks, ex._weights) for f in pair]
            future = ex._task(factorize_partitions, ex.n_points, self._mu, self._ordering, self._kind, *parts)
            ex._settle([future])
            holders = ex.client.who_has([future]).get(future.key)
            if not holders:
                raise _WorkerLeft(f"the worker holding {future.key} left")
            self._future, self._holder = future, min(holders)
            if self.ordering is None:
                self.ordering = self._on_holder(factor_ordering)

        ex._run(build)

    def _on_holder(self, fn, *args):
        """``fn(factor, *args)`` on the factor's worker and nowhere else, gathered."""
        ex = self._executor
        future = ex._task(fn, self._future, *args, workers=[self._holder], allow_other_workers=False)
        return ex._gather([future], pinned=[self._holder])[0]

    def solve(self, G: np.ndarray) -> np.ndarray:
        ex = self._executor
        G = np.ascontiguousarray(G, dtype=np.float64)

        def attempt():
            return self._on_holder(solve_factorized, G)

        rounds = max(ex.retries, 1)  # one refactorisation even without retries
        for tries in range(rounds + 1):
            try:
                return ex._run(attempt, retries=0)
            except SchedulerLostError:
                raise
            except Exception as exc:  # noqa: BLE001 - the factor's worker died, or the factor was cancelled
                lost = tries == 0 or ex._transient(exc) or self._holder not in ex._alive()
                if tries == rounds or not lost:
                    raise
                logger.warning("lost the factorisation (%s: %s); refactorising", exc.__class__.__name__, exc)
                ex._recover()
                self._build()
