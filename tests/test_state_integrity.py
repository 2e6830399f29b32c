"""What scalemb reads back from its own stores is what it wrote: checkpoints and a finished run's final state
carry a hash over their arrays, attributes and configuration, their arrays are checked against the run before
any reaches a compiled kernel, and a run working in ``OUT.next`` replaces only ``OUT``."""
import json

import numpy as np
import pytest
import zarr

import scalemb
from scalemb.errors import ScalembError
from scalemb.store.checkpoint import ATTR, FINAL_ATTR, read_checkpoint, read_config, read_final_state, record_hash
from scalemb.store.checkpointer import Checkpointer

from .cli_runner import run_cli, run_cli_process


def _attrs(path) -> dict:
    return json.loads((path / "zarr.json").read_text())["attributes"]


def _set_attr(path, name, value) -> None:
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"][name] = value
    (path / "zarr.json").write_text(json.dumps(meta))


def _rehash_final(path) -> None:
    """What an editor that also recomputes the hash would leave: only the structural checks stand."""
    group = zarr.open_group(store=str(path), mode="r")
    arrays = {name: array[:] for name, array in group["final_state"].arrays()}
    meta = _attrs(path)[FINAL_ATTR]
    _set_attr(path, FINAL_ATTR, {**meta, "record_hash": record_hash(arrays, meta)})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("final") / "run.zarr"
    proc = run_cli("embed", "school", "--model", "snest", "--optimizer", "sd", "--iterations", "12", "--tol", "0",
                   "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    return out


def _replace_array(group_path, name, data) -> None:
    group = zarr.open_group(store=str(group_path), mode="r+")
    group.create_array(name, data=data, overwrite=True)


EDITS = {  # what an edited or corrupt final_state holds: name -> (edit, rehash, expected message)
    "coords-shape": (lambda p: _replace_array(p / "final_state", "coords", np.zeros((3, 7))), True,
                     r"coords has shape \(3, 7\)"),
    "ordering-out-of-range": (lambda p: _replace_array(p / "final_state", "ordering",
                                                       np.arange(42, dtype=np.int64) * 1000), True,
                              "ordering is not a permutation"),
    "gradient-shape": (lambda p: _replace_array(p / "final_state", "gradient", np.zeros((3, 40))), True,
                       "gradient has shape"),
    "history-length": (lambda p: _replace_array(p / "final_state", "kl_history", np.zeros(3)), True,
                       "kl_history has shape"),
    "coords-edited": (lambda p: _replace_array(p / "final_state", "coords",
                                               zarr.open_group(str(p / "final_state"))["coords"][:] * 2), False,
                      "content hash mismatch"),
    "scalar-edited": (lambda p: _set_attr(p, FINAL_ATTR, {**_attrs(p)[FINAL_ATTR],
                                                         "state": {**_attrs(p)[FINAL_ATTR]["state"], "step": 1e300}}),
                      False, "content hash mismatch"),
    "config-edited": (lambda p: _set_attr(p, FINAL_ATTR, {**_attrs(p)[FINAL_ATTR],
                                                         "config": {**_attrs(p)[FINAL_ATTR]["config"],
                                                                    "n_points": 7}}), False,
                      "content hash mismatch"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_continue_refuses_an_edited_final_state_in_one_line(finished, tmp_path, case):
    """A wrong-shaped array reached numba and corrupted the heap (exit 134/139); an edit is now refused."""
    import shutil

    edit, rehash, message = EDITS[case]
    run = tmp_path / "run.zarr"
    shutil.copytree(finished, run)
    read_final_state(run)  # the untouched copy reads back
    edit(run)
    if rehash:
        _rehash_final(run)
    with pytest.raises(ScalembError, match=message):
        read_final_state(run)


@pytest.mark.slow
def test_continue_process_refuses_a_wrong_shaped_final_state(finished, tmp_path):
    """The crash the edits above caused, seen where it happened: ``scalemb continue`` in a process of its own
    (exit 134/139 before) exits 2 with one line."""
    import shutil

    run = tmp_path / "run.zarr"
    shutil.copytree(finished, run)
    edit, rehash, _ = EDITS["coords-shape"]
    edit(run)
    _rehash_final(run)
    proc = run_cli_process("continue", run, "--iterations", "3", "--quiet")  # a process: it crashed
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and "final optimiser state is unreadable" in proc.stderr, proc.stderr


def _interrupted(out, **settings):
    def stop(checkpointer, restart, iteration):
        checkpointer.request_stop()

    with pytest.raises(scalemb.RunInterrupted):
        with Checkpointer(out, every=5, overwrite=True, on_checkpoint=stop) as checkpointer:
            scalemb.Embedder(**settings).fit("school", checkpoint=checkpointer)
    return checkpointer.path


def test_checkpoint_attributes_and_config_are_hashed(tmp_path):
    out = tmp_path / "run.zarr"
    path = _interrupted(out, model="tsne", iterations=20, optimizer="dbd")
    assert path == out and read_checkpoint(out).iteration == 5
    current = _attrs(out)[ATTR]["current"]
    version = out / "checkpoints" / current
    meta = _attrs(version)
    _set_attr(version, "state", {**meta["state"], "lr": 1e6})  # an edited learning rate
    with pytest.raises(ScalembError, match="content hash mismatch"):
        read_checkpoint(out)
    _set_attr(version, "state", meta["state"])
    assert read_checkpoint(out).iteration == 5
    root = _attrs(out)[ATTR]
    _set_attr(out, ATTR, {**root, "config": {**root["config"], "seed": 99}})
    with pytest.raises(ScalembError, match="does not match its content hash"):
        read_config(out)


def test_resume_replaces_only_the_runs_own_output(tmp_path):
    """An interrupted ``--overwrite`` run works in OUT.next and replaces OUT when it finishes; an edited
    ``replaces`` naming another scalemb directory (here another run's input store) is refused, also when the
    editor recomputed the configuration hash, and the other directory is untouched."""
    from scalemb.store.checkpoint import _config_hash

    settings = dict(model="tsne", iterations=20, optimizer="dbd")
    out = tmp_path / "run.zarr"
    scalemb.embed("school", out=str(out), **settings)
    victim = tmp_path / "victim.zarr"
    scalemb.embed("school", out=str(victim), iterations=5)
    before = sorted(p.name for p in victim.rglob("*"))
    nxt = _interrupted(out, **settings)
    assert nxt.name == "run.zarr.next"
    root = _attrs(nxt)[ATTR]
    assert root["config"]["replaces"] == str(out.resolve())
    edited = {**root["config"], "replaces": str(victim.resolve())}
    _set_attr(nxt, ATTR, {**root, "config": edited})
    with pytest.raises(ScalembError, match="does not match its content hash"):
        scalemb.resume(nxt)
    _set_attr(nxt, ATTR, {**root, "config": edited, "config_hash": _config_hash(edited)})
    with pytest.raises(ScalembError, match="not the run's own output"):
        scalemb.resume(nxt)
    assert sorted(p.name for p in victim.rglob("*")) == before
    _set_attr(nxt, ATTR, root)
    result = scalemb.resume(nxt)
    assert not nxt.exists() and np.array_equal(scalemb.EmbeddingResult.load(out).embedding, result.embedding)
    assert np.array_equal(result.embedding, scalemb.embed("school", **settings).embedding)


@pytest.mark.slow
def test_second_writer_of_a_live_runs_output_is_refused(tmp_path):
    """``--overwrite`` (or ``resume``) on the output of a run still writing it swapped its checkpoints away; the
    run's advisory lock on its output now refuses them in one line, and the kernel frees it when the run ends."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run.zarr"
    live = subprocess.Popen([sys.executable, "-m", "scalemb", "embed", "school", "--model", "tsne", "--iterations",
                             "1000000", "--tol", "0", "--checkpoint-every", "5", "--out", str(out), "--quiet"],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 240
        while not (out.exists() and _attrs(out).get(ATTR, {}).get("current")):
            assert live.poll() is None and time.monotonic() < deadline, live.stderr.read() if live.poll() else ""
            time.sleep(0.2)
        for args in (("embed", "school", "--model", "tsne", "--iterations", "5", "--out", out, "--overwrite"),
                     ("resume", out)):
            proc = run_cli(*args, "--quiet")
            assert proc.returncode == 2, proc.stderr
            assert "in use by another running scalemb process (pid" in proc.stderr
            assert proc.stderr.count("\n") == 1, proc.stderr
        assert not (tmp_path / "run.zarr.next").exists() and live.poll() is None
    finally:
        live.send_signal(signal.SIGTERM)
        live.wait(120)
    assert live.returncode == 75, live.stderr.read()
    proc = run_cli("resume", out, "--iterations", str(read_checkpoint(out).iteration + 2), "--quiet")
    assert proc.returncode == 0, proc.stderr


def test_metrics_and_transform_refuse_a_reference_file_changed_since_the_run(tmp_path):
    """The run records the SHA-256 of the edge list it read; metrics and transform, which read it again from the
    provenance, refuse it once it changed (they used the changed file), as ``resume`` does."""
    from scalemb.io.coauthor_generator import write_coauthor_edge_list

    edges = write_coauthor_edge_list(tmp_path / "edges.txt", 300, seed=2)
    out = tmp_path / "run.zarr"
    assert run_cli("embed", edges, "--model", "tsne", "--iterations", "5", "--out", out, "--quiet").returncode == 0
    assert len(scalemb.EmbeddingResult.load(out).provenance["source_sha256"]) == 64
    new = tmp_path / "new.txt"
    new.write_text("0\t100000\n")
    assert run_cli("metrics", out, "--quiet").returncode == 0
    with open(edges, "a") as handle:
        handle.write("1\t2\n")
    proc = run_cli("metrics", out, "--quiet")
    assert proc.returncode == 2 and "edges.txt" in proc.stderr and "changed since the run" in proc.stderr, proc.stderr
    proc = run_cli("transform", out, new, "--out", tmp_path / "placed.zarr", "--iterations", "2")
    assert proc.returncode == 2 and "changed since the run" in proc.stderr, proc.stderr
    assert not (tmp_path / "placed.zarr").exists()
