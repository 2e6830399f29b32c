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


@pytest.mark.parametrize("ds", [1, 2, 3])
def test_a_packed_share_gives_a_workers_rows_the_same_repulsion(ds):
    """The convolution's potentials restricted to one worker's boxes and set back into zeros: its rows'
    interpolated repulsion and Z are the whole potentials' bit for bit (the rows read their boxes' nodes only)."""
    from scalemb.repulsion.convolution import convolution_shares, convolve_share, join_convolution
    from scalemb.repulsion.fft import fixed_charges, interpolate_grid
    from scalemb.repulsion.packed import pack_share, unpack_share

    n = 5000
    Y = _layout("tsne", ds, 0, n, 7 + ds)
    grid = grid_for(get_model("tsne"), ds, Y, FFTParams())
    charges = fixed_charges(grid, spread_fixed(grid, Y, 0, n))
    shares = convolution_shares(grid)
    whole = [convolve_share(grid, charges, s, shares) for s in range(shares)]
    rows = (1200, 3100)  # one worker's rows
    visit = grid.visit(Y[:, rows[0]:rows[1]], 0, rows[1] - rows[0])
    own = np.ascontiguousarray(Y[:, rows[0]:rows[1]])
    boxes = pack_charges(grid, spread_fixed(grid, own, 0, own.shape[1], visit=visit), visit[2]).boxes
    packed = [pack_share(grid, s, boxes) for s in whole]
    assert sum(p.values.nbytes for p in packed) < sum(s.values.nbytes for s in whole)
    back = [unpack_share(grid, p) for p in packed]
    assert [(b.share, b.shares, b.z) for b in back] == [(s.share, s.shares, s.z) for s in whole]
    expected = interpolate_grid(grid, own, join_convolution(grid, whole).potentials, 1, visit)
    got = interpolate_grid(grid, own, join_convolution(grid, back).potentials, 1, visit)
    for a, b in zip(expected, got):
        assert np.array_equal(a, b)


def test_a_share_with_a_time_axis_is_not_packed():
    from scalemb.repulsion.convolution import convolve_share
    from scalemb.repulsion.fft import fixed_charges
    from scalemb.repulsion.packed import pack_share

    Y = _layout("snest", 2, 1, 2000, 4)
    grid = grid_for(get_model("snest"), 2, Y, FFTParams())
    assert grid.time_in is not None
    share = convolve_share(grid, fixed_charges(grid, spread_fixed(grid, Y, 0, 2000)), 0, 1)
    with pytest.raises(ValueError, match="time axis"):
        pack_share(grid, share, np.arange(3, dtype=np.int64))
