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

SciPy's SuperLU (``splu``, and pyamg's coarsest level) records each block it allocates in a registry of the
*thread* that allocates it, and its free releases a block only if the *freeing* thread's registry holds it
(``scipy/sparse/linalg/_dsolve/_superlu_utils.c``; scipy issue 15921): a factor built in one thread and dropped
in another is never freed.  So a set-up that must not block the calling thread (``optim.solvers.interruptible``,
a Dask worker's ``dask_factor.WorkerFactor``) runs on one of this process's long-lived factor threads
(``submit_setup``, ``factor_thread``), and a solver built there frees its SuperLU objects there, wherever it is
dropped (``_FreedWhereBuilt``).
"""
import atexit
import queue
import threading
from concurrent.futures import Future

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla

FACTOR_THREAD_NAME = "scalemb-factor"
_LOCK = threading.RLock()
_HERE = threading.local()  # ``thread``: on a factor thread, its ``FactorThread``
# ``factor_thread``'s; the set-ups' threads not in use; threads made; the interpreter exiting (``_stop_all``)
_FACTOR_THREADS = {"first": None, "idle": [], "made": 0, "exiting": False}
_ALL = []  # every running ``FactorThread`` of this process


class FactorThread:
    """A daemon thread that runs what is submitted to it, in order (``submit(fn, *args)``: a ``Future``), and
    drops the objects handed back to it (``release(box)``: the SuperLU objects of a solver it built).

    ``release`` only puts the box on a ``queue.SimpleQueue``, which is safe where a garbage collection may run
    a ``__del__`` (inside another lock's holder: a ``ThreadPoolExecutor.submit`` holds a module-wide lock, so a
    ``__del__`` submitting to one deadlocks, as seen in zarr's I/O thread).

    ``keeper``: a thread of the set-ups (``submit_setup``): it builds one solver at a time and takes another
    set-up only once that solver was dropped and its SuperLU objects handed back and freed (it is then idle).  A
    thread that outlives the interpreter's exit while SuperLU blocks it allocated are still registered to it
    makes SciPy's clean-up fail at finalisation (Python then exits with status 120: seen with a thread that had
    built factors and was still busy with another): so a set-up never runs on a thread holding a solver, and
    the idle threads are ended at exit (``_stop_all``)."""

    def __init__(self, name: str, keeper: bool = False):
        self._queue = queue.SimpleQueue()
        self._keeper = keeper
        self.busy = False  # running a submitted function
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        with _LOCK:
            _ALL.append(self)
        self.thread.start()

    def _serve(self) -> None:
        _HERE.thread = self
        try:
            while True:
                item = self._queue.get()
                if item is None:  # the interpreter is exiting (``_stop_all``)
                    return
                if isinstance(item, list):  # a box of last references (``release``)
                    item.clear()
                    if self._keeper:
                        self._idle()
                    continue
                fn, args, future = item
                del item
                if future.set_running_or_notify_cancel():
                    self.busy = True
                    try:
                        result = fn(*args)
                    except BaseException as exc:  # noqa: BLE001 - the caller's to see
                        future.set_exception(exc)
                        result = None
                    else:
                        future.set_result(result)
                    self.busy = False
                    keeps = isinstance(result, _FreedWhereBuilt) and getattr(result, "_builder", None) is self
                    del result
                    if self._keeper and not keeps:
                        self._idle()
                del fn, args, future
        finally:
            with _LOCK:
                _ALL.remove(self)
                if self in _FACTOR_THREADS["idle"]:
                    _FACTOR_THREADS["idle"].remove(self)

    def _idle(self) -> None:
        """A set-up's thread that holds no solver: ready for the next set-up (``submit_setup``)."""
        with _LOCK:
            _FACTOR_THREADS["idle"].append(self)

    def submit(self, fn, *args) -> Future:
        """``fn(*args)`` on this thread; its ``Future``."""
        future = Future()
        self._queue.put((fn, args, future))
        return future

    def release(self, box: list) -> None:
        """Drop the objects in ``box`` (their last references) on this thread."""
        self._queue.put(box)


@atexit.register
def _stop_all() -> None:
    """Before the interpreter finalises: end the idle factor threads (``FactorThread``).  A set-up still running
    (abandoned by a stop) is left to the end of the process, as a daemon thread; from now on a solver is dropped
    where it is."""
    _FACTOR_THREADS["exiting"] = True
    with _LOCK:
        threads = list(_ALL)
    for thread in threads:
        thread._queue.put(None)
    for thread in threads:
        thread.thread.join(0.1)


def setups_running() -> bool:
    """Whether a set-up is still running on a factor thread (one a stop abandoned, once the run has ended).  Such
    a thread holds the SuperLU blocks it is allocating, so the interpreter's finalisation would fail, and Python
    would exit with status 120 whatever the program's exit status: the CLI then leaves by ``os._exit``
    (``cli.main.entry``)."""
    with _LOCK:
        return any(thread.busy for thread in _ALL)


def _new_thread(keeper: bool) -> FactorThread:
    with _LOCK:
        _FACTOR_THREADS["made"] += 1
        return FactorThread(f"{FACTOR_THREAD_NAME}-{_FACTOR_THREADS['made']}", keeper)


def factor_thread() -> FactorThread:
    """This process's long-lived factor thread: where a Dask worker builds, uses and frees its factors
    (``dask_factor.WorkerFactor``)."""
    with _LOCK:
        if _FACTOR_THREADS["first"] is None:
            _FACTOR_THREADS["first"] = _new_thread(keeper=False)
        return _FACTOR_THREADS["first"]


def submit_setup(build) -> Future:
    """``build()`` on an idle set-up thread (``FactorThread(keeper=True)``: one that holds no solver), a new one
    if none is idle; its future.  The thread frees the solver it builds when that is dropped, wherever."""
    with _LOCK:
        thread = _FACTOR_THREADS["idle"].pop() if _FACTOR_THREADS["idle"] else _new_thread(keeper=True)
    return thread.submit(build)


def on_factor_thread() -> bool:
    """Whether the calling thread is a factor thread."""
    return getattr(_HERE, "thread", None) is not None


def run_on_factor_thread(fn, *args):
    """``fn(*args)`` on ``factor_thread``, waited for (directly when already on a factor thread)."""
    if on_factor_thread():
        return fn(*args)
    return factor_thread().submit(fn, *args).result()


class _FreedWhereBuilt:
    """A solver holding SuperLU objects (in its attributes ``_superlu``) that a factor thread built: dropped in
    another thread, it hands them to that thread to free (module docstring).  Built anywhere else, it is dropped
    as any object (a solver built and dropped by one thread frees its blocks)."""

    _superlu = ()

    def _built_here(self) -> None:
        self._builder = getattr(_HERE, "thread", None)

    def __del__(self):
        try:
            builder = getattr(self, "_builder", None)
            if builder is not None and getattr(_HERE, "thread", None) is not builder and \
                    not _FACTOR_THREADS["exiting"]:
                builder.release([self.__dict__.pop(name, None) for name in self._superlu])
        except Exception:  # noqa: BLE001 - interpreter shutdown: module globals may be gone
            pass


class FactorizedSolver(_FreedWhereBuilt):
    """``solve(G)`` returns X with ``(L + mu I) X^T = G^T`` for G of shape ``(d, N)``.

    The first factorisation computes a fill-reducing ordering (minimum degree on ``A + A^T``); pass it back
    as ``ordering`` when the sparsity pattern is unchanged (the curvature always has P's pattern) to skip
    the ordering step, which halves the factorisation time on GrQc.
    """

    _OPTIONS = {"diag_pivot_thresh": 0.0, "options": {"SymmetricMode": True}}  # SPD: no pivoting
    _superlu = ("_lu",)

    def __init__(self, laplacian: sp.spmatrix, mu: float, ordering: np.ndarray | None = None):
        self._built_here()
        B = (laplacian + mu * sp.identity(laplacian.shape[0])).tocsc()
        if ordering is None:
            self._lu = sla.splu(B, permc_spec="MMD_AT_PLUS_A", **self._OPTIONS)
            self._order = None
            self.ordering = np.argsort(self._lu.perm_c)
        else:
            self._factorize_ordered(B[ordering][:, ordering].tocsc(), ordering)

    @classmethod
    def ordered(cls, B: sp.csc_matrix, ordering: np.ndarray) -> "FactorizedSolver":
        """The solver of a matrix already assembled in ``ordering`` (``Assembly``: ``B`` is
        ``(L + mu I)[ordering][:, ordering]`` in CSC, the matrix ``__init__`` factorises when given that
        ordering)."""
        self = cls.__new__(cls)
        self._built_here()
        self._factorize_ordered(B, ordering)
        return self

    def _factorize_ordered(self, B: sp.csc_matrix, ordering: np.ndarray) -> None:
        self._lu = sla.splu(B, permc_spec="NATURAL", **self._OPTIONS)
        self._order = self.ordering = ordering

    def solve(self, G: np.ndarray) -> np.ndarray:
        rhs = np.ascontiguousarray(G.T)
        if self._order is None:
            return np.ascontiguousarray(self._lu.solve(rhs).T)
        x = np.empty_like(rhs)
        x[self._order] = self._lu.solve(rhs[self._order])
        return np.ascontiguousarray(x.T)


class Assembly:
    """``(L(C) + mu I)`` as ``FactorizedSolver`` factorises it with a known fill-reducing ``ordering``, in CSC,
    gathered straight from C's weights: ``matrix(weights, mu)``.

    Why: the spectral direction factorises ``L(C) + mu I`` on every iteration of a small graph, and SciPy's way
    there (``laplacian_matrix``, the executor's point order ``relabel``, ``+ mu I``, CSC, the ordering's
    permutation: each a new sparse matrix, validated) cost ~2.5 ms of Python per iteration -- 80 % of a
    180-point graph's iteration, ~10 % of GrQc's.  The pattern never changes (it is P's), so where each entry
    of the final matrix comes from is found once, by running that same SciPy way on labels: C's entries
    labelled ``-1 .. -nnz`` become L's off-diagonal entries ``0 - c``, and row i's diagonal, labelled
    ``nnz + 1 + i``, the diagonal ``d - 0`` (``+ 0 I``).  The gather then gives the same structure and the
    same values, bit for bit (``-c``, ``d + mu`` with d summed as ``C.sum(axis=1)`` sums it), as long as
    SciPy drops no entry: ``build`` refuses a pattern with stored diagonal entries or empty rows and
    ``matrix`` returns None when a weight is 0 (the caller then takes SciPy's way)."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, ordering: np.ndarray, relabel=None):
        n = indptr.size - 1
        self.key = (indptr.copy(), indices.copy(), ordering.copy(), None if relabel is None else relabel.copy())
        nnz = int(indptr[-1])
        C = sp.csr_matrix((-np.arange(1.0, nnz + 1), indices, indptr), shape=(n, n))
        L = sp.diags(np.arange(nnz + 1.0, nnz + n + 1)) + C  # the labels of L = diag(d) - C, by position
        L = L.tocsr()
        if relabel is not None:
            L = L[relabel][:, relabel].tocsr()
        B = (L + 0.0 * sp.identity(n)).tocsc()
        B = B[ordering][:, ordering].tocsc()
        B.sort_indices()  # as ``splu`` sorts its input (in place) before it factorises
        label = B.data.astype(np.int64)
        self._indptr, self._indices, self._shape = B.indptr, B.indices, B.shape
        self._off = label < 0  # positions of C's entries, and which entry
        self._off_source = -label[self._off] - 1
        self._diag_source = label[~self._off] - nnz - 1
        self._row_starts = indptr[:-1]

    @classmethod
    def build(cls, indptr, indices, ordering, relabel=None):
        """An ``Assembly`` for C's pattern (CSR ``indptr``, ``indices``), or None where SciPy's way would merge
        or drop entries of it (a stored diagonal entry, an empty row)."""
        rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
        if np.any(np.diff(indptr) == 0) or np.any(indices == rows):
            return None
        return cls(indptr, indices, ordering, relabel)

    def fits(self, indptr, indices, ordering, relabel=None) -> bool:
        """The same pattern, ordering and point order as this assembly's."""
        given = (indptr, indices, ordering, relabel)
        return all((a is None and b is None) or (a is not None and b is not None and a.shape == b.shape
                                                 and np.array_equal(a, b)) for a, b in zip(self.key, given))

    def matrix(self, weights: np.ndarray, mu: float):
        """``(L(C) + mu I)[ordering][:, ordering]`` in CSC for C's ``weights`` (its CSR data), or None if a
        weight or a diagonal entry is 0 (SciPy would drop that entry)."""
        if not np.all(weights):
            return None
        diagonal = np.add.reduceat(weights, self._row_starts)[self._diag_source] + mu  # C.sum(axis=1) + mu
        if not np.all(diagonal):
            return None
        data = np.empty(self._indices.size)
        data[self._off] = -weights[self._off_source]
        data[~self._off] = diagonal
        B = sp.csc_matrix((data, self._indices.copy(), self._indptr.copy()), shape=self._shape)
        B.has_sorted_indices = True
        return B


class MultigridPreconditioner(_FreedWhereBuilt):
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
    _superlu = ("hierarchy", "_cycle")  # the coarsest level's SuperLU

    def __init__(self, laplacian: sp.spmatrix, mu: float, ordering: np.ndarray | None = None):
        import pyamg

        self._built_here()
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
