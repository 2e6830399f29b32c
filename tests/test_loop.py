"""The one optimiser loop: every step rule evaluates the objective of the iteration it is at (``iteration=``), so a
model's point term switched on after a warm-up is seen by delta-bar-delta and by the line search alike."""
import dataclasses

import numpy as np
import pytest

from scalemb.engine import LocalExecutor
from scalemb.init import random_coords
from scalemb.models import get_model
from scalemb.optim import make_optimizer

WARM_UP = 6
WEIGHT = 1e-3


def pull_together(coords, iteration, affinity):
    """``WEIGHT * sum |y_i - mean|^2`` from iteration ``WARM_UP`` on (a term that switches on after a warm-up, as
    CO-SNE's; translation-invariant, as Euclidean re-centring requires), zero before and outside an
    optimisation; records the iterations it is asked for."""
    CALLS.append(iteration)
    if iteration is None or iteration < WARM_UP:
        return 0.0, np.zeros_like(coords)
    centred = coords - coords.mean(axis=1, keepdims=True)
    return WEIGHT * float(np.sum(centred ** 2)), 2 * WEIGHT * centred


CALLS = []


@pytest.mark.parametrize("name", ["dbd", "gd", "sd"])
def test_rules_evaluate_the_objective_of_their_iteration(school_affinity, name):
    model = dataclasses.replace(get_model("tsne"), point_term=pull_together)
    ex = LocalExecutor(school_affinity, model, 2, 0)
    start = random_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0)) * 1e3  # a spread-out start
    n_iter = 14
    CALLS.clear()
    run = make_optimizer(name, "tsne", tol=0, exaggeration_iterations=0).optimize(ex, start, n_iter)
    assert None not in CALLS
    if name == "dbd":  # one evaluation per iteration at that iteration, then the final one
        assert CALLS == list(range(n_iter)) + [n_iter]
    else:  # the start at 0, then each line search's trials at the iteration their point would start
        assert CALLS[0] == 0 and CALLS == sorted(CALLS) and set(CALLS) == set(range(n_iter + 1))
    # the switch does not stop the line search (at most the one search across the boundary fails) and every
    # history entry is the objective of its iteration at the iterate reached there
    assert run.iterations == n_iter and np.isfinite(run.kl_history).all()
    assert run.kl == pytest.approx(ex.evaluate(run.coords, iteration=n_iter).kl, rel=1e-12)
    without = ex.evaluate(run.coords).kl  # outside an optimisation: no term
    centred = run.coords - run.coords.mean(axis=1, keepdims=True)
    assert run.kl - without == pytest.approx(WEIGHT * np.sum(centred ** 2), rel=1e-9)
