"""Backtracking (Armijo) line search: accept the first step ``a = a0 rho^k`` with
``f(R_x(a p)) <= f(x) + c a g.p`` (Nocedal & Wright, alg. 3.1), ``R_x`` a retraction (``x + a p`` in R^d, a
geometry's ``retract`` on a manifold: ``g.p`` is the derivative of ``f(R_x(a p))`` at ``a = 0`` for either)."""
from dataclasses import dataclass

import numpy as np


@dataclass
class LineSearchResult:
    coords: np.ndarray
    evaluation: object
    step: float
    trials: int
    accepted: bool


def armijo(evaluate, coords, direction, current, step0: float, c: float = 1e-4, rho: float = 0.5,
           max_trials: int = 30, retract=None) -> LineSearchResult:
    """``evaluate(coords) -> Evaluation``; ``current`` is the evaluation at ``coords``; ``retract(coords, step)``
    makes the trial points (``None``: ``coords + step``).

    Returns the accepted point and its evaluation (whose gradient the next iteration reuses).  If no step
    passes, returns the original point unchanged (``accepted=False``), so the objective never increases.
    """
    slope = float(np.sum(current.gradient * direction))
    if not slope < 0:
        return LineSearchResult(coords, current, 0.0, 0, False)
    step = step0
    for trial in range(1, max_trials + 1):
        candidate = coords + step * direction if retract is None else retract(coords, step * direction)
        ev = evaluate(candidate)
        if np.isfinite(ev.objective) and ev.objective <= current.objective + c * step * slope:
            return LineSearchResult(candidate, ev, step, trial, True)
        step *= rho
    return LineSearchResult(coords, current, 0.0, max_trials, False)
