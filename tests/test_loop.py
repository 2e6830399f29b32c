"""The one optimiser loop: every step rule evaluates the objective of the iteration it is at (``iteration=``), so a
model's point term switched on after a warm-up is seen by delta-bar-delta and by the line search alike, and a
jump of the objective at the switch is neither a blow-up nor the end of the line search."""
import dataclasses

import numpy as np
import pytest

from scalemb.engine import LocalExecutor
from scalemb.init import random_coords
from scalemb.models import get_model
from scalemb.optim import make_optimizer

WARM_UP = 6


def switching_term(offset, weight, calls):
    """``offset + weight * sum |y_i - mean|^2`` from iteration ``WARM_UP`` on (a term that switches on after a
    warm-up, as CO-SNE's; translation-invariant, as Euclidean re-centring requires), zero before and outside an
    optimisation; appends the iterations it is asked for to ``calls``."""
    def term(coords, iteration, affinity):
        calls.append(iteration)
        if iteration is None or iteration < WARM_UP:
            return 0.0, np.zeros_like(coords)
        centred = coords - coords.mean(axis=1, keepdims=True)
        return offset + weight * float(np.sum(centred ** 2)), 2 * weight * centred
    return term


def run_with(affinity, term, name, n_iter, start):
    ex = LocalExecutor(affinity, get_model("tsne") if term is None else
                       dataclasses.replace(get_model("tsne"), point_term=term), 2, 0)
    return ex, make_optimizer(name, "tsne", tol=0, exaggeration_iterations=0).optimize(ex, start, n_iter)


@pytest.mark.parametrize("name", ["dbd", "gd", "sd"])
def test_rules_evaluate_the_objective_of_their_iteration(school_affinity, name):
    start = random_coords(school_affinity.n_points, 2, 0, np.random.default_rng(0)) * 1e3  # a spread-out start
    n_iter, calls = 14, []
    ex, run = run_with(school_affinity, switching_term(0.0, 1e-3, calls), name, n_iter, start)
    assert None not in calls
    if name == "dbd":  # one evaluation per iteration at that iteration, then the final one
        assert calls == list(range(n_iter)) + [n_iter]
    else:  # the start at 0, then each line search's trials at the iteration their point would start
        assert calls[0] == 0 and calls == sorted(calls) and set(calls) == set(range(n_iter + 1))
    # every history entry is the objective of its iteration at the iterate reached there
    assert run.iterations == n_iter and np.isfinite(run.kl_history).all()
    assert run.kl == pytest.approx(ex.evaluate(run.coords, iteration=n_iter).kl, rel=1e-12)
    centred = run.coords - run.coords.mean(axis=1, keepdims=True)
    assert run.kl - ex.evaluate(run.coords).kl == pytest.approx(1e-3 * np.sum(centred ** 2), rel=1e-9)


@pytest.mark.parametrize("name", ["dbd", "sd"])
def test_a_jump_at_the_switch_is_not_a_blow_up(school_affinity, name):
    """A constant switched on at ``WARM_UP`` (10x the KL: 'diverged' against the best KL before it) changes no
    gradient: delta-bar-delta re-bases its best KL and follows the same path as without the term; the line
    search across the switch fails once (its start point was evaluated without the constant), then goes on."""
    start = random_coords(school_affinity.n_points, 2, 0, np.random.default_rng(1))
    _, plain = run_with(school_affinity, None, name, 20, start)
    _, jumped = run_with(school_affinity, switching_term(10.0, 0.0, []), name, 20, start)
    assert jumped.iterations == 20 and jumped.backoffs == 0
    if name == "dbd":
        np.testing.assert_allclose(jumped.kl_history[WARM_UP:] - 10.0, plain.kl_history[WARM_UP:], rtol=1e-12)
        assert np.array_equal(jumped.kl_history[:WARM_UP], plain.kl_history[:WARM_UP])
        assert np.array_equal(jumped.coords, plain.coords)
    else:
        after = jumped.kl_history[WARM_UP:] - 10.0
        assert (np.diff(after) <= 1e-12).all() and after[-1] < after[0] < plain.kl_history[0]
