"""The near field of the FFT grid, summed directly: the part of a model's kernel a split grid leaves to the pairs
within a cutoff (``near_kernel``: a cell list, each neighbour cell a contiguous, vectorisable range of the
coordinates sorted by cell key), and a time-banded grid's outliers against every row (``time_outlier_rows``).
``fastmath`` and ``fast_exp`` as in the exact kernel; float64 sums.
"""
import functools

import numpy as np
from numba import njit

from ..numba_cache import disk_cached
from ..vecmath import fast_exp, scratch, scratch_row


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


@njit(inline="always", fastmath=True, error_model="numpy")
def _segment_distances(Y, Ys, i, a, n, space_dims, bs, bt):
    """``bs[jj], bt[jj]``: squared space, time distances from point ``i`` to sorted point ``a + jj``, ``jj < n``."""
    bs[:] = 0.0
    bt[:] = 0.0
    for k in range(Y.shape[0]):
        d2 = bs if k < space_dims else bt
        yk = Ys[k, a:a + n]
        yik = Y[k, i]
        for jj in range(n):
            x = yik - yk[jj]
            d2[jj] += x * x


@njit(inline="always", fastmath=True, error_model="numpy")
def _segment_forces(Y, Ys, i, a, n, space_dims, c1, c2, R, row):
    """``R[:, row] += sum_jj c (y_i - y_{a + jj})`` with the space coefficients ``c1`` and the time ones ``c2``."""
    for k in range(Y.shape[0]):
        c = c1 if k < space_dims else c2
        yk = Ys[k, a:a + n]
        yik = Y[k, i]
        acc = 0.0
        for jj in range(n):
            acc += c[jj] * (yik - yk[jj])
        R[k, row] += acc


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
                _segment_distances(Y, Ys, i, a, n, space_dims, bs, bt)
                c1 = cs[:n]
                c2 = ct[:n]
                for jj in range(n):
                    w, f1, f2 = near_pair(bs[jj], bt[jj], cutoff2, s2, inv_s2)
                    c1[jj] = f1
                    c2[jj] = f2
                    zi += w
                _segment_forces(Y, Ys, i, a, n, space_dims, c1, c2, R, i - r0)
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
