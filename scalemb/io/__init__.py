"""Reading inputs and writing results."""
from .results import to_anndata

__all__ = ["to_anndata"]
