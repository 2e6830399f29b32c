"""Affinities from feature vectors: the SNE / t-SNE input similarities on a k-nearest-neighbour graph.

For each point ``i`` with neighbours ``N(i)`` (``k`` of them, self excluded) and distances ``d_ij``:

* ``gaussian``: ``p_j|i = exp(-beta_i d_ij^2) / sum_{l in N(i)} exp(-beta_i d_il^2)``, with the precision
  ``beta_i`` found by bisection so that the row's entropy ``H_i = -sum_j p_j|i log p_j|i`` (natural log)
  equals ``log(perplexity)`` to within 1e-5 (at most 200 steps);
* ``uniform``: ``p_j|i = 1 / k``.

The joint affinity is ``P = (P_cond + P_cond^T) / (2N)``: symmetric, zero diagonal, summing to 1.

Neighbours come from ``pynndescent.NNDescent`` (approximate) or, where it costs less (``exact_search``: at most
``EXACT_MAX_POINTS`` points, Euclidean up to a few times 1e4), an exact brute-force search (``exact_knn``:
``scipy.spatial.distance.cdist``, for the Euclidean distance candidates from matrix products, ``brute``).
"""
import math
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import zarr
from numba import njit
from scipy.spatial.distance import cdist

from ..errors import InputError
from ..progress import phase
from .affinity import Affinity, default_threads, row_partition
from .brute import euclidean_knn

EXACT_MAX_POINTS = 4096
# Euclidean: the matrix-product search (``brute``) costs ~n^2 (d + 165) and NN-descent ~n (d + 583) CPU units;
# exact while n^2 (d + EXACT_FEATURE_COST) <= EXACT_EUCLIDEAN_BUDGET: up to ~3.8e4 points of 50 features, ~1.8e4 of
# 784 (the measured crossovers, ~5.5e4 and ~1.8e4: docs/design/inputs.md).
EXACT_FEATURE_COST = 165
EXACT_EUCLIDEAN_BUDGET = 3.0e11
ENTROPY_TOL = 1e-5
MAX_STEPS = 200
METHODS = ("gaussian", "uniform")
PERPLEXITY = 30.0  # the target perplexity every front defaults to (scalemb.params), openTSNE's and t-SNE's usual


def default_neighbours(n_points: int, perplexity: float = PERPLEXITY, n_neighbors: int | None = None) -> int:
    """Neighbours per point of a kNN affinity: ``n_neighbors``, by default ``int(3 perplexity)`` (openTSNE's
    choice: the Gaussian of that perplexity puts almost no mass beyond), at most ``N - 1``."""
    return min(int(n_points) - 1, int(n_neighbors) if n_neighbors is not None else int(3 * perplexity))
# metric name -> (scipy.spatial.distance name, pynndescent name); both compute the same distance.
METRICS = {
    "euclidean": ("euclidean", "euclidean"),
    "manhattan": ("cityblock", "manhattan"),
    "cityblock": ("cityblock", "manhattan"),
    "chebyshev": ("chebyshev", "chebyshev"),
    "cosine": ("cosine", "cosine"),
    "correlation": ("correlation", "correlation"),
    "braycurtis": ("braycurtis", "braycurtis"),
    "canberra": ("canberra", "canberra"),
}
_EXACT_BLOCK_ENTRIES = 1 << 22  # distances held at once by the brute-force search (32 MB)


# ----------------------------------------------------------------------------------------------- reading

def read_features(path) -> np.ndarray:
    """Read an ``N x d`` feature matrix (float64) from ``.npy``, ``.csv``, ``.tsv`` or a Zarr v3 array directory.

    CSV / TSV: comma / tab separated, ``#`` starts a comment, blank lines are skipped, and the first line may be a
    header of non-numeric column names.  Every problem raises ``InputError`` naming the file (and the line, for
    CSV / TSV).
    """
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file")
    if path.is_dir():
        if not (path / "zarr.json").is_file():
            raise InputError(path, "directory is not a Zarr v3 array (no zarr.json)")
        return _read_zarr(path)
    if path.stat().st_size == 0:
        raise InputError(path, "file is empty")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return _read_npy(path)
    if suffix in (".csv", ".tsv"):
        return _read_csv(path, "\t" if suffix == ".tsv" else ",")
    raise InputError(path, "unsupported format (expected .npy, .csv, .tsv or a Zarr array directory)")


def _read_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(path, f"cannot read as .npy ({exc.__class__.__name__}: {exc})") from None
    return _checked(path, array)


def _read_zarr(path: Path) -> np.ndarray:
    try:
        array = np.asarray(zarr.open_array(str(path), mode="r")[...])
    except Exception as exc:  # noqa: BLE001 - zarr raises many types for unreadable or non-array stores
        raise InputError(path, f"cannot read as a Zarr array ({exc.__class__.__name__}: {exc})") from None
    return _checked(path, array)


def _read_csv(path: Path, delimiter: str = ",") -> np.ndarray:
    rows, lines = [], []
    width = width_line = None
    try:
        with open(path, "rt", encoding="utf-8-sig", errors="strict") as handle:  # -sig: skip a BOM
            for line_no, line in enumerate(handle, start=1):
                text = line.split("#", 1)[0].strip()
                if not text:
                    continue
                cells = [cell.strip() for cell in text.split(delimiter)]
                if width is None:
                    width, width_line = len(cells), line_no
                    if not any(_is_number(cell) for cell in cells):
                        continue  # header of column names
                elif len(cells) != width:
                    raise InputError(path, f"expected {width} columns (as on line {width_line}), got {len(cells)}",
                                     line_no)
                rows.append(_parse_row(path, cells, line_no))
                lines.append(line_no)
    except (UnicodeDecodeError, OSError) as exc:
        raise InputError(path, f"cannot read as UTF-8 text ({exc.__class__.__name__}: {exc})") from None
    if not rows:
        raise InputError(path, "no data rows (only a header, comments or blank lines)")
    return _checked(path, np.array(rows, dtype=np.float64), lines)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _parse_row(path: Path, cells: list, line_no: int) -> list:
    values = []
    for column, cell in enumerate(cells):
        try:
            values.append(float(cell))
        except ValueError:
            what = "empty cell" if not cell else f"non-numeric cell {cell!r}"
            raise InputError(path, f"{what} in column {column} (0-based)", line_no) from None
    return values


def _checked(path: Path, array: np.ndarray, lines: list | None = None) -> np.ndarray:
    """Validate a loaded array: 2-D, at least one row and column, real numbers, all finite."""
    if array.dtype.kind not in "biuf":
        raise InputError(path, f"expected real numbers, got dtype {array.dtype}")
    if array.ndim != 2:
        raise InputError(path, f"expected a 2-D array (points x features), got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(path, f"no data: shape {array.shape}")
    X = np.ascontiguousarray(array, dtype=np.float64)
    finite = np.isfinite(X)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        column = int(np.flatnonzero(~finite[row])[0])
        raise InputError(path, f"non-finite value {X[row, column]} at row {row}, column {column} (0-based)",
                         None if lines is None else lines[row])
    return X


FEATURE_SUFFIXES = (".npy", ".csv", ".tsv")
_PROBE_LINES = 1000


def looks_like_features(path) -> bool:
    """Whether ``path`` is a feature matrix, for ``affinity='auto'`` (``scalemb embed``, the service): ``.npy``
    is; a ``.csv`` / ``.tsv`` is when its first data line (after comments and a header of names) holds only
    numbers and either more than three columns or a non-integer in its first two (an edge list is
    ``SOURCE TARGET [weight]`` with integer or string ids); anything else is not."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return True
    if suffix not in (".csv", ".tsv") or not path.is_file():
        return False
    delimiter = "\t" if suffix == ".tsv" else ","
    try:
        with open(path, "rt", encoding="utf-8-sig", errors="replace") as handle:
            for _, line in zip(range(_PROBE_LINES), handle):
                cells = [c.strip() for c in line.split("#", 1)[0].strip().split(delimiter)]
                if cells == [""]:
                    continue
                numbers = [_number(c) for c in cells]
                if all(v is None for v in numbers):
                    continue  # a header of column names
                if any(v is None for v in numbers):
                    return False  # string ids: an edge list
                return len(cells) > 3 or any(v != int(v) for v in numbers[:2])
    except OSError:
        return False
    return False


def _number(cell: str):
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


# ------------------------------------------------------------------------------------------- neighbours

def _threads(n_jobs: int | None) -> int:
    """Threads for ``n_jobs``: None or -1 all cores (``default_threads``), else at least 1."""
    return default_threads() if n_jobs is None or n_jobs == -1 else max(1, int(n_jobs))


def exact_search(n_points: int, n_features: int, metric: str = "euclidean") -> bool:
    """Whether ``knn_graph``'s ``algorithm='auto'`` searches exactly: up to ``EXACT_MAX_POINTS`` points for any
    metric; Euclidean (the matrix-product search) while ``n^2 (d + EXACT_FEATURE_COST) <= EXACT_EUCLIDEAN_BUDGET``,
    where it costs less CPU than NN-descent."""
    if n_points <= EXACT_MAX_POINTS:
        return True
    return metric == "euclidean" and float(n_points) ** 2 * (n_features + EXACT_FEATURE_COST) <= EXACT_EUCLIDEAN_BUDGET


def knn_graph(X, n_neighbors: int = 15, metric: str = "euclidean", random_state: int | None = 0,
              n_jobs: int | None = None, algorithm: str = "auto"):
    """The ``n_neighbors`` nearest neighbours of every row of ``X``, self excluded.

    Returns ``(indices, distances)``, both ``(N, n_neighbors)``, each row sorted by increasing distance.
    ``algorithm``: ``"nndescent"`` (``pynndescent.NNDescent``, approximate, in float32, seeded by
    ``random_state``, ``n_jobs`` threads, None or -1 = all cores), ``"exact"`` (brute force, ``exact_knn``, ties
    broken by the lower index) or ``"auto"`` (exact where it is the cheaper search, ``exact_search``).
    """
    X = _as_features(X)
    n = X.shape[0]
    k = int(n_neighbors)
    if not 1 <= k < n:
        raise ValueError(f"n_neighbors must be in 1..{n - 1} (fewer than the {n} points), got {n_neighbors}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; supported: {', '.join(METRICS)}")
    if algorithm not in ("auto", "exact", "nndescent"):
        raise ValueError(f"algorithm must be 'auto', 'exact' or 'nndescent', got {algorithm!r}")
    scipy_metric, pynnd_metric = METRICS[metric]
    if algorithm == "exact" or (algorithm == "auto" and exact_search(n, X.shape[1], metric)):
        indices, distances = exact_knn(X, k, scipy_metric, n_jobs)
    else:
        indices, distances = _nndescent_knn(X, k, pynnd_metric, random_state, n_jobs)
    if not np.all(np.isfinite(distances)):
        raise ValueError(f"metric {metric!r} gives non-finite distances on this data "
                         "(e.g. an all-zero row with cosine, a constant row with correlation)")
    return indices, distances


def _as_features(X) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1:
        raise ValueError(f"X must be a 2-D array with at least 2 rows and 1 column, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or infinite values")
    return X


def exact_knn(X: np.ndarray, k: int, metric, n_jobs: int | None = None):
    """Brute force in row blocks: all distances of a block, self set to +inf, k smallest by (distance, index).
    ``metric``: a ``cdist`` metric name, or a function ``(rows, X) -> distances`` (e.g. the Poincaré distance,
    ``hyperbolic.poincare_distances``).  Euclidean: ``brute.euclidean_knn`` (candidates from matrix products on
    ``n_jobs`` threads, the same result)."""
    if isinstance(metric, str) and metric == "euclidean":
        return euclidean_knn(X, k, _threads(n_jobs))
    n = X.shape[0]
    indices = np.empty((n, k), dtype=np.int64)
    distances = np.empty((n, k), dtype=np.float64)
    for r0, r1 in row_partition(n, -(-n * n // _EXACT_BLOCK_ENTRIES)):
        D = metric(X[r0:r1], X) if callable(metric) else cdist(X[r0:r1], X, metric=metric)
        D[np.arange(r1 - r0), np.arange(r0, r1)] = np.inf
        indices[r0:r1], distances[r0:r1] = k_smallest(D, k)
    return indices, distances


def k_smallest(D: np.ndarray, k: int) -> tuple:
    """``(columns, values)`` of the ``k`` smallest entries of every row of ``D``, sorted by (value, column):
    ties go to the lower index, so the neighbour lists do not depend on the partition's internals."""
    candidates = np.argpartition(D, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(D, candidates, axis=1)
    order = np.lexsort((candidates, values), axis=-1)
    return np.take_along_axis(candidates, order, axis=1), np.take_along_axis(values, order, axis=1)


def _nndescent_knn(X: np.ndarray, k: int, metric: str, random_state, n_jobs):
    """NN-descent for ``k + 1`` neighbours, then drop self (or, if self was not found, the farthest)."""
    from pynndescent import NNDescent  # imported here: it takes seconds and small inputs never need it

    index = NNDescent(X, metric=metric, n_neighbors=k + 1, random_state=random_state, n_jobs=n_jobs,
                      verbose=False)
    indices, distances = index.neighbor_graph
    if (indices < 0).any():
        raise RuntimeError("NN-descent found fewer than n_neighbors neighbours for some points; "
                           "use algorithm='exact' or fewer neighbours")
    keep = indices != np.arange(X.shape[0])[:, None]
    keep[keep.all(axis=1), -1] = False
    return (indices[keep].reshape(-1, k).astype(np.int64),
            distances[keep].reshape(-1, k).astype(np.float64))


# ------------------------------------------------------------------------------------------- calibration

@njit(cache=True, nogil=True)
def _gaussian_rows(indptr, dist, log_perplexity, r0, r1, out):
    """Fill ``out`` with ``p_j|i ∝ exp(-beta_i d_ij^2)`` for rows ``[r0, r1)`` of a CSR pattern, bisecting on
    ``beta_i`` until the row entropy is within ``ENTROPY_TOL`` of ``log_perplexity``; returns the number of
    rows that did not get there in ``MAX_STEPS`` steps (they keep the last precision tried).

    Squared distances are shifted by the row minimum, which leaves ``p`` unchanged and keeps the largest
    weight at 1 (no underflow); the entropy is then ``H = log Z + beta sum_j p_j s_j`` with ``s_j`` shifted.
    """
    missed = 0
    for i in range(r0, r1):
        lo, hi = indptr[i], indptr[i + 1]
        d2min = np.inf
        for idx in range(lo, hi):
            d2min = min(d2min, dist[idx] * dist[idx])
        beta, beta_lo, beta_hi = 1.0, 0.0, np.inf
        Z = 1.0
        converged = False
        for _ in range(MAX_STEPS):
            Z = 0.0
            ws = 0.0
            for idx in range(lo, hi):
                s = dist[idx] * dist[idx] - d2min
                w = np.exp(-beta * s)
                out[idx] = w
                Z += w
                ws += w * s
            gap = np.log(Z) + beta * ws / Z - log_perplexity
            if abs(gap) < ENTROPY_TOL:
                converged = True
                break
            if gap > 0.0:  # too flat: sharpen
                beta_lo = beta
                beta = 2.0 * beta if beta_hi == np.inf else 0.5 * (beta + beta_hi)
            else:
                beta_hi = beta
                beta = 0.5 * (beta + beta_lo)
        if not converged:
            missed += 1
        for idx in range(lo, hi):
            out[idx] /= Z
    return missed


def conditional_affinities(D: sp.csr_matrix, perplexity: float = PERPLEXITY, method: str = "gaussian",
                           n_jobs: int | None = None) -> sp.csr_matrix:
    """``P_cond`` on the stored pattern of ``D`` (row ``i``'s stored entries are its neighbours' distances).

    Every row sums to 1: ``gaussian`` has row perplexity ``exp(H_i)`` equal to ``perplexity``, which must be
    below every row's number of neighbours (the largest entropy a row of ``k`` entries reaches is ``log k``);
    ``uniform`` gives ``1 / k_i``.  ``n_jobs`` threads calibrate row blocks (None or -1 = all cores).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    D = sp.csr_matrix(D, dtype=np.float64)
    counts = np.diff(D.indptr)
    if (counts == 0).any():
        raise ValueError(f"row {int(np.flatnonzero(counts == 0)[0])} has no neighbours (no stored distances)")
    if not np.all(np.isfinite(D.data)) or D.data.min() < 0:
        raise ValueError("distances must be finite and non-negative")
    if method == "uniform":
        return sp.csr_matrix((np.repeat(1.0 / counts, counts), D.indices, D.indptr), shape=D.shape)
    perplexity = float(perplexity)
    fewest = int(np.argmin(counts))
    if not 1.0 <= perplexity < counts[fewest]:
        raise ValueError(f"perplexity must be at least 1 and below the number of neighbours; got {perplexity} "
                         f"with {counts[fewest]} neighbours (row {fewest})")
    indptr = D.indptr.astype(np.int64)
    data = np.empty(D.nnz, dtype=np.float64)
    threads = _threads(n_jobs)
    blocks = row_partition(D.shape[0], threads)
    with ThreadPoolExecutor(len(blocks)) as pool:
        missed = sum(pool.map(lambda b: _gaussian_rows(indptr, D.data, math.log(perplexity), b[0], b[1], data),
                              blocks))
    if missed:
        warnings.warn(f"{missed} rows did not reach perplexity {perplexity} within {MAX_STEPS} bisection steps "
                      "(many neighbours at the same distance?)", RuntimeWarning, stacklevel=2)
    return sp.csr_matrix((data, D.indices, D.indptr), shape=D.shape)


# ---------------------------------------------------------------------------------------------- affinity

def joint_affinity(P_cond: sp.csr_matrix, provenance: dict) -> Affinity:
    """``P = (P_cond + P_cond^T) / (2N)`` as an ``Affinity`` over node ids ``0..N-1``."""
    n = P_cond.shape[0]
    P = ((P_cond + P_cond.T) / (2.0 * n)).tocsr()
    return Affinity(P, np.arange(n, dtype=np.int64), provenance)


def knn_affinity(X, perplexity: float = PERPLEXITY, n_neighbors: int | None = None, metric: str = "euclidean",
                 method: str = "gaussian", random_state: int | None = 0, n_jobs: int | None = None,
                 source=None) -> Affinity:
    """SNE / t-SNE input affinity ``P = (P_cond + P_cond^T) / (2N)`` on the kNN graph of the rows of ``X``.

    ``X`` is an ``N x d`` array or a path read with ``read_features`` (then the default ``source``).
    ``n_neighbors`` defaults to ``min(N - 1, int(3 * perplexity))`` for ``gaussian`` (openTSNE's choice) and
    to ``min(N - 1, 15)`` for ``uniform``, which ignores ``perplexity``.  See the module docstring for the
    conditional affinities and ``knn_graph`` for the neighbour search.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(X, (str, Path)):
        source = X if source is None else source
        with phase("reading", str(X)):
            X = read_features(X)
    X = _as_features(X)
    n = X.shape[0]
    if n_neighbors is None:
        n_neighbors = default_neighbours(n, perplexity) if method == "gaussian" else min(n - 1, 15)
    if method == "gaussian" and not 1.0 <= perplexity < n_neighbors:
        raise ValueError(f"perplexity ({perplexity}) must be at least 1 and below n_neighbors ({n_neighbors})")
    exact = exact_search(n, X.shape[1], metric)
    search = "exact" if exact else "NN-descent"
    with phase("kNN", f"{n} points x {X.shape[1]} features, {n_neighbors} neighbours, {search}"):
        indices, distances = knn_graph(X, n_neighbors, metric, random_state, n_jobs)
    k = indices.shape[1]
    D = sp.csr_matrix((distances.ravel(), indices.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    with phase("perplexity calibration", f"perplexity {perplexity:g}" if method == "gaussian" else method):
        P_cond = conditional_affinities(D, perplexity, method, n_jobs)
    return joint_affinity(P_cond, {"source": None if source is None else str(source), "method": "knn",
                           "metric": metric, "n_neighbors": int(k),
                           "knn": "exact" if exact else "nndescent",
                           "perplexity": float(perplexity) if method == "gaussian" else "uniform",
                           "seed": random_state})


def from_point_distances(provenance: dict) -> bool:
    """Whether an affinity's ``provenance`` says P was calibrated by perplexity from distances between points
    (``knn_affinity`` of feature rows, ``affinity_from_distances`` of a kNN pair or a distance matrix), not made
    from a graph or given as it is."""
    return provenance.get("method") in ("knn", "precomputed")


def affinity_from_distances(D, perplexity: float = PERPLEXITY, method: str = "gaussian", n_jobs: int | None = None,
                            source=None) -> Affinity:
    """``P = (P_cond + P_cond^T) / (2N)`` from a square sparse distance matrix: each row's stored entries
    (explicit zeros included, diagonal ignored) are its neighbours; duplicate entries are summed (SciPy)."""
    if not sp.issparse(D):
        raise TypeError(f"D must be a scipy.sparse matrix, got {type(D).__name__}")
    if D.shape[0] != D.shape[1]:
        raise ValueError(f"D must be square, got shape {D.shape}")
    D = sp.csr_matrix(D, dtype=np.float64, copy=True)
    D.sum_duplicates()
    n = D.shape[0]
    rows = np.repeat(np.arange(n), np.diff(D.indptr))
    off = D.indices != rows
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[off], minlength=n))])
    D = sp.csr_matrix((D.data[off], D.indices[off], indptr), shape=D.shape)
    with phase("perplexity calibration", f"perplexity {perplexity:g}" if method == "gaussian" else method):
        P_cond = conditional_affinities(D, perplexity, method, n_jobs)
    return joint_affinity(P_cond, {"source": None if source is None else str(source), "method": "precomputed",
                           "perplexity": float(perplexity) if method == "gaussian" else "uniform"})
