"""Checkpoints and resume: optimiser state export/import, atomic checkpoint versions in a run store."""
import json

import numpy as np
import pytest

import scalemb.io.checkpoint as checkpoint_io
from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.io.checkpoint import Checkpoint, create_store, read_checkpoint, write_checkpoint
from scalemb.models import get_model
from scalemb.optim import DBDState, DescentState, make_optimizer


def pointer(path):
    """The ``current`` checkpoint version, read as a plain JSON file (what another process sees)."""
    return json.loads((path / "zarr.json").read_text())["attributes"]["scalemb_checkpoint"]["current"]


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


def test_store_versions_switch_atomically(school_affinity, tmp_path, monkeypatch):
    """Checkpoints written from the optimiser hook; a failure between a version's arrays and the pointer switch
    leaves the previous version visible, and the optimiser resumes from it exactly."""
    path = tmp_path / "run.zarr"
    create_store(path, {"optimizer": {"name": "dbd"}, "input_hash": "x"})
    assert read_checkpoint(path) is None
    optimizer = make_optimizer("dbd", "snest")
    coords = initial_coords(school_affinity.n_points, 2, 1, np.random.default_rng(1))
    reference = optimizer.optimize(LocalExecutor(school_affinity, get_model("snest"), 2, 1), coords, 250)
    switch, calls = checkpoint_io._switch_pointer, []

    def failing_switch(group, meta, version):
        calls.append(version)
        if len(calls) == 3:
            raise OSError("killed")
        switch(group, meta, version)

    monkeypatch.setattr(checkpoint_io, "_switch_pointer", failing_switch)

    def hook(it, export):
        if it % 50 == 0:
            write_checkpoint(path, Checkpoint(0, it, export()))

    with pytest.raises(OSError, match="killed"):
        optimizer.optimize(LocalExecutor(school_affinity, get_model("snest"), 2, 1), coords, 250, checkpoint=hook)
    assert calls == ["000001", "000002", "000003"] and pointer(path) == "000002"
    assert sorted(p.name for p in (path / "checkpoints").iterdir() if p.is_dir()) == ["000002", "000003"]
    checkpoint = read_checkpoint(path)
    assert (checkpoint.restart, checkpoint.iteration) == (0, 100) and isinstance(checkpoint.state, DBDState)
    run = optimizer.optimize(LocalExecutor(school_affinity, get_model("snest"), 2, 1), None, 250,
                             state=checkpoint.state)
    assert np.array_equal(run.coords, reference.coords) and np.array_equal(run.kl_history, reference.kl_history)
    monkeypatch.setattr(checkpoint_io, "_switch_pointer", switch)
    write_checkpoint(path, Checkpoint(0, 100, checkpoint.state))  # the next write removes the orphan
    assert sorted(p.name for p in (path / "checkpoints").iterdir() if p.is_dir()) == ["000004"]
