"""The functions the Dask workers run on their held rows (``engine.held_dask``'s module docstring says when): each
takes the worker's box of held rows (``{partition: {name: rows}}``, the result of ``held_put`` pinned to that worker)
and changes or reads its partitions' rows in place, returning what is small (extents, partial sums, digests) or
the columns another worker's halo needs."""
from dataclasses import dataclass

import numpy as np

from ..repulsion.grid import band_counts, block_extent
from .blocks import add_reaction, laplacian_block
from .halo import assemble, curvature_view, finish_prepared, take_columns_parts
from .held import read_block, shift_rows
from .laplacian import row_sums


class HeldStateLost(RuntimeError):
    """A worker was asked for held rows it does not have (it restarted, or the run was released)."""


def _rows(box: dict, k: int) -> dict:
    try:
        return box[k]
    except KeyError:
        raise HeldStateLost(f"this worker holds no rows of partition {k}") from None


@dataclass(frozen=True)
class Partials:
    """A worker's per-partition results, each a tuple of float64 arrays of the same shapes (CG's ``r . u``, ``w .
    u``, ``|r|^2``; a slope's partials), as one ``(partitions, values)`` array on the wire.  Why: pickled, every
    small array carries ~110 bytes of header, so 23 partitions' three 2-vectors took 3.0 KB, packed 1.2 KB; at 7.7e5
    points that was half of the client's bytes per spectral iteration.  ``unpack`` gives the same values, so every
    sum over them is the same bits."""
    data: np.ndarray
    shapes: tuple

    def unpack(self) -> list:
        """The per-partition tuples (views of ``data``)."""
        bounds = np.cumsum([0] + [int(np.prod(shape)) for shape in self.shapes])
        return [tuple(row[a:b].reshape(shape) for a, b, shape in zip(bounds[:-1], bounds[1:], self.shapes))
                for row in self.data]


def packed(results: list):
    """``results`` as ``Partials`` if each is a non-empty tuple of float64 arrays with the first one's shapes,
    else as they are."""
    first = results[0] if results else None
    if not (isinstance(first, tuple) and first):
        return results
    shapes = tuple(a.shape if isinstance(a, np.ndarray) else None for a in first)
    for result in results:
        if not (isinstance(result, tuple) and len(result) == len(shapes) and all(
                isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == shape
                for a, shape in zip(result, shapes))):
            return results
    return Partials(np.array([np.concatenate([a.ravel() for a in result]) for result in results]), shapes)


def unpacked(results):
    """``results`` from a worker as the per-partition list (``Partials`` unpacked)."""
    return results.unpack() if isinstance(results, Partials) else results


def held_put(parts: list, ks: list, starts: list) -> dict:
    """The worker's box of held rows: per partition ``k`` of ``ks`` (whose first row is ``starts[i]``) its
    ``{name: (d, rows)}`` of ``parts``."""
    box = {}
    for k, r0, rows in zip(ks, starts, parts):
        box[k] = {name: np.array(a, dtype=np.float64, order="C") for name, a in rows.items()}
        box[k]["_r0"] = int(r0)
    return box


def held_load(directory: str, fields: dict, ks: list, bounds: list) -> dict:
    """The worker's box read from the store: per partition ``k`` of ``ks`` (rows ``bounds[i]``) its rows of the
    arrays ``directory/field`` (``read_block``)."""
    box = {}
    for k, (r0, r1) in zip(ks, bounds):
        box[k] = read_block(directory, fields, r0, r1)
        box[k]["_r0"] = int(r0)
    return box


def held_apply(box: dict, ks: list, shift, fn, args: tuple):
    """``[fn(rows_k, *args) for k in ks]`` on the held rows, after the pending ``shift`` (``packed``)."""
    out = []
    for k in ks:
        rows = _rows(box, k)
        shift_rows(rows, shift)
        out.append(fn(rows, *args))
    return packed(out)


def held_apply_formed(box: dict, ks: list, shift, pending: tuple, fn, args: tuple) -> tuple:
    """``held_gradient(*pending)`` (the deferred gradient's rows), then ``held_apply``: ``(flags, results)``."""
    flags = held_gradient(box, ks, *pending)
    return flags, held_apply(box, ks, shift, fn, args)


def held_band_counts(box: dict, ks: list, shift, space_dims: int, lo_t: float, h: float) -> np.ndarray:
    """The time-bin counts of the worker's partitions, summed here (integers: any order gives the same)."""
    total = None
    for k in ks:
        rows = _rows(box, k)
        shift_rows(rows, shift)
        counts = band_counts(rows["coords"][space_dims], lo_t, h)
        total = counts if total is None else total + counts
    return total


def held_own(box: dict, ks: list, shift) -> np.ndarray:
    """The worker's own rows of the held coordinates (its partitions in order), after the pending ``shift``."""
    parts = []
    for k in ks:
        rows = _rows(box, k)
        shift_rows(rows, shift)
        parts.append(rows["coords"])
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def held_cut(box: dict, ks: list, shift, name: str, before, needs: list) -> list:
    """On a worker v: the pending ``shift`` and ``before = (fn, args)`` (None: nothing) applied to its partitions'
    rows, then the columns of its own rows of the held array ``name`` that each other worker's halo needs (``needs``:
    positions in v's own rows, one array per destination, in the plan's order): the pieces, in that order."""
    parts = []
    for k in ks:
        rows = _rows(box, k)
        shift_rows(rows, shift)
        if before is not None:
            before[0](rows, *before[1])
        parts.append(rows[name])
    return [take_columns_parts(parts, positions) for positions in needs]


def held_pick(pieces: list, i: int) -> list:
    """Piece ``i`` of a worker's cut (``held_cut``), alone: what one destination fetches."""
    return [pieces[i]]


def _compact(box: dict, ks: list, view, name: str, received: list) -> np.ndarray:
    """The worker's compact columns of the held array ``name``: its own rows (its partitions in order: ``held_cut``
    ran here first) and its halo, the first piece of each of ``received`` (``halo.assemble``)."""
    return assemble(view, [_rows(box, k)[name] for k in ks], *[r[0] for r in received])


def held_curvature(box: dict, ks: list, view, name: str, cut, received: list, model, space_dims: int,
                   exaggeration: float, fixed: bool, pending=None, after=None) -> tuple:
    """``halo.curvature_view`` of the worker's partitions on its compact coordinates (``cut``: this worker's own
    ``held_cut``, run first): each partition's weights kept with its rows (``_weights``), the diagonal of ``L(C)``
    held as ``diag`` (``(1, rows)``).  ``pending``: a deferred gradient's ``held_gradient`` arguments, its rows
    formed first (the curvature reads only the coordinates); ``after = (fn, args)``: run on each partition's rows
    last.  ``(flags, results)``: ``held_gradient``'s flags (None without ``pending``) and per partition the
    diagonal's sum, or ``(sum, after's result)``."""
    flags = None if pending is None else held_gradient(box, ks, *pending)
    X = _compact(box, ks, view, name, received)
    out = []
    for k, b, weights in zip(ks, view.blocks, curvature_view(view, X, model, space_dims, exaggeration, fixed)):
        rows = _rows(box, k)
        diagonal = row_sums(b.indptr, weights)
        rows["_weights"], rows["diag"] = weights, diagonal[None, :]
        total = float(diagonal.sum())
        out.append(total if after is None else (total, after[0](rows, *after[1])))
    return flags, out


def held_laplacian(box: dict, ks: list, view, name: str, cut, received: list, target: str, after):
    """Each partition's rows of ``L(C) V`` for the held array ``V = name`` (``blocks.laplacian_block`` on its
    compact columns: own rows and halo) held as ``target``; then ``after = (fn, args)`` on its rows: the results
    (None without it; ``packed``)."""
    X = _compact(box, ks, view, name, received)
    out = []
    for k, b in zip(ks, view.blocks):
        rows = _rows(box, k)
        if "_weights" not in rows:
            raise HeldStateLost(f"this worker holds no curvature weights of partition {k}")
        rows[target] = laplacian_block(b, rows["_weights"], X)
        out.append(None if after is None else after[0](rows, *after[1]))
    return packed(out)


def held_ensure(rows: dict, shapes: dict) -> None:
    width = rows["coords"].shape[1]
    for name, d in shapes.items():
        if name not in rows:
            rows[name] = np.zeros((int(d), width))


def held_finish_view(view, own, grid, prepared, shares, box, ks) -> list:
    """``halo.finish_prepared``, keeping each partition's rows of attraction and repulsion here; returns the
    partitions' results without them (Z, ``sum p log w``, outlier reactions)."""
    results = finish_prepared(view, own, grid, prepared, shares)
    for k, res in zip(ks, results):
        rows = _rows(box, k)
        rows["_attraction"], rows["_repulsion"] = res.attraction, res.repulsion
        res.attraction = res.repulsion = None
    return results


def held_gradient(box: dict, ks: list, bounds: list, z: float, exaggeration: float, objective, n_points: int,
                  outliers, reaction) -> list:
    """Each partition's rows of the gradient from its kept rows (``reduce_blocks``' arithmetic, by rows):
    whether they are all finite, per partition."""
    flags = []
    for k, (r0, r1) in zip(ks, bounds):
        rows = _rows(box, k)
        A, R = rows.pop("_attraction").T, rows.pop("_repulsion") + 0.0  # + 0.0: reduce_blocks' 0 + R (no -0.0)
        add_reaction(R, r0, r1, outliers, reaction)
        rows["gradient"] = np.ascontiguousarray(objective.gradient(A, R, z, exaggeration, n_points))
        flags.append(bool(np.isfinite(rows["gradient"]).all()))
    return flags


def held_put_rows(box: dict, ks: list, name: str, arrays: list) -> int:
    for k, a in zip(ks, arrays):
        _rows(box, k)[name] = np.ascontiguousarray(a, dtype=np.float64)
    return len(ks)


def rows_extent(rows: dict) -> tuple:
    c = rows["coords"]
    return block_extent(c, 0, c.shape[1])


def rows_copy(rows: dict, names: tuple) -> list:
    return [rows[name].copy() for name in names]
