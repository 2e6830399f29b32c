"""numba loops of the FFT-accelerated interpolation: spreading charges onto the grid, interpolating back.

The grid (see ``scalemb.repulsion.fft``) has, in every dimension k, ``n_k`` equal boxes of width ``h_k``
starting at ``lo_k``, and ``p_k`` interpolation nodes per box at relative positions ``x_ka`` in [0, 1]:
equispaced ``(a + 1/2)/p`` in space (Linderman et al. 2019, sec. 3; openTSNE's layout: node ``b p + a`` is
the a-th node of box b, so all nodes are equispaced with spacing ``h/p`` and the kernel between nodes is
Toeplitz), Chebyshev ``(1 - cos(pi (a + 1/2)/m))/2`` in one box spanning the time axis.  A point y in box b
with relative position ``u = (y - lo)/h - b`` gets the Lagrange weights
``L_a(u) = prod_{c != a} (u - x_c)/(x_a - x_c)`` per dimension, and their tensor product over dimensions for
the nodes of its box.  The time axis (SNEST) holds, instead of its m Chebyshev nodes, the r components of the
time kernels' low-rank factorisation (``scalemb.repulsion.grid.time_factors``): a point's m Lagrange weights are
mapped to r component weights by an m x r matrix (one for spreading, one per time kernel for interpolating).

Grids are flat, C order over the node multi-index of the loop axes (the time axis first, then the space axes):
the charge grid ``grid[node]``, the potentials ``potentials[column, node]`` (one column per space kernel), so that
each time component is a contiguous space grid for the FFTs.  The loops visit the rows in the order they are
given (``scalemb.repulsion.grid.Grid.visit_order``: box by box, ``box_keys``, on grids too large for the cache).
Charges are spread in fixed point (int64 multiples of a power of two, ``spread_rows``) so that partial grids sum
exactly; every other accumulation is float64; no ``fastmath``.
A point's node weights are kept factorised (the weights per axis and their tensor product over the leading
axes), so the loops over its box run along the last axis, contiguous in the grid.
"""
import numpy as np
from numba import njit


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
def gather_columns_into(Y, order, first, offset, out):
    """``out[:, first + j] = Y[:, order[j] - offset]``: columns of one part of a longer row range, in place."""
    for j in range(order.shape[0]):
        for k in range(Y.shape[0]):
            out[k, first + j] = Y[k, order[j] - offset]


@njit(cache=True, nogil=True, error_model="numpy")
def gather_columns(Y, order):
    """``Y[:, order]``, C-contiguous."""
    Yv = np.empty((Y.shape[0], order.shape[0]))
    gather_columns_into(Y, order, 0, 0, Yv)
    return Yv


@njit(cache=True, nogil=True, error_model="numpy")
def put_columns(Y, positions, values):
    """``Y[:, positions] = values`` in place."""
    for j in range(positions.shape[0]):
        for k in range(Y.shape[0]):
            Y[k, positions[j]] = values[k, j]


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
