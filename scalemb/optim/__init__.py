"""Optimisers of KL(P||Q) over the embedding."""
from .base import OptimizeResult
from .dbd import DeltaBarDelta

__all__ = ["DeltaBarDelta", "OptimizeResult"]
