"""Optimisers of KL(P||Q) over the embedding: ``dbd`` (delta-bar-delta), ``sd`` (spectral direction with
line search) and ``gd`` (gradient descent with line search)."""
from dataclasses import fields

from .base import OptimizeResult
from .dbd import DeltaBarDelta
from .descent import LineSearchDescent

OPTIMIZER_NAMES = ("dbd", "sd", "gd")


def make_optimizer(name: str, **options):
    """Build optimiser ``name`` from ``options``; options that optimiser has no use for are ignored,
    ``None`` values keep its defaults."""
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZER_NAMES)}")
    cls = DeltaBarDelta if name == "dbd" else LineSearchDescent
    accepted = {f.name for f in fields(cls) if f.init}
    kwargs = {k: v for k, v in options.items() if k in accepted and v is not None}
    if name == "gd":
        kwargs["direction"] = "gradient"
    return cls(**kwargs)


__all__ = ["DeltaBarDelta", "LineSearchDescent", "OptimizeResult", "OPTIMIZER_NAMES", "make_optimizer"]
