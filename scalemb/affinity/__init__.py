"""Input affinities P: from graphs (in memory or streamed out of core), from features (kNN), on disk (store).

The names are imported on first use (``scalemb.lazy``): a Dask worker that needs ``Affinity`` does not load the
kNN search, the edge-list ingestion or zarr."""
from ..lazy import lazy_attributes

_WHERE = {"Affinity": ".affinity", "coauthorship_affinity": ".graph", "normalized_affinity": ".graph",
          "ingest_edge_list": ".ingest", "affinity_from_distances": ".knn", "knn_affinity": ".knn",
          "read_features": ".knn", "AffinityStore": ".store", "is_affinity_store": ".store",
          "write_affinity_store": ".store"}
__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)

__all__ = [*_WHERE]  # every name of the table, and nothing else
