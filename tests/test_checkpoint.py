"""Checkpoints and resume: optimiser state export/import, atomic checkpoint versions in the output store,
interrupt (API stop request, real SIGINT/SIGTERM, a writer killed mid-checkpoint) and bit-identical resume."""
import json
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import scalemb
from scalemb.embedding import initial_coords
from scalemb.engine import LocalExecutor
from scalemb.errors import ScalembError
import scalemb.store.checkpoint as checkpoint_io
from scalemb.store.checkpoint import Checkpoint, create_store, read_checkpoint, read_config, write_checkpoint
from scalemb.store.checkpointer import Checkpointer
from scalemb.models import get_model
from scalemb.optim import DBDState, DescentState, make_optimizer

from .cli_runner import message_lines, run_cli


def pointer(path):
    """The ``current`` checkpoint version, read as a plain JSON file (what another process sees)."""
    return json.loads((path / "zarr.json").read_text())["attributes"]["scalemb_checkpoint"]["current"]


def stop_at(restart, iteration):
    def on_checkpoint(checkpointer, r, it):
        if (r, it) == (restart, iteration):
            checkpointer.request_stop()
    return on_checkpoint


def assert_same_result(a, b):
    assert np.array_equal(a.embedding, b.embedding)
    assert np.array_equal(a.kl_history, b.kl_history)
    assert a.kl == b.kl and a.restart_kls == b.restart_kls and a.iterations == b.iterations


@pytest.mark.parametrize("name,model,ds,dt,options", [
    ("dbd", "snest", 2, 1, {}),
    ("dbd", "sne", 2, 0, {"learning_rate": 50.0, "tol": 0}),  # backoffs: lr halved, back to the best iterate
    ("dbd", "tsne", 2, 0, {"kl_every": 4, "max_step_norm": 0.5}),  # NaN history entries; clipped steps
    ("sd", "snest", 1, 1, {"refactor_every": 7}),  # lagged factorisation, rebuilt on resume
    ("sd", "tsne", 2, 0, {"solver": "cg"}),
    # the settings at scale: truncated Jacobi-CG, bounded point steps (active at this scale), the KL-change stop
    ("sd", "tsne", 2, 0, {"solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 10, "cg_tol": 0.1,
                          "max_point_step": 0.05, "tol": 0.0, "window": 10}),
    # with the exaggerated momentum phase (the momentum buffer is state; interrupted inside it and after it)
    ("sd", "tsne", 2, 0, {"solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 10, "max_point_step": 0.5,
                          "exaggeration": 12.0, "exaggeration_iterations": 60, "exaggeration_steps": "momentum",
                          "tol": 0.0}),
    # the hybrid: spectral steps, then delta-bar-delta polish steps (their gains are state; resumed inside both)
    ("sd", "tsne", 2, 0, {"solver": "cg", "preconditioner": "jacobi", "cg_maxiter": 10, "max_point_step": 0.5,
                          "exaggeration": 12.0, "exaggeration_iterations": 20, "exaggeration_steps": "momentum",
                          "spectral_iterations": 10, "tol": 0.0}),
    ("sd", "snest", 2, 1, {"spectral_iterations": 30, "tol": 0.0}),
    # SNEST's per-point time gains (state from the first spectral step on)
    ("sd", "snest", 2, 1, {"time_gains": 2.0, "exaggeration": 4.0, "exaggeration_iterations": 20,
                           "exaggeration_steps": "momentum", "tol": 0.0}),
    ("sd", "tsne", 2, 0, {"solver": "cg", "preconditioner": "jacobi", "max_point_step": 0.5, "exaggeration": 12.0,
                          "exaggeration_iterations": 20, "exaggeration_steps": "momentum", "spectral_iterations": 10,
                          "polish_spectral_every": 7, "tol": 0.0}),
    # inexact Newton: CG's tolerance from the last solve's (Eisenstat-Walker), both kept in the state
    ("sd", "tsne", 2, 0, {"solver": "cg", "preconditioner": "jacobi", "cg_tol": "auto", "max_point_step": 0.5,
                          "tol": 0.0}),
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
        assert len(state.kl_history) == at
        assert np.array_equal(state.kl_history, reference.kl_history[:at], equal_nan=True)
        arrays, scalars = state.split()
        json.dumps(scalars)  # what goes into the store's attributes
        restored = type(state).join(arrays, scalars)
        # a fresh executor: nothing carried over but the state (the sd factorisation is recomputed)
        run = optimizer.optimize(LocalExecutor(school_affinity, get_model(model), ds, dt), None, n_iter,
                                 state=restored)
        assert np.array_equal(run.coords, reference.coords), at
        assert np.array_equal(run.kl_history, reference.kl_history, equal_nan=True)
        assert (run.backoffs, run.evaluations) == (reference.backoffs, reference.evaluations)
    if name == "dbd" and model == "sne":
        assert reference.backoffs >= 1


def test_store_versions_switch_atomically(school_affinity, tmp_path, monkeypatch):
    """Checkpoints written from the optimiser hook; a failure between a version's arrays and the pointer switch
    leaves the previous version visible, and the optimiser resumes from it exactly."""
    path = tmp_path / "run.zarr"
    create_store(path, {"optimizer": {"name": "dbd"}, "input_hash": "x", "n_points": school_affinity.n_points,
                        "space_dims": 2, "time_dims": 1})
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


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["dbd", "sd"])
def test_api_interrupt_at_checkpoint_then_resume_is_identical(tmp_path, optimizer):
    settings = dict(model="snest", iterations=300, seed=2, restarts=3, optimizer=optimizer)
    reference = scalemb.embed("school", **settings)
    out = tmp_path / "run.zarr"
    with pytest.raises(scalemb.RunInterrupted, match="iteration 150 of restart 2"):
        with Checkpointer(out, every=50, on_checkpoint=stop_at(1, 150)) as checkpointer:
            scalemb.Embedder(**settings).fit("school", checkpoint=checkpointer)
    assert checkpointer.written == 5 + 3  # restart 1: 50..250; restart 2: 50, 100, 150
    config = read_config(out)["config"]
    spec = config["spec"]  # the run's settings: its RunSpec, stored once
    assert config["input"] == "school" and spec["model"] == "snest" and spec["restarts"] == 3
    assert config["optimizer"]["name"] == optimizer and spec["random_state"] == 2 and spec["iterations"] == 300
    assert config["scalemb_version"] == scalemb.__version__ and len(config["input_hash"]) == 64
    checkpoint = read_checkpoint(out)
    assert (checkpoint.restart, checkpoint.iteration) == (1, 150)
    assert checkpoint.restart_kls == reference.restart_kls[:1] and checkpoint.best.kl == reference.restart_kls[0]
    assert [p.name for p in (out / "checkpoints").iterdir() if p.is_dir()] == [pointer(out)]  # older ones removed

    result = scalemb.resume(out)
    assert_same_result(result, reference)
    assert_same_result(scalemb.EmbeddingResult.load(out), reference)  # the final result replaced the checkpoints
    assert not (out / "checkpoints").exists()
    with pytest.raises(ScalembError, match="has finished"):
        scalemb.resume(out)


def test_resume_with_more_iterations_extends_the_run(tmp_path):
    out = tmp_path / "run.zarr"
    with pytest.raises(scalemb.RunInterrupted):
        with Checkpointer(out, every=100, on_checkpoint=stop_at(0, 200)) as checkpointer:
            scalemb.Embedder(model="tsne", iterations=300, optimizer="dbd").fit("school", checkpoint=checkpointer)
    with pytest.raises(ScalembError, match="at iteration 200"):
        scalemb.resume(out, iterations=150)
    longer = scalemb.resume(out, iterations=450)
    assert_same_result(longer, scalemb.embed("school", model="tsne", iterations=450, optimizer="dbd"))


def _records_naming_a_module(out):
    """Each ``zarr.json`` of the store whose text names a scalemb module (``scalemb.<room>...``) or holds an array
    of Python objects (a pickle codec), with what it names."""
    found = []
    for meta in sorted(out.rglob("zarr.json")):
        text = meta.read_text()
        names = re.findall(r"scalemb\.[A-Za-z_]\w*", text)
        if names or json.loads(text).get("data_type") == "object":
            found.append((str(meta.relative_to(out)), names))
    return found


def test_stored_records_name_no_module_path(tmp_path):
    """A run's records (a checkpoint in progress, then the finished result with its final state) are read back
    by what they hold (arrays, JSON settings, an optimiser named ``dbd``/``sd``), never through a module path or a
    pickled object: moving scalemb's modules (``scalemb.io.checkpoint`` -> ``scalemb.store.checkpoint``) leaves
    every stored record readable."""
    out = tmp_path / "run.zarr"
    with pytest.raises(scalemb.RunInterrupted):
        with Checkpointer(out, every=10, on_checkpoint=stop_at(0, 20)) as checkpointer:
            scalemb.Embedder(model="tsne", max_iter=40, optimizer="sd").fit("school", checkpoint=checkpointer)
    assert (out / "checkpoints").is_dir() and _records_naming_a_module(out) == []
    scalemb.resume(out)
    assert (out / "final_state").is_dir() and _records_naming_a_module(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig,optimizer", [(signal.SIGINT, "sd"), (signal.SIGTERM, "dbd")])
def test_signal_writes_checkpoint_and_cli_resume_is_identical(tmp_path, sig, optimizer):
    """A real process stopped by a signal in its second restart, resumed by the CLI."""
    out = tmp_path / "run.zarr"
    args = ["embed", "school", "--iterations", "600", "--restarts", "2", "--tol", "0", "--seed", "5",
            "--optimizer", optimizer, "--out", str(out), "--checkpoint-every", "40", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # restart 1 has 14 checkpoints (40..560); the 16th is in restart 2
        if (out / "zarr.json").exists() and int(pointer(out) or 0) >= 16:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 75, stderr
    message = stderr.strip().splitlines()[-1]
    assert message.startswith("scalemb: interrupted at iteration") and "of restart 2" in message
    assert f"scalemb resume {out}" in message
    checkpoint = read_checkpoint(out)
    assert checkpoint.restart == 1 and 80 <= checkpoint.iteration < 600

    proc = run_cli("resume", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    reference = scalemb.embed("school", model="snest", iterations=600, restarts=2, seed=5,
                              optimizer=make_optimizer(optimizer, "snest", tol=0))
    assert_same_result(scalemb.EmbeddingResult.load(out), reference)


SLOW_SETUP = """
import os, signal, sys, time
import scalemb.engine.local as local

real = local.LocalExecutor.factorize_curvature
calls = []


def slow(self, mu, ordering=None, kind="lu"):
    solver = real(self, mu, ordering, kind)  # SuperLU blocks allocated on this set-up's thread
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)  # a long set-up, still running when the run has stopped
    return solver


local.LocalExecutor.factorize_curvature = slow
from scalemb.cli.main import entry
sys.argv = ["scalemb", *sys.argv[1:]]
entry()
"""


def test_a_cli_run_stopped_during_a_solver_set_up_exits_to_be_resumed(tmp_path):
    """SIGINT during a spectral-direction set-up (a sparse LU on its thread): the checkpoint is written at once and
    the process exits 75 (resume later) at once -- not after the set-up, and not 120, the status Python gives when
    its finalisation meets the SuperLU blocks of a thread still running."""
    out = tmp_path / "run.zarr"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SLOW_SETUP, "embed", "school", "--optimizer", "sd", "--solver",
                           "lu", "--iterations", "50", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 75, proc.stderr
    assert time.monotonic() - start < 45
    assert "scalemb: interrupted at iteration" in proc.stderr and "Exception ignored" not in proc.stderr
    assert read_checkpoint(out).iteration >= 1


CRASHING_WRITER = """
import os, signal, sys
import scalemb
import scalemb.store.checkpoint as ck
switch, calls = ck._switch_pointer, []
def crash_on_third(group, meta, version):
    calls.append(version)
    if len(calls) == 3:  # the new version's arrays are on disk; die before the pointer moves
        os.kill(os.getpid(), signal.SIGKILL)
    switch(group, meta, version)
ck._switch_pointer = crash_on_third
scalemb.embed("school", model="snest", iterations=400, restarts=2, optimizer="sd", out=sys.argv[1],
              checkpoint_every=100)
"""


@pytest.mark.slow
def test_writer_killed_before_pointer_switch_leaves_previous_checkpoint(tmp_path):
    out = tmp_path / "run.zarr"
    proc = subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    versions = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert versions == ["000002", "000003"] and pointer(out) == "000002"  # 000003 complete but not visible
    checkpoint = read_checkpoint(out)
    assert (checkpoint.restart, checkpoint.iteration) == (0, 200)
    result = scalemb.resume(out)
    reference = scalemb.embed("school", model="snest", iterations=400, restarts=2, optimizer="sd")
    assert_same_result(result, reference)


def test_half_written_version_is_invisible_and_cleaned_up(tmp_path):
    out = tmp_path / "run.zarr"
    with pytest.raises(scalemb.RunInterrupted):
        with Checkpointer(out, every=100, on_checkpoint=stop_at(0, 100)) as checkpointer:
            scalemb.Embedder(model="tsne", iterations=300, optimizer="sd").fit("school", checkpoint=checkpointer)
    current = pointer(out)
    # a newer version cut off mid-write: metadata without chunks, a truncated state array
    partial = out / "checkpoints" / f"{int(current) + 1:06d}"
    shutil.copytree(out / "checkpoints" / current, partial)
    shutil.rmtree(partial / "state" / "coords" / "c")
    (partial / "zarr.json").write_text('{"zarr_format": 3, "node_')
    checkpoint = read_checkpoint(out)
    assert checkpoint.iteration == 100 and pointer(out) == current
    result = scalemb.resume(out)
    assert not partial.exists()
    assert_same_result(result, scalemb.embed("school", model="tsne", iterations=300, optimizer="sd"))


def test_refuses_changed_input_and_stores_that_are_not_runs(tmp_path):
    edges = tmp_path / "e.txt"
    edges.write_text("1 2\n2 3\n3 1\n3 4\n4 5\n5 6\n6 4\n")
    out = tmp_path / "run.zarr"
    with pytest.raises(scalemb.RunInterrupted):
        with Checkpointer(out, every=50, on_checkpoint=stop_at(0, 50)) as checkpointer:
            scalemb.Embedder(model="tsne", iterations=200).fit(str(edges), checkpoint=checkpointer)
    assert read_config(out)["config"]["input"] == str(edges.resolve())
    edges.write_text("1 2\n2 3\n3 1\n3 4\n4 5\n5 6\n6 4\n6 7\n")
    proc = run_cli("resume", str(out))
    assert proc.returncode == 2
    lines = message_lines(proc.stderr)  # beside the progress ("reading ..."), one line
    assert len(lines) == 1 and "input changed" in lines[0] and str(out) in lines[0]
    assert read_checkpoint(out).iteration == 50  # untouched

    finished = tmp_path / "done.zarr"
    assert run_cli("embed", "school", "--iterations", "20", "--out", str(finished), "--quiet").returncode == 0
    for path, fragment in ((finished, "has finished"), (tmp_path, "not a checkpointed"),
                           (tmp_path / "none.zarr", "no such")):
        proc = run_cli("resume", str(path))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr


def test_diverging_run_leaves_no_store(tmp_path):
    out = tmp_path / "run.zarr"
    with pytest.raises(FloatingPointError):
        scalemb.embed("school", model="sne", space_dims=2, iterations=500, out=out, checkpoint_every=5,
                      optimizer=make_optimizer("dbd", "sne", learning_rate=1e6, max_backoffs=1, tol=0))
    assert not out.exists()


@pytest.mark.slow
def test_killed_before_first_checkpoint_resumes_from_the_start(tmp_path):
    """The store holds the configuration from the start: a run SIGKILLed before any checkpoint resumes from
    iteration 0 of restart 1."""
    out = tmp_path / "run.zarr"
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", "embed", "school", "--model", "tsne", "--tol", "0",
                             "--iterations", "100000", "--checkpoint-every", "0", "--out", str(out), "--quiet"])
    deadline = time.monotonic() + 60
    while not (out / "zarr.json").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=30)
    assert pointer(out) is None and read_checkpoint(out) is None
    reference = scalemb.embed("school", model="tsne", iterations=100, optimizer=make_optimizer("sd", "tsne", tol=0))
    assert_same_result(scalemb.resume(out, iterations=100), reference)
