"""Checkpoints and resume: optimiser state export/import."""
import json

import numpy as np
import pytest

from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.models import get_model
from scalemb.optim import DBDState, DescentState, make_optimizer


@pytest.mark.parametrize("name,model,ds,dt,options", [
    ("dbd", "snest", 2, 1, {}),
    ("dbd", "sne", 2, 0, {"learning_rate": 50.0, "tol": 0}),  # backoffs: lr halved, back to the best iterate
    ("sd", "snest", 1, 1, {"refactor_every": 7}),  # lagged factorisation, rebuilt on resume
    ("sd", "tsne", 2, 0, {"solver": "cg"}),
    ("gd", "snest", 2, 1, {}),
])
def test_optimizer_state_round_trip_is_exact(school_affinity, name, model, ds, dt, options):
    n_iter = 300
    optimizer = make_optimizer(name, model, **options)
    coords = initial_coords(school_affinity.n_points, ds, dt, np.random.default_rng(4))
    reference = optimizer.optimize(LocalExecutor(school_affinity, get_model(model), ds, dt), coords, n_iter)
    assert reference.iterations == n_iter
    for at in (1, 45, n_iter - 1):
        exported = []

        class Stop(Exception):
            pass

        def hook(it, export):
            if it == at:
                exported.append(export())
                raise Stop

        with pytest.raises(Stop):
            optimizer.optimize(LocalExecutor(school_affinity, get_model(model), ds, dt), coords, n_iter,
                               checkpoint=hook)
        state = exported[0]
        assert isinstance(state, DBDState if name == "dbd" else DescentState) and state.iteration == at
        assert len(state.kl_history) == at and np.array_equal(state.kl_history, reference.kl_history[:at])
        arrays, scalars = state.split()
        json.dumps(scalars)  # what goes into the store's attributes
        restored = type(state).join(arrays, scalars)
        # a fresh executor: nothing carried over but the state (the sd factorisation is recomputed)
        run = optimizer.optimize(LocalExecutor(school_affinity, get_model(model), ds, dt), None, n_iter,
                                 state=restored)
        assert np.array_equal(run.coords, reference.coords), at
        assert np.array_equal(run.kl_history, reference.kl_history)
        assert (run.backoffs, run.evaluations) == (reference.backoffs, reference.evaluations)
    if name == "dbd" and model == "sne":
        assert reference.backoffs >= 1
