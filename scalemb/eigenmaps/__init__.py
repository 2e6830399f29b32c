"""Spectral maps: graph (Laplacian) eigenmaps through the row-block Laplacian products, their Nyström extension
to new points, and Brand's kernel eigenmaps (a continuous map from a small eigenproblem)."""
from .estimator import Eigenmap
from ..engine.eigenmap import EIGENSOLVERS, EigenmapSolution, component_labels, laplacian_eigenmap, nystrom_extend
from .kernel import CORRECTIONS, KernelEigenmap, inverse_distance_graph, kernel_features

__all__ = ["CORRECTIONS", "EIGENSOLVERS", "Eigenmap", "EigenmapSolution", "KernelEigenmap", "component_labels",
           "inverse_distance_graph", "kernel_features", "laplacian_eigenmap", "nystrom_extend"]
