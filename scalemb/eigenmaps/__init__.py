"""Spectral maps: graph (Laplacian) eigenmaps through the row-block Laplacian products, their Nyström extension
to new points, and Brand's kernel eigenmaps (a continuous map from a small eigenproblem).

The names are imported on first use (``scalemb.lazy``): the method registry's entries (``.methods``) do not load
scikit-learn, which only the estimator ``Eigenmap`` needs."""
from ..lazy import lazy_attributes

_WHERE = {"Eigenmap": ".estimator", "EIGENSOLVERS": "..engine.eigenmap", "EigenmapSolution": "..engine.eigenmap",
          "component_labels": "..engine.eigenmap", "laplacian_eigenmap": "..engine.eigenmap",
          "nystrom_extend": "..engine.eigenmap", "CORRECTIONS": ".kernel", "KernelEigenmap": ".kernel",
          "inverse_distance_graph": ".kernel", "kernel_features": ".kernel"}
__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)

__all__ = [*_WHERE]  # every name of the table, and nothing else
