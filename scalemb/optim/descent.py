"""Line-search descent: the spectral direction (Vladymyrov & Carreira-Perpinan, ICML 2012) and plain
gradient descent, both with a backtracking Armijo line search.

Spectral direction for the space coordinates S: solve ``(L(C) + mu I) P_s = -G_s`` where ``L(C) S`` is the
attractive part of the gradient, i.e. a positive semi-definite partial Hessian.  ``curvature='fixed'`` uses
``C = 4 alpha P`` (the paper's B, constant, so a factorisation is reused); ``curvature='iterate'`` uses
``C = -2 alpha a_ij p_ij`` at the current iterate (``4 alpha P o K`` for t-SNE), which tracks the t-SNE
Hessian far better once clusters separate.  ``mu`` is relative to the mean diagonal of L(C): the graph's
connected components make L(C) singular (GrQc has 355), and their relative translations are driven by
repulsion only, so mu must be small (measured: 1e-5 relative; see benchmarks/optimizers.py).

Time coordinates (SNEST): their attractive term ``-sum p |t_i - t_j|^2`` is concave, so ``L(C)`` is no
curvature model there.  We keep the SNEST paper's choice, one global adaptive learning rate, and put its
step ``-eta_t G_t`` into the same search direction; ``eta_t`` grows by ``x1.2`` while successive time
gradients keep the descent direction and halves otherwise.  ``time_gains = g_max`` scales each point's time step
by its own gain as delta-bar-delta does (``+0.2`` while its time gradient keeps its sign across accepted steps,
``x0.8`` otherwise, within ``[0.01, g_max]``; ``time_gains``): the time rows start at the saddle ``t = 0`` of
``exp(dt^2)`` and leave it at different speeds, which one global rate follows badly.  The ceiling keeps the line
search, which scales space and time together, from shrinking the space step for a few runaway time rows.

On a manifold (the model's ``geometry``) the descent is Riemannian: the gradient direction is the Riemannian
gradient, trial points are ``geometry.retract(x, a p)`` and accepted points are re-centred by
``geometry.recentre`` (see ``_DescentRun``); Euclidean runs are bit for bit what they were.

Line search: start from the last accepted step (``x growth`` after a first-trial acceptance, at most
``max_step``), shrink by ``rho``, accept when ``f(x + a p) <= f(x) + c a g.p``; f is the (exaggerated)
objective, so KL never increases once exaggeration is off.  Gradient descent (``direction='gradient'``)
uses ``P = -G`` and no step cap.  The run stops once the KL fell by less than ``tol`` = 1e-5 (relative, per
iteration) over the last 50 iterations: on GrQc that is after ~1000 iterations, where KL is within ~4 % of
what another 4000 iterations give.

Defaults (measured on GrQc, benchmarks/optimizers.py): sparse LU of the current-iterate L(C) refreshed every
10 iterations (every iteration below 1024 points, where it is cheap; SCHOOL R^{1,1} needs it) (in between the
lagged factorisation is reused: a factorisation costs ~1.5 evaluations, a solve ~0.1), unit step cap with growth
1.2 (1.25 evaluations per iteration instead of 1.5 with the reference code's growth 1.5 and no cap), no early
exaggeration.  ``solver='cg'`` is the matrix-free form
(row-block Laplacian products) that a distributed executor runs, and ``solver='auto'``'s from 2e4 points
(Jacobi-preconditioned); with Jacobi it solves inexactly by default (``cg_tol='auto'``: CG's relative tolerance
follows the gradient's decrease, Eisenstat & Walker's forcing term, ``LineSearchDescent._forcing``).

At scale (issue 29): ``max_point_step = R`` bounds every point's space step to norm R (a per-point trust region,
``bounded_direction``): the solve moves loosely attached parts of the graph by their gradient over the smallest
eigenvalues of ``L(C)``, which spread a layout of 7.7e4 co-authors to ~800 units in 5 iterations, where the FFT
grid is capped.  ``exaggeration_steps='momentum'`` makes the exaggeration phase openTSNE's (bounded momentum steps
``u <- m u - lr g``, ``lr = max(1, N/12)``, one evaluation per iteration, no line search) instead of spectral
steps on the exaggerated objective; the spectral steps follow.  ``max_iterations``: the schedule's own budget
(as delta-bar-delta's), on top of the run's; ``budget``.
"""
import logging
from dataclasses import dataclass, field, replace

import numpy as np

from ..engine.blocks import Evaluation
from .base import OptimizeResult, OptimizerState
from .dbd import clip_step_norms, gains_update
from .linesearch import armijo
from .loop import HALT, KEPT, MOVED, StepRun, run_loop
from .solvers import SetupInterrupted, interruptible, jacobi_preconditioner, pcg

logger = logging.getLogger("scalemb")

DIRECTIONS = ("spectral", "gradient")
SOLVERS = ("auto", "cg", "lu")
CURVATURES = ("iterate", "fixed")
PRECONDITIONERS = ("lu", "amg", "jacobi")
EXAGGERATION_STEPS = ("spectral", "momentum")
# solver='auto': sparse LU below this many points, PCG on the row-block Laplacian products from it on
# (the LU of a co-authorship graph's curvature fills in super-linearly; GrQc, N = 5241, keeps LU and its
# results: docs/design/optimisation.md).
AUTO_LU_MAX_POINTS = 20_000
# PCG with a multigrid preconditioner rebuilds it (a set-up costs many V-cycles) only once CG needs more than
# this many iterations, or when the curvature is refreshed (``refactor_every``).
AMG_REFRESH_AFTER = 20
# cg_tol='auto' (inexact Newton, ``LineSearchDescent._forcing``): the range of CG's relative tolerance.
EW_MIN, EW_MAX = 1e-3, 0.5
# A momentum step (no line search: exaggeration, polish) whose KL exceeds this factor times the KL before it is
# undone (``_DescentRun._momentum_move``), as delta-bar-delta's ``divergence_factor``.
MOMENTUM_DIVERGENCE = 2.0
# cg_maxiter='auto': CG's iteration cap per preconditioner (``LineSearchDescent._cg_maxiter``).
AUTO_CG_MAXITER = {"jacobi": 10, "lu": 50, "amg": 50}


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


@dataclass
class LineSearchDescent:
    """Descent along the spectral direction (``direction='spectral'``) or the negative gradient."""

    derives_start = True  # ``optimize`` takes the start as a recipe (a callable) too: a held run re-derives it

    direction: str = "spectral"
    solver: str = "auto"
    curvature: str = "iterate"
    preconditioner: str = "lu"
    refresh_after: int = 4
    refactor_every: int | str = "auto"
    mu: float = 1e-5
    cg_tol: float | str = "auto"
    cg_maxiter: int | str = "auto"
    c: float = 1e-4
    rho: float = 0.5
    growth: float = 1.2
    max_step: float = 1.0
    max_point_step: float | None = None
    time_rate: float | str = "auto"
    time_gains: float | None = None
    exaggeration: float = 1.0
    exaggeration_iterations: int = 0
    exaggeration_steps: str = "spectral"
    exaggeration_momentum: float = 0.5
    spectral_iterations: int | None = None
    polish_momentum: float = 0.8
    polish_spectral_every: int | None = None
    tol: float = 1e-5
    window: int = 50
    max_failures: int = 3
    max_iterations: int | None = None
    name: str = field(default="sd", init=False)

    def __post_init__(self):
        for value, allowed, what in ((self.direction, DIRECTIONS, "direction"), (self.solver, SOLVERS, "solver"),
                                     (self.curvature, CURVATURES, "curvature"),
                                     (self.preconditioner, PRECONDITIONERS, "preconditioner")):
            if value not in allowed:
                raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
        if self.exaggeration_steps not in EXAGGERATION_STEPS:
            raise ValueError(f"unknown exaggeration_steps {self.exaggeration_steps!r}; choose one of "
                             f"{', '.join(EXAGGERATION_STEPS)}")
        if self.max_point_step is not None and not self.max_point_step > 0:
            raise ValueError(f"max_point_step must be > 0 or None, got {self.max_point_step!r}")
        if self.spectral_iterations is not None and (int(self.spectral_iterations) != self.spectral_iterations
                                                     or self.spectral_iterations < 0):
            raise ValueError(f"spectral_iterations must be an integer >= 0 or None, got {self.spectral_iterations!r}")
        if self.polish_spectral_every is not None and (int(self.polish_spectral_every) != self.polish_spectral_every
                                                       or self.polish_spectral_every < 1):
            raise ValueError(f"polish_spectral_every must be an integer >= 1 or None, got "
                             f"{self.polish_spectral_every!r}")
        if self.time_gains is not None and not (isinstance(self.time_gains, (int, float)) and self.time_gains >= 1):
            raise ValueError(f"time_gains must be a number >= 1 or None, got {self.time_gains!r}")
        if not 0 <= self.polish_momentum < 1:
            raise ValueError(f"polish_momentum must be in [0, 1), got {self.polish_momentum!r}")
        if self.cg_maxiter != "auto" and not (isinstance(self.cg_maxiter, int) and self.cg_maxiter >= 1):
            raise ValueError(f"cg_maxiter must be an integer >= 1 or 'auto', got {self.cg_maxiter!r}")
        if self.cg_tol != "auto" and not (isinstance(self.cg_tol, (int, float)) and self.cg_tol > 0):
            raise ValueError(f"cg_tol must be a number > 0 or 'auto', got {self.cg_tol!r}")
        if self.max_iterations is not None and (int(self.max_iterations) != self.max_iterations
                                                or self.max_iterations < 1):
            raise ValueError(f"max_iterations must be an integer >= 1 or None, got {self.max_iterations!r}")
        if self.direction == "gradient":
            self.name = "gd"

    def budget(self, n_iter: int) -> int:
        """Iterations a run asked for ``n_iter`` makes: at most ``max_iterations`` (the schedule's own budget),
        None: ``n_iter``.  ``Embedder.continue_run`` lifts it."""
        return int(n_iter) if self.max_iterations is None else min(int(n_iter), int(self.max_iterations))

    def params(self) -> dict:
        return {"optimizer": self.name, "direction": self.direction, "solver": self.solver,
                "curvature": self.curvature, "preconditioner": self.preconditioner,
                "refresh_after": self.refresh_after,
                "refactor_every": self.refactor_every, "mu": self.mu, "cg_tol": self.cg_tol,
                "cg_maxiter": self.cg_maxiter,
                "c": self.c, "rho": self.rho, "growth": self.growth, "max_step": self.max_step,
                "max_point_step": self.max_point_step, "time_rate": self.time_rate,
                "exaggeration": self.exaggeration, "exaggeration_iterations": self.exaggeration_iterations,
                "exaggeration_steps": self.exaggeration_steps, "exaggeration_momentum": self.exaggeration_momentum,
                "spectral_iterations": self.spectral_iterations, "polish_momentum": self.polish_momentum,
                "polish_spectral_every": self.polish_spectral_every,
                "tol": self.tol, "window": self.window,
                **({} if self.time_gains is None else {"time_gains": self.time_gains}),
                **({} if self.max_iterations is None else {"max_iterations": self.max_iterations})}

    def methods(self, n_points: int) -> tuple[str, str]:
        """``(solver, preconditioner)`` used for ``n_points`` points: ``solver='auto'`` is ``'lu'`` below
        ``AUTO_LU_MAX_POINTS`` points, otherwise ``'cg'`` preconditioned by ``preconditioner``, where the
        default ``'lu'`` (a lagged factorisation: the size LU cannot handle) becomes ``'jacobi'``.

        Jacobi, not multigrid: with the inexact solve (``cg_tol='auto'``) CG needs 10-20 Laplacian products per
        iteration with Jacobi and ~5 V-cycles with aggregation multigrid, but pyamg's V-cycle costs ~4 products
        and its hierarchy is rebuilt as the curvature changes; per iteration the Jacobi solve was 5-36x cheaper
        at 7.7e4 points, at an equal or lower KL per iteration (docs/design/optimisation.md)."""
        if self.solver != "auto":
            return self.solver, self.preconditioner
        if n_points < AUTO_LU_MAX_POINTS:
            return "lu", self.preconditioner
        return "cg", "jacobi" if self.preconditioner == "lu" else self.preconditioner

    def _refactor_every(self, n_points: int) -> int:
        """Iterations between factorisations.

        'auto': every iteration below 1024 points (a factorisation costs little next to an evaluation there),
        otherwise every 10 (measured on GrQc: same KL per iteration as every 5 within run-to-run noise, and
        the direction's overhead drops from ~75 % to ~45 % of an evaluation; every iteration is slower).
        """
        if self.refactor_every == "auto":
            return 1 if n_points < 1024 else 10
        return max(1, int(self.refactor_every))

    def _max_step(self) -> float:
        return self.max_step if self.direction == "spectral" else np.inf

    def _initial_step(self, n_points: int) -> float:
        # the spectral direction is Newton-like (unit step); the gradient needs t-SNE's N/12 scale
        return 1.0 if self.direction == "spectral" else max(1.0, n_points / 12.0)

    def _time_rate(self, n_points: int) -> float:
        return max(1.0, n_points / 12.0) * 0.002 if self.time_rate == "auto" else float(self.time_rate)

    def initial_state(self, executor, coords: np.ndarray) -> "DescentState":
        """The state before iteration 0 at ``coords`` (``(ds + dt, N)``); evaluates the objective there."""
        coords = np.array(coords, dtype=np.float64, order="C")
        n_points = coords.shape[1]
        alpha = self.exaggeration if self.exaggeration_iterations > 0 else 1.0
        ev = executor.evaluate(coords, alpha, iteration=0)
        return DescentState(iteration=0, coords=coords, kl_history=np.zeros(0), seconds=np.zeros(0),
                            evaluations=1, elapsed=0.0, kl=ev.kl, objective=ev.objective, gradient=ev.gradient,
                            z=ev.z, alpha=alpha, step=self._initial_step(n_points), time_rate=self._time_rate(n_points),
                            previous_space=None, previous_time_step=None, failures=0, factored_at=0, stale=True,
                            ordering=None, curvature_coords=None, curvature_alpha=None, factor_coords=None,
                            factor_alpha=None, factor_ordered=False)

    def optimize(self, executor, coords: np.ndarray, n_iter: int, callback=None,
                 state: "DescentState | None" = None, checkpoint=None, stop=None) -> OptimizeResult:
        """Run at most ``n_iter`` iterations from ``coords`` (``(ds + dt, N)``) or, if given, from ``state``
        (``coords`` is then ignored; the lagged factorisation is recomputed from it); ``callback(it, kl)`` each
        step.  ``checkpoint(it, export)`` is called at the start of every iteration after the first one run
        here; ``export()`` returns a ``DescentState`` from which ``optimize`` continues exactly as this run does.
        ``stop(it, kl, coords)`` after ``callback``: True ends the run there (``stopped``).  The result's ``state``
        continues the run (``state=result.state``).  The iterations are ``optim.loop.run_loop``'s; this class
        supplies the step rule (``_DescentRun``)."""
        from .descent_held import _HeldDescentRun, held_mode, initial_state

        recipe = None
        if state is None and callable(coords):  # a recipe (``derives_start``): a rewind to the start re-derives it
            recipe, coords = coords, coords()
        if state is None:
            executor.check_coords(coords)
        n_points = (np.shape(coords) if state is None else np.shape(state.coords))[1]
        if held_mode(self, executor, n_points):  # the per-point state held where the row blocks are
            s = initial_state(self, coords) if state is None else \
                state.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed)
            del coords
            run = _HeldDescentRun(self, executor, s, state is not None, checkpoint, recipe)
        elif state is None:
            run = _DescentRun(self, executor, self.initial_state(executor, coords), False, checkpoint)
        else:
            s = state.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed)
            run = _DescentRun(self, executor, s, True, checkpoint)
        return run_loop(run, self.budget(n_iter), state, callback, checkpoint, stop)

    def _restore_solver(self, executor, s: "DescentState", methods: tuple[str, str]) -> dict:
        """Rebuild the spectral solver's cache from ``s``: the executor's curvature and the lagged
        factorisation are recomputed at the coordinates where they were computed (same ordering path)."""
        state = {"stale": True} if s.stale else {}
        if s.ordering is not None:
            state["ordering"] = s.ordering
        fixed = self.curvature == "fixed"
        if s.factor_coords is not None:
            executor.set_curvature(s.factor_coords, s.factor_alpha, fixed=fixed)
            mu = self.mu * float(executor.curvature_diagonal().mean())
            state["factor"] = _factorize(executor, mu, s.ordering if s.factor_ordered else None,
                                         self._factor_kind(methods))
            state["factor_at"] = ((s.factor_coords, s.factor_alpha), s.factor_ordered)
        if s.curvature_coords is not None:
            executor.set_curvature(s.curvature_coords, s.curvature_alpha, fixed=fixed)
            state["diagonal"] = executor.curvature_diagonal()
            state["mu"] = self.mu * float(state["diagonal"].mean())
            state["curvature_at"] = (s.curvature_coords, s.curvature_alpha)
        return state

    @staticmethod
    def _factor_kind(methods: tuple[str, str]) -> str:
        """What ``executor.factorize_curvature`` builds: the LU, or a multigrid hierarchy for PCG."""
        return "amg" if methods == ("cg", "amg") else "lu"

    def _cg_maxiter(self, preconditioner: str) -> int:
        """CG's iteration cap: ``cg_maxiter``, or for ``'auto'`` ``AUTO_CG_MAXITER[preconditioner]`` (10 with
        Jacobi: a truncated Newton solve; past a compact layout Jacobi-CG's residual does not fall below the
        right-hand side's norm within 50 iterations -- the curvature of stretched edges is tiny and mu small --
        and at 7.7e4 points 10 iterations reached a lower KL per iteration than 50, at a fifth of the products;
        50 with a factorisation or multigrid, which reach ``EW_MIN`` in a few)."""
        if self.cg_maxiter == "auto":
            return AUTO_CG_MAXITER.get(preconditioner, 50)
        return int(self.cg_maxiter)

    def _forcing(self, s: "DescentState", space_grad: np.ndarray, preconditioner: str) -> float:
        """CG's relative tolerance for this iteration's solve, and the state's record of it.

        A number: ``cg_tol``.  ``'auto'`` with a factorisation or multigrid preconditioner: ``EW_MIN`` (1e-3:
        CG reaches it in a few iterations there).  ``'auto'`` with Jacobi (each CG iteration a row-block Laplacian
        product, dozens of them to 1e-3): inexact Newton with Eisenstat & Walker's (1996) choice 2, ``eta_k =
        0.9 (|g_k| / |g_{k-1}|)^2``, safeguarded by ``0.9 eta_{k-1}^2`` where that exceeds 0.1 (no sudden
        tightening), clipped to ``[EW_MIN, EW_MAX]``; the first solve uses ``EW_MAX``.  Far from a minimiser the
        direction only needs its first digit; at 7.7e4 points the inexact solve gave a lower KL per iteration than
        the one to 1e-3 at 40 % of its products.  Not for the lagged-LU preconditioner: there the descent
        converges linearly, choice 2 then stays at its ceiling and the direction degrades towards a scaled
        gradient (SCHOOL, t-SNE: KL 0.640 after 100 iterations against 0.618 at 1e-3).

        The norm is taken only where it is read: past 1e4 entries ``np.linalg.norm`` is a threaded BLAS dot
        product, whose threads, on a loaded machine, wait to be scheduled for longer than the LU solve takes."""
        needed = self.cg_tol == "auto" and preconditioner == "jacobi"
        return self._forcing_from_norm(s, float(np.linalg.norm(space_grad)) if needed else None, preconditioner)

    def _forcing_from_norm(self, s: "DescentState", norm: float | None, preconditioner: str) -> float:
        """``_forcing`` from the space gradient's norm (only read for ``cg_tol='auto'`` with Jacobi: None
        otherwise)."""
        if self.cg_tol != "auto":
            return float(self.cg_tol)
        if preconditioner != "jacobi":
            return EW_MIN
        if s.forcing is None or not s.gradient_norm:
            eta = EW_MAX
        else:
            eta = 0.9 * (norm / s.gradient_norm) ** 2
            guard = 0.9 * s.forcing ** 2
            if guard > 0.1:
                eta = max(eta, guard)
            eta = min(max(eta, EW_MIN), EW_MAX)
        s.forcing, s.gradient_norm = float(eta), norm
        return float(eta)

    def _spectral(self, executor, coords, space_grad, alpha, state, previous, methods, should_stop=None,
                  tol=None):
        """Solve ``(L(C) + mu I) P = -G`` for the space block; ``state`` carries the solver between calls.

        ``solver='lu'``: factorise L(C) once (``curvature='fixed'``) or whenever ``state['stale']`` is set
        (every ``refactor_every`` iterations for ``'iterate'``; in between, the last factorisation gives a
        lagged direction).  The fill-reducing ordering is computed once and reused.
        ``solver='cg'``: update the row-block weights C (every iteration for ``'iterate'``), then PCG
        warm-started from the previous direction, preconditioned by Jacobi or by the factorisation of an
        earlier L(C), refreshed when stale or once CG needed more than ``refresh_after`` iterations, or by a
        multigrid preconditioner of an earlier L(C) (``'amg'``, refreshed when stale or after
        ``AMG_REFRESH_AFTER`` iterations).  ``methods``: ``(solver, preconditioner)`` (``self.methods``).  The
        factorisation or hierarchy is built by ``interruptible`` and CG checks ``should_stop()`` every
        iteration: ``SetupInterrupted`` once it is True.
        """
        solver, preconditioner = methods
        fixed = self.curvature == "fixed"
        stale = state.pop("stale", False) and not (fixed and "mu" in state)
        if stale or (solver == "cg" and not fixed):
            executor.set_curvature(coords, alpha, fixed=fixed)
            state["curvature_at"] = (coords.copy(), alpha)  # where it was computed (for checkpoints)
            state["diagonal"] = executor.curvature_diagonal()
            state["mu"] = self.mu * float(state["diagonal"].mean())
            if stale:
                state.pop("factor", None)
        if solver == "lu" or preconditioner in ("lu", "amg"):
            if "factor" not in state:
                state["factor_at"] = (state["curvature_at"], state.get("ordering") is not None)
                mu, ordering, kind = state["mu"], state.get("ordering"), self._factor_kind(methods)
                state["factor"] = interruptible(lambda: _factorize(executor, mu, ordering, kind), should_stop)
                state["ordering"] = state["factor"].ordering
        if solver == "lu":
            return state["factor"].solve(-space_grad)
        if preconditioner == "jacobi":
            precondition = jacobi_preconditioner(state["diagonal"], state["mu"])
        else:
            precondition = state["factor"].solve
        cg = pcg(executor.laplacian_matvec, -space_grad, precondition, state["mu"], x0=previous,
                 tol=self.cg_tol if tol is None else tol, maxiter=self._cg_maxiter(preconditioner),
                 should_stop=should_stop)
        if cg.iterations > (AMG_REFRESH_AFTER if preconditioner == "amg" else self.refresh_after):
            state.pop("factor", None)
        return cg.x


def guarded_solve(run, it: int, solve):
    """``solve()`` for iteration ``it`` of a spectral step rule (``_DescentRun``, ``_HeldDescentRun``) with the
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


def momentum_diverged(s: "DescentState", it: int, ev, before) -> bool:
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


def _factorize(executor, mu: float, ordering, kind: str):
    """``executor.factorize_curvature`` (``kind`` passed only when it is not the LU every executor has)."""
    if kind == "lu":
        return executor.factorize_curvature(mu, ordering)
    return executor.factorize_curvature(mu, ordering, kind=kind)


class _DescentRun(StepRun):
    """Line-search descent as a step rule of ``run_loop``.

    Riemannian form: the gradient direction is ``-riemannian_gradient`` and every line-search trial point is
    ``retract(x, a p)``; the Armijo test keeps the Euclidean slope ``<grad, p>``, which is the derivative of
    ``f(retract(x, a p))`` at ``a = 0`` for any retraction.  The spectral direction solves with the Euclidean
    gradient: it is a Newton-like direction ``-B^{-1} grad`` with ``B`` the model's partial Hessian in the
    coordinates, and a Newton direction does not change with the metric (``(G^{-1} H)^{-1} G^{-1} grad =
    H^{-1} grad``), so scaling the gradient by the metric would only be undone by the curvature's."""

    def __init__(self, rule: LineSearchDescent, executor, state: DescentState, resumed: bool, checkpoint):
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
        r, s, ds, solver_state = self.rule, self.state, self.space_dims, self.solver_state
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

    def export(self, it: int, history: np.ndarray, seconds: np.ndarray, elapsed: float) -> DescentState:
        return self.state.export(it, history, seconds, elapsed, self.ev, self.solver_state)
