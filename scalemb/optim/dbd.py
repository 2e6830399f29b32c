"""Delta-bar-delta gradient descent with momentum (Jacobs 1988), as used by t-SNE and the SNEST paper.

Space coordinates: per-coordinate gains ``g <- g + 0.2`` where the gradient and the last update disagree in
sign (the descent keeps going the same way), ``g <- 0.8 g`` otherwise, floored at ``min_gain``;
``update <- momentum * update - lr * g * grad``.  Time coordinates (SNEST): one global gain, ``+0.2`` when
``sum grad . update < 0``, ``x0.8`` otherwise, and a learning rate ``time_ratio`` times smaller (paper,
sec. 4: "gamma_t / gamma_s should be very small, e.g. 1/100"; its GrQc runs used 1/500, which we measured to be
needed on GrQc: 1/100 diverges there), because Q reacts exponentially to time.
Early exaggeration multiplies P by ``exaggeration`` in the gradient for the first iterations; coordinates are
re-centred after every step (``geometry.recentre``).  On a manifold (the model's ``geometry``, e.g. the Poincaré
ball) this is Riemannian delta-bar-delta: ``grad`` above is the Riemannian gradient
``geometry.riemannian_gradient`` (in the ball the Euclidean one times ``(1 - |y|^2)^2 / 4``; a positive factor, so
the gains' sign test is unchanged), the increment is applied by ``geometry.retract`` and the momentum buffer is
reused at the new point without parallel transport (as Riemannian SGD with momentum commonly does; in a
conformal model the transport of a small step is a rescaling and rotation of order the step); Euclidean runs
are the classic update bit for bit.  ``max_step_norm`` (off by default) clips each point's space step to that
Euclidean norm, as openTSNE does (its default 5): the clipped step is also the new momentum buffer, so points
cannot shoot off after the exaggeration phase, when lr = N/12 steps are large.  ``kl_every = k > 1`` computes
the KL only every k-th iteration, as openTSNE does (its iterations compute the gradient alone), saving the
kernel's logarithms: the other entries of the KL history are NaN, the best iterate and the
``divergence_factor`` test see the computed ones, and in between a non-finite gradient or normaliser counts
as the blow-up.  ``max_iterations``: the schedule's own budget (openTSNE's fixed 750 at scale), on top of the
``n_iter`` a run asks for.  Stops early when the KL decreased by less than ``tol`` (relative, per
iteration, averaged over the last ``window`` iterations) once momentum has reached its last value; raises
``FloatingPointError`` when the KL is not finite or exceeds ``divergence_factor`` times its starting value.
"""
import logging
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..engine.held import RowsExport, hold
from .base import OptimizeResult, OptimizerState, last_computed
from .loop import MOVED, StepRun, run_loop

logger = logging.getLogger("scalemb")


@dataclass
class DBDState(OptimizerState):
    """Delta-bar-delta between iterations: increments ``update`` (momentum buffer), space ``gains``, the time
    gain, both learning rates (halved by each backoff), the best iterate so far and the backoff count.  The
    exaggeration and momentum phases follow from ``iteration``."""

    update: np.ndarray
    gains: np.ndarray
    time_gain: float
    lr: float
    lr_time: float
    best_kl: float
    best_coords: np.ndarray
    backoffs: int


@dataclass
class DeltaBarDelta:
    """Delta-bar-delta optimiser; ``learning_rate='auto'`` means ``max(1, N / 12)`` (measured, see benchmarks)
    times the model's ``learning_rate_scale`` (1 but for kernels of another length, see ``Model``)."""

    learning_rate: float | str = "auto"
    time_ratio: float = 0.002
    momentum: tuple = (0.5, 0.8, 0.9)
    momentum_switch: tuple = (250, 1000)
    exaggeration: float = 4.0
    exaggeration_iterations: int = 100
    gain_increase: float = 0.2
    gain_decrease: float = 0.8
    min_gain: float = 0.01
    tol: float = 1e-7
    window: int = 100
    divergence_factor: float = 2.0
    max_backoffs: int = 8
    max_step_norm: float | None = None
    kl_every: int = 1
    max_iterations: int | None = None
    name: str = field(default="dbd", init=False)
    derives_start = True  # ``optimize`` takes the start as a recipe (a callable): a rewind re-derives it

    def resolved_learning_rate(self, n_points: int, scale: float = 1.0) -> float:
        if self.learning_rate == "auto":
            return max(1.0, n_points / 12.0) * scale
        lr = float(self.learning_rate)
        if not lr > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        return lr

    def __post_init__(self):
        if self.max_step_norm is not None and not self.max_step_norm > 0:
            raise ValueError(f"max_step_norm must be > 0 or None, got {self.max_step_norm!r}")
        if int(self.kl_every) != self.kl_every or self.kl_every < 1:
            raise ValueError(f"kl_every must be an integer >= 1, got {self.kl_every!r}")
        if self.max_iterations is not None and (int(self.max_iterations) != self.max_iterations
                                                or self.max_iterations < 1):
            raise ValueError(f"max_iterations must be an integer >= 1 or None, got {self.max_iterations!r}")

    def budget(self, n_iter: int) -> int:
        """Iterations a run asked for ``n_iter`` makes: at most ``max_iterations`` (the schedule's own budget,
        e.g. openTSNE's 250 + 500 at scale), None: ``n_iter``.  ``Embedder.continue_run`` lifts it."""
        return int(n_iter) if self.max_iterations is None else min(int(n_iter), int(self.max_iterations))

    def momentum_at(self, iteration: int) -> float:
        for value, switch in zip(self.momentum, self.momentum_switch):
            if iteration < switch:
                return value
        return self.momentum[-1]

    def params(self) -> dict:
        """The settings as plain values (written into result attributes)."""
        return {"optimizer": self.name, "learning_rate": self.learning_rate, "time_ratio": self.time_ratio,
                "momentum": list(self.momentum), "momentum_switch": list(self.momentum_switch),
                "exaggeration": self.exaggeration, "exaggeration_iterations": self.exaggeration_iterations,
                "min_gain": self.min_gain, "tol": self.tol, "window": self.window,
                "divergence_factor": self.divergence_factor, "max_backoffs": self.max_backoffs,
                "max_step_norm": self.max_step_norm, "kl_every": self.kl_every,
                "max_iterations": self.max_iterations}

    def initial_state(self, coords: np.ndarray, space_dims: int, lr_scale: float = 1.0) -> "DBDState":
        """The state before iteration 0 at ``coords`` (``(ds + dt, N)``); ``lr_scale``: the model's
        ``learning_rate_scale``."""
        coords = np.array(coords, dtype=np.float64, order="C")
        lr = self.resolved_learning_rate(coords.shape[1], lr_scale)
        return DBDState(iteration=0, coords=coords, kl_history=np.zeros(0), seconds=np.zeros(0), evaluations=0,
                        elapsed=0.0, update=np.zeros_like(coords), gains=np.ones((space_dims, coords.shape[1])),
                        time_gain=1.0, lr=lr, lr_time=lr * self.time_ratio, best_kl=float("inf"),
                        best_coords=coords.copy(), backoffs=0)

    def optimize(self, executor, coords: np.ndarray, n_iter: int, callback=None, state: "DBDState | None" = None,
                 checkpoint=None, stop=None) -> OptimizeResult:
        """Run at most ``n_iter`` iterations from ``coords`` (``(ds + dt, N)``, or a callable returning them: a
        rewind after a lost worker calls it again instead of keeping a copy) or, if given, from ``state``
        (``coords`` is then ignored); ``callback(it, kl)`` each step.  ``checkpoint(it, export)`` is called at
        the start of every iteration after the first one run here; ``export()`` returns a ``DBDState`` from
        which ``optimize`` continues exactly as this run does.  ``stop(it, kl, coords)`` after ``callback``: True
        ends the run there (``stopped``).  The result's ``state`` continues the run (``state=result.state``).
        The iterations are ``optim.loop.run_loop``'s; this class supplies the step rule (``_DBDRun``)."""
        scale = getattr(getattr(executor, "model", None), "learning_rate_scale", 1.0)
        recipe = None
        if state is None and callable(coords):
            recipe = partial(self.initial_state, space_dims=executor.space_dims, lr_scale=scale)
            recipe = partial(_derived, recipe, coords)
        elif state is None:
            executor.check_coords(coords)
        s = (recipe() if recipe is not None else self.initial_state(coords, executor.space_dims, scale)) \
            if state is None else state.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed)
        del coords
        return run_loop(_DBDRun(self, executor, s, recipe), self.budget(n_iter), state, callback, checkpoint, stop)

    def _blew_up(self, ev, with_kl: bool, best_kl: float) -> bool:
        """The KL is not finite or above ``divergence_factor`` times the best; on iterations without the KL:
        the normaliser or the gradient is not finite (or Z is 0: every pair's weight underflowed)."""
        if with_kl:
            return not np.isfinite(ev.kl) or ev.kl > self.divergence_factor * best_kl
        # ``finite`` None: the gradient's rows are formed later (deferred: ``_DBDRun._deferred_blow_up``)
        finite = ev.finite is not False if ev.gradient is None else bool(np.isfinite(ev.gradient).all())
        return not (np.isfinite(ev.z) and ev.z > 0 and finite)

    @staticmethod
    def _jump(ev, with_kl: bool) -> str:
        return f"KL reached {ev.kl:.4g}" if with_kl else f"normaliser Z = {ev.z:.4g} or the gradient not finite"

    def _stall_start(self) -> int:
        return max(self.exaggeration_iterations, self.momentum_switch[-1] if self.momentum_switch else 0)


def _derived(initial_state, coords) -> "DBDState":
    return initial_state(coords())


FIELDS = {"coords": "coords", "update": "update", "gains": "gains", "best": "best_coords"}  # held name: field


class _DBDRun(StepRun):
    """Delta-bar-delta as a step rule of ``run_loop`` (Riemannian: gains and momentum act on the geometry's
    Riemannian gradient, the increment is applied by ``retract``; Euclidean: exactly the classic update).

    The per-point arrays (coordinates, gradient, increments, gains, best iterate) are held where the executor's
    row blocks are (``scalemb.engine.held``): on Dask workers, per iteration only scalars and small vectors
    cross the client (the objective's parts, the time gain's dot product, the column sums that re-centre).
    ``state`` holds them again at the final ``export``; held on workers (``remote``), the client drops its own
    copies, checkpoints are written by the workers (``held_rows``) and a lost worker rewinds to the last of them
    (read back by the workers) or to the start (re-derived by ``recipe``): the client keeps no O(N) copy."""

    recentres = False  # re-centred here, from the blocks' column sums (``_step``)

    def __init__(self, rule: DeltaBarDelta, executor, state: DBDState, recipe=None):
        super().__init__(executor, state)
        self.rule = rule
        self.stall_start, self.window, self.tol = rule._stall_start(), rule.window, rule.tol
        self.with_kl = True
        self.ev = None
        self.save_best = False
        self.dims = state.coords.shape[0]
        self.held = hold(executor, self._arrays(state))
        self.rescue = None
        if getattr(self.held, "remote", False):
            if state.iteration == 0:  # run_loop's check of a fresh start, before the arrays are dropped here
                self.geometry.validate(state.coords, "the optimiser's start coordinates")
            if recipe is not None:
                self._keep_rescue(self._light(state), ("start", recipe))
            else:  # a state given as arrays (a resumed checkpoint, a start array): kept until the first checkpoint
                self._keep_rescue(state.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed),
                                  ("state",))
            self._drop(state)

    @staticmethod
    def _arrays(state: DBDState) -> dict:
        return {"coords": state.coords, "update": state.update, "gains": state.gains, "best": state.best_coords}

    @staticmethod
    def _drop(state: DBDState) -> None:
        """The client's copies of the per-point arrays, released (they are held on the workers)."""
        state.coords = state.update = state.gains = state.best_coords = None

    def _light(self, state: DBDState) -> DBDState:
        """A copy of ``state`` without its per-point arrays."""
        light = replace(state, coords=None, update=None, gains=None, best_coords=None)
        return light.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed)

    def _keep_rescue(self, state: DBDState, source: tuple) -> None:
        """Where ``rewind`` returns to after a lost worker (``remote`` holds only): ``state`` (its scalars and
        history, with the arrays for ``("state",)``) and the source of its rows -- ``("start", recipe)``,
        ``("store", directory, digests)``: a checkpoint the workers wrote, or ``("state",)`` -- with the executor's
        ``auto`` repulsion decisions as they were then."""
        auto = getattr(self.executor, "auto_repulsion", None)
        self.rescue = (state, None if auto is None else (auto.current, len(auto.history)), source)

    def rescue_iteration(self) -> int:
        return int(self.rescue[0].iteration)

    def held_rows(self):
        if self.rescue is None:
            return None
        n, ds = self.held.n_points, self.space_dims
        shapes = {"coords": (self.dims, n), "update": (self.dims, n), "gains": (ds, n), "best_coords": (self.dims, n)}
        return RowsExport(self.held, FIELDS, shapes, self._written)

    def _written(self, directory: str, digests: dict, state: DBDState) -> None:
        self._keep_rescue(self._light(state), ("store", directory, digests))

    def rewind(self) -> int:
        """Back to the last checkpoint or the start, held again on the workers alive now: read back by the
        workers from the store (and checked against the digests they wrote), re-derived from the start's
        recipe, or sent from the kept state.  The replay is the uninterrupted run's, bit for bit."""
        saved, decisions, source = self.rescue
        self.state = saved.snapshot(saved.iteration, saved.kl_history, saved.seconds, saved.elapsed)
        if decisions is not None:
            auto = self.executor.auto_repulsion
            auto.current = decisions[0]
            del auto.history[decisions[1]:]
        self.save_best, self.ev = False, None
        if source[0] == "store":
            if self.held.load_rows(source[1], FIELDS) != source[2]:
                raise RuntimeError(f"{source[1]}: the checkpoint read back differs from the one written; "
                                   "refusing to continue from it")
        elif source[0] == "start":
            self.held.recover(self._arrays(source[1]()))
        else:
            self.held.recover(self._arrays(self.state))
            self._drop(self.state)
        return int(saved.iteration)

    def coords(self) -> np.ndarray:
        return self.held.gather("coords")["coords"]

    def _evaluate_held(self, alpha: float, it: int, with_kl: bool, defer: bool = False):
        self.state.evaluations += 1
        return self.held.evaluate(alpha, with_kl, it, defer)

    def _back_off(self, it: int, ev, alpha: float, with_kl: bool):
        """Back to the best iterate with halved learning rates, reset gains and momentum, evaluated there
        (``FloatingPointError`` after ``max_backoffs``)."""
        r, s = self.rule, self.state
        s.backoffs += 1
        if s.backoffs > r.max_backoffs:
            raise FloatingPointError(
                f"{r._jump(ev, with_kl)} at iteration {it} (best KL {s.best_kl:.4g}) after "
                f"{r.max_backoffs} learning-rate halvings; lower the learning rate or the time ratio")
        logger.warning("%s at iteration %d (best KL %.4g): back to the best iterate, learning rate halved "
                       "to %.4g", r._jump(ev, with_kl), it, s.best_kl, s.lr / 2)
        s.lr, s.lr_time = s.lr / 2, s.lr_time / 2
        self.held.map(_back_to_best)
        s.time_gain = 1.0
        return self._evaluate_held(alpha, it, with_kl)

    def observe(self, it: int, history: np.ndarray) -> tuple[float, float]:
        """Evaluate at the iterate (the KL every ``kl_every``-th iteration); a blow-up returns to the best
        iterate with halved learning rates and reset gains/momentum (``FloatingPointError`` after
        ``max_backoffs``)."""
        r, s = self.rule, self.state
        self.alpha = alpha = r.exaggeration if it < r.exaggeration_iterations else 1.0
        self.with_kl = with_kl = it % r.kl_every == 0
        # the gradient's rows may be formed by the step's own tasks: whether they are finite is then known after
        # it (``advance``), where a blow-up backs off exactly as here (the step taken from a non-finite gradient
        # is overwritten by the best iterate)
        ev = self._evaluate_held(alpha, it, with_kl, defer=True)
        if self.iteration_dependent and with_kl and r._blew_up(ev, with_kl, s.best_kl):
            # the objective may have changed since the best iterate (a point term switched on): re-base the best
            # KL on this iteration's objective at the best iterate before calling the jump a blow-up
            s.best_kl = self.evaluate(self.held.gather("best")["best"], alpha, it).kl
            s.evaluations += 1
        if r._blew_up(ev, with_kl, s.best_kl):
            ev = self._back_off(it, ev, alpha, with_kl)
        if ev.kl < s.best_kl:
            s.best_kl = ev.kl
            self.save_best = True  # the iterate's coordinates become the best, where they are held (``_step``)
        self.ev = ev
        # iterations that skip the KL report the last computed one (entry ``it`` is NaN: not computed)
        return ev.kl, ev.kl if with_kl else last_computed(history, it - 1)

    def _deferred_blow_up(self) -> bool:
        """After a ``map`` that formed a deferred gradient: it was not finite on an iteration without the KL
        (with the KL, the blow-up test reads the KL only)."""
        ev = self.ev
        if ev.finite is not None or self.with_kl or self.held.gradient_finite is not False:
            return False
        ev.finite = False
        return self.rule._blew_up(ev, False, self.state.best_kl)

    def advance(self, it: int, check: bool = True) -> str:
        r, s, ds = self.rule, self.state, self.space_dims
        mom = r.momentum_at(it)
        time_gain = s.time_gain
        if self.dims > ds:  # the time gain: sign of sum grad . update over the time rows of all points
            dot = 0.0
            for part in self.held.map(_time_dot, ds, self.geometry):
                dot += part
            if check and self._deferred_blow_up():
                return self._retry(it)
            if dot < 0:
                time_gain = s.time_gain + r.gain_increase
            else:
                time_gain = max(s.time_gain * r.gain_decrease, r.min_gain)
        parts = self.held.map(_step, ds, self.geometry, mom, s.lr, s.lr_time, time_gain, r.gain_increase,
                              r.gain_decrease, r.min_gain, r.max_step_norm, self.save_best)
        if check and self._deferred_blow_up():
            return self._retry(it)
        s.time_gain = time_gain
        self.save_best = False
        if self.geometry.translates:
            total = np.zeros(self.dims)
            for part in parts:
                total += part[0]
            mean = total / self.held.n_points
            self.held.shift(mean)
            # min(y - m) = fl(min y - m): rounding is monotone, so the re-centred extent needs no second pass
            lo = np.minimum.reduce([part[1] for part in parts])
            hi = np.maximum.reduce([part[2] for part in parts])
            self.held.extent_hint(lo - mean, hi - mean)
        return MOVED

    def _retry(self, it: int) -> str:
        """The blow-up ``observe`` would have seen had the gradient been formed there: back off (the speculative
        step is overwritten by the best iterate) and take the step from there, unchecked, as ``observe`` does."""
        self.ev = self._back_off(it, self.ev, self.alpha, False)
        return self.advance(it, check=False)

    def final_kl(self, it: int, converged: bool, stopped: bool) -> float | None:
        """The KL at the last iterate, unless the last iteration computed it there already."""
        if converged or (stopped and self.with_kl):
            return None
        return self._evaluate_held(1.0, it, True).kl

    def export(self, it: int, history: np.ndarray, seconds: np.ndarray, elapsed: float,
               light: bool = False) -> "DBDState":
        """The state at the start of ``it``: its arrays gathered here, or with ``light`` left None (a checkpoint
        whose rows the workers write: ``held_rows``)."""
        s = self.state
        if self.save_best:  # observed as the best, not yet stepped from: copy it where it is held
            self.held.map(_save_best)
            self.save_best = False
        if light:
            return self._light(s).snapshot(it, history, seconds, elapsed)
        arrays = self.held.gather("coords", "update", "gains", "best")
        s.coords, s.update, s.gains, s.best_coords = arrays["coords"], arrays["update"], arrays["gains"], \
            arrays["best"]
        exported = s.snapshot(it, history, seconds, elapsed)
        if self.rescue is not None:
            self._keep_rescue(exported, ("state",))
        return exported

    def close(self) -> None:
        self.held.close()


# --------------------------------------------------------------------------- row-block steps (held state)

def _back_to_best(rows: dict) -> None:
    """A backoff: the best iterate's coordinates, zero increments, unit gains."""
    rows["coords"][...] = rows["best"]
    rows["update"][...] = 0.0
    rows["gains"][...] = 1.0


def _save_best(rows: dict) -> None:
    rows["best"][...] = rows["coords"]


def _time_dot(rows: dict, ds: int, geometry) -> float:
    """The block's ``sum grad . update`` over the time rows (the time gain's test)."""
    grad = geometry.riemannian_gradient(rows["coords"], rows["gradient"])
    return float(np.sum(grad[ds:] * rows["update"][ds:]))


def _step(rows: dict, ds: int, geometry, mom: float, lr: float, lr_time: float, time_gain: float,
          gain_increase: float, gain_decrease: float, min_gain: float, max_step_norm, save_best: bool) -> tuple:
    """One delta-bar-delta step of a block's points (module docstring), in place; returns the column sums of the
    new coordinates (the re-centring's partial) and their minima and maxima (the grid's extent)."""
    coords, update, gains = rows["coords"], rows["update"], rows["gains"]
    if save_best:
        rows["best"][...] = coords
    grad = geometry.riemannian_gradient(coords, rows["gradient"])
    space_grad, space_update = grad[:ds], update[:ds]
    gains[...] = gains_update(gains, space_grad, space_update, gain_increase, gain_decrease, min_gain)
    update[:ds] = mom * space_update - lr * gains * space_grad
    if max_step_norm is not None:
        clip_step_norms(update[:ds], max_step_norm)
    if coords.shape[0] > ds:
        update[ds:] = mom * update[ds:] - lr_time * time_gain * grad[ds:]
    coords[...] = geometry.retract(coords, update)
    return coords.sum(axis=1), coords.min(axis=1), coords.max(axis=1)


def gains_update(gains: np.ndarray, gradient: np.ndarray, previous: np.ndarray, increase: float = 0.2,
                 decrease: float = 0.8, floor: float = 0.01, ceiling: float | None = None) -> np.ndarray:
    """Delta-bar-delta's gains, a new array: ``+increase`` where ``gradient`` and the last step ``previous``
    disagree in sign (the descent kept its direction), ``x decrease`` where they agree, at least ``floor`` (and at
    most ``ceiling``)."""
    same = np.sign(gradient) == np.sign(previous)
    new = np.where(same, gains * decrease, gains + increase)
    np.maximum(new, floor, out=new)
    if ceiling is not None:
        np.minimum(new, ceiling, out=new)
    return new


def clip_step_norms(steps: np.ndarray, max_norm: float) -> None:
    """Scale, in place, every column of ``steps`` (``(ds, N)``, one point's space step per column) whose
    Euclidean norm exceeds ``max_norm`` down to that norm (each column's sum in row order: the same numbers
    for a block's columns as for the whole array's)."""
    squares = steps[0] * steps[0]
    for k in range(1, steps.shape[0]):
        squares += steps[k] * steps[k]
    norms = np.sqrt(squares)
    over = norms > max_norm
    if over.any():
        steps[:, over] *= max_norm / norms[over]
