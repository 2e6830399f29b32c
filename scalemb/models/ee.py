"""Elastic embedding (EE; Carreira-Perpinan, ICML 2010), trained as in Vladymyrov & Carreira-Perpinan (ICML 2012).

Objective, over ordered pairs ``i != j`` with the symmetric P of the other models (``sum_ij p_ij = 1``)::

    E(Y) = sum_ij p_ij |y_i - y_j|^2 + (lam / N) sum_ij exp(-|y_i - y_j|^2)

Relation to the paper: its ``E(X; lam) = sum w+_nm |x_n - x_m|^2 + lam sum w-_nm exp(-|x_n - x_m|^2)`` (also over
ordered pairs, ``w_nn = 0``) with ``W+ = N P`` (rows of W+ sum to 1 on average, the scale of row-normalised
affinities) and ``W- = 1`` off the diagonal (uniform repulsion, all pairs) is ``N E(Y)``: same minimisers, and
``lam`` is the paper's lambda.  Dividing by N keeps the objective on the scale of the attraction (E >= 0; the
value at the 1e-4 random start is ~lam (N - 1)), and makes one ``lam`` mean the same layout density for any N: by
the virial identity at a stationary point (``sum_i y_i . dE/dy_i = 0``) ``sum p d^2 = (lam / N) sum w d^2``.

Block partials: with SNE's kernels (``scalemb.models.sne``: ``log w = -d^2``, ``w = exp(-d^2)``) the row-block
kernels already return everything EE needs: ``plogw = sum p log w = -sum p d^2``, ``z = sum_{i != j} w_ij``,
``A_i = sum_j p_ij d log w_ij / d y_i = -2 sum_j p_ij (y_i - y_j)``, ``R_i = sum_j w_ij d log w_ij / d y_i``, so::

    E = -plogw + (lam / N) z,            dE/dY = 2 ((lam / N) R - A)

(the paper's ``G = 4 [L(W+) - lam L(W- o K)] X`` divided by N).  Early exaggeration ``alpha`` multiplies the
attraction: ``-alpha plogw + (lam / N) z = alpha E(Y; lam / alpha)``, the EE objective at a smaller lambda.

Curvature: the attraction's Hessian is exactly ``4 L(P)`` (a quadratic), which SNE's ``curvature`` kernel gives
(``c_ij = -2 a_ij p_ij = 4 p_ij``) for both the ``iterate`` and the ``fixed`` curvature: the spectral direction
``(4 L(P) + mu I)^-1 (-G)`` is the paper's showcase, so it is this model's default optimiser.

Disconnected P (GrQc has 355 components): EE does not see the relative translation of two components once they
are a few units apart (the Gaussian repulsion vanishes), so E is flat along it, and the spectral direction with
the default tiny ``mu`` (relative 1e-5) moves components by ``G / mu`` in the first iterations: on GrQc (lam 1,
seed 0) the coordinates' standard deviation is ~1.3e4 after 300 iterations, dbd's ~11.  ``make_optimizer('sd',
mu=1e-2)`` keeps them together (~21) at a slightly higher E after the same iterations (13.20 against 12.98 after
200).

The homotopy in lambda (Carreira-Perpinan 2010: follow the minimiser path from small lambda, warm-starting each
stage) is ``homotopy`` below.  Since ``alpha E(Y; lam / alpha)`` is what an exaggerated evaluation minimises, a stage
at ``lam_k`` is a run with exaggeration ``lam / lam_k``: no second model, executor or repulsion pass is needed.
"""
from dataclasses import dataclass, replace
import math

import numpy as np

from .base import Model
from .kernels import euclidean_similarity, make_kernels
from .objective import Objective
from .sne import FFT as SNE_FFT, log_pair, pair

# The paper's lambda with W+ = N P (see the module docstring); the paper's surviving text states no default.
# Measured on SCHOOL (sd, 500 iterations, seed 0): the two classes are apart (1-NN class error 0) for every lam in
# 0.1 .. 100; lam 0.1 draws each class as a ring around its teacher, lam 1 fills the rings in, lam 0.01 collapses
# each class to a few points.  On GrQc lam 1 spreads the largest component over ~50 x 50 (0.1: ~30 x 30).
DEFAULT_LAMBDA = 1.0


def check_lambda(lam) -> float:
    """``lam`` as a float; ``ValueError`` unless it is a finite number >= 0."""
    try:
        value = float(lam)
    except (TypeError, ValueError):
        raise ValueError(f"EE lambda must be a number >= 0, got {lam!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"EE lambda must be a finite number >= 0, got {lam!r}")
    return value


@dataclass(frozen=True)
class EE(Objective):
    """The elastic-embedding reduction of block partials (module docstring): value ``-plogw + (lam / N) z``.

    E >= 0 (both sums are non-negative), and > 0 for lam > 0: the optimisers' divergence test (value above a
    multiple of the start) and relative stall test apply as for KL.  ``entropy`` (sum p log p) is not part of E.
    """

    lam: float = DEFAULT_LAMBDA

    def __post_init__(self):
        object.__setattr__(self, "lam", check_lambda(self.lam))

    name = "E"  # what the value is called in outputs
    label = "E (elastic embedding)"

    def values(self, plogw, z, entropy, exaggeration, with_kl, n_points):
        scale = self.lam / n_points
        with np.errstate(invalid="ignore", over="ignore"):
            value = -plogw + scale * z if with_kl else np.nan
            objective = -exaggeration * plogw + scale * z if with_kl else np.nan
        return float(value), float(objective)

    def gradient(self, A, R, z, exaggeration, n_points):
        scale = self.lam / n_points
        with np.errstate(invalid="ignore", over="ignore"):
            return 2.0 * (scale * R - exaggeration * A)


def make_model(lam: float = DEFAULT_LAMBDA) -> Model:
    """EE with the paper's ``lam`` (W+ = N P, W- = 1), SNE's Gaussian kernels and FFT repulsion."""
    lam = check_lambda(lam)
    return Model("ee", f"elastic embedding, lambda = {lam:g}", False, *make_kernels(log_pair, pair),
                 similarity=euclidean_similarity, objective=EE(lam), fft=SNE_FFT, default_optimizer="sd",
                 params={"lam": lam})


def homotopy_lambdas(lam: float, start: float, stages: int) -> np.ndarray:
    """``stages`` lambdas from ``start`` to ``lam``, geometrically spaced (the last is ``lam``)."""
    lam, start = check_lambda(lam), check_lambda(start)
    if not 0 < start <= lam:
        raise ValueError(f"homotopy start lambda must be in (0, lambda = {lam:g}], got {start!r}")
    if int(stages) != stages or stages < 1:
        raise ValueError(f"homotopy stages must be an integer >= 1, got {stages!r}")
    return np.geomspace(start, lam, int(stages))


def homotopy(optimizer, executor, coords: np.ndarray, stages: int = 5, start: float | None = None,
             iterations: int = 100, callback=None):
    """Minimise EE along a path of lambdas ``homotopy_lambdas(lam, start, stages)`` ending at the executor's
    model's ``lam`` (``start`` default ``lam / 100``), each stage warm-started from the last; returns one
    ``OptimizeResult`` over all stages.

    Stage k < last runs ``optimizer`` for ``iterations`` iterations with exaggeration ``lam / lam_k`` held
    throughout (``alpha E(Y; lam / alpha)``: EE at ``lam_k``, see the module docstring); the last stage runs at
    ``lam`` for at most ``iterations`` iterations with the optimiser's own stopping rule and no exaggeration.
    The history is E at the target ``lam`` throughout (each stage's first entry, a repeat of the previous
    stage's last, is dropped); ``callback(it, value)`` sees the global iteration number.
    """
    lam = executor.model.objective.lam
    lams = homotopy_lambdas(lam, lam / 100.0 if start is None else start, stages)
    histories, times, total, elapsed, evaluations, run = [], [], 0, 0.0, 0, None
    for k, lam_k in enumerate(lams):
        last = k == len(lams) - 1
        alpha = 1.0 if last else lam / lam_k
        stage = replace(optimizer, exaggeration=alpha, exaggeration_iterations=0 if last else iterations)
        offset = total
        hook = None if callback is None else (lambda it, value, offset=offset: callback(offset + it, value))
        run = stage.optimize(executor, coords, iterations, callback=hook)
        skip = 0 if k == 0 else 1
        histories.append(run.kl_history[skip:])
        times.append(run.seconds[skip:] + elapsed)
        total += run.iterations
        elapsed += float(run.seconds[-1]) if run.seconds.size else 0.0
        evaluations += run.evaluations
        coords = run.coords
    # the last stage's result (its coordinates, KL, stop and state) with the whole path's history and counts
    return replace(run, kl_history=np.concatenate(histories), iterations=total, seconds=np.concatenate(times),
                   evaluations=evaluations)
