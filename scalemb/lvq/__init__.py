"""Supervised metric learning: GMLVQ and localized LiRaM LVQ (learned local discriminative metrics), and the
supervised neighbour affinities (SNE+ / t-SNE+ / SNEST+ input) under the learned dissimilarity."""
from .affinity import learned_neighbours, neighbours_against, supervised_affinity
from .estimator import LiRaMLVQ
from .synthetic import three_tip_star

__all__ = ["LiRaMLVQ", "learned_neighbours", "neighbours_against", "supervised_affinity", "three_tip_star"]
