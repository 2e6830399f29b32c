"""What every optimiser returns, the shared stopping rule, and the base of the optimisers' state objects
(checkpoints: ``optimize(..., state=..., checkpoint=...)``)."""
from dataclasses import MISSING, dataclass, field, fields, replace

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
    stopped: bool = False  # a ``stop`` callback ended the run
    state: object = None  # the optimiser's state at the end: ``optimize(..., state=result.state)`` continues
    # the final rows, written by the workers holding them into a staged result (``store.checkpointer.StagedResult``):
    # ``coords`` and ``state``'s per-point arrays are then None (the client never held them)
    written: object = None


def stalled(history: np.ndarray, it: int, start: int, window: int, tol: float) -> bool:
    """True once ``it >= start + window`` and the KL fell by less than ``tol`` (relative, per iteration)
    on average over the last ``window`` iterations; a window over which the KL rose is not a stall (a line
    search only descends: the objective itself changed, as a model's point term does after its warm-up, e.g.
    CO-SNE's norm loss, which would otherwise end the run right there).  Entries not computed (NaN,
    ``DeltaBarDelta.kl_every``): never stalled at one; the window reaches back to the last computed entry at or
    before ``it - window``."""
    if tol <= 0 or it < start + window or not np.isfinite(history[it]):
        return False
    back = it - window
    while back > 0 and np.isnan(history[back]):
        back -= 1
    if history[it] > history[back]:  # the objective rose: it changed (a point term after its warm-up), not a stall
        return False
    return (history[back] - history[it]) < tol * (it - back) * abs(history[it])


def last_computed(history: np.ndarray, it: int) -> float:
    """The last entry of ``history[:it + 1]`` that is not NaN (NaN if none is)."""
    computed = np.flatnonzero(~np.isnan(history[:it + 1]))
    return float(history[computed[-1]]) if computed.size else float("nan")


@dataclass
class OptimizerState:
    """An optimiser's complete state at the start of iteration ``iteration`` (subclasses add their fields).

    Fields are NumPy arrays, ``None`` or JSON scalars, so ``split``/``join`` turn a state into
    ``(arrays, scalars)`` and back without knowing the fields.  ``kl_history`` and ``seconds`` hold the
    entries of iterations ``0 .. iteration - 1``; ``elapsed`` is the optimiser's wall time so far.
    """

    iteration: int
    coords: np.ndarray
    kl_history: np.ndarray
    seconds: np.ndarray
    evaluations: int
    elapsed: float

    def split(self) -> tuple[dict, dict]:
        """``(arrays, scalars)``: ndarray fields, then every other field (JSON-serialisable values)."""
        arrays, scalars = {}, {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                arrays[f.name] = value
            else:
                scalars[f.name] = value.item() if isinstance(value, np.generic) else value
        return arrays, scalars

    @classmethod
    def join(cls, arrays: dict, scalars: dict):
        """Inverse of ``split``; raises ``KeyError`` naming a missing field that has no default."""
        values = {}
        for f in fields(cls):
            if f.name in arrays:
                values[f.name] = np.asarray(arrays[f.name])
            elif f.name in scalars:
                values[f.name] = scalars[f.name]
            elif f.default is not MISSING:  # a field added since the state was written: its default
                values[f.name] = f.default
            else:
                raise KeyError(f.name)
        return cls(**values)

    def snapshot(self, iteration: int, history: np.ndarray, seconds: np.ndarray, elapsed: float,
                 share: bool = False):
        """A deep copy at the start of ``iteration`` with the first ``iteration`` history entries; ``share``: the
        per-point ``(d, N)`` arrays are the same objects (for a caller that never writes them, e.g. a rescue copy
        of arrays a holder has copied or sent away: one O(N) copy fewer on the client)."""
        copy = replace(self, iteration=iteration, kl_history=history[:iteration], seconds=seconds[:iteration],
                       elapsed=elapsed)
        for f in fields(copy):
            value = getattr(copy, f.name)
            if isinstance(value, np.ndarray) and not (share and value.ndim == 2):
                setattr(copy, f.name, value.copy())
        return copy


def history_buffers(state: OptimizerState | None, n_iter: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(kl_history, seconds, first_iteration)`` buffers of length ``n_iter + 1`` with ``state``'s entries
    copied in; ``ValueError`` if the state is already past ``n_iter``."""
    history, seconds = np.empty(n_iter + 1), np.empty(n_iter + 1)
    if state is None:
        return history, seconds, 0
    first = int(state.iteration)
    if first > n_iter:
        raise ValueError(f"the checkpoint is at iteration {first}; iterations must be at least that")
    history[:first] = state.kl_history
    seconds[:first] = state.seconds
    return history, seconds, first
