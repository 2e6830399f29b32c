"""A model's objective: how the row blocks' partial sums reduce to the objective value and its gradient.

Every executor evaluates the same per-block partials (``scalemb.engine.blocks``): ``plogw = sum_ij p_ij log w_ij``
over P's non-zeros, the attraction rows ``A_i = sum_j p_ij d log w_ij / d y_i``, the repulsion
``R_i = sum_j w_ij d log w_ij / d y_i`` over all pairs and ``z = sum_{i != j} w_ij``.  An ``Objective`` turns
their sums into ``(value, objective, gradient)``:

* ``value``: the model's objective without early exaggeration (what ``Evaluation.kl`` reports; the KL for KL
  models), NaN when asked for ``with_kl=False`` (the blocks then skip ``plogw``);
* ``objective``: the function the gradient differentiates, with the attraction weighted by ``exaggeration``
  (equal to ``value`` at ``exaggeration = 1``), NaN likewise;
* ``gradient``: ``(d, N)``.

A model with another loss (the elastic embedding's ``-sum p log w + lambda Z``, say) subclasses ``Objective``;
the engine calls nothing else.
"""
from dataclasses import dataclass

import numpy as np


class Objective:
    """Reduction of the block partials to ``(value, objective, gradient)`` (see the module docstring)."""

    name = "objective"  # the value's key in outputs (result attributes keep "kl" for every model)
    label = "objective"  # how figures and reports name the value

    def reduce(self, plogw: float, A: np.ndarray, R: np.ndarray, z: float, entropy: float, exaggeration: float,
               with_kl: bool) -> tuple:
        """``plogw``, ``z``: the sums over blocks; ``A``, ``R``: ``(d, N)``; ``entropy = sum p log p``."""
        value, objective = self.values(plogw, z, entropy, exaggeration, with_kl, R.shape[1])
        return value, objective, self.gradient(A, R, z, exaggeration, R.shape[1])

    def values(self, plogw: float, z: float, entropy: float, exaggeration: float, with_kl: bool,
               n_points: int) -> tuple:
        """``(value, objective)`` from the sums alone (NaN, NaN without ``with_kl``)."""
        raise NotImplementedError

    def gradient(self, A: np.ndarray, R: np.ndarray, z: float, exaggeration: float, n_points: int) -> np.ndarray:
        """The gradient's columns from the same columns of ``A`` and ``R`` (``(d, m)``, any ``m`` of the N points):
        elementwise, so a row block's rows, reduced where they were computed, equal those columns of the whole."""
        raise NotImplementedError


@dataclass(frozen=True)
class KL(Objective):
    """``KL(P||Q)`` with ``q_ij = w_ij / Z``: ``KL = sum p log p - sum p log w + log Z``,
    ``dKL/dy_i = 2 (R_i / Z - A_i)`` (``scalemb.models.kernels``); with exaggeration ``alpha`` the objective is
    ``sum p log p - alpha sum p log w + log Z`` and its gradient ``2 (R / Z - alpha A)``.  ``Z = 0`` or ``inf``
    gives a non-finite value, which the optimisers treat as a blow-up."""

    name = "kl"
    label = "KL(P‖Q)"

    def values(self, plogw, z, entropy, exaggeration, with_kl, n_points):
        with np.errstate(divide="ignore", invalid="ignore"):
            value = entropy - plogw + np.log(z) if with_kl else np.nan
            objective = entropy - exaggeration * plogw + np.log(z) if with_kl else np.nan
        return value, objective

    def gradient(self, A, R, z, exaggeration, n_points):
        with np.errstate(divide="ignore", invalid="ignore"):
            return 2.0 * (R / z - exaggeration * A)


__all__ = ["KL", "Objective"]
