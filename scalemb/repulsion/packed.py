"""A charge grid sent as the boxes its points occupy (``PackedCharges``): what a Dask worker ships to the worker
that convolves, instead of the whole grid; and the potentials sent back the same way (``PackedShare``).

A point's charge goes to the nodes of its own box only (``interpolation.spread_visited``), so the charges of a set
of points are zero outside the boxes they occupy.  The grid of an evaluation has many more nodes than points
(t-SNE R^2, 153,764 points: 2.3 M nodes, 92 k boxes of 5 x 5 nodes), and one worker's points occupy a fraction
of its boxes (23 % of them for half of those points, measured): the packed charges are that fraction of the
grid's bytes plus a bit per box.  The sum is unchanged bit for bit: the charges are integers (fixed point), and
adding the packed values at their nodes is the same integer addition as adding the whole grid, whose other nodes
hold zeros.

The potentials a worker's rows are interpolated from are read at the nodes of those rows' boxes only (the same
box rule, ``interpolation._point_weights``): a share of the convolution restricted to the boxes the worker's
charges came from (``pack_share``) and set back into a grid of zeros (``unpack_share``) gives its rows the same
values bit for bit.  Without a time axis only (a time-axis share is laid out by time component).

The boxes are found with the spreading's own box rule (``interpolation._box`` of ``(y - lo) / h`` on each loop
axis: ``mark_boxes``), from the coordinates the charges were spread from, so they are exactly the boxes written.
"""
from typing import NamedTuple

import numpy as np
from numba import njit

from .convolution import ConvolutionShare
from .interpolation import _box


class PackedCharges(NamedTuple):
    """A worker's fixed-point charges at the boxes its points occupy: ``boxes`` (ascending flat indices, C order
    over the grid's loop axes) and ``values`` (int64, each box's nodes in turn, in ``box_offsets`` order)."""

    boxes: np.ndarray
    values: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.boxes.nbytes + self.values.nbytes)


@njit(cache=True, nogil=True, error_model="numpy")
def mark_boxes(Yv, axes, lo, inv_width, n_boxes, mark):
    """``mark[b] = True`` for the box ``b`` of every point ``Yv[:, j]`` (flat, C order over the loop axes)."""
    for j in range(Yv.shape[1]):
        flat = 0
        for k in range(axes.shape[0]):
            flat = flat * n_boxes[k] + _box((Yv[axes[k], j] - lo[k]) * inv_width[k], n_boxes[k])
        mark[flat] = True


@njit(cache=True, nogil=True, error_model="numpy")
def _box_base(b, n_boxes, counts, strides):
    """The flat grid index of box ``b``'s first node (``_point_weights``' ``base``)."""
    base = 0
    for k in range(n_boxes.shape[0] - 1, -1, -1):
        base += (b % n_boxes[k]) * counts[k] * strides[k]
        b //= n_boxes[k]
    return base


PACK, SET, ADD = 0, 1, 2


@njit(cache=True, nogil=True, error_model="numpy")
def _walk(grid, boxes, values, n_boxes, counts, strides, outer_offsets, mode):
    """Over the nodes of ``boxes`` in turn (``values[at]`` the ``at``-th of them): ``PACK`` copies the grid's
    values into ``values``, ``SET`` writes ``values`` into the grid, ``ADD`` adds them to it."""
    inner = counts[counts.shape[0] - 1]
    at = 0
    for i in range(boxes.shape[0]):
        base = _box_base(boxes[i], n_boxes, counts, strides)
        for o in range(outer_offsets.shape[0]):
            first = base + outer_offsets[o]
            for c in range(inner):
                if mode == PACK:
                    values[at] = grid[first + c]
                elif mode == SET:
                    grid[first + c] = values[at]
                else:
                    grid[first + c] += values[at]
                at += 1


def _layout(grid) -> tuple:
    axes, lo, inv_width, n_boxes, _, counts, strides, _, _, outer_offsets = grid._loop_args(None)[:10]
    return axes, lo, inv_width, n_boxes, counts, strides, outer_offsets


def pack_charges(grid, charges: np.ndarray, Yv: np.ndarray) -> PackedCharges:
    """The charges ``charges`` (``(n_nodes,)`` int64, spread from the points ``Yv``) at the boxes those points
    occupy."""
    axes, lo, inv_width, n_boxes, counts, strides, outer_offsets = _layout(grid)
    mark = np.zeros(int(np.prod(n_boxes)), dtype=np.bool_)
    mark_boxes(np.ascontiguousarray(Yv, dtype=np.float64), axes, lo, inv_width, n_boxes, mark)
    boxes = np.flatnonzero(mark).astype(np.int64)
    values = np.empty(boxes.size * int(np.prod(counts)), dtype=np.int64)
    _walk(charges, boxes, values, n_boxes, counts, strides, outer_offsets, PACK)
    return PackedCharges(boxes, values)


def add_packed(grid, total: np.ndarray, packed: PackedCharges) -> None:
    """``total += `` the whole grid of ``packed`` (zero outside its boxes), in place: exact (integers)."""
    _, _, _, n_boxes, counts, strides, outer_offsets = _layout(grid)
    _walk(total, packed.boxes, packed.values, n_boxes, counts, strides, outer_offsets, ADD)


def sum_charges(grid, *grids) -> np.ndarray:
    """The sum of charge grids, each whole (``(n_nodes,)`` int64) or packed (``PackedCharges``), as a new whole
    grid: the same integers whatever mix and order.  ``grid`` is read only for packed ones (None: all whole)."""
    dense = [g for g in grids if not isinstance(g, PackedCharges)]
    total = dense[0] + dense[1] if len(dense) > 1 else (dense[0].copy() if dense else
                                                         np.zeros(grid.n_nodes, dtype=np.int64))
    for g in dense[2:]:
        total += g
    for g in grids:
        if isinstance(g, PackedCharges):
            add_packed(grid, total, g)
    return total


class PackedShare(NamedTuple):
    """A ``ConvolutionShare`` (no time axis) at the nodes of ``boxes`` only: ``values`` ``(columns, nodes of the
    boxes)``, box by box as in ``PackedCharges``; ``z`` as the share's."""

    share: int
    shares: int
    boxes: np.ndarray
    values: np.ndarray
    z: float


def pack_share(grid, share: ConvolutionShare, boxes: np.ndarray) -> PackedShare:
    """``share``'s potentials at the nodes of ``boxes`` (a worker's ``PackedCharges.boxes``)."""
    if grid.time_in is not None:
        raise ValueError("a share of a grid with a time axis is laid out by time component: it is sent whole")
    _, _, _, n_boxes, counts, strides, outer_offsets = _layout(grid)
    values = np.empty((share.values.shape[0], boxes.size * int(np.prod(counts))), dtype=share.values.dtype)
    for c in range(values.shape[0]):
        _walk(share.values[c], boxes, values[c], n_boxes, counts, strides, outer_offsets, PACK)
    return PackedShare(share.share, share.shares, boxes, values, share.z)


def unpack_share(grid, packed: PackedShare) -> ConvolutionShare:
    """The ``ConvolutionShare`` of ``packed``: its values at its boxes' nodes, zeros elsewhere (never read by the
    rows whose boxes they are)."""
    _, _, _, n_boxes, counts, strides, outer_offsets = _layout(grid)
    values = np.zeros((packed.values.shape[0], grid.n_nodes), dtype=packed.values.dtype)
    for c in range(values.shape[0]):
        _walk(values[c], packed.boxes, packed.values[c], n_boxes, counts, strides, outer_offsets, SET)
    return ConvolutionShare(packed.share, packed.shares, values, packed.z)
