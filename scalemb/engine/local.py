"""In-process executor: row blocks evaluated on a thread pool (the kernels release the GIL)."""
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from ..affinity.affinity import Affinity, default_threads, row_partition  # noqa: F401 - default_threads: kept here
from ..affinity.ordering import inverse_permutation, locality_order
from ..affinity.store import layout_partitions
from ..models.base import Model
from .factor import Assembly, FactorizedSolver, factorize
from ..repulsion.spec import FFTParams
from .base import Executor
from .laplacian import laplacian_matrix
from .threadchoice import ThreadChoice


POINT_ORDERS = ("given", "locality")


class LocalExecutor(Executor):
    """Evaluates a model's objective and its gradient with P split into row blocks, evaluated on a thread pool.

    Blocks: ``partitions`` (row boundaries ``0 = b_0 < ... < b_K = N``) if given, else ``n_blocks`` equal
    ranges if given, else the data-determined layout (``scalemb.affinity.store.layout_partitions``: a function of
    N and P's non-zeros only, the partitions of a store written with the defaults).  Results depend on the blocks
    only through floating-point summation order, and partials are always reduced in block order, so the thread
    count never changes a result: any ``n_threads``, and the Dask executor on the same partitions, give
    bit-identical evaluations.

    ``repulsion``, ``fft_params``: see ``scalemb.engine.base.Executor``.

    ``measure_threads`` (default True): with more than one thread, whether each evaluation uses the pool or this
    thread alone is measured during the run (``scalemb.engine.threadchoice.ThreadChoice``: the pool is kept only
    where it is >= 1.1x faster); False: always the pool.  Either way the same numbers (see above).

    ``point_order``: ``'given'`` (the default) evaluates P's rows in the input's order, as the Dask executor
    and a store input do; ``'locality'`` in P's reverse Cuthill-McKee order (``scalemb.affinity.ordering``),
    renumbering the points internally: coordinates, gradients and curvature are still exchanged in the input's
    order, and results differ from ``'given'`` by summation order only -- so not bit for bit, which is why no
    run uses it by default.  It is kept for measurements (``benchmarks/layout_cpu.py``): per evaluation at
    N ~ 1e5 it did not pay (docs/design/engine.md).
    """

    _shared_memory = True

    def __init__(self, affinity: Affinity, model: Model, space_dims: int, time_dims: int,
                 n_threads: int | None = None, n_blocks: int | None = None, partitions=None,
                 repulsion: str = "exact", fft_params: FFTParams | None = None, point_order: str = "given",
                 measure_threads: bool = True):
        if point_order not in POINT_ORDERS:
            raise ValueError(f"unknown point_order {point_order!r}; choose one of {', '.join(POINT_ORDERS)}")
        if point_order == "locality" and partitions is not None:
            raise ValueError("point_order='locality' renumbers P's rows, which given partitions fix: use 'given'")
        self._setup(model, space_dims, time_dims, affinity.n_points, repulsion, fft_params, model)
        self.affinity = affinity
        self.n_threads = n_threads or default_threads()
        self._alone = False  # this evaluation on the calling thread only (``thread_choice``)
        n = affinity.n_points
        self._order = self._rank = None
        self._assembly = None  # ``factorize_curvature``'s ``Assembly`` of P's pattern (False: refused, SciPy's way)
        internal = affinity
        if point_order == "locality":
            self._order = locality_order(affinity.P)
            self._rank = inverse_permutation(self._order)
            internal = affinity.permuted(self._order)
        if partitions is not None:  # row boundaries, e.g. an affinity store's: same sums as the Dask executor
            bounds = [(int(a), int(b)) for a, b in zip(partitions[:-1], partitions[1:])]
        elif n_blocks is not None:
            bounds = row_partition(n, n_blocks)
        else:
            layout = layout_partitions(n)
            bounds = [(int(a), int(b)) for a, b in zip(layout[:-1], layout[1:])]
        self._internal = internal
        self.bounds = bounds
        self.blocks = [internal.row_block(r0, r1) for r0, r1 in bounds]
        self._entropy = sum(block.entropy_term() for block in self.blocks)
        self._pool = ThreadPoolExecutor(self.n_threads) if len(self.blocks) > 1 and self.n_threads > 1 else None
        self.thread_choice = ThreadChoice() if measure_threads and self.n_threads > 1 else None

    @property
    def _fft_workers(self) -> int:
        """Threads of the FFT pass's grid stages (spreading, transforms, interpolation)."""
        return 1 if self._alone else self.n_threads

    def evaluate(self, coords: np.ndarray, exaggeration: float = 1.0, with_kl: bool = True,
                 iteration: int | None = None, choice=None):
        """``Executor.evaluate``, on the pool or on this thread alone as ``thread_choice`` decides (and timed for
        it)."""
        if self.thread_choice is None:
            return super().evaluate(coords, exaggeration, with_kl, iteration, choice)
        pooled = self.thread_choice.pooled()
        self._alone = not pooled
        try:
            start = time.perf_counter()
            evaluation = super().evaluate(coords, exaggeration, with_kl, iteration, choice)
            self.thread_choice.record(pooled, time.perf_counter() - start)
        finally:
            self._alone = False  # curvature and Laplacian products keep the pool
        return evaluation

    def _map(self, fn):
        """``[fn(block) for block in self.blocks]`` on the thread pool, in block order."""
        if self._pool is None or self._alone:
            return [fn(b) for b in self.blocks]
        return list(self._pool.map(fn, self.blocks))

    def map_blocks(self, fn, *args) -> list:
        """``[fn(block, *args) for block in self.blocks]`` on the thread pool, in block order."""
        return self._map(lambda b: fn(b, *args))

    def _map_kept(self, fn, kept, *args) -> list:
        pairs = list(zip(self.blocks, kept))
        if self._pool is None or self._alone:
            return [fn(b, k, *args) for b, k in pairs]
        return list(self._pool.map(lambda bk: fn(bk[0], bk[1], *args), pairs))

    @property
    def n_points(self) -> int:
        return self.affinity.n_points

    @property
    def point_order(self) -> str:
        """The order the blocks hold P's rows in: ``'given'`` or ``'locality'``."""
        return "given" if self._order is None else "locality"

    @property
    def _point_affinity(self):
        """The affinity in the blocks' point order (``Affinity.permuted``), for a model's ``point_term``."""
        return self._internal

    def _to_internal(self, X: np.ndarray) -> np.ndarray:
        """``(d, N)`` columns from the input's point order to the blocks' (C-contiguous float64)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        return X if self._order is None else np.ascontiguousarray(X[..., self._order])

    def _to_input(self, X: np.ndarray) -> np.ndarray:
        """Columns (or entries of a vector) from the blocks' point order back to the input's."""
        return X if self._rank is None else np.ascontiguousarray(X[..., self._rank])

    def curvature_matrix(self) -> sp.csr_matrix:
        """``L(C)`` as one sparse matrix (gathers every block: only for solvers that factorise it)."""
        self._check_curvature()
        weights = np.concatenate(self._weights)
        P = self._internal.P
        C = sp.csr_matrix((weights, P.indices, P.indptr), shape=P.shape)
        L = laplacian_matrix(C)
        return L if self._rank is None else L[self._rank][:, self._rank].tocsr()

    def _assembled(self, ordering, mu: float):
        """``(L(C) + mu I)`` in ``ordering`` from the blocks' weights (``Assembly``), or None where SciPy's way
        must build it."""
        self._check_curvature()
        P = self._internal.P
        if self._assembly is False:  # P's pattern was refused: it does not change, so neither does the answer
            return None
        if self._assembly is None or not self._assembly.fits(P.indptr, P.indices, ordering, self._rank):
            self._assembly = Assembly.build(P.indptr, P.indices, ordering, self._rank) or False
            if self._assembly is False:
                return None
        return self._assembly.matrix(np.concatenate(self._weights), mu)

    def factorize_curvature(self, mu: float, ordering=None, kind: str = "lu"):
        """Sparse factorisation (``kind='lu'``; ``ordering``: a fill-reducing order to reuse) or multigrid
        preconditioner (``'amg'``) of ``L(C) + mu I`` (``scalemb.engine.factor.factorize``).  An LU with a
        known ordering is assembled from the weights by an ``Assembly`` kept for P's pattern (the same matrix
        as SciPy's way, without its per-iteration Python)."""
        if kind == "lu" and ordering is not None:
            B = self._assembled(ordering, mu)
            if B is not None:
                return FactorizedSolver.ordered(B, ordering)
        return factorize(kind, self.curvature_matrix(), mu, ordering)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
