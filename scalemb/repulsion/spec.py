"""What an FFT-interpolated repulsion is made of, before any layout: the user's settings (``FFTParams``), the
plans (which kernels are convolved and how the outputs combine: ``cauchy_plan``, ``gauss_plan``,
``cauchy_time_plan``), a model's spec (``FFTSpec``, ``Model.fft``) and the look-up of a model's spec by name.
The method is ``scalemb.repulsion.fft``'s module docstring; the grid these settings build is
``scalemb.repulsion.grid``'s."""
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

MAX_TIME_POINTS = 64
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
CUTOFF_SIGMAS = 4.0


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
      ``CUTOFF_SIGMAS`` sigma;
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


def model_name(model) -> str:
    return model if isinstance(model, str) else getattr(model, "name", "given")


def check_supported(model, space_dims: int, time_dims: int) -> None:
    """Raise ValueError unless the FFT repulsion supports this model (a name, ``Model`` or ``FFTSpec``) and
    dimension pair."""
    fft_spec(model).check(model_name(model), space_dims, time_dims)


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
