"""Optimisers of KL(P||Q) over the embedding: ``dbd`` (delta-bar-delta), ``sd`` (spectral direction with
line search) and ``gd`` (gradient descent with line search)."""
from dataclasses import fields

from .base import OptimizeResult
from .dbd import DeltaBarDelta
from .descent import LineSearchDescent

OPTIMIZER_NAMES = ("auto", "dbd", "sd", "gd")


def default_optimizer_name(model: str) -> str:
    """What ``'auto'`` means: the spectral direction for t-SNE and SNEST (10-20x fewer iterations than
    delta-bar-delta on GrQc), delta-bar-delta for SNE, whose momentum finds lower KL minima there
    (GrQc R^2: 3.266 vs 3.277-3.333 with sd; benchmarks/results/optimizers.md)."""
    return "dbd" if model == "sne" else "sd"


def make_optimizer(name: str, model: str = "snest", **options):
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


__all__ = ["DeltaBarDelta", "LineSearchDescent", "OptimizeResult", "OPTIMIZER_NAMES", "default_optimizer_name",
           "make_optimizer"]
