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
``grid[node, channel]``.  Accumulation is float64; no ``fastmath`` (the loops are memory bound).
"""
import numpy as np
from numba import njit

from ..models.fastexp import fast_exp


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
    """Flat offset of each of a box's nodes from its first node, C order over the box's node multi-index."""
    digits = np.indices(tuple(int(c) for c in counts)).reshape(len(counts), -1)
    return np.ascontiguousarray((digits * np.asarray(strides, dtype=np.int64)[:, None]).sum(axis=0))


@njit(cache=True, nogil=True, error_model="numpy")
def _point_weights(Y, i, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                   time_map, time_dim, axis_weights, mapped, scratch, weights):
    """Point i's weight at each node of its box, into ``weights[:prod(counts)]`` (C order over the box's node
    multi-index, like ``box_offsets``); returns the flat index of the box's first node.

    Per dimension k: the box ``b`` (clamped to the grid), ``u = (y - lo)/h - b`` and the Lagrange weights
    ``L_a(u)``; on the time axis (``k == time_dim``) they are mapped to the ``counts[k]`` components,
    ``sum_a L_a(u) time_map[a, c]``; the box's weights are the tensor product over dimensions.
    """
    weights[0] = 1.0
    n = 1
    base = 0
    for k in range(Y.shape[0]):
        x = (Y[k, i] - lo[k]) * inv_width[k]
        b = np.int64(np.floor(x))
        if b < 0:
            b = 0
        elif b > n_boxes[k] - 1:
            b = n_boxes[k] - 1
        u = x - b
        base += b * counts[k] * strides[k]
        for a in range(points[k]):
            num = 1.0
            for c in range(points[k]):
                if c != a:
                    num *= u - positions[k, c]
            axis_weights[a] = num * inv_denominators[k, a]
        factor = axis_weights
        if k == time_dim:
            for c in range(counts[k]):
                acc = 0.0
                for a in range(points[k]):
                    acc += axis_weights[a] * time_map[a, c]
                mapped[c] = acc
            factor = mapped
        width = counts[k]
        for c in range(n):
            wc = weights[c]
            for a in range(width):
                scratch[c * width + a] = wc * factor[a]
        n *= width
        weights[:n] = scratch[:n]
    return base


@njit(cache=True, nogil=True, error_model="numpy")
def spread_rows(Y, r0, r1, lo, inv_width, centre, n_boxes, points, counts, strides, positions, inv_denominators,
                offsets, time_map, time_dim, grid):
    """Add the charges of rows ``[r0, r1)`` to ``grid`` (``(n_nodes, d + 1)``): channel 0 the unit charge,
    channel 1 + k the centred coordinate ``y_k - centre_k``, each times the node's interpolation weight."""
    dims = Y.shape[0]
    n_local = offsets.shape[0]
    axis_weights = np.empty(positions.shape[1])
    mapped = np.empty(max(1, time_map.shape[1]))
    scratch = np.empty(n_local)
    weights = np.empty(n_local)
    charge = np.empty(dims + 1)
    charge[0] = 1.0
    for i in range(r0, r1):
        base = _point_weights(Y, i, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                              time_map, time_dim, axis_weights, mapped, scratch, weights)
        for k in range(dims):
            charge[1 + k] = Y[k, i] - centre[k]
        for c in range(n_local):
            w = weights[c]
            node = base + offsets[c]
            for ch in range(dims + 1):
                grid[node, ch] += w * charge[ch]


@njit(cache=True, nogil=True, error_model="numpy")
def interpolate_rows(Y, r0, r1, lo, inv_width, centre, n_boxes, points, counts, strides, positions,
                     inv_denominators, offsets, time_map, time_dim, potentials, z_output, self_weight, force_coef,
                     force_one, force_coord, R):
    """Interpolate the potentials (``(n_nodes, n_outputs)``) at rows ``[r0, r1)``.

    With ``phi_o(y_i)`` the interpolated outputs: ``Z_i = phi_z(y_i) - w(0)`` and, per dimension k,
    ``R[k, i - r0] = coef_k ((y_ik - centre_k) phi_one(y_i) - phi_coord(y_i))``.  Returns ``sum_i Z_i``.
    """
    dims = Y.shape[0]
    n_local = offsets.shape[0]
    n_out = potentials.shape[1]
    axis_weights = np.empty(positions.shape[1])
    mapped = np.empty(max(1, time_map.shape[1]))
    scratch = np.empty(n_local)
    weights = np.empty(n_local)
    phi = np.empty(n_out)
    z = 0.0
    for i in range(r0, r1):
        base = _point_weights(Y, i, lo, inv_width, n_boxes, points, counts, strides, positions, inv_denominators,
                              time_map, time_dim, axis_weights, mapped, scratch, weights)
        phi[:] = 0.0
        for c in range(n_local):
            w = weights[c]
            node = base + offsets[c]
            for o in range(n_out):
                phi[o] += w * potentials[node, o]
        z += phi[z_output] - self_weight
        for k in range(dims):
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
