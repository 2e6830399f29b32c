"""One KL + gradient evaluation with FFT-interpolated repulsion, as a map-reduce over row blocks.

``map_blocks(fn, *args)`` returns ``[fn(block, *args) for block in blocks]`` in block order, wherever the
blocks live (threads of the local executor, Dask workers).  Steps (``scalemb.repulsion.fft``):
extent of the coordinates (here: the caller holds them) -> grid (small) -> the points' charges spread on it
(here) -> one FFT convolution (here; for t-SNE it also gives Z's grid part) -> near-field cell index of a capped
grid (here) -> attraction and interpolated repulsion per block -> ``reduce_blocks``: one pass over the blocks
per evaluation.  When the blocks are in this process, the grid part of the interpolation runs here too, once for
all rows in the spreading's box order (``interpolate_grid``), and each block takes its rows of it: the same
numbers as each block interpolating its own rows.

The charges depend on the coordinates only, not on P, so they are spread once, over all rows (in box order),
where the coordinates are: the result is a function of the coordinates alone, whatever the block layout, thread
or worker count.  Spreading them per row block instead (a partial grid per block, summed in block order) cost a
whole grid per block -- allocated, page-faulted, summed, and on Dask sent to the client: with the 16-64 blocks
of the data-determined layout that was +10 % per t-SNE evaluation and +74 % per SNEST R^{2,1} evaluation at
N = 1e5 against one block (docs/design/engine.md).
"""
import logging

import numpy as np

from ..models import ModelRef
from ..repulsion.convolution import convolve
from ..repulsion.fft import interpolate_grid, near_cells, spread
from ..repulsion.grid import block_extent, grid_for
from ..repulsion.spec import FFTParams
from .blocks import Evaluation, evaluate_block_fft, reduce_blocks

logger = logging.getLogger("scalemb")


class CappedGridWarning:
    """``on_capped`` for ``evaluate_fft`` that logs the first capped grid of an executor, once."""

    def __init__(self):
        self.warned = False

    def __call__(self, grid, lo, hi) -> None:
        if not self.warned:
            logger.warning("fft repulsion: the embedding spans %s; the grid is capped at %d nodes (%s): "
                           "pairs within the cutoff are summed directly, which costs more when many are",
                           np.array2string(hi - lo, precision=3), grid.n_nodes, grid.describe())
            self.warned = True


def evaluate_block_on_grid(block, model, coords, space_dims, grid, potentials, cells, with_kl, Yt=None,
                           grid_rows=None):
    """``evaluate_block_fft`` for a model passed as a ``Model`` or a ``ModelRef`` (on a Dask worker)."""
    model = model.model() if isinstance(model, ModelRef) else model
    return evaluate_block_fft(model, block, coords, space_dims, grid, potentials, cells, with_kl, Yt, grid_rows)


def fft_grid(model, space_dims: int, coords: np.ndarray, params: FFTParams, grid=None, on_capped=None):
    """The grid of one evaluation at ``coords`` (``grid``: one already built for them), None for a layout that
    is not finite or whose time extent overflows the time kernels (the evaluation is then not finite, which an
    optimiser treats as a blow-up: delta-bar-delta backs off, a line search shortens its step);
    ``on_capped(grid, lo, hi)`` is called when the grid is capped."""
    lo, hi = block_extent(coords, 0, coords.shape[1])
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        return None
    if grid is None:
        try:
            grid = grid_for(model, space_dims, coords, params)
        except FloatingPointError as exc:
            logger.warning("%s", exc)
            return None
    if grid.capped and on_capped is not None:
        on_capped(grid, lo, hi)
    return grid


def evaluate_fft(map_blocks, model, space_dims: int, coords: np.ndarray, entropy: float,
                 exaggeration: float, params: FFTParams, fft_workers: int = 1, on_capped=None,
                 with_kl: bool = True, point_major_copy=None, grid=None, cells=None, block_model=None) -> Evaluation:
    """The objective of ``model`` (a ``Model``; NaN without ``with_kl``) and its gradient at ``coords`` with the
    repulsion interpolated on a grid (``model.fft``); ``on_capped(grid, lo, hi)`` is called when the grid is
    capped (its near field is then summed directly).  A non-finite layout gives a NaN evaluation (the optimisers
    treat it as a blow-up).  ``point_major_copy``: ``point_major(coords)`` shared by the blocks (blocks in this
    process).  ``grid`` and ``cells``: that grid and near-field index if already built for ``coords``
    (``AutoRepulsion``).  ``block_model``: what the block function gets as the model (a ``ModelRef`` for Dask
    workers; default ``model``).  Block partials (Z, sum p log w) are summed in block order, whatever ran
    them, and the charges are spread here over all rows (module docstring): the result depends on the data-
    determined blocks only."""
    if grid is None:
        cells = None
    grid = fft_grid(model, space_dims, coords, params, grid, on_capped)
    if grid is None:
        nan = float("nan")
        return Evaluation(nan, nan, np.full(coords.shape, nan), nan)
    visit = grid.visit(coords, 0, coords.shape[1], fft_workers)  # rows in box order: spreading, interpolating
    charges = spread(grid, coords, 0, coords.shape[1], workers=fft_workers, visit=visit)
    potentials, grid_z = convolve(grid, charges, workers=fft_workers)
    if cells is None:
        cells = near_cells(grid, coords)
    extra = ()
    if point_major_copy is not None:  # blocks in this process: the grid part of all rows at once, shared
        extra = (point_major_copy, interpolate_grid(grid, coords, potentials, fft_workers, visit))
    results = map_blocks(evaluate_block_on_grid, model if block_model is None else block_model, coords, space_dims,
                         grid, potentials, cells, with_kl, *extra)
    return reduce_blocks(results, coords.shape, entropy, exaggeration, z_outside_blocks=grid_z, with_kl=with_kl,
                         objective=model.objective, outliers=grid.outliers)
