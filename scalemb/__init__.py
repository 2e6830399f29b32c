"""scalemb: SNE-family embeddings (SNE, t-SNE, space-time SNE) of large graphs."""
from ._version import __version__
from .affinity import Affinity
from .embedding import Embedder, EmbeddingResult, embed, load_affinity

__all__ = ["__version__", "Affinity", "Embedder", "EmbeddingResult", "embed", "load_affinity"]
