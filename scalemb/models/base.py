"""What a model is: the contract every embedding model fulfils (issue 19).

A model owns

* its output kernel's row-block kernels ``attraction``, ``repulsion``, ``curvature``, ``cross_repulsion`` (the
  signatures of ``scalemb.models.kernels.make_kernels``'s; a model may compile its own with the same
  signatures, e.g. a kernel of a non-Euclidean distance; ``repulsion`` must own the pairs as those do, each
  row with its next ``(N - 1) // 2`` rows mod N, and write only the columns of
  ``scalemb.engine.blocks.repulsion_window``),
* ``objective``: how the blocks' partial sums reduce to its value and gradient (``scalemb.models.objective``),
* ``geometry``: the space the coordinates live in (``scalemb.geometry``: initialisation, Riemannian gradient,
  retraction, re-centring); ``EUCLIDEAN`` by default (None is read as Euclidean too),
* ``fft``: its FFT-interpolated repulsion (a ``scalemb.repulsion.spec.FFTSpec``), or None: exact repulsion only,
* ``default_optimizer``: what optimizer ``'auto'`` means for it, and ``default_optimizer_at_scale`` what it
  means from ``scalemb.optim.AUTO_SCALE_MIN_POINTS`` points on: ``{"optimizer": name, **options}`` (options
  the user gives win), None: ``default_optimizer`` at every size; ``default_optimizer_options``: options 'auto'
  gives ``default_optimizer`` from ``scalemb.optim.AUTO_SCHEDULE_MIN_POINTS`` points on, below the size at scale
  (options the user gives win), e.g. ``MOMENTUM_EXAGGERATION``; ``default_optimizer_for_points``: what
  ``'auto'`` means at every size for P made from distances between points (features, a kNN pair, a distance
  matrix), None: ``default_optimizer_at_scale`` there too,
* ``point_term``: an optional O(N) per-point term added after the reduction, on the client:
  ``point_term(coords, iteration, affinity) -> (value, gradient)`` with ``coords`` ``(d, N)`` and ``affinity``
  in the executor's internal point order (see ``scalemb.engine.base.Executor.evaluate``),
* ``learning_rate_scale``: factor on delta-bar-delta's ``'auto'`` learning rate ``max(1, N/12)`` (tuned for
  t-SNE's unit-length kernel in R^d; CO-SNE's kernel has length γ inside the unit ball and needs ~4γ²),
* ``params``: the constructor parameters a worker rebuilds it from: ``scalemb.models.get_model(name, **params)``.

The engine, the optimisers, the CLI and the service never branch on a model's name: they read these fields.
"""
from dataclasses import dataclass, field
from typing import Callable

from ..geometry import EUCLIDEAN, Geometry
from .objective import KL, Objective


# openTSNE's schedule for large data (Belkina et al. 2019; Linderman & Steinerberger 2019): early exaggeration 12
# for 250 iterations, momentum 0.5 then 0.8, lr = N/12, each point's step clipped to norm 5 so the layout does not
# swell after the exaggeration, and its budget of 250 + 500 iterations (past it the KL keeps falling slowly while
# the layout spreads).  A model's ``default_optimizer_at_scale`` may name it.
OPENTSNE_SCHEDULE = {"optimizer": "dbd", "exaggeration": 12.0, "exaggeration_iterations": 250,
                     "momentum": (0.5, 0.8), "momentum_switch": (250,), "max_step_norm": 5.0, "max_iterations": 750}

# The spectral direction's start on mid-size graphs: an early-exaggeration phase of cheap momentum steps (one
# evaluation each, lr N/12, momentum 0.8; ``LineSearchDescent.exaggeration_steps='momentum'``), then spectral steps.
# Without it the spectral direction settles in a worse basin from the small random start (t-SNE on GrQc: KL 1.123
# after 2500 iterations; with it <= 1.12 after ~430-510 iterations for two of three seeds).
MOMENTUM_EXAGGERATION = {"exaggeration": 12.0, "exaggeration_iterations": 125, "exaggeration_steps": "momentum",
                         "exaggeration_momentum": 0.8}


@dataclass(frozen=True)
class Model:
    """An SNE-family output kernel ``w_ij = w(|s_i - s_j|^2, |t_i - t_j|^2)`` (see ``kernels``) and what the
    engine needs to optimise it (module docstring)."""

    name: str
    description: str
    has_time: bool
    attraction: Callable = field(repr=False)
    repulsion: Callable = field(repr=False)
    curvature: Callable = field(repr=False)
    cross_repulsion: Callable = field(repr=False)
    # numba function (d2s, d2t) -> a strictly increasing function of the kernel w_ij: "more similar" in this
    # model's output space, the order quality metrics rank neighbours by (scalemb.metrics)
    similarity: Callable = field(default=None, repr=False)
    # optional (N, d) -> (N, d') coordinates that ``similarity`` ranks on (space columns first), for kernels that
    # are not a function of coordinate differences: CO-SNE lifts the ball to the hyperboloid, where
    # |Δx|² - Δx0² = 2 (cosh d_B - 1)
    ranking_coords: Callable = field(default=None, repr=False)
    objective: Objective = field(default=KL(), repr=False)
    geometry: Geometry = field(default=EUCLIDEAN, repr=False)
    fft: object = field(default=None, repr=False)  # scalemb.repulsion.spec.FFTSpec | None
    default_optimizer: str = "sd"
    default_optimizer_at_scale: dict | None = field(default=None, compare=False)
    default_optimizer_options: dict | None = field(default=None, compare=False)
    default_optimizer_for_points: dict | None = field(default=None, compare=False)
    point_term: Callable = field(default=None, repr=False)
    learning_rate_scale: float = 1.0
    params: dict = field(default_factory=dict, compare=False)

    def check_dims(self, space_dims: int, time_dims: int) -> None:
        """Raise ValueError unless this model can embed in R^{space_dims, time_dims}."""
        if space_dims < 1:
            raise ValueError(f"model {self.name!r} needs at least one space dimension, got {space_dims}")
        if time_dims < 0:
            raise ValueError(f"time dimensions must be >= 0, got {time_dims}")
        if self.has_time and time_dims < 1:
            raise ValueError(f"model {self.name!r} needs at least one time dimension (--time 1)")
        if not self.has_time and time_dims != 0:
            raise ValueError(f"model {self.name!r} has no time dimensions; use --time 0 or a model with time")

    def default_time_dims(self) -> int:
        """Time dimensions when none are asked for: 1 for a model with time, else 0."""
        return 1 if self.has_time else 0

    def check_fft(self, space_dims: int, time_dims: int) -> None:
        """Raise ValueError unless this model's FFT repulsion supports R^{space_dims, time_dims}."""
        if self.fft is None:
            raise ValueError(f"model {self.name!r} has no FFT repulsion: use repulsion='exact'")
        self.fft.check(self.name, space_dims, time_dims)
