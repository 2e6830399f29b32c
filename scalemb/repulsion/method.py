"""Choosing the repulsion method: ``exact`` (all pairs, ``scalemb.models.kernels``), ``fft``
(interpolation, ``scalemb.repulsion.fft``) or ``auto``.

``auto`` considers ``fft`` when the model and dimensions are supported and N is at least the crossover
measured by ``benchmarks/repulsion.py`` (section "crossover"; docs/design/repulsion.md) for
the embedding's total dimension ds + dt (1-D layouts use the 2-D crossover); below it, it is ``exact``.
From there on the executors decide per evaluation (``AutoRepulsion``) by predicted cost: the exact kernel
costs ``~N²`` pair evaluations; the interpolation costs its per-point weights, its FFTs over the grid's nodes
and, once the grid is capped (a layout that flew apart), the pairs of its near field, counted from the cell
index (``near_pairs``) that the evaluation then reuses.  A layout whose components fly apart (co-authorship
graphs: GrQc spreads over ~6e4 units) moves from fft to exact when its near field grows; hysteresis keeps the
choice from flipping between iterations.
"""
import math
from dataclasses import dataclass

import numpy as np

from .fft import near_cells
from .grid import block_extent, grid_for
from .spec import FFTParams, check_supported, fft_spec

REPULSION_METHODS = ("auto", "exact", "fft")
# N from which fft is used, per total dimension ds + dt (None: never), from benchmarks/repulsion.py section (b):
# below it the exact kernel was faster, counting layouts that fly apart (a capped grid's near field); SNEST
# R^{3,1}'s capped 3-D grid never paid (docs/design/repulsion.md).
AUTO_FFT_MIN_POINTS = {2: 10_000, 3: 20_000, 4: None}


def fft_supported(model, space_dims: int, time_dims: int) -> bool:
    """Whether ``model`` (a name or ``Model``) has an FFT repulsion for R^{space_dims, time_dims}."""
    try:
        check_supported(model, space_dims, time_dims)
    except ValueError:
        return False
    return True


def resolve_repulsion(method: str, model, space_dims: int, time_dims: int, n_points: int) -> str:
    """``'exact'`` or ``'fft'`` for the requested ``method`` (see module docstring); ``model``: a name or
    ``Model``.  ``'auto'`` is ``'exact'`` for a model without an FFT repulsion (``Model.fft`` None) or
    dimensions its spec does not support, as below the crossover."""
    if method not in REPULSION_METHODS:
        raise ValueError(f"unknown repulsion {method!r}; choose one of {', '.join(REPULSION_METHODS)}")
    if method != "auto":
        return method
    supported = fft_supported(model, space_dims, time_dims)
    threshold = AUTO_FFT_MIN_POINTS.get(max(2, space_dims + time_dims)) if supported else None
    return "fft" if threshold is not None and n_points >= threshold else "exact"


# Predicted cost of one evaluation in seconds per unit (fitted with benchmarks/repulsion.py section (b):
# docs/design/repulsion.md): exact kernel per ordered pair (N²) by total dimension; fft per point and
# interpolation weight (p^ds r), per grid node and log2(nodes) (FFTs), and per near-field pair visited (cells
# within the cutoff, ~11 exact pairs each).  Only ratios matter.
EXACT_PAIR_SECONDS = {2: 4.7e-10, 3: 1.1e-9, 4: 1.3e-9}
FFT_WEIGHT_SECONDS = 3.0e-8
FFT_NODE_SECONDS = 2.0e-9
NEAR_PAIR_SECONDS = 5.0e-9
# auto switches method only when the other one is predicted this many times cheaper.
HYSTERESIS = 1.5


@dataclass
class Choice:
    """One decision: ``method``, the predicted seconds of both, and the fft grid and near-field cells (reused by
    the evaluation when ``method == 'fft'``; ``cells`` None on an uncapped grid)."""

    method: str
    exact_seconds: float
    fft_seconds: float
    grid: object = None
    cells: object = None
    near_pairs: int = 0


def near_pairs(cells, space_dims: int) -> int:
    """Pairs the near-field sum visits: for every point, the points in its cell and the ``3^ds - 1`` cells
    around it (``near.near_rows``' loop), from the sorted cell keys of ``fft.near_cells``."""
    keys = cells.sorted_keys
    if keys.size == 0:
        return 0
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    unique = keys[starts]
    counts = np.diff(np.append(starts, keys.size)).astype(np.float64)
    strides = np.ones(space_dims, dtype=np.int64)
    for k in range(space_dims - 2, -1, -1):
        strides[k] = strides[k + 1] * cells.n_cells[k + 1]
    total = 0.0
    for offset in np.array(np.unravel_index(np.arange(3 ** space_dims), (3,) * space_dims)).T - 1:
        shifted = unique + int(np.dot(offset, strides))
        at = np.minimum(np.searchsorted(unique, shifted), unique.size - 1)
        total += float(np.dot(counts, np.where(unique[at] == shifted, counts[at], 0.0)))
    return int(total)


class AutoRepulsion:
    """``repulsion='auto'`` above the size floor: ``choose(coords)`` before every evaluation.

    Predicted seconds: exact ``EXACT_PAIR_SECONDS[d] N²``; fft ``FFT_WEIGHT_SECONDS N p^ds r +
    FFT_NODE_SECONDS n log2 n + NEAR_PAIR_SECONDS pairs`` for the grid's ``n`` nodes (``grid.grid_for``'s) and, on
    a capped grid, its near-field pairs, plus ``N`` exact pairs per outlier of a time-banded grid.  The first
    choice takes the cheaper; afterwards the method changes only when the other is predicted ``HYSTERESIS`` times
    cheaper.  ``history``: the methods chosen, in order.
    """

    def __init__(self, model, space_dims: int, time_dims: int, params: FFTParams, hysteresis: float = HYSTERESIS):
        self.spec = fft_spec(model)  # model: a name, Model or FFTSpec
        self.space_dims, self.time_dims, self.params = space_dims, time_dims, params
        self.hysteresis = float(hysteresis)
        self.current = None
        self.history = []

    def predict(self, coords: np.ndarray) -> Choice:
        """Both predicted costs at ``coords`` (``(ds + dt, N)``), without deciding."""
        n = coords.shape[1]
        lo, hi = block_extent(coords, 0, n)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):  # fft reports the blow-up at once
            return self.unbuildable(n)
        try:
            grid = grid_for(self.spec, self.space_dims, coords, self.params)
        except FloatingPointError:  # a time extent past the kernels' range: fft reports the blow-up too
            return self.unbuildable(n)
        return self.predict_on(grid, n, coords)

    def _exact_seconds(self, n: int) -> float:
        return EXACT_PAIR_SECONDS[min(max(2, self.space_dims + self.time_dims), 4)] * float(n) * n

    def unbuildable(self, n: int) -> Choice:
        """The prediction for a layout without a grid (not finite, or a time extent past the kernels' range)."""
        return Choice("fft", self._exact_seconds(n), 0.0)

    def predict_on(self, grid, n: int, coords: np.ndarray | None = None) -> Choice:
        """Both predicted costs on ``grid`` for ``n`` points; ``coords`` (all of them) only for a capped grid,
        whose near field is counted from them (None: the caller holds no coordinates; ValueError if capped)."""
        dims = max(2, self.space_dims + self.time_dims)
        exact = self._exact_seconds(n)
        weights = grid.n_nodes / max(1, math.prod(int(b) for b in grid.n_boxes))  # nodes per box: p^ds r
        nodes = grid.n_nodes
        fft = FFT_WEIGHT_SECONDS * n * weights + FFT_NODE_SECONDS * nodes * math.log2(max(2, nodes))
        fft += EXACT_PAIR_SECONDS[min(dims, 4)] * float(n) * grid.n_outliers  # a time band's direct sums
        cells, pairs = None, 0
        if grid.capped:
            if coords is None:
                raise ValueError("a capped grid's near field is counted from the coordinates")
            cells = near_cells(grid, coords)
            pairs = near_pairs(cells, self.space_dims)
            fft += NEAR_PAIR_SECONDS * pairs
        return Choice("fft", exact, fft, grid, cells, pairs)

    def choose(self, coords: np.ndarray) -> Choice:
        """The method for the evaluation at ``coords`` (see the class docstring)."""
        return self.decide(self.predict(coords))

    def decide(self, choice: Choice) -> Choice:
        """``choice`` (a prediction) with its ``method`` decided (see the class docstring), recorded."""
        cheaper = "fft" if choice.fft_seconds < choice.exact_seconds else "exact"
        if self.current is None:
            method = cheaper
        elif self.current == "exact":
            method = "fft" if choice.fft_seconds * self.hysteresis < choice.exact_seconds else "exact"
        else:
            method = "exact" if choice.exact_seconds * self.hysteresis < choice.fft_seconds else "fft"
        self.current = choice.method = method
        self.history.append(method)
        return choice


def resolve_repulsion_settings(method: str, model, space_dims: int, time_dims: int, n_points: int,
                               fft_params: FFTParams | None = None) -> tuple:
    """``(method, params)`` for an executor: ``resolve_repulsion``'s method, except ``'auto'`` where that is
    ``fft``: the executor then chooses per evaluation (``AutoRepulsion``); for ``fft`` and ``auto`` (checked to
    be supported: ValueError naming the model if it has no FFT repulsion) ``fft_params`` with the model's
    defaults filled in for ``n_points`` points (``FFTParams.resolved``)."""
    resolved = resolve_repulsion(method, model, space_dims, time_dims, n_points)
    if method == "auto" and resolved == "fft":
        resolved = "auto"
    params = fft_params or FFTParams()
    if resolved in ("fft", "auto"):
        check_supported(model, space_dims, time_dims)
        params = params.resolved(fft_spec(model), space_dims, n_points)
    return resolved, params
