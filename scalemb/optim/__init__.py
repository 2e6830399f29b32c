"""Optimisers of KL(P||Q) over the embedding."""
from .dbd import DeltaBarDelta, OptimizeResult

__all__ = ["DeltaBarDelta", "OptimizeResult"]
