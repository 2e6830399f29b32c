"""The spectral direction with its per-point state held where P's row blocks are (``scalemb.engine.held``).

``LineSearchDescent`` (``optim.descent``) runs this step rule where its solve is the matrix-free one a cluster runs:
Jacobi-preconditioned CG on row-block Laplacian products of the current iterate's curvature (``methods() ==
('cg', 'jacobi')``, ``curvature='iterate'``: ``solver='auto'`` from ``AUTO_LU_MAX_POINTS`` points, the schedule at
scale), on a Euclidean model without a point term, with one global time rate (``time_gains=None``; per-point time
gains run the client-side rule, whose arrays the executor keeps).  Coordinates, gradient, the momentum buffer / CG
warm start, the polish gains, the time step, the search direction, the line search's base point and the CG
vectors ``x, r, z, p, Ap`` are held arrays; every step is a row-block function (``optim.held_rows``) run where the
rows are (``HeldState.map``), and what crosses the client per iteration is scalars and d-vectors:

* the momentum (exaggeration) and polish steps: one ``map`` (the step, returning the new coordinates' column sums
  and extent) and the held evaluation; SNEST's polish time gain needs one more (its ``sum g_t . v``);
* the spectral step: the curvature at the held coordinates (``set_curvature``: its weights stay with the blocks,
  the diagonal's block sums come back for ``mu``); Jacobi-CG in Chronopoulos & Gear's one-reduction form
  (``solvers.pcg_one_reduction``), each iteration one ``laplacian``: the step ``p = u + beta p, s = w + beta s,
  x += a p, r -= a s, u = M r`` before the halo of ``u`` is exchanged worker to worker, the product ``w = L u +
  mu u`` and the partials of ``r . u``, ``w . u``, ``|r|^2`` by coordinate after it, in the same tasks (standard
  PCG needs a second round per iteration for ``r . z`` after its step); the bounded direction and the line
  search's slope one ``map`` each; every trial point one ``map`` and one evaluation.

Every reduction is the block partials summed in block order (the blocks are data-determined: the affinity store's
partitions), so the run is the same number whichever executor holds the rows and however many workers there are;
with one block every partial is today's whole-array expression, so the run is ``DescentRun``'s bit for bit.  The
arithmetic of each step is ``DescentRun``'s, restated by rows (see its methods for the reasons).
"""
import logging
from dataclasses import replace

import numpy as np

from ..engine.blocks import Evaluation
from ..engine.held import RowsExport, hold
from ..geometry import geometry_of
from . import held_rows
from .descent_steps import DescentState, guarded_solve, momentum_diverged, search_failed
from .linesearch import LineSearchResult
from .loop import HALT, KEPT, MOVED, StepRun
from .solvers import SetupInterrupted, cg_coefficients

logger = logging.getLogger("scalemb")

MAX_TRIALS = 30  # ``linesearch.armijo``'s


def held_mode(rule, executor, n_points: int) -> bool:
    """Whether ``rule`` runs as ``_HeldDescentRun`` on ``executor`` (module docstring)."""
    model = getattr(executor, "model", None)
    return (rule.direction == "spectral" and rule.methods(n_points) == ("cg", "jacobi") and rule.time_gains is None
            and rule.curvature == "iterate" and model is not None and getattr(model, "point_term", None) is None
            and geometry_of(executor).translates)


def initial_state(rule, coords: np.ndarray) -> DescentState:
    """``LineSearchDescent.initial_state`` without its evaluation (taken on the held rows: ``_HeldDescentRun``)."""
    coords = np.array(coords, dtype=np.float64, order="C")
    n_points = coords.shape[1]
    nan = float("nan")
    return DescentState(iteration=0, coords=coords, kl_history=np.zeros(0), seconds=np.zeros(0), evaluations=0,
                        elapsed=0.0, kl=nan, objective=nan, gradient=None, z=nan,
                        alpha=rule.exaggeration if rule.exaggeration_iterations > 0 else 1.0,
                        step=rule._initial_step(n_points), time_rate=rule._time_rate(n_points), previous_space=None,
                        previous_time_step=None, failures=0, factored_at=0, stale=True, ordering=None,
                        curvature_coords=None, curvature_alpha=None, factor_coords=None, factor_alpha=None,
                        factor_ordered=False)


def _sum(parts):
    """Block partials summed in block order, starting from the first (one block: that partial itself)."""
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


# (held name, DescentState field)
OPTIONAL = (("prev", "previous_space"), ("ptime", "previous_time_step"), ("gains", "gains"))
FIELDS = {"coords": "coords", "gradient": "gradient", **dict(OPTIONAL)}


class _HeldDescentRun(StepRun):
    """``DescentRun`` on held rows (module docstring).  The client keeps the scalars (``state``'s, with its arrays
    None while the rows are held) and which optional arrays are set (``has``: ``previous_space``,
    ``previous_time_step``, ``gains`` not None)."""
    recentres = False  # re-centred here, from the blocks' column sums

    def __init__(self, rule, executor, state: DescentState, resumed: bool, checkpoint, recipe=None):
        super().__init__(executor, state)
        self.rule = rule
        self.stall_start, self.window, self.tol = rule.exaggeration_iterations, rule.window, rule.tol
        self.n_points = state.coords.shape[1]
        self.dims = state.coords.shape[0]
        self.refactor_every = rule._refactor_every(self.n_points)
        self.methods = rule.methods(self.n_points)
        self.should_stop = getattr(checkpoint, "stop_requested", None)
        if not resumed:
            self.geometry.validate(state.coords, "the optimiser's start coordinates")
        # where ``rewind`` returns to after a lost worker: a state with its arrays, (with a checkpoint the workers
        # wrote) its scalars and ``("store", directory, digests, fields)``, or the start's scalars and ``("start",
        # recipe)`` (re-derived: the client keeps no O(N) copy).  The holder copies or sends the state's arrays
        # and ``_hold`` drops the state's references: a rescue with arrays shares them instead of copying.
        rescue = state.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed, share=True)
        if recipe is not None:
            for field in ("coords", "gradient", "previous_space", "previous_time_step", "gains"):
                setattr(rescue, field, None)
        self.rescue = (rescue, None if recipe is None else ("start", recipe))
        self.held = None
        self._hold(state)

    def _hold(self, state: DescentState, store=None) -> None:
        """Hold ``state``'s arrays (evaluating at its coordinates if it has no gradient: a fresh start), or with
        ``store = (directory, digests, fields)`` have the workers read them back from a checkpoint they wrote (and
        check them against the digests written); drop the client's copies."""
        if store is not None:
            directory, digests, fields = store
            if self.held.load_rows(directory, fields) != digests:
                raise RuntimeError(f"{directory}: the checkpoint read back differs from the one written; refusing "
                                   "to continue from it")
            self.has = {name: name in fields for name, _ in OPTIONAL}
        else:
            arrays = {"coords": state.coords}
            if state.gradient is not None:
                arrays["gradient"] = state.gradient
            self.has = {}
            for name, field in OPTIONAL:
                value = getattr(state, field)
                self.has[name] = value is not None
                if value is not None:
                    arrays[name] = value
            if self.held is None:
                self.held = hold(self.executor, arrays)
            else:
                self.held.recover(arrays)
        ds, dt = self.space_dims, self.dims - self.space_dims
        self.held.ensure({"prev": ds, "gains": ds, "ptime": dt, "dir": self.dims, "base": self.dims,
                          "bgrad": self.dims})
        self.solver_state = {"stale": True} if state.stale else {}
        if state.gradient is None and store is None:
            self.ev = self.held.evaluate(state.alpha, True, 0)
            state.evaluations += 1
            state.kl, state.objective, state.z = float(self.ev.kl), float(self.ev.objective), float(self.ev.z)
        else:
            self.ev = Evaluation(state.kl, state.objective, None, state.z)
        for field in ("coords", "gradient", "previous_space", "previous_time_step", "gains"):
            setattr(state, field, None)

    # --- the loop's hooks

    def coords(self) -> np.ndarray:
        return self.held.gather("coords")["coords"]

    def rewind(self) -> int:
        """Back to the last exported state (or the start), held again on the workers alive now: sent from the
        client, or read back by the workers from the checkpoint they wrote."""
        saved, source = self.rescue
        if source is not None and source[0] == "start":
            self.state = initial_state(self.rule, source[1]())
            self._hold(self.state)
            return int(saved.iteration)
        self.state = saved.snapshot(saved.iteration, saved.kl_history, saved.seconds, saved.elapsed)
        self._hold(self.state, None if source is None else source[1:])
        return int(saved.iteration)

    def rescue_iteration(self) -> int:
        return int(self.rescue[0].iteration)

    def held_rows(self):
        """The held arrays a checkpoint (or the final write) has their holders write (``remote`` holds only):
        coordinates, gradient and the optional arrays set now."""
        if not getattr(self.held, "remote", False):
            return None
        n, ds, dt = self.n_points, self.space_dims, self.dims - self.space_dims
        rows = {"coords": self.dims, "gradient": self.dims, "prev": ds, "ptime": dt, "gains": ds}
        names = ["coords", "gradient"] + [name for name, _ in OPTIONAL if self.has[name]]
        return RowsExport(self.held, {name: FIELDS[name] for name in names},
                          {FIELDS[name]: (rows[name], n) for name in names}, self._written)

    def _written(self, directory: str, digests: dict, state: DescentState) -> None:
        names = ["coords", "gradient"] + [name for name, _ in OPTIONAL if self.has[name]]
        light = state.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed)
        self.rescue = (light, ("store", directory, digests, {name: FIELDS[name] for name in names}))

    def _evaluate(self, alpha: float, iteration: int):
        """The held evaluation; its gradient's rows formed by the next ``map``'s tasks on Dask (one round trip
        fewer; the step rule reads the objective only, as ``DescentRun`` does)."""
        return self.held.evaluate(alpha, True, iteration, defer=True)

    def observe(self, it: int, history: np.ndarray) -> tuple[float, float]:
        """The evaluation the last step ended on (re-evaluated once when the exaggeration ends)."""
        r, s = self.rule, self.state
        if s.alpha != 1.0 and it >= r.exaggeration_iterations:
            s.alpha = 1.0
            if r.exaggeration_steps == "momentum":
                self.has["prev"] = False  # the momentum buffer is no warm start for the solve
            self.solver_state["stale"] = True
            self.ev = self._evaluate(s.alpha, it)
            s.evaluations += 1
            s.step = r._initial_step(self.n_points)
        return self.ev.kl, self.ev.kl

    def advance(self, it: int) -> str:
        r = self.rule
        if r.exaggeration_steps == "momentum" and it < r.exaggeration_iterations:
            return self._momentum_step(it)
        polishing = r.spectral_iterations is not None and it >= r.exaggeration_iterations + r.spectral_iterations
        if polishing:
            since = it - r.exaggeration_iterations - r.spectral_iterations
            if not (r.polish_spectral_every and since > 0 and since % r.polish_spectral_every == 0):
                return self._polish_step(it)
            self.has["prev"] = False  # the momentum buffer is no warm start for the solve
        return self._spectral_step(it, polishing)

    # --- the spectral step

    def _spectral_step(self, it: int, polishing: bool) -> str:
        r, s, ds = self.rule, self.state, self.space_dims

        final = guarded_solve(self, it, lambda: self._solve(s.alpha))
        # the solve's last step, then its x: the next warm start (zeros inside the polish phase), bounded into the
        # direction
        parts = self.held.map(held_rows.step_then_direction, final, ds, self.geometry, polishing, r.max_point_step,
                              self.has["ptime"])
        self.has["prev"] = True
        if r.max_point_step is not None and not _sum([p[0] for p in parts]) < 0:
            self.held.map(held_rows.gradient_direction, ds, r.max_point_step)
        if self.dims > ds and self.has["ptime"]:
            s.time_rate *= 1.2 if _sum([p[1] for p in parts]) < 0 else 0.5
        result = self._armijo(it, s.step, s.time_rate)
        s.evaluations += result.trials
        if not result.accepted:
            self.has["prev"] = False
            return search_failed(self, it)
        s.failures = 0
        if self.dims > ds:  # (inside the polish phase no momentum buffer for its time steps)
            if polishing:
                self.has["ptime"] = False
            else:
                self.held.map(held_rows.time_step, ds, result.step)
                self.has["ptime"] = True
        s.step = min(result.step * (r.growth if result.trials == 1 else 1.0), r._max_step())
        self.ev = result.evaluation
        self._recentre(result.coords)
        return MOVED

    def _solve(self, alpha: float):
        """``_spectral`` for ``('cg', 'jacobi')`` and the current iterate's curvature: the weights at the held
        coordinates, ``mu`` from the diagonal's mean, then ``pcg_one_reduction`` on held vectors (its arithmetic,
        by rows): each iteration's step, ``u = M r`` and product in one ``laplacian`` round, whose partials are
        all its reductions; the solution held as ``x``.  The tolerance is the rule's forcing term, from the space
        gradient's norm with ``cg_tol='auto'`` (its partials come back with the curvature's, from the same tasks).
        The last step, which needs no product (the iteration limit reached), is returned as ``cg1_step``'s
        arguments, for the caller's next map to take first (``held_rows.step_then_direction``); None when the
        solve ended on a product (``x`` is then the solution)."""
        r, solver_state, ds = self.rule, self.solver_state, self.space_dims
        solver_state.pop("stale", False)
        if r.cg_tol == "auto":
            parts = self.held.set_curvature(alpha, False, after=(held_rows.space_square, (ds,)))
            sums, norm = [p[0] for p in parts], float(np.sqrt(_sum([p[1] for p in parts])))
        else:
            sums, norm = self.held.set_curvature(alpha, False), None
        tol = r._forcing_from_norm(self.state, norm, self.methods[1])
        mu = r.mu * float(_sum(sums) / self.n_points)
        solver_state["mu"] = mu
        self.held.ensure({"x": ds, "r": ds, "u": ds, "w": ds, "p": ds, "s": ds, "invd": 1})
        if self.has["prev"]:  # warm: r = rhs - (L x + mu x) needs a product of its own (L x held in w)
            self.held.laplacian("x", "w", before=(held_rows.cg_warm, (ds, mu)),
                                after=(held_rows.cg1_start, (ds, mu, True)))
            parts = self.held.laplacian("u", "w", after=(held_rows.cg1_product, (ds, mu, True)))
        else:
            parts = self.held.laplacian("u", "w", before=(held_rows.cg1_start, (ds, mu, False)),
                                        after=(held_rows.cg1_product, (ds, mu, True)))
        gamma, delta = _sum([p[0] for p in parts]), _sum([p[1] for p in parts])
        rhs_norm = np.maximum(np.sqrt(_sum([p[3] for p in parts])), np.finfo(float).tiny)
        residual = np.sqrt(_sum([p[2] for p in parts])) / rhs_norm
        maxiter = r._cg_maxiter("jacobi")
        it, step, gamma_old = 0, None, None
        while it < maxiter and residual.max() > tol:
            if self.should_stop is not None and self.should_stop():
                raise SetupInterrupted("stop requested during the CG solve")
            first = gamma_old is None
            step, beta = cg_coefficients(gamma, delta, gamma_old, step)
            it += 1
            if it < maxiter:  # the step and the next product in one round (a product wasted if r is now small)
                parts = self.held.laplacian("u", "w", before=(held_rows.cg1_step, (step, beta, first)),
                                            after=(held_rows.cg1_product, (ds, mu, False)))
                gamma_old = gamma
                gamma, delta = _sum([p[0] for p in parts]), _sum([p[1] for p in parts])
                residual = np.sqrt(_sum([p[2] for p in parts])) / rhs_norm
            else:
                return step, beta, first
        return None

    def _armijo(self, it: int, step: float, time_rate: float) -> LineSearchResult:
        """``linesearch.armijo`` on the held direction (``dir``; its time rows ``-time_rate g_t`` formed here)
        from the held point, whose coordinates and gradient are kept as ``base``/``bgrad`` for the trials and
        put back if none passes.  The accepted result's ``coords`` are the trial's column sums and extent."""
        r, s, ds = self.rule, self.state, self.space_dims
        current = self.ev
        # the slope and the first trial point in one map (the trial undone if the slope is no descent)
        moved = self.held.map(held_rows.slope_trial, ds, self.geometry, time_rate, step)
        slope = float(_sum([p[0] for p in moved]))
        if not slope < 0:
            self.held.map(held_rows.restore)
            return LineSearchResult(None, current, 0.0, 0, False)
        for trial in range(1, MAX_TRIALS + 1):
            if trial > 1:
                moved = self.held.map(held_rows.trial, self.geometry, step)
            self._hint(moved)
            ev = self._evaluate(s.alpha, it + 1)
            if np.isfinite(ev.objective) and ev.objective <= current.objective + r.c * step * slope:
                return LineSearchResult(moved, ev, step, trial, True)
            step *= r.rho
        self.held.map(held_rows.restore)
        return LineSearchResult(None, current, 0.0, MAX_TRIALS, False)

    # --- the momentum and polish steps

    def _momentum_step(self, it: int) -> str:
        """``DescentRun._momentum_step`` by rows."""
        r, s = self.rule, self.state
        scale = getattr(getattr(self.executor, "model", None), "learning_rate_scale", 1.0)
        rate = -max(1.0, self.n_points / 12.0) * scale
        parts = self.held.map(held_rows.momentum, self.space_dims, self.geometry, rate, r.exaggeration_momentum,
                              self.has["prev"], r.max_point_step, s.time_rate)
        return self._moved(it, parts, None)

    def _polish_step(self, it: int) -> str:
        """``DescentRun._polish_step`` by rows."""
        r, s, ds = self.rule, self.state, self.space_dims
        if not self.has["gains"]:
            self.held.map(held_rows.unit_gains)
            self.has["gains"] = True
            self.has["prev"] = False
            self.has["ptime"] = False
            s.polish_time_rate = r._time_rate(self.n_points)
        time_step = None
        if self.dims > ds:
            if s.polish_time_rate is None:
                s.polish_time_rate = r._time_rate(self.n_points)
            if not self.has["ptime"]:
                s.time_gain, time_step = 1.0, ("first", s.polish_time_rate)
            else:
                agree = float(_sum(self.held.map(held_rows.time_dot, ds, self.geometry))) < 0
                s.time_gain = s.time_gain + 0.2 if agree else max(s.time_gain * 0.8, 0.01)
                time_step = ("momentum", r.polish_momentum, s.polish_time_rate * s.time_gain)
        scale = getattr(getattr(self.executor, "model", None), "learning_rate_scale", 1.0)
        rate = max(1.0, self.n_points / 12.0) * scale
        parts = self.held.map(held_rows.polish, ds, self.geometry, rate, r.polish_momentum, self.has["prev"],
                              r.max_point_step, s.time_rate, time_step)
        self.has["prev"] = True
        return self._moved(it, parts, time_step)

    def _moved(self, it: int, parts: list, time_step) -> str:
        """``DescentRun._momentum_move`` after the move (taken by ``parts``' map): evaluate, undo a diverged one."""
        r, s = self.rule, self.state
        self._hint(parts)
        ev = self._evaluate(s.alpha, it + 1)
        s.evaluations += 1
        if momentum_diverged(s, it, ev, self.ev):
            self.has["prev"] = self.has["ptime"] = False
            self.held.map(held_rows.restore)
            return HALT if s.failures >= r.max_failures else KEPT
        s.failures = 0
        self.has["prev"] = True
        if time_step is not None:
            self.has["ptime"] = True
        self.ev = ev
        self._recentre(parts)
        return MOVED

    def _hint(self, parts: list) -> None:
        lo = np.minimum.reduce([p[-2] for p in parts])
        hi = np.maximum.reduce([p[-1] for p in parts])
        self.held.extent_hint(lo, hi)

    def _recentre(self, parts: list) -> None:
        """``Euclidean.recentre`` of the new coordinates from the blocks' column sums (``parts``, in block order):
        one block gives ``coords.mean(axis=1)`` bit for bit."""
        total = np.zeros(self.dims)
        for part in parts:
            total += part[-3]
        mean = total / self.n_points
        self.held.shift(mean)
        lo = np.minimum.reduce([p[-2] for p in parts])
        hi = np.maximum.reduce([p[-1] for p in parts])
        self.held.extent_hint(lo - mean, hi - mean)

    # --- the end

    def final_kl(self, it: int, converged: bool, stopped: bool) -> float:
        """The last evaluation's KL, or one without exaggeration if it was on (not counted; the held gradient is
        the exaggerated one's, as ``export`` writes)."""
        if self.state.alpha == 1.0:
            return self.ev.kl
        self.held.map(held_rows.keep_gradient)
        kl = self._evaluate(1.0, it).kl
        self.held.map(held_rows.restore_gradient)
        return kl

    def export(self, it: int, history: np.ndarray, seconds: np.ndarray, elapsed: float,
               light: bool = False) -> DescentState:
        """The state at the start of ``it``, its arrays gathered from their holders, or with ``light`` left None (a
        checkpoint or final write whose rows the workers write: ``held_rows``)."""
        s = self.state
        if light:
            arrays = {}
        else:
            names = ["coords", "gradient"] + [name for name, _ in OPTIONAL if self.has[name]]
            arrays = self.held.gather(*names)
            s.coords = arrays["coords"]
        full = replace(s, coords=arrays.get("coords"), gradient=None,
                       **{field: arrays.get(name) for name, field in OPTIONAL})
        ev = Evaluation(self.ev.kl, self.ev.objective, arrays.get("gradient"), self.ev.z)
        exported = full.export(it, history, seconds, elapsed, ev, self.solver_state)
        if not light:
            self.rescue = (exported, None)
        return exported

    def close(self) -> None:
        self.held.close()
