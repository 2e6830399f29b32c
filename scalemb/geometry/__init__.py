"""Where the embedding lives: the domain of the coordinates and how an optimiser moves in it.

A ``Geometry`` owns what the optimisers must not assume about the space (issue 19): the random start,
the domain check, the Riemannian gradient, the retraction after a step and the re-centring.  Coordinates
are ``(dims, N)`` arrays (one column per point), as everywhere in the optimisers.

- ``EUCLIDEAN`` (``Euclidean``): R^d.  The Riemannian gradient is the gradient, the retraction is
  ``coords + step`` and the re-centring subtracts the mean: exactly the arithmetic the optimisers did
  before there were geometries, so Euclidean runs are bit-identical.
- ``POINCARE`` (``PoincareBall(eps=1e-5)``): the open unit ball with the Poincaré metric
  ``g_y = lambda_y^2 I``, ``lambda_y = 2 / (1 - |y|^2)`` (CO-SNE, Guo et al. 2022).  Riemannian gradient
  ``g_y^{-1} grad = (1 - |y|^2)^2 / 4 * grad``; retraction: the Euclidean step followed by the projection
  of points with ``|y| > 1 - eps`` radially onto the sphere ``|y| = 1 - eps``.
"""
from .base import EUCLIDEAN, POINCARE, Euclidean, Geometry, PoincareBall, geometry_of, get_geometry

__all__ = ["EUCLIDEAN", "POINCARE", "Euclidean", "Geometry", "PoincareBall", "geometry_of", "get_geometry"]
