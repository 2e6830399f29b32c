"""An optimiser's per-point state, held where P's row blocks are.

Delta-bar-delta's per-point arrays (coordinates, gradient, gains, increments, best iterate) are ``(d, N)``
arrays split by the executor's row blocks.  An optimiser that keeps them as a ``HeldState`` touches them only
through

* ``map(fn, *args) -> [fn(rows_k, *args) for every block k]`` in block order: ``rows_k`` maps each array's name
  to its ``(d, r1 - r0)`` rows of block k, which ``fn`` changes in place; ``fn`` returns something small (partial
  sums), reduced by the caller in block order;
* ``evaluate(exaggeration, with_kl, iteration, defer) -> Evaluation`` at the held ``coords``: the gradient's rows
  are held as ``gradient`` (``Evaluation.gradient`` is None) and ``Evaluation.finite`` says whether all are finite;
  with ``defer`` the rows may be formed by the next ``map``, in its tasks (one round trip fewer on Dask):
  ``finite`` is then None and ``gradient_finite`` tells after that ``map``;
* ``shift(vector)``: subtract ``vector`` (one number per coordinate) from every point's coordinates, applied to
  each block before its next use;
* ``gather(*names) -> {name: (d, N)}`` in the input's point order (checkpoints and the result only);
* ``ensure({name: rows})``: hold zeros for work vectors not held yet;
* ``set_curvature(exaggeration, fixed, after=None) -> [sum of diag per block]``: the spectral direction's curvature
  weights at the held coordinates, kept where the blocks are, and ``L(C)``'s diagonal held as ``diag``; with
  ``after = (fn, args)`` run on each block last, ``(sum, fn's result)`` per block;
* ``laplacian(source, target, before, after) -> [after's result per block]``: ``target <- L(C) source``, each
  block's product from its own rows and its halo of ``source`` (on Dask exchanged worker to worker);
* ``extent_hint(lo, hi)``: the coordinates' extent as the optimiser knows it after its last step (per coordinate,
  min and max over all points, after the pending shift), which saves a round of the workers reporting it.

A state held away from the client (``remote``: ``DaskHeld``) also writes and reads its rows where they are:

* ``write_rows(directory, fields) -> {field: [digest per block]}``: each block's rows of the held array ``name``
  into the existing Zarr array ``directory/field`` (``fields``: ``{name: field}``), by the process holding them,
  with each block's SHA-256 (``rows_digest``) so the client can hash a record it never saw.  Arrays are
  ``(d, N)``, chunked by at most the narrowest block's width, so a chunk spans at most two neighbouring blocks:
  blocks of even index write first, then the odd ones, and no two writers ever share a chunk at the same time;
* ``write_result_rows(directory, fields)``: as ``write_rows``, and the coordinates transposed into the result's
  ``(N, d)`` array ``directory/embedding`` (``write_result_block``): a finished run's final write;
* ``load_rows(directory, fields)``: hold those arrays again, each block reading its own rows (a rewind to a
  checkpoint after a lost worker); the blocks' digests of what was read.

``LocalHeld`` keeps whole arrays in this process (blocks are column views: the executor's row blocks, or one
block); ``scalemb.engine.held_dask.DaskHeld`` keeps each partition's rows on the Dask worker that holds the
partition, so per iteration the client sends and receives scalars and small vectors only.  Both run the same
block functions on the same rows and reduce in block order, so they agree bit for bit.

Where the rows are held is the executor's business (its blocks, its workers), so the contract and both holders
are the engine's; an optimiser asks ``hold(executor, arrays)`` for one and works through it.
"""
import hashlib

import numpy as np


class HeldRowsLost(Exception):
    """Held rows were lost with a worker (a marker mixed into the executor's own worker-loss error): an optimiser
    can rewind to a state it exported (``StepRun.rewind``) and ``HeldState.recover`` from it."""


def hold(executor, arrays: dict):
    """The ``HeldState`` of ``arrays`` (``{name: (d, N)}``, input order, ``coords`` among them) for
    ``executor``: its own ``hold`` if it has one, else ``LocalHeld``."""
    own = getattr(executor, "hold", None)
    return own(arrays) if own is not None else LocalHeld(executor, arrays)


def rows_digest(rows: np.ndarray) -> str:
    """SHA-256 (hex) of a block's rows: the bytes of the C-ordered float64 ``(d, r1 - r0)`` array."""
    return hashlib.sha256(np.ascontiguousarray(rows, dtype=np.float64).tobytes()).hexdigest()


def store_chunk(bounds) -> int:
    """Columns per chunk of an array written by blocks ``bounds``: the narrowest block's width (at most 2**16),
    so that a chunk spans at most two neighbouring blocks (``write_rows``)."""
    return max(1, min(1 << 16, min(int(b) - int(a) for a, b in bounds)))


def write_block(rows: dict, directory: str, fields: dict, starts) -> dict | None:
    """Write a block's held rows into the Zarr arrays ``directory/field`` at its columns (the block starts at
    ``rows['_r0']``) if it is one of ``starts`` (this round's blocks); their digests, else None."""
    import os

    import zarr

    r0 = rows["_r0"]
    if r0 not in starts:
        return None
    if not os.path.isdir(directory):  # a worker on another host, without the client's file system
        raise FileNotFoundError(f"{directory}: the output store is not visible here")
    digests = {}
    with zarr.config.set({"array.write_empty_chunks": True}):  # -0.0 is written as -0.0, not left to the fill
        for name, field in fields.items():
            block = rows[name]
            zarr.open_array(store=os.path.join(directory, field), mode="r+")[:, r0:r0 + block.shape[1]] = block
            digests[field] = rows_digest(block)
    return digests


def write_result_block(rows: dict, directory: str, fields: dict, starts) -> dict | None:
    """``write_block`` of the held arrays ``fields``, and the block's coordinates transposed into the result's
    ``(N, d)`` array ``directory/embedding`` at its rows (chunked by rows as ``write_rows``' arrays are by
    columns): a finished run's final state and embedding, written by the process holding them; the digests,
    ``embedding``'s that of the ``(r1 - r0, d)`` rows as stored (``scalemb.store.results.blocked_hash``)."""
    import os

    import zarr

    digests = write_block(rows, directory, fields, starts)
    if digests is None:
        return None
    r0, block = rows["_r0"], np.ascontiguousarray(rows["coords"].T)
    with zarr.config.set({"array.write_empty_chunks": True}):
        zarr.open_array(store=os.path.join(directory, "embedding"), mode="r+")[r0:r0 + block.shape[0], :] = block
    digests["embedding"] = rows_digest(block)
    return digests


def read_block(directory: str, fields: dict, r0: int, r1: int) -> dict:
    """Columns ``r0 .. r1 - 1`` of the Zarr arrays ``directory/field``, as held rows ``{name: (d, r1 - r0)}``."""
    import os

    import zarr

    return {name: np.ascontiguousarray(zarr.open_array(store=os.path.join(directory, field), mode="r")[:, r0:r1],
                                       dtype=np.float64) for name, field in fields.items()}


def digest_block(rows: dict, fields: dict) -> dict:
    return {field: rows_digest(rows[name]) for name, field in fields.items()}


def shift_rows(rows: dict, shift) -> None:
    """Apply a pending ``shift`` to a block's coordinates (in place)."""
    if shift is not None:
        rows["coords"] -= shift[:, None]


class LocalHeld:
    """Whole arrays in this process; blocks are column ranges (``executor.bounds``, or all points as one)."""

    remote = False  # nothing is lost with a worker: the optimiser keeps no rescue copy

    def __init__(self, executor, arrays: dict):
        self.executor = executor
        self.arrays = {name: np.array(a, dtype=np.float64, order="C") for name, a in arrays.items()}
        n = self.arrays["coords"].shape[1]
        bounds = getattr(executor, "bounds", None)
        if getattr(executor, "point_order", "given") != "given" or not bounds:
            bounds = [(0, n)]  # a renumbered executor's blocks are not column ranges of the input's order
        self.bounds = [(int(a), int(b)) for a, b in bounds]
        self.n_points = n
        self._shift = None
        self.gradient_finite = None

    def _flush(self) -> None:
        if self._shift is not None:
            for r0, r1 in self.bounds:
                shift_rows({"coords": self.arrays["coords"][:, r0:r1]}, self._shift)
            self._shift = None

    def map(self, fn, *args) -> list:
        self._flush()
        return [fn({name: a[:, r0:r1] for name, a in self.arrays.items()}, *args) for r0, r1 in self.bounds]

    def shift(self, vector: np.ndarray) -> None:
        self._flush()
        self._shift = np.asarray(vector, dtype=np.float64)

    def extent_hint(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Not needed here: the executor reads the extent from the coordinates it is given."""

    def evaluate(self, exaggeration: float, with_kl: bool, iteration: int | None = None, defer: bool = False):
        """(``defer`` changes nothing here: the executor returns the whole gradient.)"""
        self._flush()
        ev = self.executor.evaluate(self.arrays["coords"], exaggeration, with_kl=with_kl, iteration=iteration)
        self.arrays["gradient"] = np.ascontiguousarray(ev.gradient, dtype=np.float64)
        ev.finite = self.gradient_finite = bool(np.isfinite(self.arrays["gradient"]).all())
        ev.gradient = None
        return ev

    def gather(self, *names) -> dict:
        self._flush()
        return {name: self.arrays[name].copy() for name in names}

    def ensure(self, shapes: dict) -> None:
        """Hold zeros ``(rows, N)`` for each ``{name: rows}`` not held yet (an optimiser's work vectors)."""
        for name, rows in shapes.items():
            if name not in self.arrays:
                self.arrays[name] = np.zeros((int(rows), self.n_points))

    def set_curvature(self, exaggeration: float, fixed: bool, after=None) -> list:
        """The executor's curvature weights C at the held coordinates (``Executor.set_curvature``) and the diagonal
        of ``L(C)`` held as ``diag`` (``(1, N)``); each block's sum of it, in block order, or ``(sum, after's
        result)`` with ``after = (fn, args)`` run on every block last."""
        self._flush()
        self.executor.set_curvature(self.arrays["coords"], exaggeration, fixed=fixed)
        diagonal = np.ascontiguousarray(self.executor.curvature_diagonal(), dtype=np.float64)
        self.arrays["diag"] = diagonal[None, :]
        sums = [float(diagonal[r0:r1].sum()) for r0, r1 in self.bounds]
        return sums if after is None else list(zip(sums, self.map(after[0], *after[1])))

    def laplacian(self, source: str, target: str, before=None, after=None) -> list:
        """``target <- L(C) source`` (the curvature of the last ``set_curvature``), with ``before = (fn, args)``
        applied to every block first (e.g. forming ``source``) and ``after = (fn, args)`` to every block after;
        ``after``'s results in block order (``[]`` without it)."""
        if before is not None:
            self.map(before[0], *before[1])
        self._flush()
        self.arrays[target] = np.ascontiguousarray(self.executor.laplacian_matvec(self.arrays[source]),
                                                   dtype=np.float64)
        return [] if after is None else self.map(after[0], *after[1])

    def put(self, name: str, array: np.ndarray) -> None:
        self._flush()
        self.arrays[name] = np.array(array, dtype=np.float64, order="C")

    def recover(self, arrays: dict) -> None:
        """Hold ``arrays`` again (nothing is lost in this process: kept for the interface)."""
        self.arrays = {name: np.array(a, dtype=np.float64, order="C") for name, a in arrays.items()}
        self._shift = None

    def close(self) -> None:
        self.arrays = {}


class RowsExport:
    """What a checkpoint writes of a ``remote`` held state: the held arrays ``fields`` (``{name: state field}``)
    of ``shapes`` (``{field: (d, N)}``), written by their holders (``write``: ``held.write_rows``) in blocks
    ``bounds``; ``written(directory, digests, state)`` is called once the version is current (the optimiser's
    rewind point from then on)."""

    def __init__(self, held, fields: dict, shapes: dict, written):
        self.held, self.fields, self.shapes, self.written = held, fields, shapes, written

    @property
    def bounds(self) -> list:
        return self.held.bounds

    def write(self, directory: str) -> dict:
        return self.held.write_rows(directory, self.fields)

    def write_result(self, directory: str, group: str) -> dict:
        """The held arrays into ``directory/group/field`` and the coordinates into ``directory/embedding``
        (``write_result_block``), by their holders; ``{path: [digest per block]}`` (``group/field``,
        ``embedding``)."""
        fields = {name: f"{group}/{field}" for name, field in self.fields.items()}
        return self.held.write_result_rows(directory, fields)
