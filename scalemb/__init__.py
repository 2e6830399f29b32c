"""scalemb: SNE-family embeddings (SNE, t-SNE, space-time SNE) of large graphs.

The public names are imported on first use (``scalemb.lazy``): ``import scalemb`` alone loads neither
scikit-learn (the estimators' base) nor the embedding machinery."""
from ._version import __version__
from .lazy import lazy_attributes

_WHERE = {"Affinity": ".affinity", "Eigenmap": ".eigenmaps", "KernelEigenmap": ".eigenmaps",
          "EmbeddingResult": ".embedding", "embed": ".embedding", "load_affinity": ".embedding",
          "SNE": ".estimator", "SNEST": ".estimator", "TSNE": ".estimator", "CoSNE": ".estimator",
          "ElasticEmbedding": ".estimator", "Embedder": ".estimator", "RunInterrupted": ".store.checkpoint",
          "resume": ".run.resume",
          "tl": ".tl"}  # scverse-style tools: scalemb.tl.tsne(adata)
__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)

__all__ = ["__version__", *_WHERE]  # every name of the table, and nothing else
