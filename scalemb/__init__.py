"""scalemb: SNE-family embeddings (SNE, t-SNE, space-time SNE) of large graphs."""
from ._version import __version__
from .affinity import Affinity
from .eigenmaps import Eigenmap, KernelEigenmap
from .embedding import Embedder, EmbeddingResult, embed, load_affinity
from .io.checkpoint import RunInterrupted
from .resume import resume

__all__ = ["__version__", "Affinity", "Eigenmap", "Embedder", "EmbeddingResult", "KernelEigenmap", "RunInterrupted",
           "embed", "load_affinity", "resume"]
