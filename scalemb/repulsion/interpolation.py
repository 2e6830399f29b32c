"""numba loops of the FFT-accelerated interpolation: spreading charges onto the grid, interpolating back.

The grid (see ``scalemb.repulsion.fft``) has, in every dimension k, ``n_k`` equal boxes of width ``h_k``
starting at ``lo_k``, and ``p_k`` interpolation nodes per box at relative positions ``x_ka`` in [0, 1]:
equispaced ``(a + 1/2)/p`` in space (Linderman et al. 2019, sec. 3; openTSNE's layout: node ``b p + a`` is
the a-th node of box b, so all nodes are equispaced with spacing ``h/p`` and the kernel between nodes is
Toeplitz), Chebyshev ``(1 - cos(pi (a + 1/2)/m))/2`` in one box spanning the time axis.  A point y in box b
with relative position ``u = (y - lo)/h - b`` gets the Lagrange weights
``L_a(u) = prod_{c != a} (u - x_c)/(x_a - x_c)`` per dimension, and their tensor product over dimensions for
the nodes of its box.  The time axis (SNEST) holds, instead of its m Chebyshev nodes, the r components of the
time kernels' low-rank factorisation (``scalemb.repulsion.fft.time_factors``): a point's m Lagrange weights are
mapped to r component weights by an m x r matrix (one for spreading, one per time kernel for interpolating).

Grids are flat, C order over the node multi-index of the loop axes (the time axis first, then the space axes):
the charge grid ``grid[node]``, the potentials ``potentials[column, node]`` (one column per space kernel), so that
each time component is a contiguous space grid for the FFTs.  The loops visit the rows in the order they are
given (``scalemb.repulsion.fft.Grid.visit_order``: box by box, ``box_keys``, on grids too large for the cache).
Charges are spread in fixed point (int64 multiples of a power of two, ``spread_rows``) so that partial grids sum
exactly; every other accumulation is float64; no ``fastmath``.
A point's node weights are kept factorised (the weights per axis and their tensor product over the leading
axes), so the loops over its box run along the last axis, contiguous in the grid.
"""
import functools

import numpy as np
from numba import njit

from ..numba_cache import disk_cached
from ..vecmath import fast_exp, scratch, scratch_row


def box_tables(node_positions):
    """For per-dimension node positions in [0, 1] (a list of arrays): ``positions[k, a]`` (padded) and
    ``inv_denominators[k, a] = 1 / prod_{c != a} (x_ka - x_kc)``; ``points[k]``."""
    points = np.array([len(x) for x in node_positions], dtype=np.int64)
    positions = np.zeros((len(points), points.max()))
    inv_denominators = np.zeros_like(positions)
    for k, x in enumerate(node_positions):
        positions[k, :len(x)] = x
        for a in range(len(x)):
            inv_denominators[k, a] = 1.0 / np.prod([x[a] - x[c] for c in range(len(x)) if c != a])
    return positions, inv_denominators, points


def box_offsets(counts, strides) -> np.ndarray:
    """Flat offset of each of a box's nodes from its first node, C order over the box's node multi-index
    (over the leading axes only, when ``counts`` and ``strides`` leave out the last one)."""
    if len(counts) == 0:  # no leading axes (a 1-D grid): the box's first node only
        return np.zeros(1, dtype=np.int64)
    digits = np.indices(tuple(int(c) for c in counts)).reshape(len(counts), -1)
    return np.ascontiguousarray((digits * np.asarray(strides, dtype=np.int64)[:, None]).sum(axis=0))


@njit(inline="always", error_model="numpy")
def _box(x, n_boxes):
    """The box of grid coordinate ``x = (y - lo)/h``, clamped to ``[0, n_boxes)``."""
    b = np.int64(np.floor(x))
    return min(max(b, 0), n_boxes - 1)


@njit(inline="always", error_model="numpy")
def _point_weights(Y, i, axes, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                   time_maps, timed, lagrange, axis_weights, outer_weights, scratch, width):
    """Point i's weights on the nodes of its box, factorised: ``axis_weights[k * W + c]`` (W = ``width``) for
    entry c of loop axis k (coordinate ``axes[k]``), and ``outer_weights[q, :n_outer]``, the tensor product over
    all loop axes but the last (C order, like ``box_offsets`` of the leading axes) with time map q.  Returns the
    flat index of the box's first node.

    Per axis k: the box ``b`` (clamped to the grid), ``u = (y - lo)/h - b`` and the Lagrange weights
    ``L_a(u)``; on the time axis (``timed``: loop axis 0) they are mapped to the ``counts[0]`` components by
    each time map q, ``sum_a L_a(u) time_maps[q, a, c]``, into row 0 for q = 0 and row ``dims - 1 + q`` after
    it.  The node weight is ``outer_weights[q, o] * axis_weights[last * W + c]``; the loops over a box's nodes
    then run over the last axis, contiguous in the grid.
    """
    dims = axes.shape[0]
    n_maps = time_maps.shape[0] if timed else 1
    base = 0
    for k in range(dims):
        x = (Y[axes[k], i] - lo[k]) * inv_width[k]
        b = _box(x, n_boxes[k])
        u = x - b
        base += b * counts[k] * strides[k]
        row = k * width
        pk = points[k]
        prefix = 1.0  # L_a(u) = inv_denominators[k, a] prod_{c < a} (u - x_c) prod_{c > a} (u - x_c): O(p)
        for a in range(pk):
            lagrange[a] = prefix * inv_denominators[k, a]
            prefix *= u - positions[k, a]
        suffix = 1.0
        for a in range(pk - 1, -1, -1):
            lagrange[a] *= suffix
            suffix *= u - positions[k, a]
        if timed and k == 0:
            for q in range(n_maps):
                row_q = 0 if q == 0 else (dims - 1 + q) * width
                for c in range(counts[0]):
                    acc = 0.0
                    for a in range(pk):
                        acc += lagrange[a] * time_maps[q, a, c]
                    axis_weights[row_q + c] = acc
        else:
            for a in range(pk):
                axis_weights[row + a] = lagrange[a]
    for q in range(n_maps):
        outer_weights[q, 0] = 1.0
        n = 1
        for k in range(dims - 1):
            row = (dims - 1 + q) * width if (k == 0 and q > 0) else k * width
            ck = counts[k]
            for c in range(n):
                wc = outer_weights[q, c]
                for a in range(ck):
                    scratch[c * ck + a] = wc * axis_weights[row + a]
            n *= ck
            for c in range(n):
                outer_weights[q, c] = scratch[c]
    return base


@njit(cache=True, nogil=True, error_model="numpy")
def _buffers(dims, positions, counts, outer_offsets, time_maps, timed):
    """Scratch arrays of ``_point_weights``: Lagrange weights, axis weights (one row per axis and one per
    further time map), outer weights (per time map), tensor scratch; and the row width."""
    width = max(positions.shape[1], counts.max())
    n_maps = time_maps.shape[0] if timed else 1
    n_outer = outer_offsets.shape[0]
    return (np.empty(positions.shape[1]), np.empty((dims + n_maps - 1) * width), np.empty((n_maps, n_outer)),
            np.empty(n_outer), width)


def bucket_divisor(n_boxes, max_buckets: int) -> tuple:
    """``(divisor, n_buckets)`` of ``box_keys``: flat box indices divided by ``divisor`` so that there are at most
    ``max_buckets`` buckets (runs of neighbouring boxes along the last axes share one)."""
    n_keys = int(np.prod(n_boxes))
    divisor = max(1, -(-n_keys // max_buckets))
    return divisor, (n_keys - 1) // divisor + 1


@njit(cache=True, nogil=True, error_model="numpy")
def box_keys(Y, rows, j0, j1, axes, lo, inv_width, n_boxes, divisor, keys, counts):
    """The bucket of rows ``rows[j0:j1]`` into ``keys[j0:j1]``: the flat box index (C order over the loop axes)
    divided by ``divisor`` (``bucket_divisor``); ``counts[b]`` += the rows in bucket b.  Boxes share no nodes,
    and a bucket is a set of whole boxes: rows in different buckets touch disjoint nodes of the grid."""
    for j in range(j0, j1):
        i = rows[j]
        key = 0
        for k in range(axes.shape[0]):
            key = key * n_boxes[k] + _box((Y[axes[k], i] - lo[k]) * inv_width[k], n_boxes[k])
        key //= divisor
        keys[j] = key
        counts[key] += 1


@njit(cache=True, nogil=True, error_model="numpy")
def box_scatter(Y, rows, j0, j1, keys, starts, order, sorted_keys, Yv):
    """The counting sort's second pass for ``rows[j0:j1]``: each row to position ``starts[key]`` (then
    incremented) of ``order``, its key to ``sorted_keys`` and its coordinates to ``Yv`` (scattered while the rows
    are read in their own order: a gather in box order would miss the cache once per point and coordinate).
    With ``starts`` the bucket offsets plus the counts of the rows before ``j0``, shares of the rows sort on
    threads into the one stable order."""
    for j in range(j0, j1):
        key = keys[j]
        at = starts[key]
        order[at] = rows[j]
        sorted_keys[at] = key
        for k in range(Y.shape[0]):
            Yv[k, at] = Y[k, rows[j]]
        starts[key] = at + 1


@njit(cache=True, nogil=True, error_model="numpy")
def gather_columns(Y, order):
    """``Y[:, order]``, C-contiguous."""
    Yv = np.empty((Y.shape[0], order.shape[0]))
    for j in range(order.shape[0]):
        for k in range(Y.shape[0]):
            Yv[k, j] = Y[k, order[j]]
    return Yv


# Most interpolated outputs the loop below handles (SNEST R^{3,1}: Z, the time force and 3 space forces).  It
# holds them in scalars, with loop-invariant guards for the unused ones: indexing a small array by a run-time
# output count instead measured 2-4x slower (the array may alias the grid, so every access reloads it).
MAX_OUTPUTS = 5


@njit(cache=True, nogil=True, error_model="numpy")
def spread_rows(Y, order, axes, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                outer_offsets, time_maps, timed, scale, grid):
    """``spread_visited`` of rows ``order`` of ``Y``."""
    spread_visited(gather_columns(Y, order), 0, order.shape[0], axes, lo, inv_width, n_boxes, points, counts,
                   strides, positions, inv_denominators, outer_offsets, time_maps, timed, scale, grid)


@njit(cache=True, nogil=True, error_model="numpy")
def spread_visited(Yv, j0, j1, axes, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                   outer_offsets, time_maps, timed, scale, grid):
    """Add the unit charges of the points ``Yv[:, j0:j1]`` to ``grid`` (flat, ``(n_nodes,)``, int64 fixed point):
    each point adds its interpolation weight to the nodes of its box (time axis: through ``time_maps[0]``), each weight
    rounded to a multiple of ``1 / scale`` (a power of two).  Integer addition is associative, so the grid is the
    same bit for bit whatever rows are spread where and summed in what order (threads, row blocks, Dask workers:
    ``scalemb.repulsion.fft.spread``).  ``outer_offsets``: ``box_offsets`` of the leading axes."""
    dims = axes.shape[0]
    last = dims - 1
    inner = counts[last]
    lagrange, axis_weights, outer_weights, scratch, width = _buffers(dims, positions, counts, outer_offsets,
                                                                     time_maps, timed)
    row_last = last * width
    for j in range(j0, j1):
        base = _point_weights(Yv, j, axes, lo, inv_width, n_boxes, points, counts, strides, positions,
                              inv_denominators, time_maps, timed, lagrange, axis_weights, outer_weights, scratch,
                              width)
        for o in range(outer_offsets.shape[0]):
            first = base + outer_offsets[o]
            wo = outer_weights[0, o]
            for c in range(inner):
                grid[first + c] += np.int64(np.rint(wo * axis_weights[row_last + c] * scale))


@njit(cache=True, nogil=True, error_model="numpy")
def interpolate_rows(Y, order, r0, axes, lo, inv_width, n_boxes, points, counts, strides, positions,
                     inv_denominators, outer_offsets, time_maps, timed, potentials, output_columns, output_maps,
                     z_output, self_weight, force_outputs, R):
    """``interpolate_visited`` at rows ``order`` of ``Y``."""
    return interpolate_visited(gather_columns(Y, order), order, r0, axes, lo, inv_width, n_boxes, points, counts,
                               strides, positions, inv_denominators, outer_offsets, time_maps, timed, potentials,
                               output_columns, output_maps, z_output, self_weight, force_outputs, R)


@njit(cache=True, nogil=True, error_model="numpy")
def interpolate_visited(Yv, order, r0, axes, lo, inv_width, n_boxes, points, counts, strides, positions,
                        inv_denominators, outer_offsets, time_maps, timed, potentials, output_columns, output_maps,
                        z_output, self_weight, force_outputs, R):
    """Interpolate at rows ``order`` (all in ``[r0, r0 + R.shape[1])``; row ``order[j]`` at ``Yv[:, j]``) the
    outputs ``phi_o`` (``interpolate_range``) into ``R[k, i - r0]``.  Returns ``sum_i Z_i`` with ``Z_i = phi_z(y_i)
    - w(0)`` (``-w(0)`` alone when ``z_output < 0``: Z is then taken on the grid), summed in row order
    (``z_sum``), not visit order: the same for any ``order`` of the same rows."""
    n = order.shape[0]
    Rv = np.empty((R.shape[0], n))
    zv = np.empty(n)
    interpolate_range(Yv, 0, n, axes, lo, inv_width, n_boxes, points, counts, strides, positions,
                      inv_denominators, outer_offsets, time_maps, timed, potentials, output_columns, output_maps,
                      z_output, force_outputs, Rv, zv)
    z_rows = np.zeros(R.shape[1])
    visited = np.zeros(R.shape[1], dtype=np.bool_)
    to_rows(order, 0, n, r0, Rv, zv, R, z_rows, visited)
    return z_sum(z_rows, visited, 0, R.shape[1], z_output, self_weight)


@njit(cache=True, nogil=True, error_model="numpy")
def to_rows(order, j0, j1, r0, Rv, zv, R, z_rows, visited):
    """Move ``interpolate_range``'s outputs from visit order to row order: for ``j`` in ``[j0, j1)``, row
    ``i = order[j]`` gets ``R[:, i - r0] = Rv[:, j]``, ``z_rows[i - r0] = zv[j]``, ``visited[i - r0] = True``.
    A separate pass: scattered stores in the interpolation loop itself cost it ~2.5x (t-SNE R^2, N = 7.7e5)."""
    for j in range(j0, j1):
        i = order[j] - r0
        for k in range(R.shape[0]):
            R[k, i] = Rv[k, j]
        z_rows[i] = zv[j]
        visited[i] = True


@njit(cache=True, nogil=True, error_model="numpy")
def z_sum(z_rows, visited, r0, r1, z_output, self_weight):
    """``sum_i (phi_z(y_i) - w(0))`` over the visited rows of ``[r0, r1)`` in row order (``phi_z`` from
    ``interpolate_range``'s ``z_rows``; only ``-w(0)`` when ``z_output < 0``), one row at a time: the same sum
    whether the rows were interpolated per block or all at once."""
    z = 0.0
    for j in range(r0, r1):
        if visited[j]:
            if z_output >= 0:
                z += z_rows[j]
            z -= self_weight
    return z


@njit(cache=True, nogil=True, error_model="numpy")
def interpolate_range(Yv, j0, j1, axes, lo, inv_width, n_boxes, points, counts, strides, positions,
                      inv_denominators, outer_offsets, time_maps, timed, potentials, output_columns, output_maps,
                      z_output, force_outputs, Rv, zv):
    """Interpolate at the points ``Yv[:, j0:j1]`` the outputs ``phi_o`` (``o < MAX_OUTPUTS``): row
    ``output_columns[o]`` of ``potentials`` (``(columns, n_nodes)``), read on the time axis through time map
    ``output_maps[o]`` (0 or 1): ``Rv[k, j] = phi_{force_outputs[k]}(y_j)`` and ``zv[j] = phi_z(y_j)`` (0 when
    ``z_output < 0``), in the points' order (``to_rows`` moves them to row order).  Points touch only their own
    entries: disjoint ranges may run on threads at once.
    """
    dims = axes.shape[0]
    last = dims - 1
    inner = counts[last]
    n_out = output_columns.shape[0]
    lagrange, axis_weights, outer_weights, scratch, width = _buffers(dims, positions, counts, outer_offsets,
                                                                     time_maps, timed)
    row_last = last * width
    two = timed and time_maps.shape[0] > 1
    v0 = potentials[output_columns[0]]
    v1 = potentials[output_columns[min(1, n_out - 1)]]
    v2 = potentials[output_columns[min(2, n_out - 1)]]
    v3 = potentials[output_columns[min(3, n_out - 1)]]
    v4 = potentials[output_columns[min(4, n_out - 1)]]
    m0 = output_maps[0] == 1
    m1 = output_maps[min(1, n_out - 1)] == 1
    m2 = output_maps[min(2, n_out - 1)] == 1
    m3 = output_maps[min(3, n_out - 1)] == 1
    m4 = output_maps[min(4, n_out - 1)] == 1
    phi = np.empty(MAX_OUTPUTS)
    for j in range(j0, j1):
        base = _point_weights(Yv, j, axes, lo, inv_width, n_boxes, points, counts, strides, positions,
                              inv_denominators, time_maps, timed, lagrange, axis_weights, outer_weights, scratch,
                              width)
        p0 = p1 = p2 = p3 = p4 = 0.0
        for o in range(outer_offsets.shape[0]):
            first = base + outer_offsets[o]
            wa = outer_weights[0, o]
            wb = outer_weights[1, o] if two else wa
            s0 = s1 = s2 = s3 = s4 = 0.0
            for c in range(inner):
                w = axis_weights[row_last + c]
                node = first + c
                s0 += w * v0[node]
                if n_out > 1:
                    s1 += w * v1[node]
                if n_out > 2:
                    s2 += w * v2[node]
                if n_out > 3:
                    s3 += w * v3[node]
                if n_out > 4:
                    s4 += w * v4[node]
            p0 += (wb if m0 else wa) * s0
            p1 += (wb if m1 else wa) * s1
            p2 += (wb if m2 else wa) * s2
            p3 += (wb if m3 else wa) * s3
            p4 += (wb if m4 else wa) * s4
        phi[0], phi[1], phi[2], phi[3], phi[4] = p0, p1, p2, p3, p4
        zv[j] = phi[z_output] if z_output >= 0 else 0.0
        for k in range(Rv.shape[0]):
            Rv[k, j] = phi[force_outputs[k]]


@njit(inline="always", error_model="numpy")
def _cell_of(Y, i, lo, cell_size, space_dims, cell):
    """``cell[k]``: point i's cell along space axis k, counted from 1 (cell 0 is the empty margin below)."""
    for k in range(space_dims):
        cell[k] = np.int64(np.floor((Y[k, i] - lo[k]) / cell_size)) + 1


@njit(inline="always")
def _cell_range(cell, offset, n_cells, space_dims, sorted_keys):
    """``[a, b)``: the points (sorted by cell key) of the cell at ``cell + offset``."""
    key = 0
    for k in range(space_dims):
        key = key * n_cells[k] + cell[k] + offset[k]
    return np.searchsorted(sorted_keys, key), np.searchsorted(sorted_keys, key + 1)


@functools.cache
def near_kernel(py_near_pair):
    """``near_rows(Y, Ys, r0, r1, space_dims, lo, cell_size, n_cells, sorted_keys, neighbours, sigma, cutoff, R,
    band_lo=-inf, band_hi=inf)`` compiled (and cached on disk) for a model's ``FFTSpec.near_pair(d2s, d2t, cutoff2,
    s2, inv_s2) -> (w, c_s, c_t)``: the part of its kernel a split grid at scale sigma (``s2 = sigma²``, ``inv_s2 =
    1/s2`` or 0) leaves to the direct sum, zero beyond ``cutoff2``, and its space and time force coefficients (a plain
    function, compiled here inline, so a spec pickles by reference; a new kernel shape is its model's module alone).

    ``near_rows`` adds ``sum_{j != i} (K - K_far)(y_i - y_j)`` over the points within ``cutoff`` in space to ``R``
    for rows ``[r0, r1)`` and returns their part of Z.  ``Ys``: the coordinates sorted by cell key (cells of side
    ``cell_size >= cutoff``), each neighbour cell a contiguous, vectorisable range; the self pair's Z term
    (``near_self_weight``) is subtracted exactly.  ``fastmath`` as in the exact kernel.  Rows whose time coordinate
    lies outside ``[band_lo, band_hi]`` (a time-banded grid's outliers, ``time_outlier_rows``) are skipped.
    """
    near_pair = njit(inline="always", fastmath=True, error_model="numpy")(py_near_pair)

    @njit(nogil=True, fastmath=True, error_model="numpy")
    def near_rows(Y, Ys, r0, r1, space_dims, lo, cell_size, n_cells, sorted_keys, neighbours, sigma, cutoff, R,
                  band_lo=-np.inf, band_hi=np.inf):
        dims = Y.shape[0]
        n_points = Ys.shape[1]
        cell = np.empty(space_dims, dtype=np.int64)
        cutoff2 = cutoff * cutoff
        s2 = sigma * sigma
        inv_s2 = 1.0 / s2 if s2 > 0 else 0.0
        self_term = near_pair(0.0, 0.0, np.inf, s2, inv_s2)[0]
        block = scratch(4, n_points)  # the pair loop stores to cs, ct while summing: vecmath's module docstring
        d2s = scratch_row(block, 0, n_points)
        d2t = scratch_row(block, 1, n_points)
        cs = scratch_row(block, 2, n_points)
        ct = scratch_row(block, 3, n_points)
        z = 0.0
        for i in range(r0, r1):
            if dims > space_dims and (Y[space_dims, i] < band_lo or Y[space_dims, i] > band_hi):
                continue
            _cell_of(Y, i, lo, cell_size, space_dims, cell)
            zi = 0.0
            for nb in range(neighbours.shape[0]):
                a, b = _cell_range(cell, neighbours[nb], n_cells, space_dims, sorted_keys)
                n = b - a
                if n <= 0:
                    continue
                bs = d2s[:n]
                bt = d2t[:n]
                bs[:] = 0.0
                bt[:] = 0.0
                for k in range(dims):  # contiguous loops over the cell's points, vectorised like the exact kernel
                    d2 = bs if k < space_dims else bt
                    yk = Ys[k, a:b]
                    yik = Y[k, i]
                    for jj in range(n):
                        x = yik - yk[jj]
                        d2[jj] += x * x
                c1 = cs[:n]
                c2 = ct[:n]
                for jj in range(n):
                    w, f1, f2 = near_pair(bs[jj], bt[jj], cutoff2, s2, inv_s2)
                    c1[jj] = f1
                    c2[jj] = f2
                    zi += w
                for k in range(dims):
                    c = c1 if k < space_dims else c2
                    yk = Ys[k, a:b]
                    yik = Y[k, i]
                    acc = 0.0
                    for jj in range(n):
                        acc += c[jj] * (yik - yk[jj])
                    R[k, i - r0] += acc
            z += zi - self_term
        return z

    return disk_cached(near_rows)


def near_self_weight(near_pair, sigma: float) -> float:
    """The near pair's ``w(0)`` at split scale ``sigma`` (0: unsplit): the self term ``near_rows`` removes."""
    s2 = float(sigma) ** 2
    return float(near_pair(0.0, 0.0, np.inf, s2, 1.0 / s2 if s2 > 0 else 0.0)[0])


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def time_outlier_rows(Y, r0, r1, space_dims, band_lo, band_hi, Yo, R, reaction):
    """The direct sums of a time-banded grid (``scalemb.repulsion.fft``, "Time band") for rows ``[r0, r1)``, with
    SNEST's kernel ``w = exp(Δt²) q``, ``q = 1/(1 + |Δs|²)`` (``fast_exp`` and ``fastmath``
    as in the exact kernel): every row against the outliers ``Yo`` (``(d, n_out)``, the points whose time
    coordinate lies outside ``[band_lo, band_hi]``).

    * A row in the band (its pairs with the band's points are on the grid): adds ``sum_o w_io d log w_io / d y_i``
      to ``R[:, i - r0]`` and ``sum_o w_io`` to Z, and the reactions: ``sum_o w_io d log w_io / d y_o =
      -(the row's term)`` to ``reaction[:, o]`` and ``sum_o w_io`` (the outliers' rows of Z) to Z once more.
    * An outlier row (never spread nor interpolated): adds its pairs with every outlier, its own included, whose
      weight ``w(0) = 1`` is removed from Z and whose force is zero.  Its pairs with the band's points arrive as
      the reactions of their rows, summed over all row blocks into ``reaction`` (a small partial sum, ``(d,
      n_out)``, added to the outliers' rows of R by the caller).

    So every ordered pair is counted once and no row needs the coordinates of any point but itself and the
    outliers.  Returns the rows' part of Z.  O(rows x n_out).
    """
    dims = Y.shape[0]
    n_out = Yo.shape[1]
    # the loops store while summing, the reactions' one reading Yo: scratch rows and a copy of Yo (vecmath's
    # module docstring; a few outliers make small arrays)
    block = scratch(4 + dims, n_out)
    d2s = scratch_row(block, 0, n_out)
    d2t = scratch_row(block, 1, n_out)
    cs = scratch_row(block, 2, n_out)
    ct = scratch_row(block, 3, n_out)
    for k in range(dims):
        scratch_row(block, 4 + k, n_out)[:] = Yo[k]
    z = 0.0
    for i in range(r0, r1):
        outlier = Y[space_dims, i] < band_lo or Y[space_dims, i] > band_hi
        d2s[:] = 0.0
        d2t[:] = 0.0
        for k in range(dims):
            d2 = d2s if k < space_dims else d2t
            yk = scratch_row(block, 4 + k, n_out)
            yik = Y[k, i]
            for j in range(n_out):
                x = yik - yk[j]
                d2[j] += x * x
        zi = 0.0
        for j in range(n_out):
            q = 1.0 / (1.0 + d2s[j])
            w = fast_exp(d2t[j]) * q
            zi += w
            cs[j] = -2.0 * w * q
            ct[j] = 2.0 * w
        z += (zi - 1.0) if outlier else 2.0 * zi
        for k in range(dims):
            c = cs if k < space_dims else ct
            yk = scratch_row(block, 4 + k, n_out)
            yik = Y[k, i]
            acc = 0.0
            if outlier:
                for j in range(n_out):
                    acc += c[j] * (yik - yk[j])
            else:
                rk = reaction[k]
                for j in range(n_out):
                    f = c[j] * (yik - yk[j])
                    acc += f
                    rk[j] -= f
            R[k, i - r0] += acc
    return z
