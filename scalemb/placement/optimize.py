"""Start and optimisation of the new points (the old ones never move).

Start: each new point at the weighted median (per coordinate, weights ``p_ij``) of its old neighbours
(openTSNE's ``initialization="median"``, robust to a neighbour far away in the map); new points with only new
neighbours take, round by round, the weighted median of their already placed neighbours; points whose
component of the new edges reaches no old point ("unattached") are placed by ``UNATTACHED_RULE``.  A jitter
of ``1e-3`` times the old map's spread separates points that start at the same place (their mutual force is
zero there): the space coordinates' mean standard deviation in space, each time coordinate's own in time (a
time jitter at the space scale, ~10 units on GrQc's maps, would start SNEST's ``exp(|Δt|²)`` at ~e^100).

Optimisation: descent along ``-G_i / (h_i + mu)`` per point, ``h_i`` the diagonal of the attractive partial
Hessian (the Jacobi form of the spectral direction of Vladymyrov & Carreira-Perpinan 2012: with old
neighbours only, each new point's block of L(C) is that diagonal), with a backtracking Armijo line search on
the whole map's KL (``optim.linesearch.armijo``), so the KL never increases.  Time coordinates (SNEST) have a
concave attractive term: their direction is the same scaled gradient times ``time_ratio`` (the SNEST paper's
smaller time rate).  ``direction="spectral"`` solves ``(B + mu I) D = -G`` instead, ``B = diag(h) - C_nn``
the attractive partial Hessian of the moving points with the fixed map as boundary
(``PlacementObjective.curvature_matrix``): the spectral direction proper, which moves points joined by edges
together (a freed region of the stored map, a component of new points) where Jacobi moves each alone; with no
edge among the moving points (kNN placement) it is the Jacobi direction.  Stops after ``iterations`` or when
the KL fell by less than ``tol`` (relative to the KL,
per iteration, averaged over the last ``window`` iterations).

Exaggeration: the descent minimises ``KL - (alpha - 1) sum_(new rows) p_ij log w_ij``, the attraction of the new
rows' affinities times ``alpha``: ``exaggeration`` for the first ``exaggeration_iterations``, then
``final_exaggeration`` (module constants; openTSNE's ``transform`` keeps 1.5 throughout).  Why: a new point's place
is ranked against stored points that were laid out without it; the stronger pull draws it (and, in a free
phase, its freed neighbours) into its neighbours' midst, which is what neighbourhood preservation counts, at a
small cost in KL.  Measured on GrQc and a generated co-authorship graph (docs/design/placement.md).  Maps with
time coordinates are never exaggerated (SNEST on GrQc: the new points' time coordinates diverged).
"""
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from numba import njit

from ..optim.base import OptimizerState, stalled
from ..optim.linesearch import armijo
from ..optim.loop import CONVERGED, KEPT, MOVED, StepRun, run_loop

DIRECTIONS = ("jacobi", "spectral")
# the attraction of the new rows' affinities: x EXAGGERATION for the first EXAGGERATION_ITERATIONS, then x
# FINAL_EXAGGERATION (maps without time coordinates; docs/design/placement.md)
EXAGGERATION = 4.0
EXAGGERATION_ITERATIONS = 50
FINAL_EXAGGERATION = 1.5
# new feature rows (kNN references): x KNN_FINAL_EXAGGERATION after the first phase instead.  A new row of P' holds
# only its own conditional affinities, p_j|i / (2 N'), summing to 1 / (2 N'); the fitted neighbour lists stay
# as they were, so the reverse half p_i|j / (2 N') that a re-embedding's symmetrised row would add is missing,
# while a stored row sums to 1 / N' on average.  x2 gives the new rows the attraction mass a re-embedding would,
# the reverse half approximated by the row's own (kNN relations are mostly mutual) (docs/design/placement.md)
KNN_FINAL_EXAGGERATION = 2.0
ITERATIONS = 300  # iterations at most (the stall test ``tol`` usually stops the descent first)
TIME_STEPS = ("joint", "separate")
UNATTACHED_RULE = ("a component of new points with no edge path to the stored map starts at one random point "
                   "of the circle (sphere) of 1.1 times the map's largest radius around its centre, time "
                   "coordinates at the map's mean, and is then optimised like the others")


@njit(cache=True)
def _weighted_median(values, weights):
    order = np.argsort(values)
    half = 0.5 * weights.sum()
    acc = 0.0
    for k in order:
        acc += weights[k]
        if acc >= half:
            return values[k]
    return values[order[-1]]


@njit(cache=True)
def _median_rows(indptr, indices, data, coords, known, out, done):
    """For each row not ``done`` with at least one ``known`` neighbour: per coordinate weighted median of the
    known neighbours' ``coords`` (``(d, n)``) into ``out[:, row]``; returns the rows placed."""
    placed = 0
    for row in range(indptr.shape[0] - 1):
        if done[row]:
            continue
        lo, hi = indptr[row], indptr[row + 1]
        count = 0
        for idx in range(lo, hi):
            if known[indices[idx]]:
                count += 1
        if count == 0:
            continue
        values = np.empty(count)
        weights = np.empty(count)
        for k in range(coords.shape[0]):
            c = 0
            for idx in range(lo, hi):
                j = indices[idx]
                if known[j]:
                    values[c] = coords[k, j]
                    weights[c] = data[idx]
                    c += 1
            out[k, row] = _weighted_median(values, weights)
        done[row] = True
        placed += 1
    return placed


def initial_positions(new_rows: sp.csr_matrix, old: np.ndarray, space_dims: int, seed: int = 0):
    """Start of the new points, ``(d, M)``, and the number of unattached ones (module docstring).
    ``new_rows``: the new rows of ``P'`` (``M x (N + M)``, old columns first); ``old``: ``(d, N)``."""
    n = old.shape[1]
    m = new_rows.shape[0]
    d = old.shape[0]
    rng = np.random.default_rng([seed, 7])
    rows = sp.csr_matrix(new_rows)
    indptr, indices, data = rows.indptr.astype(np.int64), rows.indices.astype(np.int64), rows.data
    coords = np.concatenate([old, np.zeros((d, m))], axis=1)
    known = np.concatenate([np.ones(n, dtype=np.bool_), np.zeros(m, dtype=np.bool_)])
    done = np.zeros(m, dtype=np.bool_)
    out = np.zeros((d, m))
    while True:  # round by round: old neighbours first, then placed new ones
        before = done.copy()
        if _median_rows(indptr, indices, data, coords, known, out, done) == 0:
            break
        fresh = done & ~before
        coords[:, n:][:, fresh] = out[:, fresh]
        known[n:] = done
    unattached = np.flatnonzero(~done)
    if unattached.size:
        # one start per connected component of the new-new edges
        E = rows[:, n:][unattached][:, unattached]
        _, labels = sp.csgraph.connected_components(E, directed=False)
        ds = space_dims
        centre = old.mean(axis=1)
        radius = 1.1 * float(np.sqrt(((old[:ds] - centre[:ds, None]) ** 2).sum(axis=0)).max()) + 1.0
        for label in range(labels.max() + 1):
            direction = rng.standard_normal(ds)
            direction /= np.linalg.norm(direction)
            start = centre.copy()
            start[:ds] += radius * direction
            out[:, unattached[labels == label]] = start[:, None]
    std = old.std(axis=1)
    spread = np.empty(d)  # per coordinate kind: the space spread, and each time coordinate's own
    spread[:space_dims] = float(std[:space_dims].mean()) or 1.0
    spread[space_dims:] = np.where(std[space_dims:] > 0, std[space_dims:], 1.0)
    out += 1e-3 * spread[:, None] * rng.standard_normal(out.shape)
    return out, int(unattached.size)


@dataclass
class PlacementRun:
    """The placed coordinates ``(d, M)``, the whole map's KL after each iteration (entry 0: the start)."""

    coords: np.ndarray
    kl: float
    kl_history: np.ndarray
    iterations: int
    converged: bool
    seconds: float
    evaluations: int = 0
    settings: dict = field(default_factory=dict)
    moved: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # stored rows freed
    moved_coords: np.ndarray | None = None  # their new coordinates, ``(d, len(moved))``


@dataclass
class PlacementOptimizer:
    """Preconditioned descent of the new points (module docstring)."""

    iterations: int | None = None  # None: ITERATIONS (PRE_FREE_ITERATIONS before a free phase: placement.place)
    tol: float = 1e-5
    window: int = 10
    mu: float = 1e-3
    time_ratio: float = 0.01
    growth: float = 1.2
    max_step: float = 4.0
    c: float = 1e-4
    rho: float = 0.5
    exaggeration: float | None = None  # None: EXAGGERATION (1.0 with time coordinates)
    exaggeration_iterations: int | None = None  # None: EXAGGERATION_ITERATIONS (0 with time coordinates)
    direction: str = "jacobi"
    time_step: str = "joint"
    final_exaggeration: float | None = None  # None: FINAL_EXAGGERATION (1.0 with time coordinates)

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"placement direction must be one of {', '.join(DIRECTIONS)}, got {self.direction!r}")
        if self.iterations is not None and self.iterations < 1:
            raise ValueError(f"placement iterations must be >= 1, got {self.iterations}")
        if self.time_step not in TIME_STEPS:
            raise ValueError(f"placement time_step must be one of {', '.join(TIME_STEPS)}, got {self.time_step!r}")

    def resolved(self, with_time: bool) -> "PlacementOptimizer":
        """This rule with the exaggeration defaults filled in for a map with (``with_time``) or without time
        coordinates; ``ValueError`` for an exaggeration asked of a map with time coordinates (SNEST on GrQc:
        the new points' time coordinates diverged)."""
        import dataclasses

        if with_time:
            if (self.exaggeration not in (None, 1.0) and self.exaggeration_iterations) or \
                    self.final_exaggeration not in (None, 1.0):
                raise ValueError("an exaggerated placement is not supported for models with time coordinates "
                                 "(SNEST on GrQc: the new points' time coordinates diverged)")
            defaults = (1.0, 0, 1.0)
        else:
            defaults = (EXAGGERATION, EXAGGERATION_ITERATIONS, FINAL_EXAGGERATION)
        given = (self.exaggeration, self.exaggeration_iterations, self.final_exaggeration)
        ex, its, final = (d if g is None else g for g, d in zip(given, defaults))
        return dataclasses.replace(self, exaggeration=float(ex), exaggeration_iterations=int(its),
                                   final_exaggeration=float(final),
                                   iterations=ITERATIONS if self.iterations is None else int(self.iterations))

    def params(self) -> dict:
        return {"optimizer": f"placement-{self.direction}", "iterations": self.iterations, "tol": self.tol,
                "window": self.window, "mu": self.mu, "time_ratio": self.time_ratio, "growth": self.growth,
                "max_step": self.max_step, "exaggeration": self.exaggeration,
                "exaggeration_iterations": self.exaggeration_iterations,
                "final_exaggeration": self.final_exaggeration, "time_step": self.time_step}

    def optimize(self, objective, X0: np.ndarray, space_dims: int, callback=None) -> PlacementRun:
        """Place from ``X0`` (``(d, M)``); ``callback(it, kl)`` at the start of every iteration (the KL after
        ``it`` steps).  The iterations are ``optim.loop.run_loop``'s (no re-centring: the old points are fixed);
        converged: the stall test held (also after the last iteration) or no step along the direction lowered
        the KL."""
        rule = self.resolved(X0.shape[0] > space_dims)
        start = time.perf_counter()
        X = np.array(X0, dtype=np.float64, order="C")
        alpha = rule.exaggeration if rule.exaggeration_iterations > 0 else rule.final_exaggeration
        ev = objective.evaluate(X, alpha)
        state = PlacementState(iteration=0, coords=X, kl_history=np.zeros(0), seconds=np.zeros(0), evaluations=1,
                               elapsed=0.0, alpha=alpha, step=1.0)
        run = run_loop(_PlacementRun(rule, objective, state, ev, space_dims), rule.iterations, callback=callback)
        converged = run.converged or (run.iterations == rule.iterations and stalled(
            run.kl_history, run.iterations, rule.exaggeration_iterations, rule.window, rule.tol))
        return PlacementRun(run.coords, run.kl, run.kl_history, run.iterations, converged,
                            time.perf_counter() - start, run.evaluations, rule.params())


@dataclass
class PlacementState(OptimizerState):
    """Placement between iterations: the exaggeration in force and the next first trial step."""

    alpha: float
    step: float
    time_step: float = 1.0  # the next first trial step of the time coordinates (``time_step="separate"``)


class _PlacementRun(StepRun):
    """The preconditioned descent of the new points as a step rule of ``run_loop`` (module docstring).  The
    direction ``-G_i / (h_i + mu)`` is Newton-like (a diagonal partial Hessian), so, as the spectral direction,
    it takes the Euclidean gradient; trial points go through the geometry's ``retract``."""

    recentres = False  # a translation of the new points alone moves them against the fixed map

    def __init__(self, rule: PlacementOptimizer, objective, state: PlacementState, ev, space_dims: int):
        super().__init__(objective, state)
        self.space_dims = space_dims
        self.rule, self.ev = rule, ev
        self.stall_start, self.window, self.tol = rule.exaggeration_iterations, rule.window, rule.tol

    def evaluate(self, coords, exaggeration, iteration, with_kl=True):
        """The placement objective (the whole map's KL; it has no iteration-dependent terms)."""
        return self.executor.evaluate(coords, exaggeration)

    def observe(self, it: int, history: np.ndarray) -> tuple[float, float]:
        r, s = self.rule, self.state
        if s.alpha != r.final_exaggeration and it >= r.exaggeration_iterations:
            s.alpha, s.step = r.final_exaggeration, 1.0
            self.ev = self.evaluate(s.coords, s.alpha, it)
            s.evaluations += 1
        return self.ev.kl, self.ev.kl

    def advance(self, it: int) -> str:
        r, s, alpha = self.rule, self.state, self.state.alpha
        if r.direction == "spectral":
            B = self.executor.curvature_matrix(s.coords, alpha)
            h = B.diagonal()
            shift = r.mu * (h.mean() if h.size and h.mean() > 0 else 1.0)
            if B.nnz > B.shape[0]:  # coupled moving points: solve (B + shift I) D = -G^T
                # SPD: a symmetric minimum-degree ordering and no pivoting (4x less fill than COLAMD on GrQc)
                solve = spla.splu((B + shift * sp.identity(B.shape[0])).tocsc(), permc_spec="MMD_AT_PLUS_A",
                                  diag_pivot_thresh=0.0, options={"SymmetricMode": True}).solve
                direction = -np.ascontiguousarray(solve(np.ascontiguousarray(self.ev.gradient.T)).T)
            else:  # no edge among the moving points: B is diagonal, the Jacobi direction
                direction = -self.ev.gradient * (1.0 / (h + shift))[None, :]
        else:
            h = self.executor.curvature_diagonal(s.coords, alpha)
            scale = 1.0 / (h + r.mu * (h.mean() if h.size and h.mean() > 0 else 1.0))
            direction = -self.ev.gradient * scale[None, :]
        direction[self.space_dims:] *= r.time_ratio
        if r.time_step == "separate" and direction.shape[0] > self.space_dims:
            return self._separate(it, alpha, direction)
        result = armijo(lambda x: self.evaluate(x, alpha, it + 1), s.coords, direction, self.ev, s.step, r.c, r.rho,
                        retract=self.geometry.retract)
        s.evaluations += result.trials
        if not result.accepted and alpha != r.final_exaggeration:  # the early phase is over early
            s.alpha, s.step = r.final_exaggeration, 1.0
            self.ev = self.evaluate(s.coords, s.alpha, it + 1)
            s.evaluations += 1
            return KEPT
        if not result.accepted:
            return CONVERGED  # no descent along the scaled gradient: a stationary point to the tolerance
        s.step = min(result.step * (r.growth if result.trials == 1 else 1.0), r.max_step)
        s.coords, self.ev = result.coords, result.evaluation
        return MOVED

    def _separate(self, it: int, alpha: float, direction: np.ndarray) -> str:
        """``time_step="separate"``: one Armijo search along the space rows of ``direction``, then one along
        the time rows of the direction at the new point, each with its own step memory (one step length for
        both lets a poor time direction cut the space step, and the reverse)."""
        r, s, ds = self.rule, self.state, self.space_dims
        moved = False
        for rows, attr in ((slice(0, ds), "step"), (slice(ds, None), "time_step")):
            part = np.zeros_like(direction)
            if rows.start == 0:
                part[rows] = direction[rows]
            else:  # the time direction at the point the space search reached
                h = self.executor.curvature_diagonal(s.coords, alpha)
                scale = 1.0 / (h + r.mu * (h.mean() if h.size and h.mean() > 0 else 1.0))
                part[rows] = -self.ev.gradient[rows] * scale[None, :] * r.time_ratio
            result = armijo(lambda x: self.evaluate(x, alpha, it + 1), s.coords, part, self.ev, getattr(s, attr),
                            r.c, r.rho, retract=self.geometry.retract)
            s.evaluations += result.trials
            if result.accepted:
                moved = True
                setattr(s, attr, min(result.step * (r.growth if result.trials == 1 else 1.0), r.max_step))
                s.coords, self.ev = result.coords, result.evaluation
        if not moved and alpha != r.final_exaggeration:
            s.alpha, s.step, s.time_step = r.final_exaggeration, 1.0, 1.0
            self.ev = self.evaluate(s.coords, s.alpha, it + 1)
            s.evaluations += 1
            return KEPT
        return MOVED if moved else CONVERGED

    def final_kl(self, it: int, converged: bool, stopped: bool) -> float:
        return self.ev.kl
