"""The line-search descent's steps (``optim.descent.LineSearchDescent``): ``DescentRun``, its step rule for
``optim.loop.run_loop`` with the whole arrays on the client (the momentum, spectral and polish steps, each point's
time gain, the bounded direction), and the guards the held rule (``optim.descent_held``) shares: a failed solve or
search, a diverged momentum step; ``DescentState``, what both rules continue from.  ``rule`` is a
``LineSearchDescent`` throughout (``optim.descent`` imports this module, not the other way round)."""
import logging
from dataclasses import dataclass, replace

import numpy as np

from ..engine.blocks import Evaluation
from .base import OptimizerState
from .dbd import clip_step_norms, gains_update
from .linesearch import armijo
from .loop import HALT, KEPT, MOVED, StepRun
from .solvers import SetupInterrupted

logger = logging.getLogger("scalemb")


@dataclass
class DescentState(OptimizerState):
    """Line-search descent between iterations.

    ``kl``, ``objective``, ``gradient``, ``z``: the evaluation at ``coords`` that the next iteration reuses
    (stored, not recomputed: ``coords`` were re-centred after it was taken).  ``alpha``: exaggeration in
    force; ``step``: next first trial step; ``time_rate``: SNEST time rate; ``previous_space`` /
    ``previous_time_step``: last space direction (CG warm start) and time step; ``failures``: failed line
    searches in a row.  Spectral solver: ``stale`` (refactorise next), ``factored_at`` (iteration of the last
    factorisation), ``ordering`` (the reused fill-reducing order), ``curvature_coords``/``curvature_alpha``
    (where the executor's curvature was last computed) and ``factor_coords``/``factor_alpha``/
    ``factor_ordered`` (where the current factorisation's curvature was computed, and whether it reused
    ``ordering``): resuming recomputes both instead of storing an LU.
    """

    kl: float
    objective: float
    gradient: np.ndarray
    z: float
    alpha: float
    step: float
    time_rate: float
    previous_space: np.ndarray | None
    previous_time_step: np.ndarray | None
    failures: int
    factored_at: int
    stale: bool
    ordering: np.ndarray | None
    curvature_coords: np.ndarray | None
    curvature_alpha: float | None
    factor_coords: np.ndarray | None
    factor_alpha: float | None
    factor_ordered: bool
    gains: np.ndarray | None = None  # the polish phase's delta-bar-delta gains (None before it)
    forcing: float | None = None  # cg_tol='auto': the last CG tolerance (Eisenstat-Walker forcing term)
    gradient_norm: float | None = None  # cg_tol='auto': the space gradient's norm at the last solve
    time_gain: float = 1.0  # the polish phase's time gain (delta-bar-delta's global one)
    polish_time_rate: float | None = None  # the polish phase's time learning rate (None before it; halved on blow-up)
    time_gains: np.ndarray | None = None  # time_gains set: the per-point gains of the time rows (None before any)

    def evaluation(self):
        return Evaluation(self.kl, self.objective, self.gradient, self.z)

    def export(self, iteration: int, history, seconds, elapsed: float, ev, solver: dict) -> "DescentState":
        """A snapshot with the current evaluation ``ev`` and the spectral solver cache ``solver``."""
        curvature = solver.get("curvature_at", (None, None))
        factor = solver.get("factor_at", ((None, None), False)) if "factor" in solver else ((None, None), False)
        copy = replace(self, kl=float(ev.kl), objective=float(ev.objective), gradient=ev.gradient, z=float(ev.z),
                       stale=bool(solver.get("stale", False)), ordering=solver.get("ordering"),
                       curvature_coords=curvature[0], curvature_alpha=curvature[1], factor_coords=factor[0][0],
                       factor_alpha=factor[0][1], factor_ordered=bool(factor[1]))
        return copy.snapshot(iteration, history, seconds, elapsed)

# A momentum step (no line search: exaggeration, polish) whose KL exceeds this factor times the KL before it is
# undone (``DescentRun._momentum_move``), as delta-bar-delta's ``divergence_factor``.
MOMENTUM_DIVERGENCE = 2.0


def guarded_solve(run, it: int, solve):
    """``solve()`` for iteration ``it`` of a spectral step rule (``DescentRun``, ``_HeldDescentRun``) with the
    lagged factorisation's bookkeeping: marked stale every ``refactor_every`` iterations, ``factored_at`` moved
    when it is rebuilt.  A ``SetupInterrupted`` inside (a signal during a solve or a set-up) puts the solver
    cache, ``factored_at`` and the forcing term back as they were at the start of the iteration, checkpoints
    there (which raises ``RunInterrupted`` once written) and re-raises, so a resumed run repeats the iteration."""
    s, solver_state = run.state, run.solver_state
    if it - s.factored_at >= run.refactor_every:
        solver_state["stale"] = True
    before = (dict(solver_state), s.factored_at)
    if solver_state.get("stale"):
        s.factored_at = it
    forcing = (s.forcing, s.gradient_norm)
    try:
        return solve()
    except SetupInterrupted:
        solver_state.clear()
        solver_state.update(before[0])
        s.factored_at = before[1]
        s.forcing, s.gradient_norm = forcing
        run.checkpoint(it, run.export_now)
        raise


def search_failed(run, it: int) -> str:
    """A line search of iteration ``it`` that found no decrease: the point is kept, the step starts again from the
    initial one and the factorisation is rebuilt at the next solve; ``max_failures`` in a row stop the run
    (``HALT``, logged), else ``KEPT``."""
    s, r = run.state, run.rule
    s.failures += 1
    s.step = r._initial_step(run.n_points)
    run.solver_state["stale"] = True
    if s.failures >= r.max_failures:
        logger.warning("line search found no decrease %d times in a row at iteration %d (KL %.4f): stopping",
                       s.failures, it, run.ev.kl)
        return HALT
    return KEPT


def momentum_diverged(s, it: int, ev, before) -> bool:
    """Whether the momentum or polish step of iteration ``it`` diverged: its evaluation ``ev`` is not finite or its
    KL exceeds ``MOMENTUM_DIVERGENCE`` times the KL ``before`` it.  If so, counts the failure, halves the time
    rates (and resets the polish time gain) in ``s`` and logs it; the caller goes back to the point before."""
    if np.isfinite(ev.kl) and np.isfinite(ev.objective) and ev.kl <= MOMENTUM_DIVERGENCE * abs(before.kl):
        return False
    s.failures += 1
    s.time_rate *= 0.5
    s.time_gain = 1.0
    if s.polish_time_rate is not None:
        s.polish_time_rate *= 0.5
    logger.warning("a momentum step diverged at iteration %d (KL %.4g after %.4g): back to the point before it, "
                   "time rates halved", it, ev.kl, before.kl)
    return True


def time_gains(gains: np.ndarray | None, gradient: np.ndarray, previous: np.ndarray | None, ceiling: float
               ) -> np.ndarray:
    """Per-point gains of the time rows (``time_gains``): ones at first, then delta-bar-delta's rule against
    the last accepted time step ``previous`` (``+0.2`` where the time gradient and that step have opposite signs,
    i.e. the descent kept its direction, ``x0.8`` where not), clipped to ``[0.01, ceiling]``."""
    if gains is None:
        return np.ones_like(gradient)
    if previous is None:
        return gains
    return gains_update(gains, gradient, previous, ceiling=ceiling)


def bounded_direction(direction: np.ndarray, gradient: np.ndarray, radius: float) -> np.ndarray:
    """The space direction with every point's step (a column of ``direction``, ``(ds, N)``) scaled down to
    Euclidean norm ``radius`` where it is longer (a per-point trust region); if that is no longer a descent
    direction (``<gradient, direction> >= 0``: the solve coupled the points), the negative gradient bounded the
    same way, which always is."""
    bounded = direction.copy()
    clip_step_norms(bounded, radius)
    if np.sum(gradient * bounded) < 0:
        return bounded
    bounded = -gradient
    clip_step_norms(bounded, radius)
    return bounded


def factorize(executor, mu: float, ordering, kind: str):
    """``executor.factorize_curvature`` (``kind`` passed only when it is not the LU every executor has)."""
    if kind == "lu":
        return executor.factorize_curvature(mu, ordering)
    return executor.factorize_curvature(mu, ordering, kind=kind)


class DescentRun(StepRun):
    """Line-search descent as a step rule of ``run_loop``.

    Riemannian form: the gradient direction is ``-riemannian_gradient`` and every line-search trial point is
    ``retract(x, a p)``; the Armijo test keeps the Euclidean slope ``<grad, p>``, which is the derivative of
    ``f(retract(x, a p))`` at ``a = 0`` for any retraction.  The spectral direction solves with the Euclidean
    gradient: it is a Newton-like direction ``-B^{-1} grad`` with ``B`` the model's partial Hessian in the
    coordinates, and a Newton direction does not change with the metric (``(G^{-1} H)^{-1} G^{-1} grad =
    H^{-1} grad``), so scaling the gradient by the metric would only be undone by the curvature's."""

    def __init__(self, rule, executor, state, resumed: bool, checkpoint):
        super().__init__(executor, state)
        self.rule = rule
        self.stall_start, self.window, self.tol = rule.exaggeration_iterations, rule.window, rule.tol
        self.n_points = state.coords.shape[1]
        self.refactor_every = rule._refactor_every(self.n_points)
        self.methods = rule.methods(self.n_points)
        self.should_stop = getattr(checkpoint, "stop_requested", None)
        self.ev = state.evaluation()
        self.solver_state = rule._restore_solver(executor, state, self.methods) if resumed else {"stale": True}

    def observe(self, it: int, history: np.ndarray) -> tuple[float, float]:
        """The evaluation the last step ended on (re-evaluated once when the exaggeration ends)."""
        r, s = self.rule, self.state
        if s.alpha != 1.0 and it >= r.exaggeration_iterations:
            s.alpha = 1.0
            if r.exaggeration_steps == "momentum":
                s.previous_space = None  # the momentum buffer is no warm start for the solve
            self.solver_state["stale"] = True
            self.ev = self.evaluate(s.coords, s.alpha, it)
            s.evaluations += 1
            s.step = r._initial_step(self.n_points)
        return self.ev.kl, self.ev.kl

    def advance(self, it: int) -> str:
        r, s, ds = self.rule, self.state, self.space_dims
        grad = self.ev.gradient
        rgrad = self.geometry.riemannian_gradient(s.coords, grad)
        if r.exaggeration_steps == "momentum" and it < r.exaggeration_iterations:
            return self._momentum_step(it, rgrad)
        polishing = r.spectral_iterations is not None and it >= r.exaggeration_iterations + r.spectral_iterations
        if polishing:
            since = it - r.exaggeration_iterations - r.spectral_iterations
            if not (r.polish_spectral_every and since > 0 and since % r.polish_spectral_every == 0):
                return self._polish_step(it, rgrad)
            s.previous_space = None  # the momentum buffer is no warm start for the solve
        direction = self._direction(it, grad, rgrad, polishing)
        alpha = s.alpha
        # a trial that is accepted is the next iteration's point: its objective is iteration it + 1's
        result = armijo(lambda x: self.evaluate(x, alpha, it + 1), s.coords, direction, self.ev, s.step, r.c, r.rho,
                        retract=self.geometry.retract)
        s.evaluations += result.trials
        if not result.accepted:
            s.previous_space = None
            if self.iteration_dependent:  # the kept point's evaluation must be iteration it + 1's objective
                self.ev = self.evaluate(s.coords, alpha, it + 1)
                s.evaluations += 1
            return search_failed(self, it)
        s.failures = 0
        if s.coords.shape[0] > ds:  # (inside the polish phase no momentum buffer for its time steps)
            s.previous_time_step = None if polishing else result.step * direction[ds:]
        s.step = min(result.step * (r.growth if result.trials == 1 else 1.0), r._max_step())
        s.coords = result.coords
        self.ev = result.evaluation
        return MOVED

    def _direction(self, it: int, grad: np.ndarray, rgrad: np.ndarray, polishing: bool) -> np.ndarray:
        """The line search's direction at iteration ``it``: in space the spectral direction (each point's step
        bounded by ``max_point_step``; kept as the next solve's warm start) or ``-rgrad``; in time ``-time_rate
        rgrad`` (the rate grown 1.2x while the gradient still opposes the last time step, halved when it does not),
        times the per-point ``time_gains`` outside the polish phase."""
        r, s, ds, solver_state = self.rule, self.state, self.space_dims, self.solver_state
        direction = np.empty_like(s.coords)
        if r.direction == "spectral":
            direction[:ds] = guarded_solve(self, it, lambda: r._spectral(
                self.executor, s.coords, grad[:ds], s.alpha, solver_state, s.previous_space, self.methods,
                self.should_stop, tol=r._forcing(s, grad[:ds], self.methods[1])))
            s.previous_space = direction[:ds].copy() if not polishing else np.zeros_like(direction[:ds])
            if r.max_point_step is not None:
                direction[:ds] = bounded_direction(direction[:ds], grad[:ds], r.max_point_step)
        else:
            direction[:ds] = -rgrad[:ds]
        if s.coords.shape[0] > ds:
            if s.previous_time_step is not None:
                s.time_rate *= 1.2 if np.sum(rgrad[ds:] * s.previous_time_step) < 0 else 0.5
            direction[ds:] = -s.time_rate * rgrad[ds:]
            if r.time_gains is not None and not polishing:
                s.time_gains = time_gains(s.time_gains, rgrad[ds:], s.previous_time_step, r.time_gains)
                direction[ds:] *= s.time_gains
        return direction

    def _momentum_step(self, it: int, rgrad: np.ndarray) -> str:
        """One exaggeration-phase step of ``exaggeration_steps='momentum'``: space ``u <- m u - lr g`` (``lr =
        max(1, N/12)`` times the model's ``learning_rate_scale``, ``m = exaggeration_momentum``, each point's ``u``
        bounded by ``max_point_step``; ``u`` kept in ``previous_space``), time ``-time_rate g`` as in the
        line-search steps, no line search: one evaluation per iteration, as openTSNE's exaggeration phase."""
        r, s, ds = self.rule, self.state, self.space_dims
        scale = getattr(getattr(self.executor, "model", None), "learning_rate_scale", 1.0)
        update = -max(1.0, self.n_points / 12.0) * scale * rgrad[:ds]
        if s.previous_space is not None:
            update += r.exaggeration_momentum * s.previous_space
        return self._momentum_move(it, update, rgrad)

    def _momentum_move(self, it: int, update: np.ndarray, rgrad: np.ndarray, time_step: np.ndarray | None = None
                       ) -> str:
        """Move by the space ``update`` (each point's bounded by ``max_point_step``; kept as the momentum buffer
        ``previous_space``) and ``time_step`` in time (None: ``-time_rate g``), then evaluate: one evaluation, no
        line search.  A move whose evaluation is not finite (a blow-up: SNEST's ``exp(Δt²)`` past float64) or
        whose KL exceeds ``MOMENTUM_DIVERGENCE`` times the KL before it (SNEST at 7.7e5 points: 6.37 -> 21.0 in two
        polish steps, time coordinates thrown thousands of units out the step after) is undone: back to the point
        before it with the momentum buffers emptied and the time rates halved, as delta-bar-delta backs off to its
        best iterate (``max_failures`` in a row stop the run)."""
        r, s, ds = self.rule, self.state, self.space_dims
        if r.max_point_step is not None:
            clip_step_norms(update, r.max_point_step)
        direction = np.empty_like(s.coords)
        direction[:ds] = update
        direction[ds:] = -s.time_rate * rgrad[ds:] if time_step is None else time_step
        coords = self.geometry.retract(s.coords, direction)
        ev = self.evaluate(coords, s.alpha, it + 1)
        s.evaluations += 1
        if momentum_diverged(s, it, ev, self.ev):
            s.previous_space = s.previous_time_step = None
            if self.iteration_dependent:  # the kept point's evaluation must be iteration it + 1's objective
                self.ev = self.evaluate(s.coords, s.alpha, it + 1)
                s.evaluations += 1
            return HALT if s.failures >= r.max_failures else KEPT
        s.failures = 0
        s.previous_space = update
        if time_step is not None:
            s.previous_time_step = time_step
        s.coords = coords
        self.ev = ev
        return MOVED

    def _polish_step(self, it: int, rgrad: np.ndarray) -> str:
        """One step of the polish phase (``spectral_iterations`` set, after that many spectral iterations):
        delta-bar-delta on the space block as ``DeltaBarDelta`` after openTSNE's exaggeration (gains ``+0.2`` where
        gradient and last update disagree in sign, ``x0.8`` otherwise, floored at 0.01; ``u <- m u - lr gains g``,
        ``m = polish_momentum``, ``lr = max(1, N/12)`` times the model's ``learning_rate_scale``, each point's
        ``u`` bounded by ``max_point_step``), time ``-time_rate g``; one evaluation per iteration, no line search.
        Its first step starts from unit gains and no momentum (the spectral direction is no momentum buffer).
        ``polish_spectral_every = k``: every k-th polish iteration is a spectral step with its line search instead
        (the gains kept, the momentum buffer restarted at zero after it).

        Time coordinates (SNEST): delta-bar-delta's time rule, ``v <- m v - lr_t gain_t g_t`` with one global gain
        (``+0.2`` while ``g_t . v < 0``, ``x0.8`` otherwise, floored at 0.01) and ``lr_t`` the starting time rate
        (``time_rate``: ``max(1, N/12) * 0.002``, delta-bar-delta's ``lr * time_ratio``), not the line search's
        rate: the spectral steps grow that rate by 1.2 per accepted step, safe under a line search, but a step
        without one at that rate threw a 7.7e4-point layout's time coordinates past ``exp(Δt²)``'s range."""
        r, s, ds = self.rule, self.state, self.space_dims
        if s.gains is None:
            s.gains = np.ones((ds, self.n_points))
            s.previous_space = None
            s.previous_time_step = None
            s.polish_time_rate = r._time_rate(self.n_points)
        grad = rgrad[:ds]
        if s.previous_space is None:
            s.previous_space = np.zeros_like(grad)
        s.gains = gains_update(s.gains, grad, s.previous_space)
        scale = getattr(getattr(self.executor, "model", None), "learning_rate_scale", 1.0)
        update = r.polish_momentum * s.previous_space - max(1.0, self.n_points / 12.0) * scale * s.gains * grad
        time_step = None
        if s.coords.shape[0] > ds:
            gt = rgrad[ds:]
            if s.polish_time_rate is None:  # a state written before the polish phase had its own time rate
                s.polish_time_rate = r._time_rate(self.n_points)
            if s.previous_time_step is None:
                s.time_gain, time_step = 1.0, -s.polish_time_rate * gt
            else:
                agree = float(np.sum(gt * s.previous_time_step)) < 0
                s.time_gain = s.time_gain + 0.2 if agree else max(s.time_gain * 0.8, 0.01)
                time_step = r.polish_momentum * s.previous_time_step - s.polish_time_rate * s.time_gain * gt
        return self._momentum_move(it, update, rgrad, time_step)

    def final_kl(self, it: int, converged: bool, stopped: bool) -> float:
        """The KL at the last iterate: the last evaluation's, or one without exaggeration if it was on (that
        evaluation is not counted in ``evaluations``, as it never was)."""
        return self.ev.kl if self.state.alpha == 1.0 else self.evaluate(self.state.coords, 1.0, it).kl

    def export(self, it: int, history: np.ndarray, seconds: np.ndarray, elapsed: float):
        return self.state.export(it, history, seconds, elapsed, self.ev, self.solver_state)
