"""Normaliser and repulsion by FFT-accelerated polynomial interpolation, in row blocks.

Method (Linderman, Rachh, Hoskins, Steinerberger & Kluger 2019, "Fast interpolation-based t-SNE for improved
visualization of single-cell RNA-seq data", Nat. Methods; as implemented by FIt-SNE and by openTSNE, Poličar,
Stražar & Zupan 2019/2024).  For a translation-invariant kernel ``K(y_i - y_j)`` and charges ``c_j`` the
potentials ``phi(y_i) = sum_j K(y_i - y_j) c_j`` are approximated by

1. spreading: each charge is distributed onto the interpolation nodes of its box with the Lagrange
   weights of its position (``scalemb.repulsion.interpolation``);
2. convolution: the node-to-node sums ``sum_n K(x_m - x_n) C_n`` — on an equispaced grid a Toeplitz product,
   computed once by zero-padded FFT (``scipy.fft``; ``scalemb.repulsion.convolution``);
3. interpolation: ``phi(y_i) ~ sum_m L_m(y_i) phi(x_m)`` over the nodes of y_i's box.

The error is that of degree ``p - 1`` interpolation of K over one box in each of its two arguments, so the box
width must be small against the scale on which K varies (relative to itself).

What must be convolved.  With ``w_ij = w(|Δs|², |Δt|²)`` and ``d log w/d s_i = a Δs``, ``d log w/d t_i = b Δt``
(``scalemb.models.kernels``), ``Z = sum_{i != j} w_ij`` and ``R_i = sum_j w_ij d log w_ij / d y_i``, i.e.
``R_ik = sum_j g(Δ) (y_ik - y_jk)`` for ``g = w a`` (space) or ``w b`` (time).  A space force is one
convolution of the unit charge with the odd force kernel ``g(Δ) Δ_k`` (``SpaceKernel`` with an axis; for
t-SNE ``-2 Δ_k q² = ∂q/∂Δ_k``): one forward FFT serves all of them, one inverse FFT and one interpolated
output each.  (FIt-SNE and openTSNE write ``R_ik = y_ik sum_j g - sum_j g y_jk`` instead, kernel ``g``
against the charges 1 and ``y_k``: ``d + 1`` charge channels to spread and transform, ``2 (d + 1)`` FFTs where
this needs ``d + 1``; its interpolation is a little more accurate at the same node density, 4.6e-4 against 7.9e-4
relative force error for t-SNE R^2 with 6 points in unit boxes, so the defaults below are ~1.2x denser.)

* t-SNE, ``w = q = 1/(1+|Δs|²)``, ``w a = -2 q²``: R from the force kernels against 1; Z needs only the sum
  of ``q`` * 1 over the points, which is the node sum ``sum_m C_m (q * C)_m`` (interpolation uses the
  spreading weights), taken from the charge spectrum by Parseval, ``(1/M) sum_f q^_f |C^_f|²``, without an
  inverse FFT or an interpolated output.  One charge channel, ``d`` inverse FFTs.
* SNE, ``w = exp(-|Δs|²)``, ``w a = -2 w``: Z from ``w`` * 1, R from the force kernels against 1.
* SNEST, ``w = exp(|Δt|²) q``, ``w a = -2 w q``, ``w b = 2 w``: the space force from the force kernels
  ``-2 Δs_k q² exp(Δt²)`` against 1; Z from ``q exp(Δt²)`` and the time force from the time force kernel
  ``q(Δs) 2 Δt exp(Δt²)``, both against 1: their space part is the same convolution, read through two time
  maps (``time_factors``).  The grid spans space and time (ds + 1 dimensions); per time component one forward
  and ds + 1 inverse FFTs (the charges (1, t) and ``t_i phi_1 - phi_t`` of FIt-SNE's form would need 2 and
  ds + 2, and twice the spreading).

Every plan convolves the unit charge only.  The self pair's ``w(0) = 1`` is subtracted from Z exactly; its
force term is zero (the force kernels vanish at 0).

Which plan, defaults and near field a model uses is its ``FFTSpec`` (``Model.fft``, defined in the model's
module): this module names no model; the plans above are ``cauchy_plan``, ``gauss_plan`` and ``cauchy_time_plan``.

Box layout (``FFTParams``, ``make_grid``).  Space: per dimension, boxes ``box_width`` wide (default per model
and dimension, ``FFTSpec.interpolation``, from accuracy measurements), ``p`` equispaced nodes per box, the grid
centred on the embedding's extent ``[lo, hi]``, which it covers; the node-to-node
products are convolutions, done by FFT over the space axes.  Time (SNEST, dt = 1): ``exp(Δt²)`` grows with the
time extent T and varies relatively like ``2|Δt|``, so equispaced boxes would need ~T² of them; it is entire,
so instead one box spans the time axis with ``m`` Chebyshev nodes (degree m - 1 interpolation in t, error
decaying geometrically in m; ``m = time_points`` or, by default, ``8 + 5 T`` capped at 64, measured to keep the
error of interpolating ``exp((a - t)²)`` below 1e-7 of its maximum for T <= 6).  The time parts of the
separable kernels, ``exp(Δt²)`` and ``2 Δt exp(Δt²)`` between the m nodes (m x m matrices), share a basis of
much lower numerical rank r (``time_factors``: 13 of 26 for T = 3.6), so the grid holds r time components
instead of m nodes: points spread onto them through one map and interpolate from them through one map per
time kernel, and the space FFTs run on r slices, one slice per thread (``convolve``).  In memory the time
axis comes first (``Grid.axes``), so each slice is contiguous.

Embeddings that fly apart.  The total number of nodes is capped (``FFTParams.node_cap``: ~64 per point
without a time axis, ~16 per point and time component with one, at most 2^23 per component), so memory
and FFT time stay bounded (the FFT arrays have ~``2^ds`` times the nodes of one channel).
If the extent asks for more (e.g. GrQc's t-SNE layouts, whose 355 components spread over ~7e4 units), the
space dimensions get proportionally fewer, wider boxes of width H and the Cauchy factor is split (as in
particle-particle/particle-mesh methods): the grid carries the smooth far part
``q_far = 1/(1 + d² + sigma² exp(-d²/sigma²))`` (a Cauchy-like function of d/sigma, sampled at ``sigma = H /
box_width`` as finely as the default grid samples q; SNEST's boxes at most 0.6 sigma wide), and the rest,
``q - q_far`` and ``q² - q_far²`` (< 1e-7 of q beyond ``4 sigma``), is summed directly over the pairs closer
than ``cutoff = 4 sigma``, found in a cell list (``near_cells``, ``near.near_rows``).  SNE's Gaussian
has no far part: beyond the cap the near field (cutoff 6.1) is all of it.  Accuracy is kept; the direct sum
costs more when many points lie within the cutoff of each other (at worst the exact kernel's O(N²), e.g. a
dense core with far outliers), and ``LocalExecutor`` logs once when the cap is reached.

Time band (SNEST, ``grid_for``).  The time components are what a time axis costs: each is a whole space grid
(one forward and ds + 1 inverse transforms, p^ds weights per point and output), and their number r, the SVD rank
of the time kernels at ``TIME_RANK_TOL``, grows with the width the time box spans (6 for 0.5, 13 for 3.6).  Over
a wide box ``exp(Δt²)`` also spans ``e^{T²}``, so its entries of order 1 (pairs close in time) are differences of
components up to ``e^{T²}`` larger, and lose accuracy to cancellation (lowering the rank tolerance to 1e-7 made
the repulsion of a 7.7e4-point layout with T = 3.8 wrong by 5 %).  SNEST layouts at scale keep most points in a
narrow time band and a few far from it (that layout, after 200 iterations: time std 0.044 over an extent of 3.8,
91 points beyond 0.5 of the median).  So the grid may span a band ``[a, b]`` of
the time axis only; the pairs of the points outside it (the outliers, ``Grid.outliers``, whose coordinates travel
with the grid) are summed directly, exactly (``near.time_outlier_rows``): every row against the
outliers, O(N n_out); an outlier row is neither spread nor interpolated, and gets its pairs with the band as the
reactions of those rows, a ``(d, n_out)`` partial sum per row block that the caller adds to R's outlier columns
when it reduces the blocks (``interpolate``'s ``reaction``).  ``grid_for`` picks, per evaluation, the whole
extent or a band of width ``T / 2^(k/3)`` (down to ``MIN_BAND_WIDTH``, each placed where a histogram of the time
coordinates holds the most points) by predicted seconds (``grid_cost``: weights, transforms, direct pairs); when
the whole extent wins the grid is the one without a band, as with ``FFTParams(time_band=False)``.

Partitioning (the map-reduce the Dask executor distributes): ``block_extent`` (of all rows where the caller
holds Y, as the executors do, or per row block reduced by min/max) -> ``make_grid`` (small); ``spread`` per
row block -> partial grids, summed; ``convolve`` once (potentials, and for t-SNE Z's grid part);
``interpolate`` per row block -> rows of R and the block's part of Z.  Every function needs only the row range,
the full ``(d, N)`` coordinates, the grid / potentials and the small parameters.
"""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .convolution import convolve
from .grid import SPREAD_ROWS_PER_THREAD, Grid, grid_for
from .interpolation import interpolate_range, interpolate_visited, spread_visited, to_rows, z_sum
from .near import near_kernel, time_outlier_rows
from .spec import FFTParams
from .threads import threads_for

def spread_fixed(grid: Grid, Y: np.ndarray, r0: int, r1: int, out: np.ndarray | None = None,
                 workers: int = 1, visit: tuple | None = None) -> np.ndarray:
    """Unit charges of rows ``[r0, r1)`` of ``Y`` added to ``out`` (int64 fixed point at ``grid.charge_scale``,
    ``(n_nodes,)``; new if None) and returned: a partial grid, summed exactly with other rows' (``+``).
    ``workers`` threads spread contiguous shares of the rows in their visit order (``Grid.visit``), cut
    where the box changes, so that no two threads write the same node: one grid, no per-thread copies to sum;
    integer addition makes it the same grid, bit for bit, for any ``workers``.  ``visit``: ``grid.visit(Y, r0,
    r1)`` if the caller has it."""
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    out = np.zeros(grid.n_nodes, dtype=np.int64) if out is None else out
    if r1 <= r0:
        return out
    order, keys, Yv = visit if visit is not None else grid.visit(Y, r0, r1)
    args = grid._loop_args(None if grid.time_in is None else grid.time_in[None])
    workers = threads_for(workers, order.size, SPREAD_ROWS_PER_THREAD)
    if workers == 1 or keys is None:
        spread_visited(Yv, 0, order.size, *args, grid.charge_scale, out)
        return out
    cuts = [0]
    for k in range(1, workers):  # each cut moved back to the first row of its key: threads own whole boxes
        cut = int(np.searchsorted(keys, keys[k * order.size // workers], side="left"))
        cuts.append(max(cuts[-1], cut))
    cuts.append(order.size)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda k: spread_visited(Yv, cuts[k], cuts[k + 1], *args, grid.charge_scale, out),
                      range(workers)))
    return out


def fixed_charges(grid: Grid, total: np.ndarray) -> np.ndarray:
    """The float64 charges of a summed fixed-point grid (``spread_fixed``)."""
    return total.astype(np.float64) / grid.charge_scale


def spread(grid: Grid, Y: np.ndarray, r0: int, r1: int, workers: int = 1, visit: tuple | None = None) -> np.ndarray:
    """Unit charges of rows ``[r0, r1)`` on the grid nodes, ``(n_nodes,)`` float64: partial (sum over blocks),
    spread by ``workers`` threads (``spread_fixed``; ``visit`` as there); the fixed-point sum makes the result
    the same for any ``workers``."""
    return fixed_charges(grid, spread_fixed(grid, Y, r0, r1, workers=workers, visit=visit))


@dataclass(frozen=True)
class NearCells:
    """Coordinates sorted by space cell (side ``cell_size``) for the near-field sums of a split grid."""

    cell_size: float
    n_cells: np.ndarray
    sorted_coords: np.ndarray
    sorted_keys: np.ndarray


def near_cells(grid: Grid, Y: np.ndarray) -> NearCells | None:
    """The cell index of the full embedding for ``grid``'s near field (None if the grid is not split).
    Built once per evaluation from the full coordinates (O(N log N)), shared by all row blocks."""
    if not grid.capped:
        return None
    if grid.time_band is not None:  # the outliers' pairs are summed directly (``time_outlier_rows``)
        Y = Y[:, grid.in_band(Y, np.arange(Y.shape[1]))]
    ds = grid.space_dims
    extent = grid.box_width[:ds] * grid.n_boxes[:ds]
    cell_size = max(grid.cutoff, float(extent.max()) / 2 ** 20)  # keys fit in int64 in 3-D
    cells = np.floor((Y[:ds] - grid.lo[:ds, None]) / cell_size).astype(np.int64) + 1
    n_cells = cells.max(axis=1) + 2
    keys = np.zeros(Y.shape[1], dtype=np.int64)
    for k in range(ds):
        keys = keys * n_cells[k] + cells[k]
    order = np.argsort(keys, kind="stable")
    return NearCells(cell_size, n_cells, np.ascontiguousarray(Y[:, order]), np.ascontiguousarray(keys[order]))


class GridRows(NamedTuple):
    """The grid part of the interpolation at all rows at once (``interpolate_grid``): ``R`` ``(d, N)``, and per
    row ``phi_z`` and whether it was interpolated (``interpolation.interpolate_range``)."""

    R: np.ndarray
    z_rows: np.ndarray
    visited: np.ndarray


def interpolate_grid(grid: Grid, Y: np.ndarray, potentials: np.ndarray, workers: int = 1,
                     visit: tuple | None = None) -> GridRows:
    """The grid part of ``interpolate`` at every row of ``Y`` in one pass (``visit``: ``grid.visit(Y, 0, N)``
    if the caller has it, e.g. from ``spread``): the rows in their visit order split among ``workers`` threads
    (each row writes only its own entries).  Where all rows are in one process, this replaces each row block's
    own sort and pass (``interpolate``'s ``grid_rows``): box by box over all N rows, consecutive rows share
    their boxes' nodes in cache, which a block's rows, spread over the whole layout, rarely do.  Each row's
    values are the same either way, and ``interpolate`` sums Z over a block's rows in row order as before: the
    results are the same bit for bit."""
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    n = Y.shape[1]
    if potentials.shape != (grid.n_potentials, grid.n_nodes):
        raise ValueError(f"potentials must have shape {(grid.n_potentials, grid.n_nodes)}, got {potentials.shape}")
    order, _, Yv = visit if visit is not None else grid.visit(Y, 0, n)
    plan = grid.plan
    columns = np.array([column for column, _ in plan.outputs], dtype=np.int64)
    maps = np.array([time_map for _, time_map in plan.outputs], dtype=np.int64)
    R = np.empty((grid.dims, n)) if grid.time_band is None else np.zeros((grid.dims, n))
    z_rows = np.zeros(n)
    visited = np.zeros(n, dtype=np.bool_)
    Rv = np.empty((grid.dims, order.size))
    zv = np.empty(order.size)
    loop = (*grid._loop_args(grid.time_out), np.ascontiguousarray(potentials), columns, maps, plan.z_output,
            np.array(plan.force, dtype=np.int64), Rv, zv)

    def share(k):
        j0, j1 = int(cuts[k]), int(cuts[k + 1])
        interpolate_range(Yv, j0, j1, *loop)
        to_rows(order, j0, j1, 0, Rv, zv, R, z_rows, visited)

    workers = threads_for(workers, order.size, SPREAD_ROWS_PER_THREAD)
    cuts = np.linspace(0, order.size, workers + 1).astype(np.int64)
    if workers == 1:
        share(0)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(share, range(workers)))
    return GridRows(R, z_rows, visited)


def interpolate(grid: Grid, Y: np.ndarray, potentials: np.ndarray, r0: int, r1: int,
                cells: NearCells | None = None, reaction: np.ndarray | None = None,
                grid_rows: GridRows | None = None):
    """Rows ``[r0, r1)`` of the repulsion ``R`` (``(d, r1 - r0)``) and their part of Z, from the potentials
    (plus, on a split grid, the near field, with ``cells = near_cells(grid, Y)``, built here if not given).
    When ``convolve`` takes Z on the grid (t-SNE), the rows' part is their near field minus their self pairs,
    and Z is that summed over blocks plus ``Convolution.z``.  On a time-banded grid (``grid.outliers``) the rows'
    pairs with the outliers are summed directly (``near.time_outlier_rows``) and their reactions on the
    outliers added to ``reaction`` (``(d, n_out)``, required then): summed over all row blocks, it is added to R's
    outlier columns (``grid.outliers``) by the caller.  ``grid_rows``: ``interpolate_grid``'s pass over all rows,
    whose rows ``[r0, r1)`` then replace this block's own (``potentials`` unused)."""
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    if potentials.shape != (grid.n_potentials, grid.n_nodes):
        raise ValueError(f"potentials must have shape {(grid.n_potentials, grid.n_nodes)}, got {potentials.shape}")
    plan = grid.plan
    if grid_rows is not None:
        R = grid_rows.R[:, r0:r1].copy()
        z = z_sum(grid_rows.z_rows, grid_rows.visited, r0, r1, plan.z_output, grid.self_weight)
    else:
        columns = np.array([column for column, _ in plan.outputs], dtype=np.int64)
        maps = np.array([time_map for _, time_map in plan.outputs], dtype=np.int64)
        R = np.empty((grid.dims, r1 - r0)) if grid.time_band is None else np.zeros((grid.dims, r1 - r0))
        order, _, Yv = grid.visit(Y, r0, r1)
        z = interpolate_visited(Yv, order, r0, *grid._loop_args(grid.time_out),
                                np.ascontiguousarray(potentials), columns, maps, plan.z_output, grid.self_weight,
                                np.array(plan.force, dtype=np.int64), R)
    if grid.capped:
        cells = cells or near_cells(grid, Y)
        ds = grid.space_dims
        neighbours = np.array(np.unravel_index(np.arange(3 ** ds), (3,) * ds), dtype=np.int64).T - 1
        near_rows = near_kernel(grid.spec.near_pair)
        z += near_rows(Y, cells.sorted_coords, r0, r1, ds, np.ascontiguousarray(grid.lo[:ds]), cells.cell_size,
                       cells.n_cells, cells.sorted_keys, np.ascontiguousarray(neighbours),
                       float(grid.sigma) if np.isfinite(grid.sigma) else 0.0, grid.cutoff, R,
                       *(grid.time_band or ()))
    if grid.time_band is not None:
        if reaction is None or reaction.shape != (grid.dims, grid.n_outliers):
            raise ValueError(f"a time-banded grid needs reaction of shape {(grid.dims, grid.n_outliers)}")
        z += time_outlier_rows(Y, r0, r1, grid.space_dims, grid.time_band[0], grid.time_band[1],
                               grid.outlier_coords, R, reaction)
    return R, float(z)


def fft_repulsion(model, Y: np.ndarray, space_dims: int, params: FFTParams = FFTParams(),
                  bounds=None, workers: int = 1):
    """Single-process driver of the map-reduce: ``(R, Z)`` for the ``(d, N)`` coordinates ``Y``, with the
    rows split at ``bounds`` (a list of ``(r0, r1)``; default one block).  Same contract as the exact
    ``Model.repulsion`` summed over blocks: ``gradient = 2 (-A + R / Z)``."""
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    n = Y.shape[1]
    bounds = bounds or [(0, n)]
    grid = grid_for(model, space_dims, Y, params)
    charges = fixed_charges(grid, sum(spread_fixed(grid, Y, r0, r1) for r0, r1 in bounds))
    potentials, z = convolve(grid, charges, workers)
    cells = near_cells(grid, Y)
    R = np.empty_like(Y)
    reactions = np.zeros((Y.shape[0], grid.n_outliers))
    for r0, r1 in bounds:
        reaction = np.zeros_like(reactions)
        R[:, r0:r1], zb = interpolate(grid, Y, potentials, r0, r1, cells, reaction)
        reactions += reaction
        z += zb
    if grid.n_outliers:
        R[:, grid.outliers] += reactions
    return R, z
