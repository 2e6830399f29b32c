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
``geometry.recentre`` (see ``DescentRun``); Euclidean runs are bit for bit what they were.

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
from dataclasses import dataclass, field

import numpy as np

from .base import OptimizeResult
from .loop import run_loop
from .descent_held import _HeldDescentRun, held_mode, initial_state
from .descent_steps import DescentRun, DescentState, factorize
from .solvers import interruptible, jacobi_preconditioner, pcg, pcg_one_reduction

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
# cg_maxiter='auto': CG's iteration cap per preconditioner (``LineSearchDescent._cg_maxiter``).
AUTO_CG_MAXITER = {"jacobi": 10, "lu": 50, "amg": 50}


def _check_whole_or_none(name: str, value, minimum: int) -> None:
    """ValueError naming ``name`` unless ``value`` is None or a whole number >= ``minimum``."""
    if value is not None and (int(value) != value or value < minimum):
        raise ValueError(f"{name} must be an integer >= {minimum} or None, got {value!r}")


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
                                     (self.preconditioner, PRECONDITIONERS, "preconditioner"),
                                     (self.exaggeration_steps, EXAGGERATION_STEPS, "exaggeration_steps")):
            if value not in allowed:
                raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
        if self.max_point_step is not None and not self.max_point_step > 0:
            raise ValueError(f"max_point_step must be > 0 or None, got {self.max_point_step!r}")
        for name, minimum in (("spectral_iterations", 0), ("polish_spectral_every", 1), ("max_iterations", 1)):
            _check_whole_or_none(name, getattr(self, name), minimum)
        if self.time_gains is not None and not (isinstance(self.time_gains, (int, float)) and self.time_gains >= 1):
            raise ValueError(f"time_gains must be a number >= 1 or None, got {self.time_gains!r}")
        if not 0 <= self.polish_momentum < 1:
            raise ValueError(f"polish_momentum must be in [0, 1), got {self.polish_momentum!r}")
        if self.cg_maxiter != "auto" and not (isinstance(self.cg_maxiter, int) and self.cg_maxiter >= 1):
            raise ValueError(f"cg_maxiter must be an integer >= 1 or 'auto', got {self.cg_maxiter!r}")
        if self.cg_tol != "auto" and not (isinstance(self.cg_tol, (int, float)) and self.cg_tol > 0):
            raise ValueError(f"cg_tol must be a number > 0 or 'auto', got {self.cg_tol!r}")
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
        supplies the step rule (``DescentRun``)."""
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
            run = DescentRun(self, executor, self.initial_state(executor, coords), False, checkpoint)
        else:
            s = state.snapshot(state.iteration, state.kl_history, state.seconds, state.elapsed)
            run = DescentRun(self, executor, s, True, checkpoint)
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
            state["factor"] = factorize(executor, mu, s.ordering if s.factor_ordered else None,
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
                state["factor"] = interruptible(lambda: factorize(executor, mu, ordering, kind), should_stop)
                state["ordering"] = state["factor"].ordering
        if solver == "lu":
            return state["factor"].solve(-space_grad)
        if preconditioner == "jacobi":
            precondition = jacobi_preconditioner(state["diagonal"], state["mu"])
        else:
            precondition = state["factor"].solve
        # Jacobi-CG on the current iterate's curvature is the solve a cluster runs on held rows (``descent_held``):
        # its one-reduction form here too, so that a run is the same number on the client's arrays and on the
        # workers'; on the fixed curvature (never held) PCG's own form, whose recorded runs keep their bits
        solve = pcg_one_reduction if preconditioner == "jacobi" and not fixed else pcg
        cg = solve(executor.laplacian_matvec, -space_grad, precondition, state["mu"], x0=previous,
                   tol=self.cg_tol if tol is None else tol, maxiter=self._cg_maxiter(preconditioner),
                   should_stop=should_stop)
        if cg.iterations > (AMG_REFRESH_AFTER if preconditioner == "amg" else self.refresh_after):
            state.pop("factor", None)
        return cg.x
