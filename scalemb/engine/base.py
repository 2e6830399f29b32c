"""What every executor shares: the model's evaluation, the FFT-or-exact choice, the curvature and its
Laplacian products, all written once against ``map_blocks``.

An executor holds P's rows in blocks somewhere (``LocalExecutor``: in this process, run on a thread pool;
``DaskExecutor``: on Dask workers) and implements

* ``map_blocks(fn, *args) -> [fn(block_k, *args) for every block k]``, in block order;
* ``_keep(fn, *args)``: the same, leaving the results where the blocks are (handles, one per block), and
  ``_map_kept(fn, kept, *args) -> [fn(block_k, kept_k, *args)]`` on them (the curvature weights stay on the
  workers);
* ``_call(fn)``: run ``fn()`` (the Dask executor repeats it after recovering a lost worker);
* ``_to_internal`` / ``_to_input``: the blocks' point order (the local executor may renumber the points for
  locality) from and to the input's;
* ``bounds``: the blocks' row ranges; ``_entropy``: ``sum p log p``; ``_point_affinity``: what a model's
  ``point_term`` gets as its affinity (in the internal point order).

Block functions get the model as ``self._model_arg``: the ``Model`` itself in this process, a ``ModelRef``
(name, parameters, origin) for Dask workers, which rebuild it (``block_model``).  Partials are always reduced in
block order by ``reduce_blocks`` and the model's ``Objective``, so executors on the same blocks agree bit for bit.
"""
import numpy as np

from ..models import Model, ModelRef
from ..repulsion.method import AutoRepulsion, resolve_repulsion_settings
from .blocks import Evaluation, curvature_block, evaluate_block, laplacian_block, point_major, reduce_blocks
from .fft_pass import CappedGridWarning, evaluate_fft
from .laplacian import row_sums


def block_model(model) -> Model:
    """The ``Model`` a block function was given: a ``Model``, or a ``ModelRef`` rebuilt (cached per process)."""
    return model.model() if isinstance(model, ModelRef) else model


def evaluate_partition(block, coords, model, space_dims: int, with_kl: bool, Yt=None):
    """``evaluate_block`` with the model as passed to block functions (``block_model``)."""
    return evaluate_block(block_model(model), block, coords, space_dims, with_kl, Yt)


def curvature_partition(block, coords, model, space_dims: int, exaggeration: float, fixed: bool,
                        Yt=None) -> np.ndarray:
    return curvature_block(block_model(model), block, coords, space_dims, exaggeration, fixed, Yt)


def diagonal_partition(block, weights: np.ndarray) -> np.ndarray:
    return row_sums(block.indptr, weights)


class Executor:
    """Evaluates a model's objective and gradient over P's row blocks (see the module docstring).

    ``repulsion``: ``'exact'`` (all pairs), ``'fft'`` (interpolation on a grid with ``fft_params``, the model's
    ``FFTSpec``; ValueError naming the model if it has none) or ``'auto'`` (``scalemb.repulsion.method``: exact
    for a model without one); ``self.repulsion`` is the resolved method: ``'exact'``, ``'fft'`` or ``'auto'``
    (chosen per evaluation by ``self.auto_repulsion``, an ``AutoRepulsion``).
    """

    # set by subclasses: whether the blocks live in this process (they then share one point-major copy of the
    # coordinates), and the threads the FFT convolution may use (scipy's -1: all)
    _shared_memory = False
    _fft_workers = -1

    def _setup(self, model: Model | None, space_dims: int, time_dims: int, n_points: int, repulsion: str, fft_params,
               model_arg) -> None:
        """The shared settings.  ``model`` None: an executor for row-block maps and Laplacian products with fixed
        weights only (the eigenmaps), which cannot evaluate."""
        if model is None:
            repulsion = "exact"
        else:
            model.check_dims(space_dims, time_dims)
        self.repulsion, self.fft_params = resolve_repulsion_settings(repulsion, model, space_dims, time_dims,
                                                                     n_points, fft_params)
        self.auto_repulsion = (AutoRepulsion(model, space_dims, time_dims, self.fft_params)
                               if self.repulsion == "auto" else None)
        self._warn_capped = CappedGridWarning()
        self.model = model
        self._model_arg = model_arg
        self.space_dims = space_dims
        self.time_dims = time_dims
        self._weights = None
        self._curvature_args = None

    # --- what subclasses provide

    def map_blocks(self, fn, *args) -> list:
        raise NotImplementedError

    def _keep(self, fn, *args) -> list:
        return self.map_blocks(fn, *args)

    def _map_kept(self, fn, kept, *args) -> list:
        raise NotImplementedError

    def _call(self, fn):
        return fn()

    def _to_internal(self, X: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(X, dtype=np.float64)

    def _to_input(self, X: np.ndarray) -> np.ndarray:
        return X

    @property
    def _point_affinity(self):
        return None

    # --- evaluation

    def check_coords(self, coords) -> None:
        """ValueError unless ``coords`` is ``(ds + dt, N)`` for this executor's dimensions and points: the kernels
        read rows by index, so another shape would give numbers, not an error."""
        shape, expected = np.shape(coords), (self.space_dims + self.time_dims, self.n_points)
        if shape != expected:
            raise ValueError(f"coordinates of shape {shape}: this executor embeds {self.n_points} points in "
                             f"{self.space_dims} space and {self.time_dims} time dimensions, so expects {expected}")

    def evaluate(self, coords: np.ndarray, exaggeration: float = 1.0, with_kl: bool = True,
                 iteration: int | None = None, choice=None) -> Evaluation:
        """The model's objective (``Evaluation.kl``, without exaggeration; NaN without ``with_kl``: not computed),
        the optimised ``objective`` and its gradient at ``coords`` (``(ds + dt, N)``, input point order).

        After the blocks' reduction the model's ``point_term(coords, iteration, affinity)``, if any, adds its
        value to ``kl`` and ``objective`` and its gradient to the gradient: it is called on the client with the
        coordinates **in the executor's internal point order** (``_to_internal``: the local executor's locality
        order, if it renumbered the points; the input order otherwise) and ``affinity`` in that same order (the
        local executor's internal ``Affinity``, the Dask executor's ``AffinityStore``), so per-point arrays it
        reads (``affinity.radii``) line up with the columns of ``coords``.  ``iteration``: the optimiser's
        iteration (None outside an optimisation), for terms switched on after a warm-up.  ``choice``: with
        ``repulsion='auto'``, the decision already made for ``coords`` (``AutoRepulsion.decide``)."""
        if self.model is None:
            raise RuntimeError("this executor has no model (a Laplacian-only executor): it cannot evaluate")
        self.check_coords(coords)
        coords = self._to_internal(coords)
        if choice is None and self.auto_repulsion is not None:
            choice = self.auto_repulsion.choose(coords)
        use_fft = self.repulsion == "fft" or (choice is not None and choice.method == "fft")
        evaluation = self._call(lambda: self._evaluate_blocks(coords, exaggeration, with_kl, use_fft, choice))
        if self.model.point_term is not None:
            value, gradient = self.model.point_term(coords, iteration, self._point_affinity)
            evaluation.kl += value
            evaluation.objective += value
            evaluation.gradient = evaluation.gradient + gradient
        evaluation.gradient = self._to_input(evaluation.gradient)
        return evaluation

    def _evaluate_blocks(self, coords, exaggeration, with_kl, use_fft, choice) -> Evaluation:
        """One map-reduce over the blocks, exact or FFT repulsion (``coords`` in the internal order)."""
        extra = (point_major(coords),) if self._shared_memory else ()  # once per evaluation, shared by the blocks
        if use_fft:
            return evaluate_fft(self.map_blocks, self.model, self.space_dims, coords, self._entropy, exaggeration,
                                self.fft_params, fft_workers=self._fft_workers, on_capped=self._warn_capped,
                                with_kl=with_kl, point_major_copy=extra[0] if extra else None,
                                grid=None if choice is None else choice.grid,
                                cells=None if choice is None else choice.cells, block_model=self._model_arg)
        results = self.map_blocks(evaluate_partition, coords, self._model_arg, self.space_dims, with_kl, *extra)
        return reduce_blocks(results, coords.shape, self._entropy, exaggeration, with_kl=with_kl,
                             objective=self.model.objective)

    # --- curvature (spectral direction)

    def set_curvature(self, coords: np.ndarray, exaggeration: float = 1.0, fixed: bool = False) -> None:
        """Compute and keep, per block (where the block is), the weights C of the space partial Hessian ``L(C)``
        (``blocks.curvature_block``)."""
        coords = self._to_internal(coords)
        self._curvature_args = (coords, exaggeration, fixed)
        self._call(self._compute_curvature)

    def _compute_curvature(self) -> None:
        coords, exaggeration, fixed = self._curvature_args
        if self.model is None and not fixed:
            raise RuntimeError("this executor has no model: only the fixed curvature 4 P is available")
        self._weights = None
        # one point-major copy shared by the blocks, as an evaluation's (per block: a copy of all N points each)
        extra = (point_major(coords),) if self._shared_memory and not fixed else ()
        self._weights = self._keep(curvature_partition, coords, self._model_arg, self.space_dims, exaggeration,
                                   fixed, *extra)

    def _check_curvature(self) -> None:
        if self._weights is None:
            raise RuntimeError("call set_curvature() before using the curvature")

    def laplacian_matvec(self, V: np.ndarray) -> np.ndarray:
        """``L(C) V`` for V of shape ``(d, N)``, by row blocks."""
        self._check_curvature()
        V = self._to_internal(V)
        out = np.empty_like(V)
        for (r0, r1), rows in zip(self.bounds, self._call(lambda: self._map_kept(laplacian_block, self._weights, V))):
            out[:, r0:r1] = rows
        return self._to_input(out)

    def curvature_diagonal(self) -> np.ndarray:
        """Diagonal of ``L(C)``: the row sums of C."""
        self._check_curvature()
        return self._to_input(np.concatenate(self._call(lambda: self._map_kept(diagonal_partition,
                                                                                 self._weights))))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        pass
