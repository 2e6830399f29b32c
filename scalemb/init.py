"""Initial coordinates of an SNE-family run: ``random``, ``spectral``, ``pca`` or given (a ``.npy`` file / array).

- ``random`` (the SNEST reference code's start): space ``1e-4 N(0, 1)``, time ``1e-5 N(0, 1)``.
- ``spectral``: the graph eigenmap of P (``scalemb.engine.eigenmap``, through the executor's row-block
  Laplacian products, so it runs where the run runs), scaled as openTSNE's spectral start: the eigenvectors
  ``v_k`` of ``D^{-1} P`` times their eigenvalues ``mu_k`` (diffusion-map coordinates), centred, then all
  columns divided by the same factor so that the first has standard deviation 1e-4.  Components the
  eigenvectors do not reach (they are 0 there: GrQc's small components) start at the random start's
  coordinates instead, and every point gets a jitter of 1e-6 N(0, 1): nodes with the same neighbours (authors
  of one paper only) have equal eigenvector entries, and SNE gradients never separate coincident points.
- ``pca``: the first principal components of the input features (kNN affinities built from a feature file
  recorded in the affinity's provenance, or the feature array the estimator was fitted to), scaled like
  ``spectral`` (openTSNE's PCA start: first column standard deviation 1e-4).
- a ``.npy`` file or an array of shape ``(N, ds)`` or ``(N, ds + dt)``, rows in the run's node order, used as
  given (a previous map, say): no rescaling.

Time columns (SNEST): every start but a full ``(N, ds + dt)`` array draws them as the random start does,
``1e-5 N(0, 1)``.  A spectral time coordinate has no meaning to copy (time in SNEST is a point's importance,
learned from the KL's repulsion of pairs), and the random time start is the one the SNEST paper's results use.

Restart k draws its random parts from the stream ``(seed, k)``, as before; with the random start restart k's
coordinates are exactly those of earlier versions.
"""
from pathlib import Path

import numpy as np

from .errors import InputError, ScalembError
from .geometry import EUCLIDEAN, Geometry, geometry_of
from .affinity.knn import read_features
from .engine.eigenmap import laplacian_eigenmap

INIT_NAMES = ("random", "spectral", "pca")
SCALE = 1e-4  # standard deviation of the first space coordinate (openTSNE's rescale); random space start
TIME_SCALE = 1e-5
JITTER = 1e-6


def check_init(init) -> None:
    """Raise ``ValueError`` unless ``init`` is a start name, a ``.npy`` path or a 2-D array."""
    if isinstance(init, np.ndarray):
        if init.ndim != 2:
            raise ValueError(f"an init array must be 2-D (N x dims), got shape {init.shape}")
        return
    if isinstance(init, (str, Path)):
        if str(init) in INIT_NAMES or str(init).endswith(".npy"):
            return
    raise ValueError(f"unknown init {init!r}; choose one of {', '.join(INIT_NAMES)} or a .npy file")


def random_coords(n_points: int, space_dims: int, time_dims: int, rng: np.random.Generator,
                  geometry: Geometry = EUCLIDEAN) -> np.ndarray:
    """Small random start, ``(ds + dt, N)``: space ``geometry.initial`` at scale 1e-4 (1e-4 N(0,1) in every
    geometry: the ball's projection never acts at that scale), time 1e-5 N(0,1) (SNEST reference code)."""
    space = geometry.initial(n_points, space_dims, rng, SCALE)
    time_ = rng.standard_normal((time_dims, n_points)) * TIME_SCALE
    return np.ascontiguousarray(np.concatenate([space, time_]))


def rescale(Y: np.ndarray, target: float = SCALE) -> np.ndarray:
    """``(N, d)`` centred and scaled by one factor so that column 0 has standard deviation ``target``."""
    Y = Y - Y.mean(axis=0)
    std = Y[:, 0].std()
    if not std > 0:
        raise ScalembError("the initial layout's first coordinate is constant; choose another init")
    return Y * (target / std)


def spectral_layout(executor, space_dims: int, seed: int = 0, method: str = "lanczos") -> np.ndarray:
    """``(N, ds)`` diffusion-map coordinates ``mu_k v_k`` of P's graph (not yet rescaled); rows of components
    the eigenvectors do not reach are NaN (they take the random start, see ``initial_coords``)."""

    solution = laplacian_eigenmap(executor, space_dims, method=method, seed=seed)
    Y = solution.coords * (1.0 - solution.eigenvalues)
    reach = np.bincount(solution.labels, weights=np.abs(solution.coords).sum(axis=1))
    Y[reach[solution.labels] <= 1e-12 * np.abs(solution.coords).max()] = np.nan
    return Y


def pca_layout(features: np.ndarray, space_dims: int) -> np.ndarray:
    """``(N, ds)`` scores of the first principal components of ``features`` (by SVD of the centred data)."""
    X = np.asarray(features, dtype=np.float64)
    X = X - X.mean(axis=0)
    if space_dims > min(X.shape):
        raise ScalembError(f"pca init: {space_dims} components asked of {X.shape[1]}-dimensional features")
    U, S, _ = np.linalg.svd(X, full_matrices=False)
    U = U[:, :space_dims] * S[:space_dims]
    return U * np.sign(U[np.argmax(np.abs(U), axis=0), np.arange(space_dims)])  # deterministic signs


def features_from_provenance(provenance: dict) -> np.ndarray:
    """The feature rows a kNN affinity was built from (its provenance ``source``), for ``init='pca'``."""

    source = provenance.get("source")
    if provenance.get("method") != "knn" or not source or not Path(str(source)).exists():
        raise ScalembError("init 'pca' needs feature input: a kNN affinity store built from a feature file that "
                           "still exists (a graph has no features: use init 'spectral')")
    return read_features(source)


def read_init_file(path, n_points: int, space_dims: int, time_dims: int) -> np.ndarray:
    """A ``.npy`` start, checked: shape ``(N, ds)`` or ``(N, ds + dt)``, finite values (``InputError`` else)."""
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(path, "no such init file") from None
    except (OSError, ValueError) as exc:
        raise InputError(path, f"not a readable .npy array ({exc})") from None
    return checked_init(array, n_points, space_dims, time_dims, str(path))


def checked_init(array, n_points: int, space_dims: int, time_dims: int, name: str = "init array") -> np.ndarray:
    array = np.asarray(array)
    widths = {space_dims, space_dims + time_dims}
    if array.ndim != 2 or array.shape[0] != n_points or array.shape[1] not in widths:
        raise InputError(name, f"init must have shape ({n_points}, {' or '.join(map(str, sorted(widths)))}) "
                               f"(N x space [+ time] dimensions), got {array.shape}")
    if not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
        raise InputError(name, f"init must be real numbers, got dtype {array.dtype}")
    bad = np.flatnonzero(~np.isfinite(array).all(axis=1))
    if bad.size:
        raise InputError(name, f"init has {bad.size} row(s) with NaN or infinite values (first: row {bad[0]})")
    return array.astype(np.float64)


class Initializer:
    """The start of every restart of one run: ``coords(rng)`` returns ``(ds + dt, N)``.

    The deterministic part (eigenmap, PCA, file) is computed once, on first use; ``rng`` draws the random
    parts of each restart."""

    def __init__(self, init, executor, space_dims: int, time_dims: int, provenance: dict | None = None,
                 seed: int = 0, features: np.ndarray | None = None):
        """``features``: the feature rows of an in-memory kNN input (``pca``; else read from ``provenance``)."""
        check_init(init)
        self.features = features
        self.init = init
        self.executor = executor
        self.space_dims = space_dims
        self.time_dims = time_dims
        self.provenance = provenance or {}
        self.seed = seed
        self._layout = None

    def layout(self) -> np.ndarray | None:
        """The deterministic ``(N, ds)`` or ``(N, ds + dt)`` part (``None`` for the random start)."""
        init, n = self.init, self.executor.n_points
        if isinstance(init, np.ndarray):
            return self._in_domain(checked_init(init, n, self.space_dims, self.time_dims), "init array")
        if str(init) == "random":
            return None
        if self._layout is None:
            if str(init) == "spectral":
                self._layout = spectral_layout(self.executor, self.space_dims, seed=self.seed)
            elif str(init) == "pca":
                features = self.features if self.features is not None else \
                    features_from_provenance(self.provenance)
                if features.shape[0] != n:
                    raise ScalembError(f"pca init: {features.shape[0]} feature rows for {n} points")
                self._layout = pca_layout(features, self.space_dims)
            else:
                self._layout = self._in_domain(read_init_file(init, n, self.space_dims, self.time_dims), str(init))
        return self._layout

    def _in_domain(self, layout: np.ndarray, name: str) -> np.ndarray:
        """``layout`` (a given start, ``(N, ds [+ dt])``) if its space columns lie in the model's geometry
        (``geometry.validate``: a Poincaré-ball point with ``|y| >= 1`` is a ``ValueError`` naming ``name``),
        checked here so that a bad start fails before a checkpoint store is written."""
        geometry_of(self.executor).validate(layout[:, :self.space_dims].T, name)
        return layout

    def coords(self, rng: np.random.Generator) -> np.ndarray:
        """The start of the restart drawing from ``rng``: random parts from the model's geometry
        (``geometry.initial``), given parts checked against it by ``layout``."""
        n, ds, dt = self.executor.n_points, self.space_dims, self.time_dims
        geometry = geometry_of(self.executor)
        start = random_coords(n, ds, dt, rng, geometry)
        layout = self.layout()
        if layout is None:
            return start
        if isinstance(self.init, np.ndarray) or str(self.init).endswith(".npy"):
            start[:layout.shape[1]] = layout.T  # as given; missing time columns stay random
            return np.ascontiguousarray(start)
        space = layout.copy()
        missing = np.isnan(space).any(axis=1)
        space[~missing] = rescale(space[~missing])
        space[missing] = start[:ds, missing].T
        start[:ds] = space.T + JITTER * rng.standard_normal((n, ds)).T
        return np.ascontiguousarray(start)
