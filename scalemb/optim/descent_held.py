"""The spectral direction with its per-point state held where P's row blocks are (``scalemb.engine.held``).

``LineSearchDescent`` (``optim.descent``) runs this step rule where its solve is the matrix-free one a cluster runs:
Jacobi-preconditioned CG on row-block Laplacian products of the current iterate's curvature (``methods() ==
('cg', 'jacobi')``, ``curvature='iterate'``: ``solver='auto'`` from ``AUTO_LU_MAX_POINTS`` points, the schedule at
scale), on a Euclidean model without a point term, with one global time rate (``time_gains=None``; per-point time
gains run the client-side rule, whose arrays the executor keeps).  Coordinates, gradient, the momentum buffer / CG
warm start, the polish gains, the time step, the search direction, the line search's base point and the CG
vectors ``x, r, z, p, Ap`` are held arrays; every step is a row-block function run where the rows are
(``HeldState.map``), and what crosses the client per iteration is scalars and d-vectors:

* the momentum (exaggeration) and polish steps: one ``map`` (the step, returning the new coordinates' column sums
  and extent) and the held evaluation; SNEST's polish time gain needs one more (its ``sum g_t . v``);
* the spectral step: the curvature at the held coordinates (``set_curvature``: its weights stay with the blocks,
  the diagonal's block sums come back for ``mu``); PCG with each Laplacian product one ``laplacian`` (the halo of
  ``p`` exchanged worker to worker, ``p``'s update ``z + beta p`` and ``p . Ap`` in the same tasks) and each step
  ``x += a p, r -= a Ap, z = M r`` one ``map`` returning ``r . z`` and ``|r|^2`` by coordinate; the bounded
  direction and the line search's slope one ``map`` each; every trial point one ``map`` and one evaluation.

Every reduction is the block partials summed in block order (the blocks are data-determined: the affinity store's
partitions), so the run is the same number whichever executor holds the rows and however many workers there are;
with one block every partial is today's whole-array expression, so the run is ``_DescentRun``'s bit for bit.  The
arithmetic of each step is ``_DescentRun``'s, restated by rows (see its methods for the reasons).
"""
import logging
from dataclasses import replace

import numpy as np

from ..engine.blocks import Evaluation
from ..engine.held import RowsExport, hold
from ..geometry import geometry_of
from .dbd import clip_step_norms, gains_update
from .descent import DescentState, guarded_solve, momentum_diverged, search_failed
from .linesearch import LineSearchResult
from .loop import HALT, KEPT, MOVED, StepRun
from .solvers import SetupInterrupted

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
    """``_DescentRun`` on held rows (module docstring).  The client keeps the scalars (``state``'s, with its arrays
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
        fewer; the step rule reads the objective only, as ``_DescentRun`` does)."""
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

        def solve():
            norm = float(np.sqrt(_sum(self.held.map(_space_square, ds)))) if r.cg_tol == "auto" else None
            self._solve(s.alpha, r._forcing_from_norm(s, norm, self.methods[1]))

        guarded_solve(self, it, solve)
        # the solve's x: the next warm start (zeros inside the polish phase), bounded into the direction
        parts = self.held.map(_direction, ds, self.geometry, polishing, r.max_point_step, self.has["ptime"])
        self.has["prev"] = True
        if r.max_point_step is not None and not _sum([p[0] for p in parts]) < 0:
            self.held.map(_gradient_direction, ds, r.max_point_step)
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
                self.held.map(_time_step, ds, result.step)
                self.has["ptime"] = True
        s.step = min(result.step * (r.growth if result.trials == 1 else 1.0), r._max_step())
        self.ev = result.evaluation
        self._recentre(result.coords)
        return MOVED

    def _solve(self, alpha: float, tol: float) -> None:
        """``_spectral`` for ``('cg', 'jacobi')`` and the current iterate's curvature: the weights at the held
        coordinates, ``mu`` from the diagonal's mean, then ``pcg`` on held vectors (its arithmetic, by rows), the
        solution held as ``x``."""
        r, solver_state, ds = self.rule, self.solver_state, self.space_dims
        solver_state.pop("stale", False)
        mu = r.mu * float(_sum(self.held.set_curvature(alpha, False)) / self.n_points)
        solver_state["mu"] = mu
        self.held.ensure({"x": ds, "r": ds, "z": ds, "p": ds, "Ap": ds, "invd": 1})
        warm = self.has["prev"]
        if warm:  # r = rhs - (L x + mu x)
            parts = self.held.laplacian("x", "Ap", before=(_cg_warm, (ds, mu)), after=(_cg_start, (ds, mu, True)))
        else:
            parts = self.held.map(_cg_cold, ds, mu)
        rz = _sum([p[0] for p in parts])
        rr = _sum([p[1] for p in parts])
        rhs_norm = np.maximum(np.sqrt(_sum([p[2] for p in parts])), np.finfo(float).tiny)
        maxiter = r._cg_maxiter("jacobi")
        it = 0
        residual = np.sqrt(rr) / rhs_norm
        beta = None
        while it < maxiter and residual.max() > tol:
            if self.should_stop is not None and self.should_stop():
                raise SetupInterrupted("stop requested during the CG solve")
            pap = _sum(self.held.laplacian("p", "Ap", before=None if beta is None else (_cg_direction, (beta,)),
                                           after=(_cg_product, (mu,))))
            step = np.where(pap > 0, rz / np.where(pap > 0, pap, 1.0), 0.0)
            parts = self.held.map(_cg_step, step)
            rz_new = _sum([p[0] for p in parts])
            beta = np.where(rz > 0, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
            rz = rz_new
            it += 1
            residual = np.sqrt(_sum([p[1] for p in parts])) / rhs_norm

    def _armijo(self, it: int, step: float, time_rate: float) -> LineSearchResult:
        """``linesearch.armijo`` on the held direction (``dir``; its time rows ``-time_rate g_t`` formed here)
        from the held point, whose coordinates and gradient are kept as ``base``/``bgrad`` for the trials and
        put back if none passes.  The accepted result's ``coords`` are the trial's column sums and extent."""
        r, s, ds = self.rule, self.state, self.space_dims
        current = self.ev
        # the slope and the first trial point in one map (the trial undone if the slope is no descent)
        moved = self.held.map(_slope_trial, ds, self.geometry, time_rate, step)
        slope = float(_sum([p[0] for p in moved]))
        if not slope < 0:
            self.held.map(_restore)
            return LineSearchResult(None, current, 0.0, 0, False)
        for trial in range(1, MAX_TRIALS + 1):
            if trial > 1:
                moved = self.held.map(_trial, self.geometry, step)
            self._hint(moved)
            ev = self._evaluate(s.alpha, it + 1)
            if np.isfinite(ev.objective) and ev.objective <= current.objective + r.c * step * slope:
                return LineSearchResult(moved, ev, step, trial, True)
            step *= r.rho
        self.held.map(_restore)
        return LineSearchResult(None, current, 0.0, MAX_TRIALS, False)

    # --- the momentum and polish steps

    def _momentum_step(self, it: int) -> str:
        """``_DescentRun._momentum_step`` by rows."""
        r, s = self.rule, self.state
        scale = getattr(getattr(self.executor, "model", None), "learning_rate_scale", 1.0)
        rate = -max(1.0, self.n_points / 12.0) * scale
        parts = self.held.map(_momentum, self.space_dims, self.geometry, rate, r.exaggeration_momentum,
                              self.has["prev"], r.max_point_step, s.time_rate)
        return self._moved(it, parts, None)

    def _polish_step(self, it: int) -> str:
        """``_DescentRun._polish_step`` by rows."""
        r, s, ds = self.rule, self.state, self.space_dims
        if not self.has["gains"]:
            self.held.map(_unit_gains)
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
                agree = float(_sum(self.held.map(_time_dot, ds, self.geometry))) < 0
                s.time_gain = s.time_gain + 0.2 if agree else max(s.time_gain * 0.8, 0.01)
                time_step = ("momentum", r.polish_momentum, s.polish_time_rate * s.time_gain)
        scale = getattr(getattr(self.executor, "model", None), "learning_rate_scale", 1.0)
        rate = max(1.0, self.n_points / 12.0) * scale
        parts = self.held.map(_polish, ds, self.geometry, rate, r.polish_momentum, self.has["prev"],
                              r.max_point_step, s.time_rate, time_step)
        self.has["prev"] = True
        return self._moved(it, parts, time_step)

    def _moved(self, it: int, parts: list, time_step) -> str:
        """``_DescentRun._momentum_move`` after the move (taken by ``parts``' map): evaluate, undo a diverged one."""
        r, s = self.rule, self.state
        self._hint(parts)
        ev = self._evaluate(s.alpha, it + 1)
        s.evaluations += 1
        if momentum_diverged(s, it, ev, self.ev):
            self.has["prev"] = self.has["ptime"] = False
            self.held.map(_restore)
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
        self.held.map(_keep_gradient)
        kl = self._evaluate(1.0, it).kl
        self.held.map(_restore_gradient)
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


# --------------------------------------------------------------------------- row-block steps (held state)

def _moved_summary(coords: np.ndarray) -> tuple:
    """The new coordinates' column sums (the re-centring's partial) and their minima and maxima (the extent)."""
    return coords.sum(axis=1), coords.min(axis=1), coords.max(axis=1)


def _space_square(rows: dict, ds: int) -> float:
    """The block's ``|g_s|^2`` as ``np.linalg.norm`` of the whole space gradient sums it (``x.dot(x)``)."""
    g = np.ascontiguousarray(rows["gradient"][:ds]).ravel()
    return float(g.dot(g))


def _dot_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``pcg``'s per-coordinate inner products ``einsum('kn,kn->k')`` of the block's rows."""
    return np.einsum("kn,kn->k", np.ascontiguousarray(a), np.ascontiguousarray(b))


def _squares(a: np.ndarray) -> np.ndarray:
    """``np.linalg.norm(a, axis=1)**2``'s block partial: ``add.reduce(a * a, axis=1)``."""
    return np.add.reduce(a * a, axis=1)


def _cg_warm(rows: dict, ds: int, mu: float) -> None:
    """The warm start ``x = previous`` and the preconditioner ``1 / (diag + mu)``."""
    rows["x"][...] = rows["prev"]
    rows["invd"][...] = 1.0 / (rows["diag"] + mu)


def _cg_cold(rows: dict, ds: int, mu: float) -> tuple:
    rows["x"][...] = 0.0
    rows["invd"][...] = 1.0 / (rows["diag"] + mu)
    return _cg_start(rows, ds, mu, False)


def _cg_start(rows: dict, ds: int, mu: float, warm: bool) -> tuple:
    """``pcg``'s start: ``r = rhs - (L x + mu x)`` (warm; ``Ap`` holds ``L x``) or ``rhs``, ``z = M r``, ``p = z``
    with ``rhs = -g_s``; partials of ``r . z``, ``|r|^2`` and ``|rhs|^2``."""
    rhs = -rows["gradient"][:ds]
    r = rhs - (rows["Ap"] + mu * rows["x"]) if warm else rhs.copy()
    rows["r"][...] = r
    z = r * rows["invd"][0]
    rows["z"][...] = z
    rows["p"][...] = z
    return _dot_rows(r, z), _squares(r), _squares(rhs)


def _cg_direction(rows: dict, beta: np.ndarray) -> None:
    rows["p"][...] = rows["z"] + beta[:, None] * rows["p"]


def _cg_product(rows: dict, mu: float) -> np.ndarray:
    """``Ap = L p + mu p`` (``Ap`` holds ``L p``); the block's ``p . Ap``."""
    rows["Ap"][...] = rows["Ap"] + mu * rows["p"]
    return _dot_rows(rows["p"], rows["Ap"])


def _cg_step(rows: dict, step: np.ndarray) -> tuple:
    rows["x"] += step[:, None] * rows["p"]
    rows["r"] -= step[:, None] * rows["Ap"]
    z = rows["r"] * rows["invd"][0]
    rows["z"][...] = z
    return _dot_rows(rows["r"], z), _squares(rows["r"])


def _direction(rows: dict, ds: int, geometry, polishing: bool, radius, with_time: bool) -> tuple:
    """The solve's ``x`` kept as the next warm start (zeros inside the polish phase) and, bounded by ``radius``
    (``descent.bounded_direction``), the space direction; partials of ``<g_s, bounded>`` and, with a time step
    kept, ``sum g_t . v_t`` (the time rate's test)."""
    x = rows["x"]
    rows["prev"][...] = 0.0 if polishing else x
    bounded = x.copy()
    if radius is not None:
        clip_step_norms(bounded, radius)
    rows["dir"][:ds] = bounded
    slope = float(np.sum(rows["gradient"][:ds] * bounded)) if radius is not None else 0.0
    time_dot = 0.0
    if with_time and rows["coords"].shape[0] > ds:
        rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
        time_dot = float(np.sum(rgrad[ds:] * rows["ptime"]))
    return slope, time_dot


def _gradient_direction(rows: dict, ds: int, radius: float) -> None:
    """``bounded_direction``'s fallback: the negative space gradient, bounded."""
    bounded = -rows["gradient"][:ds]
    clip_step_norms(bounded, radius)
    rows["dir"][:ds] = bounded


def _slope_trial(rows: dict, ds: int, geometry, time_rate: float, step: float) -> tuple:
    """The direction's time rows ``-time_rate g_t``, the point kept for the trials, the first trial point; the
    block's ``<g, p>`` and the trial's summary."""
    coords, grad = rows["coords"], rows["gradient"]
    if coords.shape[0] > ds:
        rows["dir"][ds:] = -time_rate * geometry.riemannian_gradient(coords, grad)[ds:]
    rows["base"][...] = coords
    rows["bgrad"][...] = grad
    return (float(np.sum(grad * rows["dir"])),) + _trial(rows, geometry, step)


def _trial(rows: dict, geometry, step: float) -> tuple:
    rows["coords"][...] = geometry.retract(rows["base"], step * rows["dir"])
    return _moved_summary(rows["coords"])


def _restore(rows: dict) -> None:
    """Back to the point kept before the move (no step passed, or it diverged)."""
    rows["coords"][...] = rows["base"]
    rows["gradient"][...] = rows["bgrad"]


def _time_step(rows: dict, ds: int, step: float) -> None:
    rows["ptime"][...] = step * rows["dir"][ds:]


def _keep_gradient(rows: dict) -> None:
    rows["bgrad"][...] = rows["gradient"]


def _restore_gradient(rows: dict) -> None:
    rows["gradient"][...] = rows["bgrad"]


def _unit_gains(rows: dict) -> None:
    rows["gains"][...] = 1.0


def _time_dot(rows: dict, ds: int, geometry) -> float:
    rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
    return float(np.sum(rgrad[ds:] * rows["ptime"]))


def _move(rows: dict, ds: int, geometry, update: np.ndarray, radius, time_step) -> tuple:
    """``_DescentRun._momentum_move``'s move: the space ``update`` bounded and kept as the momentum buffer, the
    time rows ``time_step``, the point kept (``base``, ``bgrad``) to undo it; the new coordinates' summary."""
    if radius is not None:
        clip_step_norms(update, radius)
    coords = rows["coords"]
    direction = np.empty_like(coords)
    direction[:ds] = update
    direction[ds:] = time_step
    rows["base"][...] = coords
    rows["bgrad"][...] = rows["gradient"]
    rows["prev"][...] = update
    rows["coords"][...] = geometry.retract(coords, direction)
    return _moved_summary(rows["coords"])


def _momentum(rows: dict, ds: int, geometry, rate: float, momentum: float, with_buffer: bool, radius,
              time_rate: float) -> tuple:
    """An exaggeration-phase momentum step: ``u = -lr g_s (+ m u)``, time ``-time_rate g_t``."""
    rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
    update = rate * rgrad[:ds]
    if with_buffer:
        update += momentum * rows["prev"]
    return _move(rows, ds, geometry, update, radius, -time_rate * rgrad[ds:])


def _polish(rows: dict, ds: int, geometry, rate: float, momentum: float, with_buffer: bool, radius,
            time_rate: float, time_step) -> tuple:
    """A polish step: delta-bar-delta's gains and ``u = m u - lr gains g_s``; time ``-time_rate g_t`` (no time
    step: ``time_step`` None), ``-rate_t g_t`` (``('first', rate_t)``) or ``m v - rate_t g_t`` (``('momentum',
    m, rate_t)``, ``rate_t`` the time rate times its gain); the time step kept (``ptime``)."""
    rgrad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
    grad = rgrad[:ds]
    if not with_buffer:
        rows["prev"][...] = 0.0
    previous = rows["prev"]
    gains = rows["gains"]
    gains[...] = gains_update(gains, grad, previous)
    update = momentum * previous - rate * gains * grad
    if time_step is None:
        step_t = -time_rate * rgrad[ds:]
    elif time_step[0] == "first":
        step_t = -time_step[1] * rgrad[ds:]
    else:
        step_t = time_step[1] * rows["ptime"] - time_step[2] * rgrad[ds:]
    if time_step is not None:
        rows["ptime"][...] = step_t
    return _move(rows, ds, geometry, update, radius, step_t)
