"""Input affinities P."""
from .affinity import Affinity
from .graph import coauthorship_affinity, normalized_affinity

__all__ = ["Affinity", "coauthorship_affinity", "normalized_affinity"]
