"""What every optimiser returns, and the shared stopping rule."""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class OptimizeResult:
    coords: np.ndarray
    kl: float
    kl_history: np.ndarray  # exact KL at iterations 0..iterations
    iterations: int
    converged: bool
    backoffs: int = 0
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # wall time at each history entry
    evaluations: int = 0  # KL + gradient evaluations (line-search trials included)


def stalled(history: np.ndarray, it: int, start: int, window: int, tol: float) -> bool:
    """True once ``it >= start + window`` and the KL fell by less than ``tol`` (relative, per iteration)
    on average over the last ``window`` iterations."""
    if tol <= 0 or it < start + window:
        return False
    old, new = history[it - window], history[it]
    return (old - new) < tol * window * abs(new)
