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
import functools
import math
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import scipy.fft

from .interpolation import (MAX_OUTPUTS, box_keys, box_offsets, box_scatter, box_tables, bucket_divisor,
                            gather_columns, interpolate_range, interpolate_visited, spread_visited, to_rows, z_sum)
from .convolution import convolve
from .near import near_kernel, time_outlier_rows
from .threads import on_threads, thread_count

MAX_TIME_POINTS = 64
# a point's spread weight is below 2^CHARGE_HEADROOM_BITS in magnitude (tensor products of Lagrange weights,
# ~1.2 per space axis, and the time map's row sums), checked in tests/test_fft_repulsion.py
CHARGE_HEADROOM_BITS = 8
# FFTParams.accuracy: (extra Lagrange points per box, factor on the box width) applied to the model's default
# interpolation where the user gave none: more points per box and narrower boxes lower the gradient's error
# (measured errors per level: docs/design/repulsion.md).
FFT_ACCURACY = {"fast": (0, 9 / 7), "default": (0, 1.0), "high": (1, 6 / 7)}
# FFTParams.accuracy's values: a level of FFT_ACCURACY, or 'auto': the model's rule by the point count
# (``FFTSpec.fast_from_points``; ``FFTParams.accuracy_for``).
FFT_ACCURACY_CHOICES = ("auto", *FFT_ACCURACY)
# FFTParams.box_width's range, in units of the kernels' length scale (1; the defaults are 0.5-1.0): narrower
# boxes would need more nodes than any node cap allows (the cap widens them, and a split kernel's sigma = width /
# box_width then overflows float64 below ~1e-150), wider ones interpolate a kernel over a thousand of its widths.
BOX_WIDTH_RANGE = (1e-3, 1e3)
# Charge grids larger than this (32768 nodes) are visited box by box (``Grid.visit_order``; then also spread on
# threads), sorted into at most the rows' count plus ``SORT_BUCKETS`` buckets of whole boxes
# (``Grid.visit``).
SORT_ABOVE_BYTES = 2 ** 18
SORT_BUCKETS = 2 ** 16


def _cauchy(d2s, sigma):
    """``q = 1/(1 + d²)``, or with ``sigma > 0`` its smooth far part ``1/(1 + d² + sigma² exp(-d²/sigma²))``."""
    if sigma == 0:
        return 1.0 / (1.0 + d2s)
    return 1.0 / (1.0 + d2s + sigma ** 2 * np.exp(-d2s / sigma ** 2))


def _cauchy2(d2s, sigma):
    return _cauchy(d2s, sigma) ** 2


def _gauss(d2s, sigma):
    """``exp(-d²)``; no far part (with ``sigma > 0`` the near field holds all of it)."""
    return np.exp(-d2s) if sigma == 0 else np.zeros_like(d2s)


def _time_growth(dt):
    """SNEST's time factor ``exp(Δt²)``, saturating like ``scalemb.vecmath.fast_exp``."""
    return np.exp(np.minimum(dt * dt, 709.0))


def _time_force(dt):
    """The time force kernel's time factor ``d exp(Δt²)/dΔt = 2 Δt exp(Δt²)``."""
    return 2.0 * dt * _time_growth(dt)


# Near-field cutoff for the Gaussian: exp(-6.1²) < 1e-16.
GAUSS_CUTOFF = 6.1
# Near-field cutoff in units of sigma: exp(-16) ~ 1e-7 of the split-off part remains beyond it.
_CUTOFF_SIGMAS = 4.0


@dataclass(frozen=True)
class FFTParams:
    """Interpolation settings.

    ``points``: Lagrange nodes per box per space dimension (p); ``box_width``: space box width (wider when
    the node cap forces it); None for either: the default for the model and space dimension
    (``DEFAULT_INTERPOLATION``).  ``time_points``: Chebyshev nodes on the time axis (None: ``8 + 5 T`` for
    time extent T, at most ``MAX_TIME_POINTS``); ``max_nodes``: cap on the grid's total node count (None:
    ``node_cap(N)``); ``min_boxes``: fewest boxes per space dimension; ``accuracy``: 'fast', 'default' or 'high',
    how the defaults for ``points``/``box_width`` are chosen (``FFT_ACCURACY``: wider boxes, or one more point in
    narrower boxes; values given explicitly are kept), or 'auto' (the default): 'fast' from the model's
    ``FFTSpec.fast_from_points`` points, 'default' below it (``accuracy_for``).  ``time_band``: with a time
    axis, let ``grid_for`` span only the time band that makes the evaluation cheapest and sum the points outside
    it directly ("Time band" in the module docstring); False: the grid spans the whole time extent.
    """

    points: int | None = None
    box_width: float | None = None
    time_points: int | None = None
    max_nodes: int | None = None
    min_boxes: int = 1
    accuracy: str = "auto"
    time_band: bool = True

    def node_cap(self, n_points: int | None, time_slices: int | None = None) -> int:
        """``max_nodes``, or by default ``min(2^23, max(2^14, 64 N))`` without a time axis and
        ``min(2^23, max(2^14, 16 N)) r`` with ``r = time_slices`` time components: the FFT work per time
        component stays proportional to N (at most ~1.2 s of transforms per component on one core), beyond it
        the kernel split takes over.  64 N without time (16 N for SNEST's r slices): a cap that large-data
        layouts reach sends pairs to the near field, which then dominates an evaluation (the measurements:
        docs/design/repulsion.md)."""
        if self.max_nodes is not None:
            return int(self.max_nodes)
        per_point = 16 if time_slices else 64
        return min(2 ** 23, max(2 ** 14, per_point * int(n_points or 2 ** 18))) * (time_slices or 1)

    def __post_init__(self):
        if self.points is not None and (int(self.points) != self.points or self.points < 2):
            raise ValueError(f"interpolation points per box must be an integer >= 2, got {self.points}")
        low, high = BOX_WIDTH_RANGE
        if self.box_width is not None and not (low <= self.box_width <= high):  # NaN fails too
            raise ValueError(f"box_width must be in [{low:g}, {high:g}], got {self.box_width}")
        if self.time_points is not None and (int(self.time_points) != self.time_points or self.time_points < 2):
            raise ValueError(f"time_points must be an integer >= 2, got {self.time_points}")
        if self.accuracy not in FFT_ACCURACY_CHOICES:
            raise ValueError(f"unknown fft accuracy {self.accuracy!r}; choose one of "
                             f"{', '.join(FFT_ACCURACY_CHOICES)}")
        if int(self.min_boxes) != self.min_boxes or self.min_boxes < 1:
            raise ValueError(f"min_boxes must be an integer >= 1, got {self.min_boxes}")
        if self.max_nodes is not None and (int(self.max_nodes) != self.max_nodes or self.max_nodes < 1):
            raise ValueError(f"max_nodes must be a positive integer, got {self.max_nodes}")

    def accuracy_for(self, model, n_points: int | None) -> str:
        """The level of ``FFT_ACCURACY`` these settings mean for ``n_points`` points of ``model`` (a name,
        ``Model`` or ``FFTSpec``): ``accuracy`` itself, or for 'auto' 'fast' from ``FFTSpec.fast_from_points``
        points (None: never) and 'default' below it or where the count is not known (``n_points`` None).

        Why a coarser grid at scale: an evaluation's cost follows the grid's node count, and the layouts of large
        inputs are wide (their extent grows with N), so the default grid's nodes, not the points, dominate an
        evaluation there; 'fast' has (7/9)² = 0.6 of its nodes.  Its gradient error (a few 1e-2 of the whole
        gradient on a converged layout, where attraction and repulsion nearly cancel) is below what the
        optimisers' steps resolve at that size: whole runs end at the same KL and neighbourhood preservation.
        Each model sets its own threshold from its own measurements (none: not measured, 'default')."""
        if self.accuracy != "auto":
            return self.accuracy
        threshold = fft_spec(model).fast_from_points
        return "fast" if threshold is not None and n_points is not None and n_points >= threshold else "default"

    def resolved(self, model, space_dims: int, n_points: int | None = None) -> "FFTParams":
        """These settings with ``points`` and ``box_width`` filled in from the model's defaults (``model``: a
        name, ``Model`` or ``FFTSpec``; ``FFTSpec.interpolation``) and ``accuracy`` by ``accuracy_for`` (an
        'auto' accuracy becomes the level it means for ``n_points`` points)."""
        spec = fft_spec(model)
        points, width = spec.interpolation[space_dims]
        accuracy = self.accuracy_for(spec, n_points)
        extra, factor = FFT_ACCURACY[accuracy]
        return replace(self, points=self.points or points + extra, box_width=self.box_width or width * factor,
                       accuracy=accuracy)

    def as_dict(self) -> dict:
        values = {"points": self.points, "box_width": self.box_width, "time_points": self.time_points,
                  "max_nodes": self.max_nodes, "min_boxes": self.min_boxes}
        if self.accuracy != "default":  # runs at the default level keep the attributes they always had
            values["accuracy"] = self.accuracy
        if not self.time_band:
            values["time_band"] = False
        return values


@dataclass(frozen=True)
class SpaceKernel:
    """A space kernel of a plan, as a function of the node offset Δ (per-axis arrays, broadcastable):
    ``radial(|Δ|², sigma)``, or with ``axis = k`` the force kernel ``-2 Δ_k radial(|Δ|², sigma)``, i.e.
    ``g Δ_k`` for the model's ``g = w a = -2 radial`` (t-SNE, ``radial = q²``: ``∂q/∂Δ_k``)."""

    radial: object
    axis: int | None = None

    def __call__(self, deltas, sigma):
        values = self.radial(sum(d * d for d in deltas), sigma)
        return values if self.axis is None else -2.0 * deltas[self.axis] * values


@dataclass(frozen=True)
class Plan:
    """Which kernels to convolve, and how the outputs combine (see module docstring).

    The charge is the unit charge.  Column c of the potentials is the convolution with space kernel
    ``kernels[potentials[c]]`` (on each time component alike).  ``outputs[o] = (column, time map)``: the
    interpolated output o reads that column through time kernel ``time_kernels[map]`` (no time axis: map 0).
    ``force[k]``: the output that is ``R_k``.  Z is ``sum_i phi_z(y_i)`` with ``z_output`` the output of ``w``,
    or, without one (``z_output = -1``), the unit charge's node sum against kernel ``z_kernel``, taken in
    ``convolve``.
    """

    kernels: tuple
    time_kernels: tuple
    potentials: tuple
    outputs: tuple
    z_output: int
    force: tuple
    z_kernel: int | None = None


def cauchy_plan(space_dims: int) -> Plan:
    """t-SNE's ``q = 1/(1+|Δs|²)``: columns the force kernels ``-2 Δ_k q²``; Z from kernel 0 (q) by Parseval."""
    space = tuple(range(space_dims))
    kernels = (SpaceKernel(_cauchy),) + tuple(SpaceKernel(_cauchy2, k) for k in space)
    return Plan(kernels, time_kernels=(), potentials=tuple(1 + k for k in space),
                 outputs=tuple((k, 0) for k in space), z_output=-1, force=space, z_kernel=0)


def gauss_plan(space_dims: int) -> Plan:
    """The Gaussian ``exp(-|Δs|²)``: columns w, then the force kernels ``-2 Δ_k w``."""
    space = tuple(range(space_dims))
    kernels = (SpaceKernel(_gauss),) + tuple(SpaceKernel(_gauss, k) for k in space)
    return Plan(kernels, time_kernels=(), potentials=(0,) + tuple(1 + k for k in space),
                 outputs=((0, 0),) + tuple((1 + k, 0) for k in space), z_output=0,
                 force=tuple(1 + k for k in space))


def cauchy_time_plan(space_dims: int) -> Plan:
    """SNEST's ``exp(|Δt|²) q(|Δs|²)`` (one time dimension): columns q, then the force kernels; outputs Z (q
    through ``exp(Δt²)``), the time force (q through ``2Δt exp(Δt²)``), the space forces (through ``exp(Δt²)``)."""
    space = tuple(range(space_dims))
    kernels = (SpaceKernel(_cauchy),) + tuple(SpaceKernel(_cauchy2, k) for k in space)
    return Plan(kernels, time_kernels=(_time_growth, _time_force), potentials=(0,) + tuple(1 + k for k in space),
                 outputs=((0, 0), (0, 1)) + tuple((1 + k, 0) for k in space), z_output=0,
                 force=tuple(2 + k for k in space) + (1,))


def cauchy_self_weight(sigma: float) -> float:
    """``w(0)`` of the Cauchy grid kernel: 1, or its far part's ``1/(1 + sigma²)`` on a split grid."""
    return float(_cauchy(np.float64(0.0), sigma))


def gauss_self_weight(sigma: float) -> float:
    """``w(0)`` of the Gaussian grid kernel: 1, or 0 on a split grid (it has no far part)."""
    return 0.0 if sigma > 0 else 1.0


@dataclass(frozen=True)
class FFTSpec:
    """A model's FFT-interpolated repulsion (``Model.fft``): everything this module needs to know of it.

    * ``plan(space_dims) -> Plan``: the convolutions and outputs (``cauchy_plan``, ``gauss_plan``,
      ``cauchy_time_plan``, or the model's own);
    * ``interpolation``: ``{space_dims: (points per box, box width)}``, the defaults measured for the model
      (``FFTParams.resolved``); the supported space dimensions are its keys;
    * ``near_pair(d2s, d2t, cutoff2, s2, inv_s2) -> (w, c_s, c_t)``: the part of the kernel a split grid leaves
      to the direct sum, a plain function of the model's module written for numba (``near.near_kernel``
      compiles it inline into the near field; being plain, a spec sent to a worker pickles it by reference);
    * ``self_weight(sigma)``: the grid kernel's ``w(0)`` at split scale sigma (0: unsplit), removed from Z;
    * ``time_dims``: the time dimensions it supports (0, or 1 with a time kernel);
    * ``near_cutoff``: a kernel without a far part (the Gaussian): a capped grid is one box and the near field
      within this cutoff is all of it; None: the kernel is split at sigma and summed directly within
      ``_CUTOFF_SIGMAS`` sigma;
    * ``far_box_width``: widest box of a split grid in units of sigma (None: the box width);
    * ``fast_from_points``: from this many points ``FFTParams(accuracy='auto')`` means 'fast' (``accuracy_for``);
      None: 'auto' is always 'default'.
    """

    plan: object
    interpolation: dict = field(compare=False)
    near_pair: object
    self_weight: object
    time_dims: int = 0
    near_cutoff: float | None = None
    far_box_width: float | None = None
    fast_from_points: int | None = None

    def check(self, name: str, space_dims: int, time_dims: int) -> None:
        """Raise ValueError unless this spec supports R^{space_dims, time_dims} (``name``: the model's)."""
        if space_dims not in self.interpolation:
            dims = sorted(self.interpolation)
            raise ValueError(f"fft repulsion supports {dims[0]} to {dims[-1]} space dimensions for model "
                             f"{name!r}, got {space_dims}")
        if time_dims != self.time_dims:
            if self.time_dims == 0:
                raise ValueError(f"model {name!r} has no time dimensions, got {time_dims}")
            raise ValueError(f"fft repulsion supports model {name!r} with exactly {self.time_dims} time "
                             f"dimension{'s' if self.time_dims > 1 else ''}, got {time_dims}")


_MODELS = []  # [(get_model, model_names)]: installed by scalemb.models.registry (``use_model_registry``)


def use_model_registry(get_model, model_names) -> None:
    """Let a model's name stand for the model in this package (``fft_spec('tsne')``, ``DEFAULT_INTERPOLATION``):
    installed by ``scalemb.models.registry``, the layer above, when it is imported, so that this package imports
    nothing from it."""
    _MODELS[:] = [(get_model, model_names)]


def _registry():
    if not _MODELS:
        raise ValueError("a model name needs scalemb.models imported (pass the Model or its FFTSpec)")
    return _MODELS[0]


def fft_spec(model) -> FFTSpec:
    """The ``FFTSpec`` of ``model``: a spec, a ``Model`` or a model name (``scalemb.models.get_model``);
    ValueError naming the model if it has none."""
    if isinstance(model, FFTSpec):
        return model
    if isinstance(model, str):
        model = _registry()[0](model)
    if model.fft is None:
        raise ValueError(f"model {model.name!r} has no FFT repulsion: use repulsion='exact'")
    return model.fft


def _model_name(model) -> str:
    return model if isinstance(model, str) else getattr(model, "name", "given")


def check_supported(model, space_dims: int, time_dims: int) -> None:
    """Raise ValueError unless the FFT repulsion supports this model (a name, ``Model`` or ``FFTSpec``) and
    dimension pair."""
    fft_spec(model).check(_model_name(model), space_dims, time_dims)


class _DefaultInterpolation(Mapping):
    """``DEFAULT_INTERPOLATION[model name, space_dims] -> (points, box width)``, read from the models' specs."""

    def __getitem__(self, key):
        name, space_dims = key
        try:
            return fft_spec(name).interpolation[space_dims]
        except ValueError:
            raise KeyError(key) from None

    def __iter__(self):
        get_model, model_names = _registry()
        for name in model_names():
            spec = get_model(name).fft
            for ds in sorted(spec.interpolation) if spec is not None else ():
                yield name, ds

    def __len__(self):
        return sum(1 for _ in self)


DEFAULT_INTERPOLATION = _DefaultInterpolation()


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
        workers = max(1, min(thread_count(workers), n // SPREAD_ROWS_PER_THREAD))
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
    spec.check(_model_name(model), space_dims, dims - space_dims)
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
            cutoff = _CUTOFF_SIGMAS * sigma
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
    workers = max(1, min(thread_count(workers), order.size // SPREAD_ROWS_PER_THREAD))
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


# Fewest rows per thread worth a thread of ``spread_fixed``.
SPREAD_ROWS_PER_THREAD = 4096


def fixed_charges(grid: Grid, total: np.ndarray) -> np.ndarray:
    """The float64 charges of a summed fixed-point grid (``spread_fixed``)."""
    return total.astype(np.float64) / grid.charge_scale


def spread(grid: Grid, Y: np.ndarray, r0: int, r1: int, workers: int = 1, visit: tuple | None = None) -> np.ndarray:
    """Unit charges of rows ``[r0, r1)`` on the grid nodes, ``(n_nodes,)`` float64: partial (sum over blocks),
    spread by ``workers`` threads (``spread_fixed``; ``visit`` as there); the fixed-point sum makes the result
    the same for any ``workers``."""
    return fixed_charges(grid, spread_fixed(grid, Y, r0, r1, workers=workers, visit=visit))


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

    workers = max(1, min(thread_count(workers), order.size // SPREAD_ROWS_PER_THREAD))
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
