"""Optimisers of KL(P||Q) over the embedding: ``dbd`` (delta-bar-delta), ``sd`` (spectral direction with
line search) and ``gd`` (gradient descent with line search)."""
from dataclasses import dataclass, field, fields

from .base import OptimizeResult, OptimizerState
from .dbd import DBDState, DeltaBarDelta
from .descent import AUTO_LU_MAX_POINTS, DescentState, LineSearchDescent
from ..models import Model, get_model

OPTIMIZER_NAMES = ("auto", "dbd", "sd", "gd")
# 'auto' from this many points on: the model's ``default_optimizer_at_scale`` (t-SNE: an exaggeration phase, a
# bounded spectral phase, then delta-bar-delta polish steps; SNEST: the same with its own x4 exaggeration).  Below
# it the spectral direction's sparse LU is cheap and it reaches dbd's KL in 13-37x fewer iterations; from here on
# the LU fills in (Jacobi-preconditioned inexact CG instead: ~10-20 Laplacian products per iteration) and its
# Newton-like steps spread the layout unless each point's step is bounded (components and loosely attached parts
# move by gradient / mu), where the FFT grid is capped and the near field costs O(N^2) (docs/design/optimisation.md).
AUTO_SCALE_MIN_POINTS = AUTO_LU_MAX_POINTS
# P made from distances between points (a kNN affinity of feature rows, a kNN pair, a distance matrix) gets the
# model's ``default_optimizer_for_points`` (else its ``default_optimizer_at_scale``) at every size: on feature
# data (digits, a single-cell set, a 2e4 x 50 Gaussian mixture) openTSNE's schedule gave equal or better
# trustworthiness than the spectral direction at less CPU (5x less on the mixture, whose separated clusters the
# Newton-like steps spread over thousands of units),
# while on co-authorship graphs (GrQc) the spectral direction reaches far lower KL and better neighbourhoods
# (NP@deg 0.84 against 0.75) -- docs/design/optimisation.md.
# 'auto' from this many points on (below AUTO_SCALE_MIN_POINTS): the model's ``default_optimizer`` with its
# ``default_optimizer_options`` (t-SNE, SNEST: a momentum early-exaggeration phase before the spectral steps,
# measured on GrQc); below it the spectral direction alone, as SCHOOL's Table 1 values were measured.
AUTO_SCHEDULE_MIN_POINTS = 1024


def default_optimizer_name(model=None, n_points: int | None = None, from_points: bool = False) -> str:
    """What ``'auto'`` means for ``model`` (a name or ``Model``) and an input of ``n_points`` points: its
    ``Model.default_optimizer`` (the models record why, e.g. the spectral direction for t-SNE, delta-bar-delta
    for SNE), or from ``AUTO_SCALE_MIN_POINTS`` on -- and at every size for P made from distances between points
    (``from_points``: features, a kNN pair, a distance matrix; not a graph) -- its ``default_optimizer_at_scale``
    where it has one; without a model the ``Model`` defaults."""

    if model is None:
        small = Model.__dataclass_fields__["default_optimizer"].default
    else:
        small = (get_model(model) if isinstance(model, str) else model).default_optimizer
    at_scale = _at_scale(model, from_points)
    if _scale_rule(n_points, from_points) and at_scale is not None:
        return at_scale["optimizer"]
    return small


def _scale_rule(n_points: int | None, from_points: bool) -> bool:
    """Whether ``'auto'`` takes the model's ``default_optimizer_at_scale`` (``AUTO_SCALE_MIN_POINTS``, points)."""
    return n_points is not None and (n_points >= AUTO_SCALE_MIN_POINTS or from_points)


def make_optimizer(name: str, model=None, n_points: int | None = None, *, from_points: bool = False,
                   iterations: int | None = None, **options):
    """Build optimiser ``name`` from ``options`` (``None`` values keep its defaults); an option that optimiser has
    no use for is refused (``ValueError`` naming it), or with ``'auto'``, whose choice the caller did not make,
    left out with a ``UserWarning`` naming it.  ``'auto'`` is resolved for ``model`` and ``n_points``
    (``default_optimizer_name``; below ``AUTO_SCALE_MIN_POINTS`` the model's ``default_optimizer``, from there on
    its ``default_optimizer_at_scale`` with the options it names, e.g. openTSNE's schedule for t-SNE; from
    ``AUTO_SCHEDULE_MIN_POINTS`` below that, ``default_optimizer`` with the model's ``default_optimizer_options``,
    e.g. a momentum exaggeration phase); without
    ``n_points``, for a model whose choice depends on the size, an ``AutoOptimizer``, resolved by
    ``resolve_optimizer`` once the input's size is known (or by its ``optimize``, from the executor's).
    ``from_points``: the input's P was made from distances between points, which takes the schedule at scale at
    every size.  ``iterations``: the run's budget; a schedule at scale longer than it (``max_iterations``) is
    shortened in proportion (``fitted_schedule``)."""
    at_scale = _at_scale(model, from_points)
    mid = _schedule(model)
    if name == "auto" and n_points is None and (at_scale is not None or mid is not None):
        _check_options(options)
        return AutoOptimizer(model, {k: v for k, v in options.items() if v is not None})
    chosen = name != "auto"
    if name == "auto":
        name = default_optimizer_name(model, n_points, from_points)
        if at_scale is not None and _scale_rule(n_points, from_points):  # the model's schedule at scale
            schedule = fitted_schedule({k: v for k, v in at_scale.items() if k != "optimizer"}, iterations)
            options = {**schedule, **{k: v for k, v in options.items() if v is not None}}
        elif mid is not None and n_points >= AUTO_SCHEDULE_MIN_POINTS:  # its default's options at this size
            options = {**mid, **{k: v for k, v in options.items() if v is not None}}
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZER_NAMES)}")
    cls = DeltaBarDelta if name == "dbd" else LineSearchDescent
    options = _step_bound(cls, options)
    accepted = {f.name for f in fields(cls) if f.init}
    kwargs = {k: v for k, v in options.items() if k in accepted and v is not None}
    unused = sorted(k for k, v in options.items() if v is not None and k not in accepted and
                    not (k == "optimizer" and v == name))  # a schedule naming its own optimiser
    if unused and chosen:
        raise ValueError(f"{', '.join(unused)}: not a setting of the {name} optimiser")
    if unused:
        import warnings

        warnings.warn(f"{', '.join(unused)}: not a setting of the {name} optimiser that 'auto' chose for this "
                      "input; left out", UserWarning, stacklevel=2)
    if name == "gd":
        kwargs["direction"] = "gradient"
    return cls(**kwargs)


def _step_bound(cls, options: dict) -> dict:
    """``options`` with the run's ``max_step_norm`` (one setting: each point's space step clipped to this norm,
    as openTSNE's ``max_step_norm`` clips its gradient steps) spelt as the line-search optimisers' own
    ``max_point_step`` (their per-point trust region, ``optim.descent``); a value given wins over a schedule's."""
    bound = options.get("max_step_norm")
    if cls is DeltaBarDelta or bound is None:
        return options
    if not bound > 0:
        raise ValueError(f"max_step_norm must be > 0 or None, got {bound!r}")
    return {**{k: v for k, v in options.items() if k != "max_step_norm"}, "max_point_step": bound}


def fitted_schedule(schedule: dict, iterations: int | None) -> dict:
    """``schedule`` for a budget of ``iterations``: where that is below its ``max_iterations``, its early
    exaggeration phase and momentum switch are shortened in proportion (openTSNE's 250 of 750 become a third of
    the budget), so a short run still ends with steps on the objective itself, not inside the exaggerated phase."""
    total = schedule.get("max_iterations")
    if iterations is None or total is None or iterations >= total:
        return schedule
    fitted = dict(schedule)
    if "exaggeration_iterations" in fitted:
        fitted["exaggeration_iterations"] = int(fitted["exaggeration_iterations"] * iterations // total)
    if "momentum_switch" in fitted:
        fitted["momentum_switch"] = tuple(int(k * iterations // total) for k in fitted["momentum_switch"])
    return fitted


def _at_scale(model, from_points: bool = False) -> dict | None:
    """The model's ``default_optimizer_at_scale`` (``{"optimizer": name, **options}``) or None; ``from_points``
    (P made from distances between points): its ``default_optimizer_for_points`` where it has one."""

    if model is None:
        return None
    model = get_model(model) if isinstance(model, str) else model
    if from_points and model.default_optimizer_for_points is not None:
        return model.default_optimizer_for_points
    return model.default_optimizer_at_scale


def _schedule(model) -> dict | None:
    """The model's ``default_optimizer_options`` or None."""

    if model is None:
        return None
    return (get_model(model) if isinstance(model, str) else model).default_optimizer_options


def _check_options(options: dict) -> None:
    """Build both candidates once so a bad option fails now, not when the input's size is known."""
    for name, cls in (("dbd", DeltaBarDelta), ("sd", LineSearchDescent)):
        accepted = {f.name for f in fields(cls) if f.init}
        make_optimizer(name, **{k: v for k, v in _step_bound(cls, options).items() if k in accepted})


@dataclass
class AutoOptimizer:
    """``optimizer='auto'`` before the input is known: ``resolve(n_points, from_points)`` builds the optimiser
    ``make_optimizer('auto', model, n_points, from_points=from_points, **options)`` (the runner does, so a run's
    results, checkpoints and ``continue`` always hold the resolved optimiser)."""

    model: object
    options: dict = field(default_factory=dict)
    name: str = field(default="auto", init=False)

    def resolve(self, n_points: int, from_points: bool = False, iterations: int | None = None):
        return make_optimizer("auto", self.model, int(n_points), from_points=from_points, iterations=iterations,
                              **self.options)

    def optimize(self, executor, coords, n_iter: int, **kwargs):
        """``resolve(executor.n_points).optimize(...)``."""
        return self.resolve(executor.n_points).optimize(executor, coords, n_iter, **kwargs)

    def params(self) -> dict:
        return {"optimizer": "auto", **self.options}


def resolve_optimizer(optimizer, n_points: int, from_points: bool = False, iterations: int | None = None):
    """``optimizer`` itself, or an ``AutoOptimizer`` resolved for ``n_points`` (``from_points``: P made from
    distances between points; ``iterations``: the run's budget, see ``make_optimizer``)."""
    if not isinstance(optimizer, AutoOptimizer):
        return optimizer
    return optimizer.resolve(n_points, from_points, iterations)


def optimizer_config(optimizer) -> dict:
    """Every constructor field of a ``DeltaBarDelta`` / ``LineSearchDescent`` plus its ``name`` (JSON values)."""
    config = {f.name: getattr(optimizer, f.name) for f in fields(optimizer) if f.init}
    return {"name": optimizer.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}}


def optimizer_from_config(config: dict):
    """Inverse of ``optimizer_config``."""
    config = dict(config)
    cls = DeltaBarDelta if config.pop("name") == "dbd" else LineSearchDescent
    kinds = {f.name: f.type for f in fields(cls) if f.init}
    return cls(**{k: tuple(v) if kinds.get(k) in (tuple, "tuple") else v for k, v in config.items()})


__all__ = ["AUTO_SCALE_MIN_POINTS", "AUTO_SCHEDULE_MIN_POINTS", "AutoOptimizer", "resolve_optimizer",
           "DBDState", "DeltaBarDelta", "DescentState", "LineSearchDescent", "OptimizeResult", "OptimizerState",
           "OPTIMIZER_NAMES", "default_optimizer_name", "make_optimizer", "optimizer_config", "optimizer_from_config"]
