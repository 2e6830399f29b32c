"""The unit of work: one row block of P and the full embedding in, partial sums out.

``evaluate_block`` is the only per-iteration function that touches P; every executor (threads here, Dask
workers later) calls it on its blocks and ``reduce_blocks`` sums the partials and reduces them by the model's
``Objective``; for KL: ``KL = sum p log p - sum_blocks plogw + log Z``, ``grad = 2 (-alpha A + R / Z)`` with
``alpha`` the early exaggeration (see ``scalemb.models.kernels`` for A, R, Z).

With the FFT-interpolated repulsion (``scalemb.repulsion``) a block's repulsion is its own rows of R, from
potentials on a grid shared by all blocks: ``evaluate_block_fft``.

``Evaluation`` (the reduced value and gradient) is what every executor's ``evaluate`` answers; it is defined
here, with the reduction that makes it, and the optimisers read it from here.
"""
from dataclasses import dataclass

import numpy as np

from ..affinity.affinity import RowBlock
from ..models.base import Model
from ..models.objective import KL, Objective
from ..repulsion.fft import GridRows, NearCells, interpolate
from ..repulsion.grid import Grid
from .laplacian import laplacian_rows


@dataclass
class Evaluation:
    """The model's objective value, the optimised objective and its gradient at one embedding (``gradient`` is
    ``(d, N)``).

    ``kl`` is the model's objective without exaggeration (KL(P||Q) for KL models; the name is kept);
    ``objective`` (for KL ``sum p log p - alpha sum p log w + log Z``) is what the gradient differentiates; it
    equals ``kl`` unless early exaggeration ``alpha != 1`` is on.  Both are NaN for an evaluation asked for without
    them (``evaluate(..., with_kl=False)``).
    """

    kl: float
    objective: float
    gradient: np.ndarray | None  # None: the gradient's rows stay where they were computed (``engine.held``)
    z: float
    finite: bool | None = None  # set by ``engine.held``: whether every entry of the gradient is finite


@dataclass
class BlockResult:
    """Partial sums of one row block: attraction rows ``[r0, r1)``, repulsion, Z and sum p log w.

    ``repulsion`` is, with the exact kernel, the block's partial over the pairs it owns on the circular column
    window ``repulsion_window(r0, r1, N)`` (``(ds + dt, width)``, columns ``start, start + 1, ...`` mod N: the
    only columns the kernel writes), or, if ``repulsion_rows``, the block's own rows ``(ds + dt, r1 - r0)`` of R
    (FFT interpolation).  ``outlier_reaction``: on a time-banded FFT grid, the block's partial of R's columns
    ``grid.outliers`` (``scalemb.repulsion.fft.interpolate``), ``(ds + dt, n_out)``.
    """

    r0: int
    r1: int
    attraction: np.ndarray  # (r1 - r0, ds + dt)
    repulsion: np.ndarray
    z: float
    plogw: float
    repulsion_rows: bool = False
    repulsion_start: int = 0
    outlier_reaction: np.ndarray | None = None


def point_major(coords: np.ndarray) -> np.ndarray:
    """``(N, d)`` C-contiguous copy of the ``(d, N)`` coordinates, for the sparse kernels
    (``scalemb.models.kernels``)."""
    return np.ascontiguousarray(coords.T)


def repulsion_window(r0: int, r1: int, n_points: int) -> tuple:
    """``(start, width)``: the circular window of columns ``start .. start + width - 1`` (mod N) that a model's
    exact ``repulsion`` kernel writes for rows ``[r0, r1)``.  The kernels own each unordered pair once (the
    half-pair scheme of ``scalemb.models.kernels``, which every model's kernel follows, see
    ``scalemb.models.base``): row i pairs with its next ``(N - 1) // 2`` rows, ``N // 2`` for the first half of
    an even N, wrapping around, so the rows write columns ``r0 .. r1 - 1 + N // 2`` at most.

    Why: a block's partial is then about half of a ``(d, N)`` array, which halves the zeroing and the reduction
    adds per block, part of the fixed per-block cost of the data-determined 16-64 blocks (docs/design/engine.md)."""
    return r0, min(n_points, max(0, r1 - r0) + n_points // 2)


def _window(array: np.ndarray, start: int, width: int) -> list:
    """The (one or two) column slices of ``array`` making the circular window ``(start, width)``."""
    n = array.shape[1]
    first = min(width, n - start)
    return [array[:, start:start + first]] + ([array[:, :width - first]] if width > first else [])


def evaluate_block(model: Model, block: RowBlock, coords: np.ndarray, space_dims: int,
                   with_kl: bool = True, Yt: np.ndarray | None = None) -> BlockResult:
    """Evaluate rows ``[block.r0, block.r1)``; ``coords`` is the full ``(ds + dt, N)`` embedding (``Yt``, if
    given, its ``point_major`` copy shared by all blocks).  Without ``with_kl`` the block's ``sum p log w`` is
    not computed (0)."""
    A = np.zeros((block.r1 - block.r0, coords.shape[0]))
    Yt = point_major(coords) if Yt is None else Yt
    plogw = model.attraction(block.indptr, block.indices, block.data, block.r0, Yt, space_dims, A, with_kl)
    R = np.empty_like(coords)
    start, width = repulsion_window(block.r0, block.r1, coords.shape[1])
    parts = _window(R, start, width)
    for part in parts:
        part[...] = 0.0
    z = model.repulsion(coords, space_dims, block.r0, block.r1, R)
    window = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    return BlockResult(block.r0, block.r1, A, window, float(z), float(plogw), repulsion_start=start)


def evaluate_block_fft(model: Model, block: RowBlock, coords: np.ndarray, space_dims: int, grid: Grid,
                       potentials: np.ndarray, cells: NearCells | None = None, with_kl: bool = True,
                       Yt: np.ndarray | None = None, grid_rows: GridRows | None = None) -> BlockResult:
    """Rows ``[block.r0, block.r1)`` with the repulsion interpolated from ``potentials`` on ``grid``
    (``scalemb.repulsion.fft``: the charges of all rows, spread, summed and convolved; ``cells`` the near-field
    index of a split grid; ``Yt`` as in ``evaluate_block``; ``grid_rows``: the grid part of all rows, if already
    interpolated, ``scalemb.repulsion.fft.interpolate_grid``)."""
    A, plogw = attraction_block(model, block, coords, space_dims, with_kl, Yt)
    return repulsion_block_fft(block, A, plogw, coords, grid, potentials, cells, grid_rows)


def attraction_block(model: Model, block: RowBlock, coords: np.ndarray, space_dims: int, with_kl: bool = True,
                     Yt: np.ndarray | None = None) -> tuple:
    """``(A, sum p log w)`` of rows ``[block.r0, block.r1)``: the attraction part of ``evaluate_block_fft``,
    which needs the coordinates only (not the potentials: a Dask worker computes it while the charges are
    convolved, ``engine.halo.attraction_view``)."""
    A = np.zeros((block.r1 - block.r0, coords.shape[0]))
    Yt = point_major(coords) if Yt is None else Yt
    plogw = model.attraction(block.indptr, block.indices, block.data, block.r0, Yt, space_dims, A, with_kl)
    return A, float(plogw)


def repulsion_block_fft(block: RowBlock, A: np.ndarray, plogw: float, coords: np.ndarray, grid: Grid,
                        potentials: np.ndarray, cells: NearCells | None = None,
                        grid_rows: GridRows | None = None) -> BlockResult:
    """``evaluate_block_fft`` given the rows' attraction ``A, plogw`` (``attraction_block``): the interpolated
    repulsion of rows ``[block.r0, block.r1)``."""
    reaction = None if grid.time_band is None else np.zeros((coords.shape[0], grid.n_outliers))
    R, z = interpolate(grid, coords, potentials, block.r0, block.r1, cells, reaction, grid_rows)
    return BlockResult(block.r0, block.r1, A, R, z, plogw, repulsion_rows=True, outlier_reaction=reaction)


def sum_partials(results, z_outside_blocks: float = 0.0) -> tuple:
    """``(z, plogw, reaction)``: the blocks' Z and ``sum p log w`` summed in block order after ``z_outside_blocks``,
    and their ``outlier_reaction`` partials summed in block order (None without a time band).  What the client
    reduces when the rows stay where they were computed (``scalemb.engine.held``)."""
    z, plogw, reaction = z_outside_blocks, 0.0, None
    for res in results:
        z += res.z
        plogw += res.plogw
        if res.outlier_reaction is not None:
            reaction = res.outlier_reaction.copy() if reaction is None else reaction + res.outlier_reaction
    return z, plogw, reaction


def add_reaction(R: np.ndarray, r0: int, r1: int, outliers: np.ndarray | None, reaction: np.ndarray | None) -> None:
    """Add, in place, the summed outlier reaction (``sum_partials``) to the columns of R's rows ``[r0, r1)``
    (``R``: ``(d, r1 - r0)``) that are outliers of a time-banded grid."""
    if reaction is None or outliers is None or outliers.size == 0:
        return
    lo, hi = np.searchsorted(outliers, [r0, r1])
    if hi > lo:
        R[:, outliers[lo:hi] - r0] += reaction[:, lo:hi]


def reduce_blocks(results, coords_shape, entropy_term: float, exaggeration: float = 1.0,
                  z_outside_blocks: float = 0.0, with_kl: bool = True, objective: Objective = KL(),
                  outliers: np.ndarray | None = None) -> Evaluation:
    """Sum block partials (in block order) and reduce them by the model's ``objective``
    (``scalemb.models.objective``: for ``KL``, the exact KL(P||Q) and its gradient, exaggerated attraction if
    ``exaggeration`` > 1); ``z_outside_blocks``: a part of Z computed once, not per block (the FFT convolution's,
    for t-SNE); ``outliers``: the columns of R that blocks' ``outlier_reaction`` partials add to, summed over the
    blocks first (``sum_partials``), then added (``add_reaction``), so rows reduced where they were computed
    give the same numbers.  Without ``with_kl`` (blocks evaluated without it) value and objective are NaN: not
    computed."""
    attraction = np.zeros(coords_shape)
    repulsion = np.zeros(coords_shape)
    for res in results:
        attraction[:, res.r0:res.r1] = res.attraction.T
        if res.repulsion_rows:
            repulsion[:, res.r0:res.r1] += res.repulsion
        else:  # the block's column window; the columns outside it are exact zeros of its partial
            offset = 0
            for part in _window(repulsion, res.repulsion_start, res.repulsion.shape[1]):
                part += res.repulsion[:, offset:offset + part.shape[1]]
                offset += part.shape[1]
    z, plogw, reaction = sum_partials(results, z_outside_blocks)
    if reaction is not None:
        repulsion[:, outliers] += reaction
    n = coords_shape[1]
    value, total = objective.values(plogw, z, entropy_term, exaggeration, with_kl, n)
    gradient = objective.gradient(attraction, repulsion, z, exaggeration, n)
    return Evaluation(float(value), float(total), gradient, float(z))


def curvature_block(model: Model, block: RowBlock, coords: np.ndarray, space_dims: int,
                    exaggeration: float = 1.0, fixed: bool = False, Yt: np.ndarray | None = None) -> np.ndarray:
    """Weights ``c_ij`` of the block's rows of the attractive partial Hessian ``L(C)`` (space coordinates).

    ``fixed``: ``C = 4 alpha P`` (constant, the spectral direction of Vladymyrov & Carreira-Perpinan 2012);
    otherwise ``C = -2 alpha a_ij P`` at ``coords`` (``4 alpha P o K`` for t-SNE), see ``models.kernels``.
    ``Yt``: ``point_major(coords)`` if the caller has it (one copy shared by all blocks, as ``evaluate_block``).
    """
    if fixed:
        return 4.0 * exaggeration * block.data
    weights = np.empty_like(block.data)
    Yt = point_major(coords) if Yt is None else Yt
    model.curvature(block.indptr, block.indices, block.data, block.r0, Yt, space_dims, weights)
    return exaggeration * weights


def laplacian_block(block: RowBlock, weights: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Rows ``[r0, r1)`` of ``L(C) V`` for V of shape ``(d, N)``."""
    out = np.zeros((V.shape[0], block.r1 - block.r0))
    laplacian_rows(block.indptr, block.indices, weights, block.r0, np.ascontiguousarray(V), out)
    return out
