"""FFT-accelerated interpolation repulsion against the exact all-pairs kernel (scalemb.repulsion)."""
import logging
import math
import time
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

from scalemb.affinity import Affinity, coauthorship_affinity
from scalemb.affinity.affinity import row_partition
from scalemb.cli.main import main
from scalemb.embedding import EmbeddingResult, initial_coords
from scalemb.engine import LocalExecutor
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.io.edgelist import read_edge_list
from scalemb.models import get_model
from scalemb.optim import make_optimizer
from scalemb.repulsion import (AUTO_FFT_MIN_POINTS, DEFAULT_INTERPOLATION, FFTParams, block_extent, convolve,
                               fft_repulsion, interpolate, make_grid, resolve_repulsion, spread)
from scalemb.repulsion.fft import fixed_charges, spread_fixed

CASES = [("tsne", 1, 0), ("tsne", 2, 0), ("tsne", 3, 0), ("sne", 1, 0), ("sne", 2, 0), ("sne", 3, 0),
         ("snest", 1, 1), ("snest", 2, 1), ("snest", 3, 1)]
TOL = 1e-3


def _exact(model, Y, ds):
    R = np.zeros_like(Y)
    z = get_model(model).repulsion(Y, ds, 0, Y.shape[1], R)
    return R, z


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _random_affinity(n, seed):
    A = sp.random(n, n, density=10 / n, random_state=seed)
    A = A + A.T
    A.setdiag(0)
    return Affinity(A, np.arange(n))


def _clustered_layout(n, ds, dt, scale, rng):
    """Gaussian clusters of unit spread at random centres (scale: the spread of the centres); time ~ N(0, 0.5)."""
    centres = rng.normal(size=(20, ds)) * scale
    S = centres[rng.integers(0, 20, n)] + rng.normal(size=(n, ds))
    T = rng.normal(size=(n, dt)) * 0.5
    return np.ascontiguousarray(np.concatenate([S, T], axis=1).T)


@pytest.fixture(scope="module")
def coauthor_affinity(tmp_path_factory):
    path = write_coauthor_edge_list(tmp_path_factory.mktemp("g") / "g.txt", 1500, seed=3, edges_per_author=1.5)
    return coauthorship_affinity(read_edge_list(path))


class _Converged(dict):
    """``converged[model, ds, dt]``: computed on first use and kept for the module (a fast test needs one case,
    the slow ones every case)."""

    def __init__(self, affinity):
        super().__init__()
        self.affinity = affinity

    def __missing__(self, case):
        model, ds, dt = case
        with LocalExecutor(self.affinity, get_model(model), ds, dt, repulsion="exact") as ex:
            coords = initial_coords(self.affinity.n_points, ds, dt, np.random.default_rng(0))
            self[case] = make_optimizer("auto", model).optimize(ex, coords, 300).coords
        return self[case]


@pytest.fixture(scope="module")
def converged(coauthor_affinity):
    """Layouts of a sparse co-authorship graph with many components (like GrQc), 300 iterations of the
    default optimiser with the exact kernel, for every supported model and dimension (each case computed when
    a test first asks for it)."""
    return _Converged(coauthor_affinity)


@pytest.mark.slow
@pytest.mark.parametrize("model,ds,dt", CASES)
def test_matches_exact_on_random_layouts(model, ds, dt):
    rng = np.random.default_rng(ds + 10 * dt)
    affinity = _random_affinity(1200, ds)
    scale = {"tsne": 15.0, "sne": 3.0, "snest": 15.0}[model]
    Y = _clustered_layout(1200, ds, dt, scale, rng)
    Re, ze = _exact(model, Y, ds)
    Rf, zf = fft_repulsion(model, Y, ds)
    assert abs(zf / ze - 1) < TOL
    assert _rel(Rf, Re) < TOL
    exact = LocalExecutor(affinity, get_model(model), ds, dt, repulsion="exact").evaluate(Y)
    fast = LocalExecutor(affinity, get_model(model), ds, dt, repulsion="fft").evaluate(Y)
    assert abs(fast.z / exact.z - 1) < TOL
    assert abs(fast.kl - exact.kl) < TOL
    assert _rel(fast.gradient, exact.gradient) < TOL


@pytest.mark.slow
@pytest.mark.parametrize("model,ds,dt", CASES)
def test_matches_exact_on_converged_layouts(model, ds, dt, converged, coauthor_affinity):
    Y = converged[model, ds, dt]
    exact = LocalExecutor(coauthor_affinity, get_model(model), ds, dt, repulsion="exact").evaluate(Y)
    fast = LocalExecutor(coauthor_affinity, get_model(model), ds, dt, repulsion="fft").evaluate(Y)
    assert abs(fast.z / exact.z - 1) < TOL
    assert _rel(fast.gradient, exact.gradient) < TOL
    if dt:  # the time force separately: it is much smaller than the space force
        assert _rel(fast.gradient[ds:], exact.gradient[ds:]) < TOL


@pytest.mark.parametrize("model,ds,dt", [("tsne", 2, 0), ("sne", 3, 0), ("snest", 2, 1)])
def test_any_row_partition_gives_the_one_block_result(model, ds, dt):
    n = 501
    Y = _clustered_layout(n, ds, dt, 5.0, np.random.default_rng(1))
    R1, z1 = fft_repulsion(model, Y, ds)
    inside = np.arange(n)
    if dt:  # a time band's outlier rows sum their reactions over the blocks: equal up to the order of the sums
        from scalemb.repulsion import grid_for

        outliers = grid_for(model, ds, Y).outliers
        assert outliers is not None and outliers.size > 0
        inside = np.setdiff1d(inside, outliers)
    for bounds in (row_partition(n, 2), row_partition(n, 7), [(0, 1), (1, 300), (300, n)]):
        R, z = fft_repulsion(model, Y, ds, bounds=bounds)
        assert z == pytest.approx(z1, rel=1e-12)
        # the charges sum exactly (fixed point), the rows are read alike
        np.testing.assert_array_equal(R[:, inside], R1[:, inside])
        np.testing.assert_allclose(R, R1, rtol=1e-12, atol=1e-12 * np.abs(R1).max())


@pytest.mark.parametrize("model,ds,dt", [("tsne", 2, 0), ("snest", 2, 1)])
def test_charges_are_bit_identical_for_any_split_and_thread_count(model, ds, dt, monkeypatch):
    """Fixed-point spreading: partial grids of any row split, summed in any order, and ``spread`` on any number
    of threads give the same charges bit for bit (what lets Dask workers each spread their own rows)."""
    from scalemb.repulsion import grid as grid_module, threads as threads_module

    n = 20_000
    Y = _clustered_layout(n, ds, dt, 30.0, np.random.default_rng(3))
    grid = make_grid(model, ds, Y.min(axis=1), Y.max(axis=1), n_points=n)
    one = spread(grid, Y, 0, n, workers=1)
    monkeypatch.setattr(grid_module, "SORT_ROWS_PER_THREAD", 4096)  # the sort on threads too
    for threads in (2, 3):  # spread_fixed's shares, Grid.visit's sort (threads_for)
        monkeypatch.setattr(threads_module, "thread_count", lambda workers, t=threads: t)
        np.testing.assert_array_equal(spread(grid, Y, 0, n, workers=threads), one)
    parts = [spread_fixed(grid, Y, r0, r1) for r0, r1 in [(0, 7), (7, 9000), (9000, 9000), (9000, n)]]
    np.testing.assert_array_equal(fixed_charges(grid, parts[3] + parts[0] + parts[2] + parts[1]), one)
    if not dt:  # unit charges: the weights of a point sum to 1
        assert one.sum() == pytest.approx(n, rel=1e-9)


def test_transform_threads_follow_the_grid_size_and_change_no_bit():
    """scipy's transforms get one thread per ``TRANSFORM_NODES_PER_THREAD`` grid nodes (``threads_for``), at most
    ``workers`` (scipy's -1: every usable CPU), at least one; the convolution is the same bit for bit on any count."""
    from scalemb.repulsion import convolution
    from scalemb.repulsion.threads import threads_for

    per = convolution.TRANSFORM_NODES_PER_THREAD
    assert threads_for(2, per - 1, per) == 1
    assert threads_for(2, 2 * per, per) == 2
    assert threads_for(3, 10 * per, per) == 3
    assert threads_for(1, 10 * per, per) == 1
    assert 1 <= threads_for(-1, 10 * per, per) <= 10
    grid = make_grid("tsne", 2, [0.0, 0.0], [80.0, 60.0], n_points=16_000)
    assert grid.n_nodes >= 2 * per
    charges = np.random.default_rng(4).random(grid.n_nodes)
    one = convolve(grid, charges, workers=1)
    two = convolve(grid, charges, workers=2)
    np.testing.assert_array_equal(two.potentials, one.potentials)
    assert two.z == one.z


def test_map_reduce_pieces_need_only_rows_grid_and_potentials():
    """The worker-side functions on separate row blocks, with an empty block, reproduce the driver."""
    Y = _clustered_layout(300, 2, 1, 4.0, np.random.default_rng(2))
    bounds = [(0, 0), (0, 120), (120, 300)]
    extents = [block_extent(Y, r0, r1) for r0, r1 in bounds]
    grid = make_grid("snest", 2, np.min([e[0] for e in extents], 0), np.max([e[1] for e in extents], 0),
                     n_points=300)
    potentials, grid_z = convolve(grid, fixed_charges(grid, sum(spread_fixed(grid, Y, r0, r1) for r0, r1 in bounds)))
    parts = [interpolate(grid, Y, potentials, r0, r1) for r0, r1 in bounds]
    R, z = fft_repulsion("snest", Y, 2, FFTParams(time_band=False))  # the grid over the whole extent, as here
    np.testing.assert_allclose(np.concatenate([p[0] for p in parts], axis=1), R, rtol=1e-10,
                               atol=1e-10 * np.abs(R).max())
    assert grid_z + sum(p[1] for p in parts) == pytest.approx(z, rel=1e-12)


@pytest.mark.parametrize("model,ds,dt", [("tsne", 1, 0), ("tsne", 2, 0), ("sne", 3, 0), ("snest", 2, 1)])
def test_convolution_is_the_node_to_node_sum(model, ds, dt):
    """``convolve`` (FFTs, cropped inverse transforms, single precision on 2-D/3-D grids) against the direct
    sum over node pairs ``phi_c(x_m) = sum_n K_c(x_m - x_n) C_n``; a time axis (first in memory) holds
    components that the space convolution treats alike.  Z's grid part (t-SNE, by Parseval) against
    ``sum_mn C_m K(x_m - x_n) C_n``."""
    rng = np.random.default_rng(ds)
    lo, hi = np.zeros(ds + dt), np.concatenate([rng.uniform(1.5, 2.5, ds), np.ones(dt)])
    grid = make_grid(model, ds, lo, hi, FFTParams(points=3, box_width=0.7))  # up to 12 nodes per dimension
    charges = rng.normal(size=grid.n_nodes)
    potentials, grid_z = convolve(grid, charges)
    assert potentials.shape == (len(grid.plan.potentials), grid.n_nodes)
    axes = [grid.lo[k] + grid.box_width[k] * (np.arange(grid.space_nodes[k]) + 0.5) / grid.points[k]
            for k in range(ds)]
    x = np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=1)
    deltas = list(np.moveaxis(x[:, None, :] - x[None, :, :], 2, 0))
    c = charges.reshape(-1, len(x)).T  # (space nodes, time components or 1)
    for column, k in enumerate(grid.plan.potentials):
        direct = (grid.plan.kernels[k](deltas, grid.sigma) @ c).T.ravel()
        scale = np.abs(direct).max()
        np.testing.assert_allclose(potentials[column], direct, atol=(1e-5 if ds > 1 else 1e-12) * scale)
    if grid.plan.z_kernel is None:
        assert grid_z == 0.0
    else:
        kernel, unit = grid.plan.kernels[grid.plan.z_kernel](deltas, grid.sigma), charges
        scale = np.abs(unit) @ kernel @ np.abs(unit)
        assert grid_z == pytest.approx(unit @ kernel @ unit, abs=(1e-6 if ds > 1 else 1e-13) * scale)


def _node_weights(grid, Y, time_map):
    """Dense ``(N, n_nodes)`` matrix of every point's weight on every node, built with NumPy from the Lagrange
    formula (time axis: the Chebyshev weights times ``time_map``), nodes in the grid's memory order (``axes``),
    as the reference for the numba loops."""
    factors = []
    node_positions = grid.node_positions()
    for k in grid.axes:
        x = node_positions[k]
        u = (Y[k] - grid.lo[k]) / grid.box_width[k]
        box = np.clip(np.floor(u), 0, grid.n_boxes[k] - 1).astype(int)
        u = u - box
        lagrange = np.stack([np.prod([(u - x[c]) / (x[a] - x[c]) for c in range(len(x)) if c != a], axis=0)
                             for a in range(len(x))], axis=1)
        if k >= grid.space_dims:
            lagrange = lagrange @ time_map
        full = np.zeros((Y.shape[1], int(grid.n_boxes[k]) * grid.counts[k]))
        cols = box[:, None] * grid.counts[k] + np.arange(grid.counts[k])
        np.put_along_axis(full, cols, lagrange, axis=1)
        factors.append(full)
    W = factors[0]
    for f in factors[1:]:
        W = (W[:, :, None] * f[:, None, :]).reshape(Y.shape[1], -1)
    return W


@pytest.mark.parametrize("by_box", [False, True])
@pytest.mark.parametrize("model,ds,dt", CASES)
def test_spreading_and_interpolation_loops_match_dense_weights(model, ds, dt, by_box, monkeypatch):
    """``spread`` is ``W^T 1`` and ``interpolate`` reads each output's potential column through its time map,
    ``W_map potentials[column]`` (``W`` the dense node weights); the loop holds outputs in scalars up to
    ``MAX_OUTPUTS``.  The rows come in an order unrelated to their boxes; ``by_box``: the loops visit them box
    by box (``Grid.visit_order``, used for large grids)."""
    from scalemb.repulsion import grid as grid_module
    from scalemb.repulsion.interpolation import MAX_OUTPUTS

    monkeypatch.setattr(grid_module, "SORT_ABOVE_BYTES", -1 if by_box else 2 ** 62)
    rng = np.random.default_rng(ds + 3 * dt)
    Y = _clustered_layout(40, ds, dt, 2.0, rng)
    grid = make_grid(model, ds, Y.min(axis=1), Y.max(axis=1), FFTParams(points=3, box_width=1.3))
    assert len(grid.plan.outputs) <= MAX_OUTPUTS
    dense = _node_weights(grid, Y, grid.time_in)
    # fixed point: each weight rounded to 1 / charge_scale, and every weight well inside the int64 headroom
    np.testing.assert_allclose(spread(grid, Y, 0, Y.shape[1]), dense.sum(axis=0), rtol=0,
                               atol=0.5 * Y.shape[1] / grid.charge_scale)
    assert np.abs(dense).sum(axis=1).max() < 2.0 ** grid_module.CHARGE_HEADROOM_BITS
    potentials = rng.normal(size=(len(grid.plan.potentials), grid.n_nodes))
    maps = [None] if grid.time_out is None else list(grid.time_out)
    phi = np.stack([_node_weights(grid, Y, maps[time_map]) @ potentials[column]
                    for column, time_map in grid.plan.outputs], axis=1)
    R, z = interpolate(grid, Y, potentials, 0, Y.shape[1])
    interpolated = np.sum(phi[:, grid.plan.z_output]) if grid.plan.z_output >= 0 else 0.0  # else: on the grid
    assert z == pytest.approx(interpolated - Y.shape[1] * grid.self_weight, rel=1e-12)
    for k, output in enumerate(grid.plan.force):
        np.testing.assert_allclose(R[k], phi[:, output], rtol=1e-10, atol=1e-10 * np.abs(phi[:, output]).max())
    R5, z5 = interpolate(grid, Y, potentials, 5, 33)
    np.testing.assert_allclose(R5, R[:, 5:33], rtol=1e-12, atol=1e-14)
    order = grid.visit_order(Y, 5, 33)
    assert sorted(order) == list(range(5, 33))
    assert (order != np.arange(5, 33)).any() == by_box  # clustered rows in random order: sorting moves some


def test_time_kernel_factors_have_low_rank():
    """SNEST's time kernels (``exp(Δt²)`` and the time force's ``2 Δt exp(Δt²)``) between the Chebyshev nodes
    are held by r < m components, one basis for both, that reproduce each."""
    from scalemb.repulsion.grid import TIME_RANK_TOL, time_factors, time_matrix

    grid = make_grid("snest", 2, [0.0, 0.0, -1.8], [20.0, 20.0, 1.8])
    m, r = grid.points[-1], grid.counts[-1]
    assert grid.nodes[0] == r and r < m / 2 + 1
    into, out_of = time_factors(grid.plan.time_kernels, m, 3.6)
    assert into.shape == (m, r) and out_of.shape == (2, m, r)
    for kernel, out in zip(grid.plan.time_kernels, out_of):
        T = time_matrix(kernel, m, 3.6)
        assert np.abs(out @ into.T - T).max() <= 10 * TIME_RANK_TOL * np.abs(T).max()


def _banded_layout(n, rng, outliers=30):
    """SNEST layouts at scale (benchmarks/results/snest_fft.md): clusters in space; in time a narrow bulk (std 0.05)
    and a few points spread over +-1.5, which stretch the time axis of a grid over the whole extent."""
    Y = _clustered_layout(n, 2, 1, 5.0, rng)
    Y[2] *= 0.1
    Y[2, rng.choice(n, outliers, replace=False)] = rng.uniform(-1.5, 1.5, outliers)
    return Y


@pytest.mark.parametrize("max_nodes", [None, 20_000])
def test_time_band_matches_exact_with_fewer_time_components(max_nodes):
    """``grid_for`` spans the time band that is cheapest to convolve and sums the outliers outside it directly:
    fewer time components than the whole extent's grid, and Z, the space and the time forces (of the outliers,
    whose pairs with the band arrive as reactions, too) as accurate as the exact kernel allows, also on a capped
    grid (near field of the band's points only)."""
    from scalemb.repulsion import grid_for

    n = 4000
    Y = _banded_layout(n, np.random.default_rng(5))
    params = FFTParams(max_nodes=max_nodes)
    band, whole = grid_for("snest", 2, Y, params), grid_for("snest", 2, Y, replace(params, time_band=False))
    assert band.capped == whole.capped == (max_nodes is not None)
    assert band.time_band is not None and whole.time_band is None and whole.n_outliers == 0
    assert 0 < band.n_outliers < n // 20 and band.counts[-1] < whole.counts[-1]
    t = Y[2]
    assert np.array_equal(band.outliers, np.flatnonzero((t < band.time_band[0]) | (t > band.time_band[1])))
    Re, ze = _exact("snest", Y, 2)
    errors = {}
    for name, p in (("band", params), ("whole", replace(params, time_band=False))):
        R, z = fft_repulsion("snest", Y, 2, p, bounds=row_partition(n, 3))
        errors[name] = (abs(z / ze - 1), _rel(R[:2], Re[:2]), _rel(R[2], Re[2]),
                        _rel(R[:, band.outliers], Re[:, band.outliers]))
    assert max(errors["band"]) < TOL
    assert errors["band"][2] <= errors["whole"][2]  # the time force: no cancellation over a wide time box


def test_time_band_row_blocks_and_reactions():
    """Outlier rows get their pairs with the band as reactions summed over the row blocks: every partition gives
    the one-block result (rows in the band bit for bit, outlier rows up to the order of the partial sums), and
    the pieces need only the rows, the grid (with the outliers' coordinates) and the potentials."""
    from scalemb.repulsion import grid_for

    n = 1501
    Y = _banded_layout(n, np.random.default_rng(6))
    grid = grid_for("snest", 2, Y)
    assert grid.n_outliers > 0
    R1, z1 = fft_repulsion("snest", Y, 2)
    inside = np.setdiff1d(np.arange(n), grid.outliers)
    for bounds in (row_partition(n, 2), [(0, 1), (1, 700), (700, 700), (700, n)]):
        R, z = fft_repulsion("snest", Y, 2, bounds=bounds)
        assert z == pytest.approx(z1, rel=1e-12)
        np.testing.assert_array_equal(R[:, inside], R1[:, inside])
        np.testing.assert_allclose(R[:, grid.outliers], R1[:, grid.outliers], rtol=1e-12, atol=1e-12)
    potentials = convolve(grid, spread(grid, Y, 0, n)).potentials
    with pytest.raises(ValueError, match="reaction"):
        interpolate(grid, Y, potentials, 0, n)


def test_time_band_gradient_matches_finite_differences(coauthor_affinity):
    """The banded FFT gradient (space and time, of points in the band and of outliers) against central
    differences of the exact KL."""
    from scalemb.repulsion import grid_for

    n = coauthor_affinity.n_points
    rng = np.random.default_rng(8)
    Y = _banded_layout(n, rng)
    grid = grid_for("snest", 2, Y)
    assert grid.n_outliers > 0
    model = get_model("snest")
    with LocalExecutor(coauthor_affinity, model, 2, 1, n_blocks=3, repulsion="fft") as ex:
        gradient = ex.evaluate(Y).gradient
    entries = [(k, int(i)) for i in grid.outliers[:3] for k in (0, 2)]
    entries += [(k, int(i)) for i in rng.choice(np.setdiff1d(np.arange(n), grid.outliers), 3) for k in (1, 2)]
    h = 1e-5
    with LocalExecutor(coauthor_affinity, model, 2, 1, repulsion="exact") as exact:
        for k, i in entries:
            plus, minus = Y.copy(), Y.copy()
            plus[k, i] += h
            minus[k, i] -= h
            fd = (exact.evaluate(plus).kl - exact.evaluate(minus).kl) / (2 * h)
            assert abs(fd - gradient[k, i]) < 1e-3 * abs(fd) + 1e-7, (k, i, fd, gradient[k, i])


def test_executor_blocks_and_threads_agree(coauthor_affinity, converged):
    Y = converged["tsne", 2, 0]
    model = get_model("tsne")
    one = LocalExecutor(coauthor_affinity, model, 2, 0, n_blocks=1, repulsion="fft").evaluate(Y)
    with LocalExecutor(coauthor_affinity, model, 2, 0, n_threads=2, n_blocks=5, repulsion="fft") as ex:
        many = ex.evaluate(Y)
    assert many.kl == pytest.approx(one.kl, rel=1e-12)
    np.testing.assert_allclose(many.gradient, one.gradient, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("model,ds,dt", [("tsne", 2, 0), ("sne", 2, 0), ("snest", 2, 1)])
def test_flying_apart_layout_is_bounded_and_accurate(model, ds, dt, caplog):
    """Components far apart (here 1e6 units) would need ~1e13 grid nodes: the grid is capped, memory and time
    stay bounded, the kernel split keeps the accuracy, and the executor warns."""
    rng = np.random.default_rng(4)
    n = 2000
    Y = _clustered_layout(n, ds, dt, 5.0, rng)
    Y[:ds, : n // 10] += 1e6  # one tenth of the points, a far-away component
    Y[:ds, n // 10: n // 5] -= 3e3  # and another one
    grid = make_grid(model, ds, Y.min(1), Y.max(1), FFTParams(), n)
    assert grid.capped and grid.n_nodes <= FFTParams().node_cap(n, grid.counts[-1] if dt else None)
    assert math.prod(grid.padded()) <= 2.5 ** ds * grid.n_nodes
    start = time.perf_counter()
    R, z = fft_repulsion(model, Y, ds)
    assert time.perf_counter() - start < 5.0
    Re, ze = _exact(model, Y, ds)
    assert abs(z / ze - 1) < TOL and _rel(R, Re) < TOL
    affinity = _random_affinity(n, 0)
    with caplog.at_level(logging.WARNING, logger="scalemb"):
        ev = LocalExecutor(affinity, get_model(model), ds, dt, repulsion="fft").evaluate(Y)
    assert np.isfinite(ev.kl) and "capped" in caplog.text


def test_wide_layout_with_small_cap_keeps_accuracy():
    """A many-component spread (GrQc-like t-SNE layouts) with a deliberately small grid: the near field
    carries what the coarse grid cannot resolve."""
    rng = np.random.default_rng(5)
    Y = _clustered_layout(2000, 2, 0, 60.0, rng)
    params = FFTParams(max_nodes=2 ** 12)
    assert make_grid("tsne", 2, Y.min(1), Y.max(1), params).capped
    Re, ze = _exact("tsne", Y, 2)
    Rf, zf = fft_repulsion("tsne", Y, 2, params)
    assert abs(zf / ze - 1) < TOL and _rel(Rf, Re) < TOL


def test_non_finite_coordinates_give_non_finite_kl(school_affinity):
    Y = np.random.default_rng(0).normal(size=(2, school_affinity.n_points))
    Y[0, 3] = np.inf
    ev = LocalExecutor(school_affinity, get_model("tsne"), 2, 0, repulsion="fft").evaluate(Y)
    assert not np.isfinite(ev.kl)


@pytest.mark.parametrize("kwargs", [{"points": 1}, {"points": 2.5}, {"box_width": 0.0}, {"box_width": -1.0},
                                    {"box_width": float("nan")}, {"time_points": 1}, {"max_nodes": 0},
                                    {"min_boxes": 0}])
def test_bad_parameters_raise(kwargs):
    with pytest.raises(ValueError):
        FFTParams(**kwargs)


def test_bad_inputs_raise(school_affinity):
    with pytest.raises(ValueError, match="max_nodes"):
        make_grid("tsne", 2, [0.0, 0.0], [1.0, 1.0], FFTParams(max_nodes=8))
    with pytest.raises(ValueError, match="space dimensions"):
        make_grid("tsne", 4, np.zeros(4), np.ones(4))
    with pytest.raises(ValueError, match="time dimension"):
        make_grid("snest", 2, np.zeros(4), np.ones(4))
    with pytest.raises(ValueError, match="finite"):
        make_grid("tsne", 2, [0.0, 0.0], [np.nan, 1.0])
    with pytest.raises(ValueError, match="unknown repulsion"):
        LocalExecutor(school_affinity, get_model("tsne"), 2, 0, repulsion="bh")
    with pytest.raises(ValueError, match="space dimensions"):
        LocalExecutor(school_affinity, get_model("sne"), 4, 0, repulsion="fft")
    grid = make_grid("tsne", 2, [0.0, 0.0], [3.0, 3.0])
    with pytest.raises(ValueError, match="charges"):
        convolve(grid, np.zeros((grid.n_nodes, 2)))


def test_auto_picks_by_size():
    small, large = 1000, AUTO_FFT_MIN_POINTS[2]
    assert resolve_repulsion("auto", "tsne", 2, 0, small) == "exact"
    assert resolve_repulsion("auto", "tsne", 2, 0, large) == "fft"
    assert resolve_repulsion("auto", "tsne", 1, 0, large) == "fft"
    assert resolve_repulsion("auto", "snest", 2, 1, 10 ** 7) == ("exact" if AUTO_FFT_MIN_POINTS[3] is None
                                                                  else "fft")
    assert resolve_repulsion("auto", "sne", 4, 0, large) == "exact"  # unsupported: exact
    assert resolve_repulsion("exact", "tsne", 2, 0, large) == "exact"


def test_cli_repulsion_fft(tmp_path, capsys):
    out = tmp_path / "school.zarr"
    assert main(["embed", "school", "--model", "tsne", "--repulsion", "fft", "--iterations", "200",
                 "--out", str(out), "--quiet"]) == 0
    res = EmbeddingResult.load(out)
    assert res.repulsion["method"] == "fft" and res.repulsion["points"] == DEFAULT_INTERPOLATION["tsne", 2][0]
    assert "accuracy" not in res.repulsion  # 'auto' below t-SNE's threshold: the default level, as before
    assert res.kl < 0.75
    with pytest.raises(SystemExit) as refused:  # the table's bound, checked where the flag is parsed
        main(["embed", "school", "--repulsion", "fft", "--fft-points", "1", "--out", str(tmp_path / "x.zarr"),
              "--quiet"])
    assert refused.value.code == 2 and "--fft-points: must be an integer >= 2" in capsys.readouterr().err
    fast = tmp_path / "fast.zarr"
    assert main(["embed", "school", "--model", "tsne", "--repulsion", "fft", "--fft-accuracy", "fast",
                 "--iterations", "20", "--out", str(fast), "--quiet"]) == 0
    stored = EmbeddingResult.load(fast).repulsion
    assert stored["accuracy"] == "fast" and stored["box_width"] == pytest.approx(0.9)


def test_accuracy_setting_orders_the_error(coauthor_affinity):
    """``FFTParams.accuracy``: 'fast' widens the default boxes, 'high' adds a point in narrower boxes; on a converged
    t-SNE layout the gradient error orders fast > default > high, and explicit points / widths are kept.  The
    layout is the one the presets were measured on at 7.7e4 points: openTSNE's schedule (compact), on an uncapped
    grid (a capped grid sums the near pairs exactly: its error says little of the interpolation's)."""
    from scalemb.models.base import OPENTSNE_SCHEDULE
    from scalemb.repulsion.spec import FFT_ACCURACY

    assert FFTParams(accuracy="fast").resolved("tsne", 2) == FFTParams(points=5, box_width=0.9, accuracy="fast")
    high = FFTParams(accuracy="high").resolved("tsne", 2)
    assert (high.points, high.box_width) == (6, pytest.approx(0.6))
    assert FFTParams(points=3, box_width=2.0, accuracy="high").resolved("tsne", 2).points == 3
    assert set(FFT_ACCURACY) == {"fast", "default", "high"}
    with pytest.raises(ValueError, match="fft accuracy"):
        FFTParams(accuracy="medium")
    assert "accuracy" not in FFTParams(accuracy="default").as_dict()
    assert FFTParams(accuracy="high").as_dict()["accuracy"] == "high" and FFTParams().as_dict()["accuracy"] == "auto"
    with LocalExecutor(coauthor_affinity, get_model("tsne"), 2, 0, repulsion="exact") as ex:
        start = initial_coords(coauthor_affinity.n_points, 2, 0, np.random.default_rng(0))
        Y = make_optimizer("dbd", "tsne", **OPENTSNE_SCHEDULE).optimize(ex, start, 300).coords
        exact = ex.evaluate(Y)
    errors = {}
    for accuracy in FFT_ACCURACY:
        params = FFTParams(accuracy=accuracy, max_nodes=1 << 21)
        assert not make_grid("tsne", 2, Y.min(1), Y.max(1), params.resolved("tsne", 2), Y.shape[1]).capped
        with LocalExecutor(coauthor_affinity, get_model("tsne"), 2, 0, repulsion="fft", fft_params=params) as ex:
            errors[accuracy] = _rel(ex.evaluate(Y).gradient, exact.gradient)
    assert errors["fast"] > errors["default"] > errors["high"]
    assert errors["fast"] < 5e-2 and errors["default"] < 1e-2 and errors["high"] < 2e-3


@pytest.mark.parametrize("outliers", [30, 0])
def test_snest_fast_grid_fewer_time_components_bounded_error(outliers):
    """SNEST's 'fast' level (its 'auto' from 2e4 points): boxes 9/7 as wide and the time components' rank
    tolerance ``TIME_RANK_TOLS['fast']`` (1e-6) -- fewer components than the default grid on the same layout (a
    time band, or the whole time extent), and Z, the space and the time forces still within a few 1e-3 of the
    exact kernel (measured at 7.7e4 co-authors: gradient error 6.4e-3, default 1.9e-3); the time factorisation
    itself within 10x its tolerance."""
    from scalemb.repulsion import grid_for
    from scalemb.repulsion.grid import TIME_RANK_TOLS, time_factors, time_matrix

    assert TIME_RANK_TOLS["fast"] == 1e-6 and TIME_RANK_TOLS["default"] == TIME_RANK_TOLS["high"] == 1e-9
    n = 4000
    Y = _banded_layout(n, np.random.default_rng(5), outliers)
    if not outliers:
        Y[2] *= 10.0  # the whole time extent (std 0.5): many components
    Re, ze = _exact("snest", Y, 2)
    errors, ranks = {}, {}
    for level in ("fast", "default"):
        params = FFTParams(accuracy=level)
        grid = grid_for("snest", 2, Y, params)
        ranks[level] = grid.counts[-1]
        R, z = fft_repulsion("snest", Y, 2, params, bounds=row_partition(n, 3))
        errors[level] = (abs(z / ze - 1), _rel(R[:2], Re[:2]), _rel(R[2], Re[2]))
    assert ranks["fast"] < ranks["default"]
    assert max(errors["default"]) < TOL and max(errors["fast"]) < 1e-2
    grid = make_grid("snest", 2, [0.0, 0.0, -1.8], [20.0, 20.0, 1.8])
    m = grid.points[-1]
    into, out_of = time_factors(grid.plan.time_kernels, m, 3.6, TIME_RANK_TOLS["fast"])
    assert into.shape[1] < time_factors(grid.plan.time_kernels, m, 3.6)[0].shape[1]
    for kernel, out in zip(grid.plan.time_kernels, out_of):
        T = time_matrix(kernel, m, 3.6)
        assert np.abs(out @ into.T - T).max() <= 10 * TIME_RANK_TOLS["fast"] * np.abs(T).max()


def test_auto_accuracy_is_fast_from_the_models_threshold(tmp_path):
    """``FFTParams(accuracy='auto')`` (the default, and ``fft_accuracy``'s) is 'fast' for t-SNE from its
    ``FFTSpec.fast_from_points`` (10 000) points and 'default' below it, or where the point count is unknown;
    SNEST from its own (20 000); models without a threshold (SNE) keep 'default' at any size; an explicit level is
    kept at any size.
    Resolution writes the level it chose, so results below the threshold keep the attributes they always had,
    and an executor's grid (``resolve_repulsion_settings``, from the input's size) follows the rule."""
    from scalemb.params import BY_NAME
    from scalemb.repulsion.method import resolve_repulsion_settings

    threshold = get_model("tsne").fft.fast_from_points
    assert threshold == 10_000 and FFTParams().accuracy == "auto" and BY_NAME["fft_accuracy"].default == "auto"
    points, width = DEFAULT_INTERPOLATION["tsne", 2]
    assert FFTParams().resolved("tsne", 2, threshold) == FFTParams(points=points, box_width=width * 9 / 7,
                                                                    accuracy="fast")
    below = FFTParams().resolved("tsne", 2, threshold - 1)
    assert below == FFTParams(points=points, box_width=width, accuracy="default")
    assert "accuracy" not in below.as_dict()
    assert FFTParams().resolved("tsne", 2).accuracy == "default"  # no count: the default level
    assert FFTParams().accuracy_for("tsne", 10 ** 6) == "fast"
    assert get_model("sne").fft.fast_from_points is None and FFTParams().accuracy_for("sne", 10 ** 7) == "default"
    snest = get_model("snest").fft.fast_from_points
    assert snest == 20_000 and FFTParams().accuracy_for("snest", snest - 1) == "default"
    assert FFTParams().accuracy_for("snest", snest) == "fast"
    for level in ("fast", "default", "high"):
        assert FFTParams(accuracy=level).accuracy_for("tsne", 10) == level
        assert FFTParams(accuracy=level).accuracy_for("tsne", 10 ** 7) == level
    assert FFTParams(box_width=0.7).resolved("tsne", 2, 10 ** 6).box_width == 0.7  # given values are kept
    with pytest.raises(ValueError, match="auto, fast, default, high"):
        FFTParams(accuracy="coarse")
    for n, level in ((threshold - 1, "default"), (threshold, "fast")):
        assert resolve_repulsion_settings("fft", "tsne", 2, 0, n)[1].accuracy == level
    # 'auto' repulsion: exact below the threshold (t-SNE's is where R^2 turns to the FFT), 'fast' FFT from it
    assert resolve_repulsion_settings("auto", "tsne", 2, 0, threshold - 1)[0] == "exact"
    assert resolve_repulsion_settings("auto", "tsne", 2, 0, threshold)[1].accuracy == "fast"
    assert resolve_repulsion_settings("auto", "snest", 2, 1, 10 ** 6)[1].accuracy == "fast"
    with LocalExecutor(_random_affinity(threshold, 0), get_model("tsne"), 2, 0, repulsion="fft") as ex:
        assert ex.fft_params.accuracy == "fast" and ex.fft_params.box_width == pytest.approx(0.9)
    with pytest.raises(SystemExit):  # the table's choices, checked where the flag is parsed
        main(["embed", "school", "--fft-accuracy", "coarse", "--out", str(tmp_path / "x.zarr"), "--quiet"])


def test_time_extent_past_the_kernels_range_is_a_blow_up_not_a_crash(coauthor_affinity, caplog):
    """SNEST's ``exp(Δt²)`` overflows float64 beyond |Δt| ~ 26: a layout whose time axis spans more has no FFT
    grid; the evaluation is then not finite (fixed and 'auto' repulsion alike), which delta-bar-delta treats as
    a blow-up (back to the best iterate, learning rates halved) instead of failing inside the grid's SVD."""
    from scalemb.repulsion.grid import time_factors
    from scalemb.repulsion.method import AutoRepulsion

    n = coauthor_affinity.n_points
    Y = _layout_with_time(n, spread=0.3)
    with pytest.raises(FloatingPointError, match="time extent"):
        make_grid("snest", 2, np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 40.0]), FFTParams(), n)
    plan = get_model("snest").fft.plan(2)
    assert np.isfinite(time_factors(plan.time_kernels, 20, 3.0)[0]).all()
    bad = Y.copy()
    bad[2, 0] = 40.0
    choice = AutoRepulsion("snest", 2, 1, FFTParams()).predict(bad)
    assert choice.grid is None
    for repulsion in ("fft", "auto"):
        with LocalExecutor(coauthor_affinity, get_model("snest"), 2, 1, repulsion=repulsion) as ex:
            assert np.isfinite(ex.evaluate(Y).kl)
            if repulsion == "fft":
                assert not np.isfinite(ex.evaluate(bad).kl)
    # a run whose time coordinates jump past the range backs off and ends finite
    rule = make_optimizer("dbd", "snest", learning_rate=50.0, time_ratio=1.0)
    with LocalExecutor(coauthor_affinity, get_model("snest"), 2, 1, repulsion="fft") as ex:
        result = rule.optimize(ex, Y, 30)
    assert np.isfinite(result.kl) and np.isfinite(result.coords).all()
    assert "overflows the time kernels" in caplog.text and "back to the best iterate" in caplog.text


def _layout_with_time(n, spread):
    rng = np.random.default_rng(2)
    return np.concatenate([rng.normal(size=(2, n)) * 3.0, rng.normal(size=(1, n)) * spread])


@pytest.mark.parametrize("buckets", [2 ** 16, 3])
@pytest.mark.parametrize("model,ds,dt,max_nodes", [("tsne", 2, 0, None), ("sne", 2, 0, 4000),
                                                   ("snest", 2, 1, None), ("tsne", 3, 0, 5000)])
def test_box_order_threads_and_one_pass_interpolation_change_no_bit(model, ds, dt, max_nodes, buckets, monkeypatch):
    """Rows visited box by box (``Grid.visit``: a counting sort, on any number of threads, into coarse buckets of
    whole boxes when there are more boxes than ``SORT_BUCKETS`` allows), spread by threads owning whole boxes of
    one grid, and interpolated in one pass over all rows (``interpolate_grid``, on threads) give every row block
    the same repulsion and Z, bit for bit, as the block's own pass in row order; also on a time-banded grid
    (SNEST) and on capped ones (near field)."""
    from scalemb.repulsion import fft, grid as grid_module, grid_for, threads as threads_module
    from scalemb.repulsion.fft import interpolate_grid, near_cells

    n = 6000
    rng = np.random.default_rng(7)
    Y = _banded_layout(n, rng) if dt else _clustered_layout(n, ds, dt, 6.0, rng)
    grid = grid_for(model, ds, Y, FFTParams(max_nodes=max_nodes))
    assert grid.capped == (max_nodes is not None) and (grid.time_band is not None) == bool(dt)
    monkeypatch.setattr(grid_module, "SORT_ABOVE_BYTES", 2 ** 62)
    as_given = fft.spread_fixed(grid, Y, 0, n)
    potentials = convolve(grid, fixed_charges(grid, as_given)).potentials
    cells = near_cells(grid, Y)
    bounds = [(0, 1), (1, 2500), (2500, 2500), (2500, n)]
    reaction = np.zeros((Y.shape[0], grid.n_outliers))
    expected = [interpolate(grid, Y, potentials, r0, r1, cells, reaction.copy()) for r0, r1 in bounds]
    monkeypatch.setattr(grid_module, "SORT_ABOVE_BYTES", -1)
    monkeypatch.setattr(grid_module, "SORT_BUCKETS", buckets)
    for module in (fft, grid_module):  # spread_fixed's and interpolate_grid's shares
        monkeypatch.setattr(module, "SPREAD_ROWS_PER_THREAD", 100)
    monkeypatch.setattr(grid_module, "SORT_ROWS_PER_THREAD", 100)  # Grid.visit's sort
    order, keys, Yv = grid.visit(Y, 0, n)
    assert np.array_equal(np.sort(order), grid.in_band(Y, np.arange(n)))
    assert np.all(np.diff(keys) >= 0) and np.array_equal(Yv, Y[:, order])
    assert (order != np.sort(order)).any() == (math.prod(grid.n_boxes) > 1)  # SNE's capped grid: one box
    for threads in (1, 2, 3):
        monkeypatch.setattr(threads_module, "thread_count", lambda workers, t=threads: t)
        for got, want in zip(grid.visit(Y, 0, n, workers=threads), (order, keys, Yv)):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(fft.spread_fixed(grid, Y, 0, n, workers=threads), as_given)
        rows = interpolate_grid(grid, Y, potentials, workers=threads)
        for (r0, r1), (R, z) in zip(bounds, expected):
            for grid_rows in (rows, None):
                got = interpolate(grid, Y, potentials, r0, r1, cells, reaction.copy(), grid_rows)
                np.testing.assert_array_equal(got[0], R)
                assert got[1] == z


def test_one_kernel_spectrum_serves_every_node_count_of_an_fft_length():
    """Two grids of different node counts with the same FFT lengths share one kernel spectrum (the circulant of
    the most nodes that length holds), and the convolution on the smaller one is still the node-to-node sum."""
    from scalemb.repulsion import convolution

    grids = {}
    for width in np.linspace(3.0, 12.0, 40):  # box counts 5..18 of width 0.7: find two with one FFT length
        grid = make_grid("tsne", 2, [0.0, 0.0], [width, 1.0], FFTParams(points=3, box_width=0.7))
        grids.setdefault(grid.padded(), {})[grid.space_nodes] = grid
    small, large = next(sorted(g.values(), key=lambda g: g.n_nodes)[:2] for g in grids.values() if len(g) > 1)
    assert small.space_nodes != large.space_nodes and small.padded() == large.padded()
    convolution._spectra.clear()
    kernel = small.plan.kernels[small.plan.potentials[0]]
    assert convolution.kernel_spectrum(large, kernel) is convolution.kernel_spectrum(small, kernel)
    assert len(convolution._spectra) == 1
    charges = np.random.default_rng(0).normal(size=small.n_nodes)
    potentials = convolve(small, charges).potentials
    axes = [small.lo[k] + small.box_width[k] * (np.arange(small.space_nodes[k]) + 0.5) / small.points[k]
            for k in range(2)]
    x = np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=1)
    deltas = list(np.moveaxis(x[:, None, :] - x[None, :, :], 2, 0))
    for column, k in enumerate(small.plan.potentials):
        direct = small.plan.kernels[k](deltas, small.sigma) @ charges
        np.testing.assert_allclose(potentials[column], direct, atol=1e-5 * np.abs(direct).max())
