"""The one optimiser loop that every step rule (delta-bar-delta, line-search descent) plugs into.

Like scikit-learn's single ``_gradient_descent`` or PyMDE's one optimiser: the loop owns what every run does
the same way, a step rule owns only how it evaluates and how it moves.  Per iteration ``it``:

1. ``checkpoint(it, export)`` (from the second iteration run here on; ``export()`` is the state at the start
   of ``it``, from which ``optimize(..., state=...)`` continues exactly as this run does);
2. ``run.observe(it, history)`` -> ``(entry, kl)``: the rule evaluates (or reuses its last evaluation);
   ``entry`` goes into the history (NaN where the rule skipped the KL), ``kl`` is what ``callback(it, kl)``
   and ``stop(it, kl, coords)`` see (the last computed KL);
3. ``FloatingPointError`` if that KL is not finite; the stall test (``stalled``) from ``run.stall_start``;
4. ``run.advance(it)`` moves the coordinates through the geometry (``MOVED``), keeps them (``KEPT``: a failed
   line search) or ends the run (``HALT``; ``CONVERGED``: at a stationary point); after a move the loop
   re-centres them (``geometry.recentre``) unless the rule's objective is anchored (``recentres = False``:
   new points placed into a fixed map).

A fresh run first checks its start (``geometry.validate``: finite, inside the domain).
After the loop ``run.final_kl`` gives the last history entry (``None``: the entry is already there), then
the final state is exported; a checkpointed run whose rows are held elsewhere has their holders write them into
the staged result first (``checkpoint.final_rows``) and exports only the scalars (``OptimizeResult.written``).
Held rows lost with a worker (``engine.held.HeldRowsLost``), in an iteration, a checkpoint's write, the final
write or the final export, rewind the run to its last checkpoint or its start (``run.rewind``) and
the iterations are replayed: the result is the uninterrupted run's.  The geometry comes from
``executor.model.geometry`` (``EUCLIDEAN`` for a model without one): the rules call only
``riemannian_gradient``, ``retract`` and the loop ``recentre``, so nothing here assumes R^d, and for Euclidean
models the arithmetic is exactly what it was before.
"""
import logging
import time

import numpy as np

from ..engine.held import HeldRowsLost
from ..geometry import geometry_of
from .base import OptimizeResult, OptimizerState, history_buffers, stalled

MOVED, KEPT, HALT, CONVERGED = "moved", "kept", "halt", "converged"
MAX_REWINDS = 3  # rewinds after lost held rows (a worker lost) before the run gives up (the error propagates)

logger = logging.getLogger("scalemb")


class StepRun:
    """One run of a step rule: the executor, its geometry, the rule's mutable ``state`` (an
    ``OptimizerState``) and the hooks ``run_loop`` calls.  ``checkpoint``/``export`` are set by the loop
    (a rule that must checkpoint in the middle of a step, as the spectral solver's interrupted set-up does)."""

    stall_start: int = 0
    window: int = 0
    tol: float = 0.0
    recentres: bool = True  # False: the objective is not invariant under the geometry's re-centring

    def __init__(self, executor, state: OptimizerState):
        self.executor = executor
        self.geometry = geometry_of(executor)
        self.space_dims = executor.space_dims
        self.state = state
        # the model's objective may change with the iteration (a point term switched on after a warm-up): the
        # rules then re-base what they compare across iterations (the line search's current point, DBD's best KL)
        self.iteration_dependent = getattr(getattr(executor, "model", None), "point_term", None) is not None
        self.checkpoint = None
        self.export_now = None

    def evaluate(self, coords: np.ndarray, exaggeration: float, iteration: int, with_kl: bool = True):
        """``executor.evaluate`` of the objective that holds at iteration ``iteration`` (a model's
        ``point_term`` may switch on after a warm-up: the executor passes it the iteration)."""
        return self.executor.evaluate(coords, exaggeration, with_kl=with_kl, iteration=iteration)

    def coords(self) -> np.ndarray:
        """The coordinates now (what ``stop`` sees; a rule holding them elsewhere gathers them)."""
        return self.state.coords

    def close(self) -> None:
        """Release what the run holds (called once the loop has exported its final state)."""

    def rewind(self) -> int:
        """After its held rows were lost (``engine.held.HeldRowsLost``): return to the last state it exported
        and hold it again; the iteration to continue from.  A rule that holds nothing elsewhere never loses
        rows: it is never asked."""
        raise NotImplementedError

    def held_rows(self):
        """None, or an ``engine.held.RowsExport``: the per-point arrays a checkpoint has written by the processes
        holding them (then ``export(..., light=True)`` leaves them None)."""
        return None

    def rescue_iteration(self) -> int:
        """The iteration ``rewind`` returns to."""
        return 0

    def observe(self, it: int, history: np.ndarray) -> tuple[float, float]:
        raise NotImplementedError

    def advance(self, it: int) -> str:
        raise NotImplementedError

    def final_kl(self, it: int, converged: bool, stopped: bool) -> float | None:
        raise NotImplementedError

    def export(self, it: int, history: np.ndarray, seconds: np.ndarray, elapsed: float) -> OptimizerState:
        return self.state.snapshot(it, history, seconds, elapsed)


def run_loop(run: StepRun, n_iter: int, resumed: OptimizerState | None = None, callback=None, checkpoint=None,
             stop=None) -> OptimizeResult:
    """Iterations ``resumed.iteration`` (0 for a fresh run) to at most ``n_iter`` of ``run`` (module
    docstring); ``resumed`` is the state the run was built from, whose history entries are copied in.
    ``run.close()`` is called at the end, however the loop ends."""
    try:
        return _run_loop(run, n_iter, resumed, callback, checkpoint, stop)
    finally:
        run.close()


def _run_loop(run: StepRun, n_iter: int, resumed, callback, checkpoint, stop) -> OptimizeResult:
    s = run.state
    if resumed is None and s.coords is not None:  # (a rule holding them elsewhere checked them itself)
        run.geometry.validate(s.coords, "the optimiser's start coordinates")
    history, seconds, first = history_buffers(resumed, n_iter)
    start = time.perf_counter() - s.elapsed
    at = [first]  # the iteration under way, which ``_iterations`` advances

    def export(light: bool = False):
        """The state at the start of the iteration under way; ``light`` (only where ``run.held_rows()`` is not
        None): without the per-point arrays its holders write themselves."""
        if light:
            return run.export(at[0], history, seconds, time.perf_counter() - start, light=True)
        return run.export(at[0], history, seconds, time.perf_counter() - start)

    export.rows = run.held_rows

    run.checkpoint, run.export_now = checkpoint, export
    rewinds, begin = 0, first
    while True:
        try:
            it, converged, stopped = _iterations(run, begin, n_iter, at, history, seconds, start, callback,
                                                 checkpoint, stop, export)
            at[0] = it
            kl = run.final_kl(it, converged, stopped)
            if kl is not None:
                history[it] = kl
                seconds[it] = time.perf_counter() - start
            staged = _write_final(run, checkpoint, export)
            # rows lost while they are gathered or written: rewound and replayed like any other loss
            final = export(light=True) if staged is not None else export()
            break
        except HeldRowsLost as lost:
            rewinds += 1
            if rewinds > MAX_REWINDS:
                raise
            logger.warning("%s; replaying from iteration %d", lost, run.rescue_iteration())
            begin = run.rewind()
            s = run.state
    return OptimizeResult(s.coords, float(history[it]), history[:it + 1].copy(), it, converged,
                          getattr(s, "backoffs", 0), seconds[:it + 1].copy(), s.evaluations, stopped, final, staged)


def _iterations(run: StepRun, begin: int, n_iter: int, at: list, history, seconds, start: float, callback,
                checkpoint, stop, export) -> tuple[int, bool, bool]:
    """Iterations ``begin`` to at most ``n_iter``: ``(it, converged, stopped)`` with ``it`` the iteration the loop
    ended at (``n_iter`` when it ran out); ``at[0]`` is the iteration under way (``export``'s)."""
    for it in range(begin, n_iter):
        at[0] = it
        if checkpoint is not None and it > begin:
            checkpoint(it, export)
        history[it], kl = run.observe(it, history)
        seconds[it] = time.perf_counter() - start
        if callback is not None:
            callback(it, kl)
        if stop is not None and stop(it, kl, run.coords()):
            return it, False, True
        if not np.isfinite(kl):
            raise FloatingPointError(f"KL became {kl} at iteration {it}")
        if stalled(history, it, run.stall_start, run.window, run.tol):
            return it, True, False
        outcome = run.advance(it)
        if outcome in (HALT, CONVERGED):
            return it, outcome == CONVERGED, False
        if outcome == MOVED and run.recentres:
            run.state.coords = run.geometry.recentre(run.state.coords, run.space_dims)
    return n_iter, False, False


def _write_final(run: StepRun, checkpoint, export):
    """The final rows written by the processes holding them (``checkpoint.final_rows(rows)``, a hook of a
    checkpointed run whose output store they can see: a staged result, ``store.checkpointer.StagedResult``), or None
    (the final state is then gathered: ``export()``).  Only a rule whose rows are held elsewhere
    (``run.held_rows()``) has them written there; the light export first applies what is pending to the rows."""
    final_rows = getattr(checkpoint, "final_rows", None)
    if final_rows is None or run.held_rows() is None:
        return None
    export(light=True)  # a best iterate observed but not yet copied is copied where it is held
    return final_rows(run.held_rows())
