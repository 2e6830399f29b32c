"""Packed charge grids (``repulsion.packed``): the charges of a set of points at the boxes they occupy sum into
the same integers as the whole grids, for every grid kind the halo exchange spreads on."""
import numpy as np
import pytest

from scalemb.models import get_model
from scalemb.repulsion import FFTParams
from scalemb.repulsion.fft import spread_fixed
from scalemb.repulsion.grid import grid_for
from scalemb.repulsion.packed import PackedCharges, add_packed, pack_charges, sum_charges


def _layout(model, ds, dt, n, seed):
    rng = np.random.default_rng(seed)
    Y = rng.normal(size=(ds + dt, n)) * 20.0
    Y[:, : n // 10] *= 0.01  # a dense core and a sparse halo: many boxes empty, some crowded
    if dt:
        Y[ds:] *= 0.02
    return Y


@pytest.mark.parametrize("model,ds,dt", [("tsne", 1, 0), ("tsne", 2, 0), ("tsne", 3, 0), ("snest", 2, 1)])
def test_packed_charges_sum_to_the_whole_grids(model, ds, dt):
    n = 6000
    Y = _layout(model, ds, dt, n, ds + 3 * dt)
    grid = grid_for(get_model(model), ds, Y, FFTParams())
    cuts = [0, 1500, 4200, n]
    visits = [grid.visit(Y, a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    parts = [spread_fixed(grid, Y, a, b, visit=v) for (a, b), v in zip(zip(cuts[:-1], cuts[1:]), visits)]
    whole = parts[0] + parts[1] + parts[2]
    packed = [pack_charges(grid, p, v[2]) for p, v in zip(parts, visits)]
    assert np.array_equal(sum_charges(grid, parts[0], packed[1], packed[2]), whole)
    assert np.array_equal(sum_charges(grid, packed[2], parts[1], packed[0]), whole)  # any mix, any order
    assert np.array_equal(sum_charges(grid, *packed), whole)
    assert np.array_equal(sum_charges(grid, *parts), whole)
    for p, q in zip(parts, packed):  # each packed grid is its whole grid, and holds only its boxes' nodes
        alone = np.zeros_like(p)
        add_packed(grid, alone, q)
        assert np.array_equal(alone, p)
        per_box = int(np.prod(grid.counts))
        assert q.values.size == q.boxes.size * per_box and np.all(np.diff(q.boxes) > 0)
    if ds >= 2:  # most boxes are empty: the packed grids are a fraction of the whole
        assert sum(q.nbytes for q in packed) < 0.6 * sum(p.nbytes for p in parts)


def test_no_points_pack_to_nothing_and_the_sum_of_nothing_is_zero():
    Y = _layout("tsne", 2, 0, 500, 1)
    grid = grid_for(get_model("tsne"), 2, Y, FFTParams())
    empty = pack_charges(grid, np.zeros(grid.n_nodes, dtype=np.int64), np.zeros((2, 0)))
    assert isinstance(empty, PackedCharges) and empty.boxes.size == 0 and empty.values.size == 0
    assert np.array_equal(sum_charges(grid, empty), np.zeros(grid.n_nodes, dtype=np.int64))
    whole = spread_fixed(grid, Y, 0, 500)
    assert np.array_equal(sum_charges(grid, empty, whole), whole)


def test_points_on_the_grids_edges_are_in_its_edge_boxes():
    """The largest coordinate sits exactly on the grid's upper edge: the spreading clamps it into the last box,
    and so must the packing (else its charges would be dropped)."""
    Y = _layout("tsne", 2, 0, 800, 2)
    grid = grid_for(get_model("tsne"), 2, Y, FFTParams())
    edge = np.argmax(Y[0])
    visit = grid.visit(Y, 0, 800)
    charges = spread_fixed(grid, Y, 0, 800, visit=visit)
    packed = pack_charges(grid, charges, visit[2])
    alone = np.zeros_like(charges)
    add_packed(grid, alone, packed)
    assert np.array_equal(alone, charges) and Y[0, edge] == Y[0].max()
