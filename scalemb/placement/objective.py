"""The objective of placing M new points into a fixed map of N points, and its gradient, by row blocks.

Let ``P'`` be the joint affinity of all ``N + M`` points (symmetric, summing to 1 over ordered pairs, rows
ordered old then new; ``scalemb.placement.affinity`` builds it the way the run's P was built), ``Y`` the
old coordinates (fixed) and ``X`` the new ones.  Placement minimises the KL of the whole map,

    ``KL(P'||Q) = sum p log p - sum_{ij} p_ij log w_ij + log Z``,  ``Z = sum_{i != j} w_ij``,

over ``X`` only.  Splitting the ordered pairs into old-old (oo), old-new and new-old (on, twice) and new-new
(nn):

    ``sum p log w = S_oo + 2 S_on + S_nn``,  ``Z = Z_oo + 2 Z_on + Z_nn``,

where ``S_oo`` and ``Z_oo`` do not depend on ``X``: they are computed once (the attraction kernel on the old
rows' old columns; the exact all-pairs repulsion or one FFT pass).  ``S_on + S_nn`` is the attraction
kernel's ``sum p log w`` over the new rows of ``P'`` (columns split into old ``B`` and new ``E`` so that
``S_nn`` is known), ``Z_on`` and ``Z_nn`` come from ``cross_repulsion`` of the new rows against the old
points and against each other (``scalemb.models.kernels``).  The gradient of a new point is the full map's
gradient row (each pair involving ``x_i`` appears twice in the ordered sums):

    ``dKL/dx_i = 2 (-sum_j p_ij d log w_ij/dx_i + sum_{j != i} w_ij d log w_ij/dx_i / Z)``,

j over old and new points: the new rows of the same ``A`` and ``R`` the embedding uses (``engine.blocks``).

Relation to openTSNE's ``prepare_partial`` / ``transform``: there each new point has its own conditional
affinities ``p_j|i`` to the reference (summing to 1) and its own normaliser ``Z_i = sum_{j old} w_ij``, and
``sum_i KL(P_i||Q_i)`` is minimised: the points do not interact.  Here the normaliser is the whole map's Z
(dominated by the fixed ``Z_oo``), new points attract and repel each other, and the value minimised is the
KL that a full re-embedding minimises, so the two can be compared directly.  For kNN affinities the new
rows of ``P'`` are openTSNE's ``p_j|i / (2 (N + M))`` (the reference's neighbour lists do not change).

Repulsion from the old points: exact (``cross_repulsion``, O(M N) per evaluation) or, with ``repulsion="fft"``,
through one FFT grid of the fixed map computed once (``placement.frozen.FrozenField``: O(M) per evaluation, and
``Z_oo`` by one FFT pass instead of O(N²)); the new points' repulsion among themselves is exact either way.

Freed stored points (``placement.place``'s free phase) are numbered among the moving rows, before the placed
points (``n_placed``: the last rows).  The exaggeration then weighs the pairs by whether they hold a placed point:
``alpha`` (the optimiser's exaggeration) the pairs with at least one placed point, ``stored_attraction`` (beta) the
moving rows' other pairs (freed-freed and freed-fixed), so the descended objective is

    ``KL - (alpha - 1) S_placed - (beta - 1) S_stored``,  ``S_placed + S_stored = 2 S_on + S_nn``,

the KL reported unchanged.  Why: the stored map was laid out without the new points' links; pulled by them
(alpha > 1) while their hold on the old layout is loosened (beta < 1), the freed points follow the links the map
lacks (docs/design/placement.md).  Without freed rows (``n_placed`` all of them) every pair holds a placed point
and beta plays no part.

Work is split into blocks of ``BLOCK_ROWS`` new rows (a layout fixed by the data, not by the thread count),
evaluated on a thread pool; each block costs O(rows x (N + M)) for the repulsion.
"""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..affinity.affinity import row_partition
from ..engine.blocks import Evaluation, point_major
from ..engine.laplacian import row_sums
from ..engine.local import default_threads
from ..models.base import Model

BLOCK_ROWS = 256


def block_terms(model: Model, space_dims: int, n_old: int, rows: "_Rows", Yt: np.ndarray, X: np.ndarray,
                old: np.ndarray, field, with_kl: bool):
    """One block of new rows: ``(rows, A, R, S_on, S_nn, Z_on, Z_nn, A_rest, S_rest)`` (module docstring;
    ``A``, ``S_on``, ``S_nn`` of the pairs with a placed point, ``A_rest`` (None without freed rows) and ``S_rest``
    (``2 S_on + S_nn`` of the block's other pairs) of the rest); ``Yt`` the whole
    map point-major, ``field`` the frozen grid or None (exact sums).  The same function on local threads and on
    Dask workers (``_remote_block``)."""
    d, ds = X.shape[0], space_dims
    A = np.zeros((rows.r1 - rows.r0, d))
    r0 = n_old + rows.r0
    s_on = model.attraction(*rows.b, r0, Yt, ds, A, with_kl)
    s_nn = model.attraction(*rows.e, r0, Yt, ds, A, with_kl)
    A_rest, s_rest = None, 0.0
    if rows.rest is not None:  # the freed rows' pairs without a placed point (weighed apart: module docstring)
        A_rest = np.zeros((rows.r1 - rows.r0, d))
        s_rest = 2.0 * model.attraction(*rows.rest[0], r0, Yt, ds, A_rest, with_kl) + \
            model.attraction(*rows.rest[1], r0, Yt, ds, A_rest, with_kl)
    R = np.zeros((d, rows.r1 - rows.r0))
    if field is not None:
        z_on = field.add(X, rows.r0, rows.r1, R)
    else:
        z_on = model.cross_repulsion(X, rows.r0, rows.r1, old, ds, False, R)
    z_nn = model.cross_repulsion(X, rows.r0, rows.r1, X, ds, True, R)
    return rows, A, R, float(s_on), float(s_nn), float(z_on), float(z_nn), A_rest, float(s_rest)


def _remote_block(model: Model, space_dims: int, rows: "_Rows", old: np.ndarray, X: np.ndarray, field,
                  with_kl: bool):
    """``block_terms`` on a Dask worker, from the broadcast old map and new coordinates (``Yt`` built as the
    client builds it: the same values)."""
    Yt = point_major(np.ascontiguousarray(np.concatenate([old, X], axis=1)))
    return block_terms(model, space_dims, old.shape[1], rows, Yt, X, old, field, with_kl)


def z_old_part(model: Model, old: np.ndarray, space_dims: int, r0: int, r1: int) -> float:
    """``sum_{i in [r0, r1), j != i} w_ij`` over the old points (exact), one block of ``Z_oo``."""
    R = np.zeros_like(old)
    return float(model.repulsion(old, space_dims, r0, r1, R))


@dataclass
class _Rows:
    """New rows ``[r0, r1)`` (0-based among the new points) of ``P'``: ``B`` (old columns) and ``E`` (new
    columns, indices into the combined ``[old, new]`` numbering), CSR parts with ``indptr`` from 0."""

    r0: int
    r1: int
    b: tuple
    e: tuple
    rest: tuple | None = None  # (b, e) of the pairs without a placed point (freed rows), None if there are none


def split_placed(rows: sp.csr_matrix, n_old: int, n_freed: int) -> tuple:
    """The moving rows ``rows`` (``M x (N + M)``, the ``n_freed`` freed rows first) as ``(with, without)``: the
    entries of the pairs with a placed point (row or column past the freed ones) and the others, same shape."""
    coo = rows.tocoo()
    placed = (coo.row >= n_freed) | (coo.col >= n_old + n_freed)
    return tuple(sp.csr_matrix((coo.data[keep], (coo.row[keep], coo.col[keep])), shape=rows.shape)
                 for keep in (placed, ~placed))


def _csr_parts(M: sp.csr_matrix, r0: int, r1: int, shift: int) -> tuple:
    lo, hi = M.indptr[r0], M.indptr[r1]
    return ((M.indptr[r0:r1 + 1] - lo).astype(np.int64), M.indices[lo:hi].astype(np.int64) + shift,
            np.ascontiguousarray(M.data[lo:hi], dtype=np.float64))


class PlacementObjective:
    """``KL(P'||Q)`` of the whole map as a function of the new points' coordinates (module docstring).

    ``P``: the ``(N + M) x (N + M)`` joint affinity, old rows first; ``old``: the fixed ``(ds + dt, N)``
    coordinates.  ``evaluate(X)`` takes the new coordinates ``(ds + dt, M)`` and returns an ``Evaluation``
    whose gradient is ``(ds + dt, M)``; ``curvature_diagonal(X)`` the per-point diagonal of the attractive
    partial Hessian (``engine.blocks.curvature_block``'s weights summed over each new row).
    """

    def __init__(self, model: Model, space_dims: int, P: sp.csr_matrix, old: np.ndarray, n_threads: int | None = None,
                 z_old: float | None = None, repulsion: str = "exact", client=None, n_placed: int | None = None,
                 stored_attraction: float = 1.0):
        if repulsion not in ("exact", "fft"):
            raise ValueError(f"placement repulsion must be 'exact' or 'fft', got {repulsion!r}")
        if not stored_attraction > 0:
            raise ValueError(f"stored_attraction must be > 0, got {stored_attraction!r}")
        self.model = model
        self.repulsion = repulsion
        self.space_dims = space_dims
        self.old = np.ascontiguousarray(old, dtype=np.float64)
        n = self.old.shape[1]
        P = sp.csr_matrix(P)
        if P.shape[0] != P.shape[1] or P.shape[0] <= n:
            raise ValueError(f"P must be square with more than the {n} old rows, got shape {P.shape}")
        self.n_old, self.n_new = n, P.shape[0] - n
        self.n_placed = self.n_new if n_placed is None else int(n_placed)
        if not 0 < self.n_placed <= self.n_new:
            raise ValueError(f"n_placed must be in [1, {self.n_new}], got {n_placed!r}")
        self.stored_attraction = float(stored_attraction)
        self.entropy = float(np.sum(P.data * np.log(P.data)))
        old_block = P[:n, :n].tocsr()
        new_rows = P[n:].tocsr()
        n_freed = self.n_new - self.n_placed
        split = split_placed(new_rows, n, n_freed) if n_freed else (new_rows, None)
        parts = []
        for rows in split:
            if rows is None:
                parts.append(None)
                continue
            B, E = rows[:, :n].tocsr(), rows[:, n:].tocsr()
            B.sort_indices()
            E.sort_indices()
            parts.append((B, E))
        old_block.sort_indices()
        (B, E), rest = parts
        self.rows = [_Rows(r0, r1, _csr_parts(B, r0, r1, 0), _csr_parts(E, r0, r1, n),
                           None if rest is None else (_csr_parts(rest[0], r0, r1, 0), _csr_parts(rest[1], r0, r1, n)))
                     for r0, r1 in row_partition(self.n_new, -(-self.n_new // BLOCK_ROWS))]
        self.n_threads = n_threads or default_threads()
        self._pool = ThreadPoolExecutor(self.n_threads) if len(self.rows) > 1 and self.n_threads > 1 else None
        A = np.zeros((n, self.old.shape[0]))
        indptr = old_block.indptr.astype(np.int64)
        self.plogw_old = float(model.attraction(indptr, old_block.indices.astype(np.int64), old_block.data, 0,
                                                point_major(self.old), space_dims, A, True))
        self.field = None
        if repulsion == "fft":
            from .frozen import FrozenField

            self.field = FrozenField(model, space_dims, self.old, workers=self.n_threads)
        self.client = client
        if client is not None:  # the old map (and its frozen grid) on every worker, the row blocks spread; keys
            # not content-hashed: a key released by one call and scattered again by the next (the same X twice in a
            # line search) could be forgotten by the scheduler after the new scatter ("lost dependencies")
            self._remote_old = client.scatter(self.old, broadcast=True, hash=False)
            self._remote_field = (client.scatter(self.field, broadcast=True, hash=False)
                                  if self.field is not None else None)
            self._remote_model = client.scatter(model, broadcast=True, hash=False)
            self._remote_rows = client.scatter(self.rows, hash=False)
        if z_old is not None:
            self.z_old = float(z_old)
        else:
            self.z_old = self.field.z_old() if self.field is not None else self._z_old()

    def _z_old(self) -> float:
        """``Z_oo``: the exact all-pairs kernel over the old points, in blocks of rows."""
        n = self.n_old
        blocks = row_partition(n, -(-n // BLOCK_ROWS))
        if self.client is not None:
            futures = [self.client.submit(z_old_part, self._remote_model, self._remote_old, self.space_dims, r0, r1,
                                          pure=False) for r0, r1 in blocks]
            return float(sum(self.client.gather(futures)))
        return float(sum(self._map(lambda bounds: z_old_part(self.model, self.old, self.space_dims, *bounds),
                                   blocks)))

    def _map(self, fn, items):
        if self._pool is None:
            return [fn(item) for item in items]
        return list(self._pool.map(fn, items))

    def combined(self, X: np.ndarray) -> np.ndarray:
        """``[old, X]``: the ``(ds + dt, N + M)`` coordinates of the whole map."""
        return np.ascontiguousarray(np.concatenate([self.old, X], axis=1))

    def _block(self, rows: _Rows, Yt: np.ndarray, X: np.ndarray, with_kl: bool):
        return block_terms(self.model, self.space_dims, self.n_old, rows, Yt, X, self.old, self.field, with_kl)

    def _blocks(self, X: np.ndarray, with_kl: bool) -> list:
        """Every row block's ``block_terms``, in block order: on the thread pool, or on the Dask workers
        holding the blocks (``client``; the new coordinates broadcast, the results gathered in order)."""
        if self.client is None:
            Yt = point_major(self.combined(X))
            return self._map(lambda rows: self._block(rows, Yt, X, with_kl), self.rows)
        remote_X = self.client.scatter(X, broadcast=True, hash=False)
        futures = [self.client.submit(_remote_block, self._remote_model, self.space_dims, rows, self._remote_old,
                                      remote_X, self._remote_field, with_kl, pure=False)
                   for rows in self._remote_rows]
        return self.client.gather(futures)

    def evaluate(self, X: np.ndarray, exaggeration: float = 1.0, with_kl: bool = True) -> Evaluation:
        """KL of the whole map and its gradient with respect to the new coordinates ``X`` (``(ds + dt, M)``);
        with ``exaggeration`` alpha the gradient and ``objective`` are those of ``H - alpha sum p log w + log Z``
        (the new rows' attraction exaggerated; the old-old part is a constant either way); with freed rows alpha
        weighs the pairs with a placed point and ``stored_attraction`` the others (module docstring)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.shape != (self.old.shape[0], self.n_new):
            raise ValueError(f"new coordinates must have shape {(self.old.shape[0], self.n_new)}, got {X.shape}")
        results = self._blocks(X, with_kl)
        attraction = np.zeros_like(X)
        repulsion = np.zeros_like(X)
        rest = None if self.n_placed == self.n_new else np.zeros_like(X)
        s_on = s_nn = z_on = z_nn = s_rest = 0.0
        for rows, A, R, a, b, c, e, A_rest, f in results:
            attraction[:, rows.r0:rows.r1] = A.T
            repulsion[:, rows.r0:rows.r1] = R
            if A_rest is not None:
                rest[:, rows.r0:rows.r1] = A_rest.T
            s_on, s_nn, z_on, z_nn, s_rest = s_on + a, s_nn + b, z_on + c, z_nn + e, s_rest + f
        z = self.z_old + 2.0 * z_on + z_nn
        beta = self.stored_attraction
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = self.entropy - (self.plogw_old + 2.0 * s_on + s_nn + s_rest) + np.log(z) if with_kl else np.nan
            objective = kl - (exaggeration - 1.0) * (2.0 * s_on + s_nn) - (beta - 1.0) * s_rest if with_kl else np.nan
            gradient = 2.0 * (repulsion / z - exaggeration * attraction)
            if rest is not None:
                gradient -= 2.0 * beta * rest
        return Evaluation(float(kl), float(objective), gradient, float(z))

    def curvature_diagonal(self, X: np.ndarray, exaggeration: float = 1.0) -> np.ndarray:
        """``h_i = sum_j c_ij`` over new row i (``c_ij = -2 a_ij p_ij``, ``models.kernels.curvature``): the
        diagonal of the attractive partial Hessian in space at ``X``, ``(M,)``, of the objective ``evaluate``
        descends with ``exaggeration`` (the pairs weighed as there)."""
        Yt = point_major(self.combined(np.ascontiguousarray(X, dtype=np.float64)))
        h = np.zeros(self.n_new)
        h_rest = None if self.n_placed == self.n_new else np.zeros(self.n_new)
        for rows in self.rows:
            for target, parts in ((h, (rows.b, rows.e)), (h_rest, rows.rest or ())):
                for indptr, indices, data in parts:
                    weights = np.empty_like(data)
                    self.model.curvature(indptr, indices, data, self.n_old + rows.r0, Yt, self.space_dims, weights)
                    target[rows.r0:rows.r1] += row_sums(indptr, weights)
        h = exaggeration * h
        return h if h_rest is None else h + self.stored_attraction * h_rest

    def curvature_matrix(self, X: np.ndarray, exaggeration: float = 1.0) -> sp.csr_matrix:
        """``B = diag(h) - C_nn`` (``(M, M)``): the attractive partial Hessian in space of the moving points
        at ``X``, old points held fixed (``C`` the curvature weights ``c_ij`` of the new rows, ``C_nn`` its
        new-new block, ``h`` = ``curvature_diagonal``: every row's weights summed, old columns included).  It
        is the Laplacian of the new-new weights plus each point's weights to the fixed points on the diagonal,
        i.e. the spectral direction's ``L`` with the fixed points as a Dirichlet boundary; positive definite
        on every component of the moving points that touches the fixed map.  Of the objective ``evaluate``
        descends with ``exaggeration`` (the pairs weighed as there)."""
        Yt = point_major(self.combined(np.ascontiguousarray(X, dtype=np.float64)))
        B = exaggeration * self._curvature_part(Yt, [(part, part.b, part.e) for part in self.rows])
        if self.n_placed == self.n_new:
            return B
        return (B + self.stored_attraction * self._curvature_part(Yt, [(part, *part.rest) for part in self.rows])
                ).tocsr()

    def _curvature_part(self, Yt: np.ndarray, parts: list) -> sp.csr_matrix:
        """``diag(h) - C_nn`` of the ``(rows, B part, E part)`` given (``curvature_matrix``)."""
        h = np.zeros(self.n_new)
        rows, cols, vals = [], [], []
        for part, *csr in parts:
            for k, (indptr, indices, data) in enumerate(csr):
                weights = np.empty_like(data)
                self.model.curvature(indptr, indices, data, self.n_old + part.r0, Yt, self.space_dims, weights)
                h[part.r0:part.r1] += row_sums(indptr, weights)
                if k == 1 and data.size:
                    rows.append(part.r0 + np.repeat(np.arange(part.r1 - part.r0), np.diff(indptr)))
                    cols.append(indices - self.n_old)
                    vals.append(-weights)
        off = (sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(self.n_new, self.n_new)) if vals else sp.csr_matrix((self.n_new, self.n_new)))
        return (sp.diags(h) + off).tocsr()

    def close(self) -> None:
        if self.client is not None:  # release the workers' copies
            self._remote_old = self._remote_field = self._remote_model = self._remote_rows = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
