"""The fixed map's repulsion on new points through one FFT grid (the "frozen grid" of placement).

While new points are placed the ``N`` old points never move, so their potentials

    ``phi_c(x) = sum_j K_c(x - y_j)``   (``K_c``: the model's kernel ``w`` and its force kernels ``g Δ_k``)

are the same function of ``x`` at every evaluation.  ``FrozenField`` computes them once, on the grid of
``scalemb.repulsion.fft`` (spread the old points' unit charges, one FFT convolution per kernel), and each
evaluation only interpolates them at the new points: ``Z_on = sum_i phi_w(x_i)`` and the rows of ``R`` from the
old points, O(M) per evaluation after an O(N + grid) set-up, where the exact sum costs O(M N).  On a split
(capped) grid the near part of the kernel comes from the direct sum over the old points within the cutoff
(``near.near_rows`` against the old points' cell list).

The grid's plan is the model's, except that Z must be interpolated per point (a new point's ``phi_w`` is not a
node sum of the old points' charges): where the model's plan takes Z by Parseval (t-SNE), the kernel ``w`` is
added as a potential and an output.  The grid covers the old map's space extent around its centre out to
``MARGIN`` times its radius (the unattached components' start, ``UNATTACHED_RULE``, is at 1.1 times), and the
time extent widened by ``MARGIN - 1`` of itself on both sides; new points outside (the interpolation would
extrapolate) get the exact sum against all old points instead.  ``Z_oo``, the old map's own normaliser, is one
``fft_repulsion`` pass.  Accuracy: that of the embedding's FFT repulsion (``tests/test_transform.py`` checks
the KL and gradient against the exact objective).
"""
from dataclasses import replace

import numpy as np

from ..repulsion.convolution import convolve
from ..repulsion.fft import fft_repulsion, near_cells, spread
from ..repulsion.grid import make_grid
from ..repulsion.spec import FFTParams, fft_spec
from ..repulsion.interpolation import interpolate_rows
from ..repulsion.near import near_kernel, near_self_weight

MARGIN = 1.25


class FrozenField:
    """The old points' ``(R, Z)`` on new points, from potentials computed once (module docstring)."""

    def __init__(self, model, space_dims: int, old: np.ndarray, params: FFTParams = FFTParams(), workers: int = 1):
        self.model = model
        spec = fft_spec(model)  # ValueError for a model without FFT repulsion
        old = np.ascontiguousarray(old, dtype=np.float64)
        self.old = old
        ds = space_dims
        self.space_dims = ds
        n = old.shape[1]
        lo_old, hi_old = old.min(axis=1), old.max(axis=1)
        centre = (lo_old[:ds] + hi_old[:ds]) / 2
        radius = float(np.sqrt(((old[:ds] - centre[:, None]) ** 2).sum(axis=0)).max()) + 1.0
        lo = np.concatenate([centre - MARGIN * radius, lo_old[ds:] - (MARGIN - 1) * (hi_old[ds:] - lo_old[ds:])])
        hi = np.concatenate([centre + MARGIN * radius, hi_old[ds:] + (MARGIN - 1) * (hi_old[ds:] - lo_old[ds:])])
        grid = make_grid(spec, ds, lo, hi, params, n)
        plan = grid.plan
        if plan.z_output < 0:  # Z by Parseval in the model's plan: interpolate w per point instead
            plan = replace(plan, potentials=(plan.z_kernel,) + plan.potentials,
                           outputs=((0, 0),) + tuple((c + 1, m) for c, m in plan.outputs), z_output=0,
                           force=tuple(f + 1 for f in plan.force), z_kernel=None)
            grid = replace(grid, plan=plan)
        self.grid = grid
        self.potentials = np.ascontiguousarray(convolve(grid, spread(grid, old, 0, n), workers).potentials)
        self.cells = near_cells(grid, old)
        self.columns = np.array([column for column, _ in plan.outputs], dtype=np.int64)
        self.maps = np.array([time_map for _, time_map in plan.outputs], dtype=np.int64)
        self.force = np.array(plan.force, dtype=np.int64)
        self.hi = grid.lo + grid.box_width * grid.n_boxes
        self.params = params
        self.workers = workers

    def z_old(self) -> float:
        """``Z_oo`` of the old map (one FFT pass, ``fft_repulsion``)."""
        return float(fft_repulsion(self.model, self.old, self.space_dims, self.params, workers=self.workers)[1])

    def add(self, X: np.ndarray, r0: int, r1: int, R: np.ndarray) -> float:
        """Add the old points' repulsion on new rows ``[r0, r1)`` of ``X`` (``(d, M)``) to ``R``
        (``(d, r1 - r0)``); return those rows' part of ``Z_on = sum_i sum_j w(x_i, y_j)``."""
        grid = self.grid
        block = X[:, r0:r1]
        inside = np.all((block >= grid.lo[:, None]) & (block <= self.hi[:, None]), axis=0)
        rows = np.flatnonzero(inside)
        z = 0.0
        if rows.size:
            grid_R = np.zeros((X.shape[0], r1 - r0))
            z += interpolate_rows(X, r0 + rows, r0, *grid._loop_args(grid.time_out), self.potentials,
                                  self.columns, self.maps, 0, grid.self_weight, self.force, grid_R)
            z += rows.size * grid.self_weight  # interpolate_rows removes a self pair a new point does not have
            R[:, rows] += grid_R[:, rows]
            if self.cells is not None:
                z += self._near(X[:, r0 + rows], rows, R)
        outside = np.flatnonzero(~inside)
        if outside.size:
            Xo = np.ascontiguousarray(X[:, r0 + outside])
            Ro = np.zeros((X.shape[0], outside.size))
            z += self.model.cross_repulsion(Xo, 0, outside.size, self.old, self.space_dims, False, Ro)
            R[:, outside] += Ro
        return float(z)

    def _near(self, Xin: np.ndarray, rows: np.ndarray, R: np.ndarray) -> float:
        """The near-field sums of the in-grid points ``Xin`` against the old points (split grid).  Only points
        whose cell lies in the old points' cell range are passed to ``near_rows`` (beyond it its cell keys
        would alias; such a point is more than a cell, >= the cutoff, from every old point: no near pairs)."""
        grid, cells, ds = self.grid, self.cells, self.space_dims
        index = np.floor((Xin[:ds] - grid.lo[:ds, None]) / cells.cell_size).astype(np.int64) + 1
        near = np.flatnonzero(np.all((index >= 0) & (index <= cells.n_cells[:, None] - 1), axis=0))
        if near.size == 0:
            return 0.0
        Xn = np.ascontiguousarray(Xin[:, near])
        Rn = np.zeros_like(Xn)
        neighbours = np.array(np.unravel_index(np.arange(3 ** ds), (3,) * ds), dtype=np.int64).T - 1
        sigma = float(grid.sigma) if np.isfinite(grid.sigma) else 0.0
        self_term = near_self_weight(grid.spec.near_pair, sigma)
        z = near_kernel(grid.spec.near_pair)(Xn, cells.sorted_coords, 0, near.size, ds,
                                             np.ascontiguousarray(grid.lo[:ds]), cells.cell_size, cells.n_cells,
                                             cells.sorted_keys, np.ascontiguousarray(neighbours), sigma, grid.cutoff,
                                             Rn)
        R[:, rows[near]] += Rn
        return float(z) + near.size * self_term  # near_rows removes a self pair a new point does not have
