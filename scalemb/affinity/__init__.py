"""Input affinities P."""
from .affinity import Affinity
from .graph import coauthorship_affinity, normalized_affinity
from .store import AffinityStore, is_affinity_store, write_affinity_store

__all__ = ["Affinity", "AffinityStore", "coauthorship_affinity", "is_affinity_store", "normalized_affinity",
           "write_affinity_store"]
