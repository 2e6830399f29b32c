"""Input affinities P: from graphs (in memory or streamed out of core), from features (kNN), on disk (store)."""
from .affinity import Affinity
from .graph import coauthorship_affinity, normalized_affinity
from .ingest import ingest_edge_list
from .knn import affinity_from_distances, knn_affinity, read_features
from .store import AffinityStore, is_affinity_store, write_affinity_store

__all__ = ["Affinity", "AffinityStore", "affinity_from_distances", "coauthorship_affinity", "ingest_edge_list",
           "is_affinity_store", "knn_affinity", "normalized_affinity", "read_features", "write_affinity_store"]
