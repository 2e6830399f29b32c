"""numba loops of the FFT-accelerated interpolation: spreading charges onto the grid, interpolating back.

The grid (see ``scalemb.repulsion.fft``) has, in every dimension k, ``n_k`` equal boxes of width ``h_k``
starting at ``lo_k``, and ``p_k`` interpolation nodes per box at relative positions ``x_ka`` in [0, 1]:
equispaced ``(a + 1/2)/p`` in space (Linderman et al. 2019, sec. 3; openTSNE's layout: node ``b p + a`` is
the a-th node of box b, so all nodes are equispaced with spacing ``h/p`` and the kernel between nodes is
Toeplitz), Chebyshev ``(1 - cos(pi (a + 1/2)/m))/2`` in one box spanning the time axis.  A point y in box b
with relative position ``u = (y - lo)/h - b`` gets the Lagrange weights
``L_a(u) = prod_{c != a} (u - x_c)/(x_a - x_c)`` per dimension, and their tensor product over dimensions for
the nodes of its box.  The time axis (SNEST) holds, instead of its m Chebyshev nodes, the r components of the
time kernel's low-rank factorisation (``scalemb.repulsion.fft.make_grid``): a point's m Lagrange weights are
mapped to r component weights by an m x r matrix (one for spreading, one for interpolating).

Grids are flat, C order over the node multi-index, with the channel as the last (fastest) axis:
``grid[node, channel]``.  A point's node weights are kept factorised (the weights per axis and their tensor
product over the leading axes), so the loops over its box run along the last axis, contiguous in the grid.
Accumulation is float64; no ``fastmath``.
"""
import numpy as np
from numba import njit

from ..models.vecmath import fast_exp


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
def _point_weights(Y, i, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                   time_map, time_dim, lagrange, axis_weights, outer_weights, scratch):
    """Point i's weights on the nodes of its box, factorised: ``axis_weights[k * W + c]`` (W its row width)
    for entry c of axis k, and ``outer_weights[:n_outer]``, the tensor product over all axes but the last
    (C order, like ``box_offsets`` of the leading axes).  Returns the flat index of the box's first node.

    Per dimension k: the box ``b`` (clamped to the grid), ``u = (y - lo)/h - b`` and the Lagrange weights
    ``L_a(u)``; on the time axis (``k == time_dim``) they are mapped to the ``counts[k]`` components,
    ``sum_a L_a(u) time_map[a, c]``.  The node weight is ``outer_weights[o] * axis_weights[last * W + c]``; the
    loops over a box's nodes then run over the last axis, contiguous in the grid.
    """
    dims = Y.shape[0]
    width = axis_weights.shape[0] // dims
    base = 0
    for k in range(dims):
        x = (Y[k, i] - lo[k]) * inv_width[k]
        b = np.int64(np.floor(x))
        if b < 0:
            b = 0
        elif b > n_boxes[k] - 1:
            b = n_boxes[k] - 1
        u = x - b
        base += b * counts[k] * strides[k]
        row = k * width
        pk = points[k]
        for a in range(pk):
            num = inv_denominators[k, a]
            for c in range(pk):
                if c != a:
                    num *= u - positions[k, c]
            lagrange[a] = num
        if k == time_dim:
            for c in range(counts[k]):
                acc = 0.0
                for a in range(pk):
                    acc += lagrange[a] * time_map[a, c]
                axis_weights[row + c] = acc
        else:
            for a in range(pk):
                axis_weights[row + a] = lagrange[a]
    outer_weights[0] = 1.0
    n = 1
    for k in range(dims - 1):
        row = k * width
        ck = counts[k]
        for c in range(n):
            wc = outer_weights[c]
            for a in range(ck):
                scratch[c * ck + a] = wc * axis_weights[row + a]
        n *= ck
        for c in range(n):
            outer_weights[c] = scratch[c]
    return base


@njit(cache=True, nogil=True, error_model="numpy")
def _buffers(dims, positions, counts, outer_offsets):
    """Scratch arrays of ``_point_weights``: Lagrange weights, axis weights, outer weights, tensor scratch."""
    width = max(positions.shape[1], counts.max())
    n_outer = outer_offsets.shape[0]
    return np.empty(positions.shape[1]), np.empty(dims * width), np.empty(n_outer), np.empty(n_outer)


# Most charge channels (the unit charge and up to d <= 4 coordinates) and potential outputs the loops below
# handle (the plans use at most 2 channels and 5 outputs, SNEST R^{3,1}).  They hold channels and outputs in
# scalars, with loop-invariant guards for the unused ones: indexing a small array by a run-time channel count instead
# measured 2-4x slower (the array may alias the grid, so every access reloads it).
MAX_CHANNELS = 5
MAX_OUTPUTS = 6


@njit(cache=True, nogil=True, error_model="numpy")
def spread_rows(Y, r0, r1, lo, inv_width, centre, n_boxes, points, counts, strides, positions, inv_denominators,
                outer_offsets, time_map, time_dim, charge_coords, grid):
    """Add the charges of rows ``[r0, r1)`` to ``grid`` (``(n_nodes, channels)``, ``channels <=
    MAX_CHANNELS``): channel 0 the unit charge, channel c > 0 the centred coordinate ``y_k - centre_k`` of
    ``k = charge_coords[c - 1]``, each times the node's interpolation weight.  ``outer_offsets``:
    ``box_offsets`` of the leading axes."""
    dims = Y.shape[0]
    channels = grid.shape[1]
    last = dims - 1
    inner = counts[last]
    lagrange, axis_weights, outer_weights, scratch = _buffers(dims, positions, counts, outer_offsets)
    row_last = last * (axis_weights.shape[0] // dims)
    for i in range(r0, r1):
        base = _point_weights(Y, i, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                              time_map, time_dim, lagrange, axis_weights, outer_weights, scratch)
        c1 = c2 = c3 = c4 = 0.0
        if channels > 1:
            c1 = Y[charge_coords[0], i] - centre[charge_coords[0]]
        if channels > 2:
            c2 = Y[charge_coords[1], i] - centre[charge_coords[1]]
        if channels > 3:
            c3 = Y[charge_coords[2], i] - centre[charge_coords[2]]
        if channels > 4:
            c4 = Y[charge_coords[3], i] - centre[charge_coords[3]]
        for o in range(outer_offsets.shape[0]):
            first = base + outer_offsets[o]
            wo = outer_weights[o]
            for c in range(inner):
                w = wo * axis_weights[row_last + c]
                node = first + c
                grid[node, 0] += w
                if channels > 1:
                    grid[node, 1] += w * c1
                if channels > 2:
                    grid[node, 2] += w * c2
                if channels > 3:
                    grid[node, 3] += w * c3
                if channels > 4:
                    grid[node, 4] += w * c4


@njit(cache=True, nogil=True, error_model="numpy")
def interpolate_rows(Y, r0, r1, lo, inv_width, centre, n_boxes, points, counts, strides, positions,
                     inv_denominators, outer_offsets, time_map, time_dim, potentials, z_output, self_weight,
                     force_coef, force_one, force_coord, R):
    """Interpolate the potentials (``(n_nodes, n_outputs)``, ``n_outputs <= MAX_OUTPUTS``) at rows ``[r0, r1)``.

    With ``phi_o(y_i)`` the interpolated outputs: ``Z_i = phi_z(y_i) - w(0)`` (``-w(0)`` alone when
    ``z_output < 0``: Z is then taken on the grid) and, per dimension k,
    ``R[k, i - r0] = coef_k ((y_ik - centre_k) phi_one(y_i) - phi_coord(y_i))``, or ``coef_k phi_coord(y_i)``
    when ``one_k < 0``.  Returns ``sum_i Z_i``.
    """
    dims = Y.shape[0]
    last = dims - 1
    inner = counts[last]
    n_out = potentials.shape[1]
    lagrange, axis_weights, outer_weights, scratch = _buffers(dims, positions, counts, outer_offsets)
    row_last = last * (axis_weights.shape[0] // dims)
    phi = np.empty(MAX_OUTPUTS)
    z = 0.0
    for i in range(r0, r1):
        base = _point_weights(Y, i, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                              time_map, time_dim, lagrange, axis_weights, outer_weights, scratch)
        p0 = p1 = p2 = p3 = p4 = p5 = 0.0
        for o in range(outer_offsets.shape[0]):
            first = base + outer_offsets[o]
            wo = outer_weights[o]
            for c in range(inner):
                w = wo * axis_weights[row_last + c]
                node = first + c
                p0 += w * potentials[node, 0]
                if n_out > 1:
                    p1 += w * potentials[node, 1]
                if n_out > 2:
                    p2 += w * potentials[node, 2]
                if n_out > 3:
                    p3 += w * potentials[node, 3]
                if n_out > 4:
                    p4 += w * potentials[node, 4]
                if n_out > 5:
                    p5 += w * potentials[node, 5]
        phi[0], phi[1], phi[2], phi[3], phi[4], phi[5] = p0, p1, p2, p3, p4, p5
        if z_output >= 0:
            z += phi[z_output]
        z -= self_weight
        for k in range(dims):
            if force_one[k] < 0:
                R[k, i - r0] = force_coef[k] * phi[force_coord[k]]
            else:
                R[k, i - r0] = force_coef[k] * ((Y[k, i] - centre[k]) * phi[force_one[k]] - phi[force_coord[k]])
    return z


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def near_rows(Y, Ys, r0, r1, space_dims, lo, cell_size, n_cells, sorted_keys, neighbours, kind, sigma, cutoff,
              R):
    """Near-field correction for rows ``[r0, r1)``: ``sum_{j != i} (K - K_far)(y_i - y_j)`` over the points
    within ``cutoff`` in space, added to ``R``; returns the rows' part of Z.  ``Ys`` holds the coordinates
    sorted by cell key (``sorted_keys``; cells of side ``cell_size >= cutoff``), so each neighbour cell is a
    contiguous, vectorisable range; the self pair is included there and its Z term subtracted exactly.

    ``kind`` 0 t-SNE (``q - q_far``, force ``-2 (q² - q_far²)``), 1 SNE (the whole Gaussian, no far part),
    2 SNEST (``exp(Δt²)`` times the t-SNE terms; time force ``2 exp(Δt²)(q - q_far)``), with
    ``q_far = 1 / (1 + d² + sigma² exp(-d² / sigma²))``.  ``fastmath`` as in the exact kernel (checked against
    it by tests/test_fft_repulsion.py).
    """
    dims = Y.shape[0]
    n_points = Ys.shape[1]
    cell = np.empty(space_dims, dtype=np.int64)
    cutoff2 = cutoff * cutoff
    s2 = sigma * sigma
    inv_s2 = 1.0 / s2 if s2 > 0 else 0.0
    self_term = 1.0 if kind == 1 else 1.0 - 1.0 / (1.0 + s2)
    d2s = np.empty(n_points)
    d2t = np.empty(n_points)
    cs = np.empty(n_points)
    ct = np.empty(n_points)
    z = 0.0
    for i in range(r0, r1):
        for k in range(space_dims):
            cell[k] = np.int64(np.floor((Y[k, i] - lo[k]) / cell_size)) + 1
        zi = 0.0
        for nb in range(neighbours.shape[0]):
            key = 0
            for k in range(space_dims):
                key = key * n_cells[k] + cell[k] + neighbours[nb, k]
            a = np.searchsorted(sorted_keys, key)
            b = np.searchsorted(sorted_keys, key + 1)
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
                inside = 1.0 if bs[jj] < cutoff2 else 0.0
                if kind == 1:
                    w = inside * fast_exp(-bs[jj])
                    c1[jj] = -2.0 * w
                    c2[jj] = 0.0
                else:
                    q = 1.0 / (1.0 + bs[jj])
                    qf = 1.0 / (1.0 + bs[jj] + s2 * fast_exp(-bs[jj] * inv_s2))
                    et = inside * (fast_exp(bt[jj]) if kind == 2 else 1.0)
                    w = et * (q - qf)
                    c1[jj] = -2.0 * et * (q * q - qf * qf)
                    c2[jj] = 2.0 * w
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
