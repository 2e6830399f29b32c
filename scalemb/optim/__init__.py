"""Optimisers of KL(P||Q) over the embedding: ``dbd`` (delta-bar-delta), ``sd`` (spectral direction with
line search) and ``gd`` (gradient descent with line search)."""
from dataclasses import fields

from .base import OptimizeResult, OptimizerState
from .dbd import DBDState, DeltaBarDelta
from .descent import DescentState, LineSearchDescent

OPTIMIZER_NAMES = ("auto", "dbd", "sd", "gd")


def default_optimizer_name(model=None) -> str:
    """What ``'auto'`` means for ``model`` (a name or ``Model``): its ``Model.default_optimizer`` (the models
    record why, e.g. the spectral direction for t-SNE, delta-bar-delta for SNE); without a model the
    ``Model`` default, the spectral direction."""
    from ..models import Model, get_model

    if model is None:
        return Model.__dataclass_fields__["default_optimizer"].default
    return (get_model(model) if isinstance(model, str) else model).default_optimizer


def make_optimizer(name: str, model=None, **options):
    """Build optimiser ``name`` (``'auto'`` resolved for ``model``) from ``options``; options that optimiser
    has no use for are ignored, ``None`` values keep its defaults."""
    if name == "auto":
        name = default_optimizer_name(model)
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZER_NAMES)}")
    cls = DeltaBarDelta if name == "dbd" else LineSearchDescent
    accepted = {f.name for f in fields(cls) if f.init}
    kwargs = {k: v for k, v in options.items() if k in accepted and v is not None}
    if name == "gd":
        kwargs["direction"] = "gradient"
    return cls(**kwargs)


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


__all__ = ["DBDState", "DeltaBarDelta", "DescentState", "LineSearchDescent", "OptimizeResult", "OptimizerState",
           "OPTIMIZER_NAMES", "default_optimizer_name", "make_optimizer", "optimizer_config", "optimizer_from_config"]
