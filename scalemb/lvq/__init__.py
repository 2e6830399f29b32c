"""Supervised metric learning: GMLVQ and localized LiRaM LVQ (learned local discriminative metrics), and the
supervised neighbour affinities (SNE+ / t-SNE+ / SNEST+ input) under the learned dissimilarity."""
from .estimator import LiRaMLVQ

__all__ = ["LiRaMLVQ"]
