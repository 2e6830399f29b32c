"""In-process executor: row blocks evaluated on a thread pool (the kernels release the GIL)."""
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from ..affinity.affinity import Affinity, row_partition
from ..affinity.ordering import inverse_permutation, locality_order
from ..affinity.store import layout_partitions
from ..models.base import Model
from ..optim.solvers import factorize
from ..repulsion.fft import FFTParams
from ..repulsion.method import AutoRepulsion, resolve_repulsion_settings
from .blocks import Evaluation, curvature_block, evaluate_block, laplacian_block, point_major, reduce_blocks
from .fft_pass import CappedGridWarning, evaluate_fft
from .laplacian import row_sums


POINT_ORDERS = ("auto", "given", "locality")
# From this many points on, point_order='auto' evaluates in the locality order (scalemb.affinity.ordering): below
# it the coordinates fit in the fastest caches anyway, and the committed small-graph results (GrQc, Table 1)
# keep their summation order.
LOCALITY_ORDER_MIN_POINTS = 20000


def default_threads() -> int:
    """Threads to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class LocalExecutor:
    """Evaluates KL and its gradient with P split into row blocks, evaluated on a thread pool.

    Blocks: ``partitions`` (row boundaries ``0 = b_0 < ... < b_K = N``) if given, else ``n_blocks`` equal
    ranges if given, else the data-determined layout (``scalemb.affinity.store.layout_partitions``: a function of
    N and P's non-zeros only, the partitions of a store written with the defaults).  Results depend on the blocks
    only through floating-point summation order, and partials are always reduced in block order, so the thread
    count never changes a result: any ``n_threads``, and the Dask executor on the same partitions, give
    bit-identical evaluations.

    ``repulsion``: ``'exact'`` (all pairs), ``'fft'`` (interpolation on a grid with ``fft_params``,
    ``scalemb.repulsion.fft``) or ``'auto'`` (``scalemb.repulsion.method``); ``self.repulsion`` is the
    resolved method: ``'exact'``, ``'fft'`` or ``'auto'`` (chosen per evaluation by ``self.auto_repulsion``,
    an ``AutoRepulsion``).

    ``point_order``: ``'given'`` evaluates P's rows in the input's order; ``'locality'`` in P's reverse
    Cuthill-McKee order (``scalemb.affinity.ordering``: faster neighbour gathers), renumbering the points
    internally: coordinates, gradients and curvature are still exchanged in the input's order, and results
    differ from ``'given'`` by summation order only; ``'auto'``: locality from ``LOCALITY_ORDER_MIN_POINTS``
    points on, unless ``partitions`` are given (they fix the row order the Dask executor uses).
    """

    def __init__(self, affinity: Affinity, model: Model, space_dims: int, time_dims: int,
                 n_threads: int | None = None, n_blocks: int | None = None, partitions=None,
                 repulsion: str = "exact", fft_params: FFTParams | None = None, point_order: str = "auto"):
        model.check_dims(space_dims, time_dims)
        if point_order not in POINT_ORDERS:
            raise ValueError(f"unknown point_order {point_order!r}; choose one of {', '.join(POINT_ORDERS)}")
        if point_order == "locality" and partitions is not None:
            raise ValueError("point_order='locality' renumbers P's rows, which given partitions fix: use 'given'")
        self.repulsion, self.fft_params = resolve_repulsion_settings(repulsion, model.name, space_dims, time_dims,
                                                                     affinity.n_points, fft_params)
        self._warn_capped = CappedGridWarning()
        self.auto_repulsion = (AutoRepulsion(model.name, space_dims, time_dims, self.fft_params)
                               if self.repulsion == "auto" else None)
        self.affinity = affinity
        self.model = model
        self.space_dims = space_dims
        self.time_dims = time_dims
        self.n_threads = n_threads or default_threads()
        n = affinity.n_points
        self._order = self._rank = None
        internal = affinity
        if point_order == "locality" or (point_order == "auto" and partitions is None
                                         and n >= LOCALITY_ORDER_MIN_POINTS):
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
        self.blocks = [internal.row_block(r0, r1) for r0, r1 in bounds]
        self._entropy = sum(block.entropy_term() for block in self.blocks)
        self._pool = ThreadPoolExecutor(self.n_threads) if len(self.blocks) > 1 and self.n_threads > 1 else None
        self._weights = None

    def _map(self, fn):
        if self._pool is None:
            return [fn(b) for b in self.blocks]
        return list(self._pool.map(fn, self.blocks))

    @property
    def n_points(self) -> int:
        return self.affinity.n_points

    @property
    def point_order(self) -> str:
        """The order the blocks hold P's rows in: ``'given'`` or ``'locality'``."""
        return "given" if self._order is None else "locality"

    def _to_internal(self, X: np.ndarray) -> np.ndarray:
        """``(d, N)`` columns from the input's point order to the blocks' (C-contiguous float64)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        return X if self._order is None else np.ascontiguousarray(X[..., self._order])

    def _to_input(self, X: np.ndarray) -> np.ndarray:
        """Columns (or entries of a vector) from the blocks' point order back to the input's."""
        return X if self._rank is None else np.ascontiguousarray(X[..., self._rank])

    def evaluate(self, coords: np.ndarray, exaggeration: float = 1.0, with_kl: bool = True) -> Evaluation:
        """KL(P||Q) and gradient at ``coords`` (``(ds + dt, N)``, C-contiguous float64); without ``with_kl``
        the KL (and objective) is not computed: NaN."""
        coords = self._to_internal(coords)
        choice = self.auto_repulsion.choose(coords) if self.auto_repulsion is not None else None
        if self.repulsion == "fft" or (choice is not None and choice.method == "fft"):
            evaluation = self._evaluate_fft(coords, exaggeration, with_kl, choice)
        else:
            Yt = point_major(coords)  # once per evaluation, shared by the blocks
            results = self._map(lambda b: evaluate_block(self.model, b, coords, self.space_dims, with_kl, Yt))
            evaluation = reduce_blocks(results, coords.shape, self._entropy, exaggeration, with_kl=with_kl)
        evaluation.gradient = self._to_input(evaluation.gradient)
        return evaluation

    def _evaluate_fft(self, coords: np.ndarray, exaggeration: float, with_kl: bool, choice=None) -> Evaluation:
        """The FFT-repulsion map-reduce over this executor's blocks (``engine.fft_pass``); ``choice``: an
        ``AutoRepulsion`` decision whose grid and near-field cells are reused."""
        return evaluate_fft(lambda fn, *args: self._map(lambda b: fn(b, *args)), self.model.name,
                            self.space_dims, coords, self._entropy, exaggeration, self.fft_params,
                            fft_workers=self.n_threads, on_capped=self._warn_capped, with_kl=with_kl,
                            share_point_major=True, grid=None if choice is None else choice.grid,
                            cells=None if choice is None else choice.cells)

    def set_curvature(self, coords: np.ndarray, exaggeration: float = 1.0, fixed: bool = False) -> None:
        """Compute and keep, per block, the weights C of the space partial Hessian ``L(C)`` (see blocks)."""
        coords = self._to_internal(coords)
        self._weights = self._map(lambda b: curvature_block(self.model, b, coords, self.space_dims,
                                                            exaggeration, fixed))

    def _block_weights(self):
        if self._weights is None:
            raise RuntimeError("call set_curvature() before using the curvature")
        return zip(self.blocks, self._weights)

    def laplacian_matvec(self, V: np.ndarray) -> np.ndarray:
        """``L(C) V`` for V of shape ``(d, N)``, by row blocks."""
        V = self._to_internal(V)
        out = np.empty_like(V)
        for block, rows in zip(self.blocks, self._map_weights(lambda b, w: laplacian_block(b, w, V))):
            out[:, block.r0:block.r1] = rows
        return self._to_input(out)

    def _map_weights(self, fn):
        pairs = list(self._block_weights())
        if self._pool is None:
            return [fn(b, w) for b, w in pairs]
        return list(self._pool.map(lambda bw: fn(*bw), pairs))

    def curvature_diagonal(self) -> np.ndarray:
        """Diagonal of ``L(C)``: the row sums of C."""
        return self._to_input(np.concatenate([row_sums(b.indptr, w) for b, w in self._block_weights()]))

    def curvature_matrix(self) -> sp.csr_matrix:
        """``L(C)`` as one sparse matrix (gathers every block: only for solvers that factorise it)."""
        weights = np.concatenate([w for _, w in self._block_weights()])
        P = self._internal.P
        C = sp.csr_matrix((weights, P.indices, P.indptr), shape=P.shape)
        L = (sp.diags(np.asarray(C.sum(axis=1)).ravel()) - C).tocsr()
        return L if self._rank is None else L[self._rank][:, self._rank].tocsr()

    def factorize_curvature(self, mu: float, ordering=None, kind: str = "lu"):
        """Sparse factorisation (``kind='lu'``; ``ordering``: a fill-reducing order to reuse) or multigrid
        preconditioner (``'amg'``) of ``L(C) + mu I`` (``scalemb.optim.solvers.factorize``)."""
        return factorize(kind, self.curvature_matrix(), mu, ordering)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
