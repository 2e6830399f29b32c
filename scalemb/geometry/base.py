"""The ``Geometry`` interface and its two spaces, Euclidean R^d and the Poincaré ball (see the package docstring)."""
from dataclasses import dataclass

import numpy as np


class Geometry:
    """What an optimiser may do with coordinates ``(dims, N)``; subclasses define the five operations."""

    name: str = "geometry"

    def initial(self, n_points: int, dims: int, rng: np.random.Generator, scale: float = 1e-4) -> np.ndarray:
        """A random start ``(dims, N)`` inside the domain: ``scale * N(0, 1)`` per coordinate (t-SNE's start),
        drawn as ``rng.standard_normal((dims, n_points))`` so that a seed gives the same start in every
        geometry whose domain contains it."""
        return rng.standard_normal((dims, n_points)) * scale

    def validate(self, coords: np.ndarray, source: str) -> None:
        """``ValueError`` naming ``source`` unless every coordinate is finite and every point in the domain."""
        coords = np.asarray(coords)
        if coords.ndim != 2:
            raise ValueError(f"{source}: coordinates must be a 2-D (dims, N) array, got shape {coords.shape}")
        bad = np.flatnonzero(~np.isfinite(coords).all(axis=0))
        if bad.size:
            raise ValueError(f"{source}: {bad.size} point(s) with NaN or infinite coordinates (first: point "
                             f"{bad[0]})")

    def riemannian_gradient(self, coords: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """The Riemannian gradient ``G(y)^{-1} grad`` of an objective whose Euclidean gradient is ``grad``."""
        raise NotImplementedError

    def retract(self, coords: np.ndarray, step: np.ndarray) -> np.ndarray:
        """The point reached from ``coords`` by the tangent ``step`` (a new array, inside the domain)."""
        raise NotImplementedError

    def recentre(self, coords: np.ndarray, space_dims: int) -> np.ndarray:
        """``coords`` moved by an isometry that leaves the objective unchanged and keeps the map from drifting."""
        raise NotImplementedError

    # whether ``recentre`` subtracts the coordinates' mean (a translation): an optimiser holding the coordinates
    # by row blocks then subtracts the mean of the blocks' column sums instead (``scalemb.engine.held``)
    translates = False

    def __repr__(self):
        return f"{type(self).__name__}()"


class Euclidean(Geometry):
    """R^d with the identity metric: the identity, ``coords + step`` and mean-subtraction (today's arithmetic)."""

    name = "euclidean"
    translates = True

    def riemannian_gradient(self, coords: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """``grad`` itself (the same array: no copy, no arithmetic, so Euclidean runs stay bit-identical)."""
        return grad

    def retract(self, coords: np.ndarray, step: np.ndarray) -> np.ndarray:
        return coords + step

    def recentre(self, coords: np.ndarray, space_dims: int) -> np.ndarray:
        """Subtract each coordinate's mean over the points.  Every row is centred, the SNEST time rows too
        (``space_dims`` is unused here): the kernels see only differences ``s_i - s_j`` and ``t_i - t_j``, so
        the translation changes nothing but the drift, and this is what the optimisers have always done."""
        return coords - coords.mean(axis=1, keepdims=True)


@dataclass(frozen=True, repr=False)
class PoincareBall(Geometry):
    """The open unit ball with the Poincaré metric ``(2 / (1 - |y|^2))^2 I`` (every row of ``coords`` is a ball
    coordinate: hyperbolic models have no SNEST time).

    Retraction = Euclidean step, then projection onto ``|y| <= 1 - eps`` (radially: ``y * (1 - eps) / |y|``).
    Why not the exponential map ``y (+) tanh(lambda_y |v| / 2) v / |v|``: (1) the step-and-project update is
    Riemannian SGD as CO-SNE (and Nickel & Kiela's Poincaré embeddings, whose code CO-SNE builds on) run it, so
    our optimisers reproduce the paper's update; (2) it is a first-order retraction like the exponential map
    (same point and same derivative at ``step = 0`` inside the ball), which is all the convergence theory of
    Riemannian descent with a line search needs; (3) near the boundary ``tanh`` saturates to 1.0 in float64
    and the exponential map lands on the sphere, so it needs the same projection anyway.

    ``eps = 1e-5`` keeps ``1 - |y|^2 >= ~2e-5``: hyperbolic distances up to ~``log(4 / eps) ~ 12.9`` from the
    origin, conformal factors up to 1e5, and ``arcosh(1 + 2 |u - v|^2 / ((1 - |u|^2)(1 - |v|^2)))`` has its
    argument below ~1e10, far from float64 trouble; Nickel & Kiela use the same ``eps``.
    """

    eps: float = 1e-5
    name = "poincare"

    def __post_init__(self):
        if not 0 < self.eps < 1:
            raise ValueError(f"the Poincaré ball's eps must be in (0, 1), got {self.eps!r}")

    @property
    def radius(self) -> float:
        """The largest norm a retracted point has: ``1 - eps``."""
        return 1.0 - self.eps

    def initial(self, n_points: int, dims: int, rng: np.random.Generator, scale: float = 1e-4) -> np.ndarray:
        return self.project(super().initial(n_points, dims, rng, scale))

    def validate(self, coords: np.ndarray, source: str) -> None:
        super().validate(coords, source)
        norms = norms_of(np.asarray(coords, dtype=np.float64))
        outside = np.flatnonzero(norms >= 1.0)
        if outside.size:
            raise ValueError(f"{source}: {outside.size} point(s) on or outside the unit ball (first: point "
                             f"{outside[0]}, norm {norms[outside[0]]:.6g}); Poincaré-ball coordinates need |y| < 1")

    def riemannian_gradient(self, coords: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """``(1 - |y|^2)^2 / 4 * grad``: the inverse of the metric ``lambda_y^2 I``, ``lambda_y = 2 / (1 - |y|^2)``."""
        factor = 1.0 - np.einsum("ij,ij->j", coords, coords)
        return grad * (0.25 * factor * factor)

    def retract(self, coords: np.ndarray, step: np.ndarray) -> np.ndarray:
        """``project(coords + step)``: strictly inside the ball for every finite or infinite step (an infinite
        component moves the point to the boundary sphere along that component's sign); a NaN step stays NaN,
        so the optimiser's blow-up test sees it instead of a silently invented point."""
        return self.project(coords + step)

    def recentre(self, coords: np.ndarray, space_dims: int) -> np.ndarray:
        """The identity (a new array): the ball has no translation that keeps the origin, and CO-SNE's norm
        loss ties each point to the origin, so a Möbius re-centring would change the objective."""
        return coords.copy()

    def project(self, coords: np.ndarray) -> np.ndarray:
        """Points with ``|y| > 1 - eps`` scaled radially onto ``|y| = 1 - eps`` (a new array).  Norms are
        computed without overflow (``coords`` may hold 1e300 or inf after a huge step)."""
        y = np.array(coords, dtype=np.float64)
        infinite = np.isinf(y).any(axis=0)
        if infinite.any():  # direction of the infinite components only
            block = y[:, infinite]
            y[:, infinite] = np.where(np.isinf(block), np.sign(block), 0.0)
        norms = norms_of(y)
        outside = norms > self.radius
        if outside.any():
            y[:, outside] *= self.radius / norms[outside]
        return y


def norms_of(coords: np.ndarray) -> np.ndarray:
    """Euclidean norm of every column, ``(N,)``, scaled by the largest component first so that huge finite
    values do not overflow to inf (NaN columns stay NaN)."""
    largest = np.abs(coords).max(axis=0) if coords.shape[0] else np.zeros(coords.shape[1])
    scale = np.where(largest > 0, largest, 1.0)
    return scale * np.sqrt(np.einsum("ij,ij->j", coords / scale, coords / scale))


EUCLIDEAN = Euclidean()
POINCARE = PoincareBall(eps=1e-5)
GEOMETRIES = {EUCLIDEAN.name: EUCLIDEAN, POINCARE.name: POINCARE}


def geometry_of(executor) -> Geometry:
    """The geometry of ``executor.model`` (``EUCLIDEAN`` when the model, or the executor, has none: models
    from before the contract's ``Model.geometry``, executors without a ``model``)."""
    geometry = getattr(getattr(executor, "model", None), "geometry", None)
    return EUCLIDEAN if geometry is None else geometry


def get_geometry(name: str) -> Geometry:
    """The geometry called ``name`` (``'euclidean'`` or ``'poincare'``); ``ValueError`` naming the choices."""
    try:
        return GEOMETRIES[name]
    except KeyError:
        raise ValueError(f"unknown geometry {name!r}; choose one of {', '.join(GEOMETRIES)}") from None
