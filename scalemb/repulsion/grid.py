"""The interpolation grid of one evaluation (``Grid``): its boxes and nodes over the layout's extent, the node cap
and the split kernel's scale past it (``make_grid``), the time band and its outliers (``grid_for``,
``grid_from_summaries``), the fixed-point charge scale, the time components (``time_factors``) and the visit
order of a large grid's rows (``Grid.visit``).  Why each is so: ``scalemb.repulsion.fft``'s module docstring
("Box layout", "Embeddings that fly apart", "Time band")."""
import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.fft

from .interpolation import (MAX_OUTPUTS, box_keys, box_offsets, box_scatter, box_tables, bucket_divisor,
                            gather_columns)
from .spec import CUTOFF_SIGMAS, MAX_TIME_POINTS, FFTParams, FFTSpec, Plan, fft_spec, model_name
from .threads import on_threads, threads_for

# a point's spread weight is below 2^CHARGE_HEADROOM_BITS in magnitude (tensor products of Lagrange weights,
# ~1.2 per space axis, and the time map's row sums), checked in tests/test_fft_repulsion.py
CHARGE_HEADROOM_BITS = 8
# Charge grids larger than this (32768 nodes) are visited box by box (``Grid.visit_order``; then also spread on
# threads), sorted into at most the rows' count plus ``SORT_BUCKETS`` buckets of whole boxes
# (``Grid.visit``).
SORT_ABOVE_BYTES = 2 ** 18
SORT_BUCKETS = 2 ** 16
# Fewest rows per thread worth a thread of ``spread_fixed`` and ``interpolate_grid``.
SPREAD_ROWS_PER_THREAD = 4096
# Fewest rows per thread worth a thread of ``Grid.visit``'s sort: below it the threads' start-up and the per-thread
# bucket counts (rows + ``SORT_BUCKETS`` each, summed after the counting pass) cost more than the second thread
# gains (on the 2-core machines two threads took twice the time at 1.6e4 rows and 1.25x at 1.5e5, 0.77x at 7.7e5:
# docs/design/repulsion.md, "Threads for the grid stages").
SORT_ROWS_PER_THREAD = 2 ** 18


def _equispaced(points: int) -> np.ndarray:
    return (np.arange(points) + 0.5) / points


def _chebyshev(points: int) -> np.ndarray:
    return (1.0 - np.cos(np.pi * (np.arange(points) + 0.5) / points)) / 2.0


@dataclass(frozen=True)
class Grid:
    """One evaluation's box layout: in dimension k, ``n_boxes[k]`` boxes of width ``box_width[k]`` from
    ``lo[k]`` with ``points[k]`` nodes each (space: equispaced, time: one box of Chebyshev nodes);
    ``capped`` if ``max_nodes`` forced wider space boxes than asked for, in which case the kernel is split
    at scale ``sigma``: the grid carries the smooth far part, pairs closer than ``cutoff`` the rest.  With a
    time axis, ``time_in`` (m x r) and ``time_out`` (one m x r map per time kernel, ``time_factors``) map a
    point's Chebyshev weights to the r time components the grid holds, for spreading and for interpolating.
    ``time_band``: ``(lo, hi)`` of a time-banded grid (``grid_for``), whose time box spans that band only;
    ``outliers`` (global column indices, ascending) and ``outlier_coords`` (``(d, n_out)``) are the points whose
    time coordinate lies outside it, summed directly (``near.time_outlier_rows``); None otherwise."""

    spec: FFTSpec
    space_dims: int
    points: tuple
    lo: np.ndarray
    box_width: np.ndarray
    n_boxes: np.ndarray
    capped: bool
    plan: Plan = field(repr=False)
    sigma: float = 0.0
    cutoff: float = 0.0
    time_in: np.ndarray | None = field(default=None, repr=False)
    time_out: np.ndarray | None = field(default=None, repr=False)
    charge_scale: float = field(default=2.0 ** 30, repr=False)
    time_band: tuple | None = None
    outliers: np.ndarray | None = field(default=None, repr=False)
    outlier_coords: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_outliers(self) -> int:
        return 0 if self.outliers is None else int(self.outliers.size)

    def in_band(self, Y: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``rows`` without the outliers (those whose time coordinate lies outside ``time_band``)."""
        if self.time_band is None:
            return rows
        t = Y[self.space_dims, rows]
        return rows[(t >= self.time_band[0]) & (t <= self.time_band[1])]

    @property
    def self_weight(self) -> float:
        """The grid kernel's ``w(0)``, removed from Z exactly."""
        return self.spec.self_weight(self.sigma)

    @property
    def dims(self) -> int:
        return len(self.lo)

    @property
    def counts(self) -> tuple:
        """Grid entries per box and dimension: ``p`` per space dimension, the rank r on the time axis."""
        return tuple(self.points[:self.space_dims]) + (() if self.time_in is None else (self.time_in.shape[1],))

    @property
    def axes(self) -> tuple:
        """Coordinate of each axis of the grid's memory layout: the time axis first (so that each time
        component is a contiguous space grid), then the space axes."""
        space = tuple(range(self.space_dims))
        return space if self.time_in is None else (self.space_dims,) + space

    @property
    def space_nodes(self) -> tuple:
        return tuple(int(n) * p for n, p in zip(self.n_boxes[:self.space_dims], self.points[:self.space_dims]))

    @property
    def nodes(self) -> tuple:
        """Node counts per axis of the memory layout (``axes``)."""
        return tuple(int(self.n_boxes[k]) * self.counts[k] for k in self.axes)

    @property
    def n_nodes(self) -> int:
        return math.prod(self.nodes)

    @property
    def n_potentials(self) -> int:
        return len(self.plan.potentials)

    def node_positions(self) -> list:
        """Relative node positions in a box, per dimension."""
        return [_equispaced(p) if k < self.space_dims else _chebyshev(p) for k, p in enumerate(self.points)]

    def padded(self) -> tuple:
        """Space FFT lengths: at least ``2 n - 1`` per dimension (linear, not circular, convolution)."""
        return tuple(scipy.fft.next_fast_len(2 * n - 1, real=True) for n in self.space_nodes)

    def _loop_args(self, time_maps):
        """The grid arguments of ``interpolation.spread_rows``/``interpolate_rows`` (and the first four of
        ``box_keys``), per axis of the memory layout, with ``time_maps`` (``(maps, m, r)``) on the time axis."""
        axes = np.array(self.axes, dtype=np.int64)
        counts = np.array(self.counts, dtype=np.int64)[axes]
        strides = np.cumprod((self.nodes[1:] + (1,))[::-1])[::-1].astype(np.int64)
        positions, inv_denominators, points = box_tables([self.node_positions()[k] for k in axes])
        timed = time_maps is not None
        return (axes, np.ascontiguousarray(self.lo[axes], dtype=np.float64), 1.0 / self.box_width[axes],
                self.n_boxes[axes].astype(np.int64), points, counts, strides, positions, inv_denominators,
                box_offsets(counts[:-1], strides[:-1]),
                np.ascontiguousarray(time_maps) if timed else np.zeros((1, 1, 1)), timed)

    def visit_order(self, Y: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """The order the loops visit rows ``[r0, r1)`` in (those in the time band only, ``in_band``): box by
        box (``visit``: a counting sort) when the charge grid is larger than
        ``SORT_ABOVE_BYTES``, else as given.  A layout's rows come in an order unrelated to their place (t-SNE
        R^2 at N = 7.7e5: 2 M nodes, 16 MB of charges, 8 MB per potential): visited as given, each point's box
        is a cache miss; box by box, the nodes in use stay in cache."""
        return self.visit(Y, r0, r1)[0]

    def visit(self, Y: np.ndarray, r0: int, r1: int, workers: int = 1) -> tuple:
        """``(order, keys, Yv)``: ``visit_order``, for each of its rows a key that changes only between disjoint
        sets of boxes (``interpolation.box_keys``; rows split where it changes touch disjoint nodes), None when
        the rows are visited as given, and their coordinates in that order (``(d, rows)``, C-contiguous).

        The sort is a stable counting sort over at most the rows' count plus ``SORT_BUCKETS`` buckets, on
        ``workers`` threads, each counting and then placing a contiguous share of the rows (``box_keys``,
        ``box_scatter``) after the shares before it: the one stable order whatever ``workers``."""
        rows = self.in_band(Y, np.arange(r0, r1, dtype=np.int64))
        if self.n_nodes * 8 <= SORT_ABOVE_BYTES:
            Yv = np.ascontiguousarray(Y[:, r0:r1]) if rows.size == r1 - r0 else gather_columns(Y, rows)
            return rows, None, Yv
        axes, lo, inv_width, n_boxes = self._loop_args(None)[:4]
        divisor, n_buckets = bucket_divisor(n_boxes, rows.size + SORT_BUCKETS)
        n = rows.size
        workers = threads_for(workers, n, SORT_ROWS_PER_THREAD)
        cuts = np.linspace(0, n, workers + 1).astype(np.int64)
        keys = np.empty(n, dtype=np.int64)
        counts = np.zeros((workers, n_buckets), dtype=np.int64)
        order = np.empty(n, dtype=np.int64)
        sorted_keys = np.empty(n, dtype=np.int64)
        Yv = np.empty((Y.shape[0], n))

        def count(t):
            box_keys(Y, rows, int(cuts[t]), int(cuts[t + 1]), axes, lo, inv_width, n_boxes, divisor, keys, counts[t])

        def place(t):
            box_scatter(Y, rows, int(cuts[t]), int(cuts[t + 1]), keys, starts[t], order, sorted_keys, Yv)

        on_threads(count, workers)
        # bucket b of share t starts after all rows of the buckets before b and share t's predecessors' rows in b
        totals = counts.sum(axis=0)
        starts = np.cumsum(counts, axis=0) - counts + (np.cumsum(totals) - totals)
        on_threads(place, workers)
        return order, sorted_keys, Yv

    def describe(self) -> str:
        boxes = "x".join(str(int(n)) for n in self.n_boxes[:self.space_dims])
        widths = ", ".join(f"{w:.3g}" for w in self.box_width[:self.space_dims])
        time_ = f", {self.points[-1]} time nodes (rank {self.counts[-1]})" if self.dims > self.space_dims else ""
        split = f", capped: split at sigma {self.sigma:.3g}, near field within {self.cutoff:.3g}"
        band = (f", time band [{self.time_band[0]:.3g}, {self.time_band[1]:.3g}] ({self.n_outliers} outside)"
                if self.time_band is not None else "")
        return (f"{boxes} boxes (width {widths}) x {self.points[0]} points{time_}, {self.n_nodes} nodes"
                + (split if self.capped else "") + band)


def block_extent(Y: np.ndarray, r0: int, r1: int):
    """Per-dimension ``(min, max)`` of rows ``[r0, r1)`` of the ``(d, N)`` coordinates (reduce with min/max)."""
    if r1 <= r0:
        return np.full(Y.shape[0], np.inf), np.full(Y.shape[0], -np.inf)
    block = Y[:, r0:r1]
    return block.min(axis=1), block.max(axis=1)


def make_grid(model, space_dims: int, lo, hi, params: FFTParams = FFTParams(),
              n_points: int | None = None) -> Grid:
    """The box layout for ``n_points`` points whose coordinates lie in ``[lo, hi]`` (per dimension), for
    ``model``'s FFT repulsion (a name, ``Model`` or ``FFTSpec``)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    dims = lo.shape[0]
    spec = fft_spec(model)
    spec.check(model_name(model), space_dims, dims - space_dims)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(hi >= lo)):
        raise ValueError(f"embedding extent must be finite, got [{lo}, {hi}]")
    ds = space_dims
    extent = hi - lo
    time_width = np.where(extent[ds:] > 0, extent[ds:], 1.0)  # one box spans the time axis
    params = params.resolved(spec, ds, n_points)
    plan = spec.plan(ds)
    p = int(params.points)
    points = [p] * ds
    time_in = time_out = None
    rank = 1
    if dims > ds:
        m = _time_box(params, float(extent[ds]))
        points.append(int(m))
        time_in, time_out = time_factors(plan.time_kernels, int(m), float(time_width[0]),
                                         TIME_RANK_TOLS[params.accuracy])
        rank = time_in.shape[1]
    per_box = p ** ds * rank
    max_nodes = params.node_cap(n_points, rank if dims > ds else None)
    if per_box > max_nodes:
        raise ValueError(f"max_nodes={max_nodes} is less than the {per_box} nodes of one box")
    width = params.box_width
    wanted = np.maximum(params.min_boxes, np.ceil(extent[:ds] / width)).astype(np.int64)
    n_space = wanted.copy()
    sigma = cutoff = 0.0
    if math.prod(int(n) for n in n_space) * per_box > max_nodes:
        shrink = (math.prod(int(n) for n in n_space) * per_box / max_nodes) ** (1.0 / ds)
        n_space = np.maximum(1, np.floor(n_space / shrink)).astype(np.int64)
        while math.prod(int(n) for n in n_space) * per_box > max_nodes:
            n_space[np.argmax(n_space)] -= 1
        if spec.near_cutoff is not None:  # no far part: one box, the near field is the whole kernel
            n_space[:] = 1
            sigma, cutoff = np.inf, spec.near_cutoff
        else:  # far kernel at scale sigma sampled as finely (relative to sigma) as the default grid samples q,
            # or at least as finely as the spec's far_box_width says
            far = spec.far_box_width if spec.far_box_width is not None else width
            sigma = float((extent[:ds] / n_space).max() / min(width, far))
            cutoff = CUTOFF_SIGMAS * sigma
    n_boxes = np.concatenate([n_space, np.ones(dims - ds, dtype=np.int64)])
    capped = bool(np.any(n_space < wanted))
    if capped:
        box_width = np.concatenate([np.where(extent[:ds] > 0, extent[:ds] / n_space, 1.0), time_width])
    else:  # boxes exactly ``width`` wide, centred on the data: the node spacing stays the same from one
        # evaluation to the next, and so does the kernel's spectrum while the box count does (kernel_spectrum)
        box_width = np.concatenate([np.full(ds, float(width)), time_width])
        lo = np.concatenate([(lo[:ds] + hi[:ds]) / 2 - n_space * width / 2, lo[ds:]])
    if len(plan.outputs) > MAX_OUTPUTS:  # the interpolation loop's scalars
        raise ValueError(f"fft repulsion: {len(plan.outputs)} outputs exceed the interpolation loop's {MAX_OUTPUTS}")
    return Grid(spec, ds, tuple(points), lo, box_width, n_boxes, capped, plan, sigma, cutoff,
                time_in, time_out, charge_scale(n_points))


# Time band (``grid_for``): predicted seconds, on one core, per point and interpolation weight (spreading and
# interpolating, ``p^ds r`` space-time weights and ``m r`` time-map entries), per grid node and log2(nodes) of
# each time component's transforms, and per direct pair of ``near.time_outlier_rows``; measured on the
# 2-core machine (only their ratios matter; docs: the SNEST FFT results).
BAND_WEIGHT_SECONDS = 2.0e-9
BAND_NODE_SECONDS = 1.3e-10
BAND_PAIR_SECONDS = 2.0e-9
# Candidate bands: the whole time extent T, then widths T / 2^(k/3) down to this width, each placed where it
# holds the most points (a histogram of ``BAND_BINS`` bins over the extent).  Steps of 2^(1/3): the rank falls
# slowly with the width (13 at 3.5, 11 at 2.5) and a layout's few outliers may lie just beyond the bulk (a
# 7.7e4-point run after 400 iterations: 9 points beyond a band 2.5 wide of an extent of 3.5, cost -18 %).
MIN_BAND_WIDTH = 0.05
BAND_STEP = 2 ** (-1 / 3)
BAND_BINS = 1024


def grid_cost(grid: Grid, n_in: int, n_out: int, n_points: int, rank: int | None = None,
              time_points: int | None = None) -> float:
    """Predicted seconds of one evaluation's grid work for ``n_in`` points in the grid's time band and the
    direct sums of ``n_out`` outliers against ``n_points`` points (``BAND_*_SECONDS``): per point, ``p^ds r``
    weights spread once and read by each output, and ``3 m r`` time-map entries; per time component, one forward
    and one inverse transform per potential on the padded space grid (~``2^ds`` times its nodes).  ``rank`` and
    ``time_points``: those of another time box on the same space grid (default: the grid's)."""
    ds = grid.space_dims
    if rank is None:
        rank = 1 if grid.time_in is None else grid.time_in.shape[1]
    if time_points is None:
        time_points = 0 if grid.time_in is None else grid.points[-1]
    space_weights = math.prod(grid.points[:ds]) * rank * (1 + len(grid.plan.outputs))
    padded = math.prod(grid.space_nodes) * 2 ** ds
    transforms = (1 + grid.n_potentials) * rank
    return (BAND_WEIGHT_SECONDS * n_in * (space_weights + 3 * time_points * rank)
            + BAND_NODE_SECONDS * transforms * padded * math.log2(max(2, padded))
            + BAND_PAIR_SECONDS * float(n_points) * n_out)


def _time_box(params: FFTParams, width: float) -> int:
    """Chebyshev nodes of a time box ``width`` wide (``FFTParams.time_points``, or ``8 + 5 width`` capped)."""
    return int(params.time_points or min(MAX_TIME_POINTS, int(np.ceil(8 + 5 * width))))


@functools.lru_cache(maxsize=1024)
def _band_rank(time_kernels, time_points: int, width: float, tol: float = None) -> int:
    """The rank ``time_factors`` keeps for a time box ``width`` wide at rank tolerance ``tol`` (for the cost of a
    candidate band)."""
    return time_factors(time_kernels, time_points, width, TIME_RANK_TOL if tol is None else tol)[0].shape[1]


def grid_for(model, space_dims: int, Y: np.ndarray, params: FFTParams = FFTParams()) -> Grid:
    """The grid of one evaluation at the ``(d, N)`` coordinates ``Y`` (all of them: the caller holds them):
    ``make_grid`` over their extent, or, with a time axis and ``params.time_band``, over the time band that
    ``grid_cost`` predicts cheapest (module docstring, "Time band").  A function of ``Y`` alone."""
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    n = Y.shape[1]
    lo, hi = block_extent(Y, 0, n)
    return grid_from_summaries(model, space_dims, lo, hi, n, params,
                               lambda lo_t, h: band_counts(Y[space_dims], lo_t, h),
                               lambda band: band_outliers(Y, space_dims, band, 0))


def band_counts(t: np.ndarray, lo_t: float, h: float) -> np.ndarray:
    """Points per time bin (``BAND_BINS`` bins of width ``h`` from ``lo_t``) of the time coordinates ``t``:
    integer counts, so any split of the points sums to the same."""
    bins = np.minimum(((t - lo_t) / h).astype(np.int64), BAND_BINS - 1)
    return np.bincount(bins, minlength=BAND_BINS)


def band_outliers(Y: np.ndarray, space_dims: int, band: tuple, r0: int) -> tuple:
    """``(indices + r0, coordinates)`` of the columns of ``Y`` whose time lies outside ``band``."""
    t = Y[space_dims]
    local = np.flatnonzero((t < band[0]) | (t > band[1]))
    return local + r0, np.ascontiguousarray(Y[:, local])


def grid_from_summaries(model, space_dims: int, lo, hi, n: int, params: FFTParams, counts_of, outliers_of) -> Grid:
    """``grid_for`` from what it needs of the points, however they are held: their extent ``lo, hi``, ``n``,
    ``counts_of(lo_t, h)`` (``band_counts`` of all points) and ``outliers_of(band)`` (``band_outliers`` of all
    points, in point order), called only for a time-banded candidate."""
    full = make_grid(model, space_dims, lo, hi, params, n)
    ds = space_dims
    extent = float(hi[ds] - lo[ds]) if full.time_in is not None else 0.0
    if full.time_in is None or not params.time_band or n == 0 or extent <= 2 * MIN_BAND_WIDTH:
        return full
    best, best_cost = None, grid_cost(full, n, 0, n)
    h = extent / BAND_BINS
    tol = TIME_RANK_TOLS[params.resolved(model, ds, n).accuracy]
    cumulative = np.concatenate([[0], np.cumsum(counts_of(float(lo[ds]), h))])
    width = extent * BAND_STEP
    while width >= MIN_BAND_WIDTH:
        w = int(np.ceil(width / h))
        inside = cumulative[w:] - cumulative[:-w]
        start = int(np.argmax(inside))
        band = (float(lo[ds] + start * h), float(min(hi[ds], lo[ds] + (start + w) * h)))
        m = _time_box(params, band[1] - band[0])
        rank = _band_rank(full.plan.time_kernels, m, float(f"{band[1] - band[0]:.2g}"), tol)  # cached, ~1 % wider
        cost = grid_cost(full, int(inside[start]), n - int(inside[start]), n, rank, m)
        if cost < best_cost:
            best, best_cost = band, cost
        width *= BAND_STEP
    if best is None:
        return full
    grid = make_grid(model, ds, np.concatenate([lo[:ds], [best[0]]]), np.concatenate([hi[:ds], [best[1]]]),
                     params, n)
    outliers, outlier_coords = outliers_of(best)
    return replace(grid, time_band=best, outliers=outliers, outlier_coords=outlier_coords)


def charge_scale(n_points: int | None) -> float:
    """The fixed-point scale ``2^S`` of spread charges (``interpolation.spread_rows``) for ``n_points`` points:
    ``S = 62 - CHARGE_HEADROOM_BITS - ceil(log2(N + 1))``, at most 40, so that a node's total charge (at most N
    points times a per-point weight below ``2^CHARGE_HEADROOM_BITS``) fits an int64.  Rounding each weight to
    ``2^-S`` (S = 34 at N = 1e6, 27 at 1e8) is far below the interpolation's own error (>= 1e-4 relative); it buys
    charges that sum exactly, in any order: a function of the coordinates alone, however the rows are split among
    threads or workers.  ``n_points`` None: ``2^30``."""
    if n_points is None:
        return 2.0 ** 30
    bits = 62 - CHARGE_HEADROOM_BITS - int(np.ceil(np.log2(int(n_points) + 1)))
    return 2.0 ** min(40, max(8, bits))


def time_matrix(time_kernel, time_points: int, width: float) -> np.ndarray:
    """``time_kernel(tau_a - tau_b)`` between ``time_points`` Chebyshev nodes ``tau`` spanning ``width``."""
    tau = width * _chebyshev(time_points)
    return time_kernel(tau[:, None] - tau[None, :])


# Singular values of the stacked time matrices kept, relative to the largest (``time_factors``).
TIME_RANK_TOL = 1e-9
# ... per accuracy level (``FFT_ACCURACY``): 'fast' keeps those above 1e-6, one or two time components fewer (a
# band 0.13 wide: 3 instead of 4, 1.0 wide: 6 instead of 8, 3.6 wide: 9 instead of 13).  On SNEST R^{2,1} layouts
# at 7.7e4 points the gradient's error against the exact kernel did not change (1.92e-3 at the default grid with
# either tolerance; the space interpolation's error dominates): docs/design/repulsion.md.
TIME_RANK_TOLS = {"fast": 1e-6, "default": TIME_RANK_TOL, "high": TIME_RANK_TOL}


def time_factors(time_kernels, time_points: int, width: float, tol: float = TIME_RANK_TOL) -> tuple:
    """``(into, out_of)``: ``into`` m x r and ``out_of`` (kernels, m, r) with ``time_matrix(kernel_q) ~
    out_of[q] @ into.T`` for every time kernel q, one basis ``into`` for all: the truncated SVD of the
    kernels' matrices stacked (each scaled to unit largest entry), ``[T_q / s_q] = U S V^T``, keeping the
    singular values above ``tol`` times the largest: ``into = V_r S_r``, ``out_of[q] = s_q U_{q,r}``.
    The time part of the kernel between points, ``sum_ab L_a(t_i) T_ab L_b(t_j)`` (Chebyshev interpolation in
    both arguments), becomes ``sum_c u_c(t_i) v_c(t_j)`` with ``v = L @ into`` and ``u = L @ out_of[q]``: the
    grid holds r time components instead of m nodes, and the charges spread through ``into`` serve every
    kernel.  ``exp(Δt²)`` and ``2 Δt exp(Δt²)`` on a time axis 3.6 wide: rank 13 of 26 nodes."""
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        mats = [time_matrix(kernel, time_points, width) for kernel in time_kernels]
    if not all(np.isfinite(T).all() for T in mats):
        raise FloatingPointError(f"fft repulsion: a time extent of {width:.4g} overflows the time kernels "
                                 "(exp(Δt²) beyond float64)")
    scales = [float(np.abs(T).max()) for T in mats]
    U, sv, Vt = np.linalg.svd(np.concatenate([T / sc for T, sc in zip(mats, scales)]))
    r = max(1, int(np.count_nonzero(sv > tol * sv[0])))
    out_of = U[:, :r].reshape(len(mats), time_points, r) * np.array(scales)[:, None, None]
    return np.ascontiguousarray(Vt[:r].T * sv[:r]), np.ascontiguousarray(out_of)
