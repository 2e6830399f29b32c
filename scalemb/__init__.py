"""scalemb: SNE-family embeddings (SNE, t-SNE, space-time SNE) of large graphs."""
from ._version import __version__
from .affinity import Affinity
from .embedding import EmbeddingResult, embed, load_affinity
from .estimator import SNE, SNEST, TSNE, Embedder
from .io.checkpoint import RunInterrupted
from .resume import resume

__all__ = ["__version__", "Affinity", "Embedder", "EmbeddingResult", "RunInterrupted", "SNE", "SNEST", "TSNE", "embed",
           "load_affinity", "resume"]
