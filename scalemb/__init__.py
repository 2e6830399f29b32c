"""scalemb: SNE-family embeddings (SNE, t-SNE, space-time SNE) of large graphs."""
from ._version import __version__
from .affinity import Affinity
from .eigenmaps import Eigenmap, KernelEigenmap
from .embedding import EmbeddingResult, embed, load_affinity
from .estimator import SNE, SNEST, TSNE, CoSNE, ElasticEmbedding, Embedder
from .store.checkpoint import RunInterrupted
from .resume import resume
from . import tl  # noqa: E402  (scverse-style tools: scalemb.tl.tsne(adata))

__all__ = ["__version__", "Affinity", "CoSNE", "Eigenmap", "ElasticEmbedding", "Embedder", "EmbeddingResult",
           "KernelEigenmap", "RunInterrupted", "SNE", "SNEST", "TSNE", "embed", "load_affinity", "resume", "tl"]
