"""CLI defects of issue 23: one-line errors (status 2) instead of tracebacks or "diverged", checkpoints and
results checked on load, resume never connecting to a scheduler address it read from a checkpoint."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import scalemb
from scalemb.store.checkpointer import Checkpointer

from .cli_runner import message_lines, run_cli


def one_line_error(proc, fragment=""):
    lines = message_lines(proc.stderr)  # beside the progress ("reading ..."), one line
    return proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr and \
        (len(lines) == 1 or lines[0].startswith("usage:"))


def interrupted_run(out):
    """A t-SNE run of SCHOOL stopped at its first checkpoint (iteration 5 of 20): ``out``."""
    def stop(checkpointer, restart, iteration):
        checkpointer.request_stop()

    with pytest.raises(scalemb.RunInterrupted):
        with Checkpointer(out, every=5, on_checkpoint=stop) as checkpointer:
            scalemb.Embedder(model="tsne", iterations=20).fit("school", checkpoint=checkpointer)
    return out


@pytest.mark.parametrize("args", [
    ("embed", "school", "--learning-rate", "inf", "--optimizer", "dbd"),
    ("embed", "school", "--learning-rate", "nan", "--optimizer", "dbd"),
    ("embed", "school", "--time-ratio", "nan", "--optimizer", "dbd"),
    ("embed", "school", "--time-ratio", "inf", "--optimizer", "dbd"),
    ("embed", "school", "--exaggeration", "-4"),
    ("embed", "school", "--seed", "-1"),
    ("generate", "coauthor", "--authors", "1e12"),
    ("generate", "coauthor", "--authors", "1000000000000"),
    ("generate", "coauthor", "--authors", "10", "--edges-per-author", "inf"),
    ("plot", "x.zarr", "--dpi", "100000"),
])
def test_bad_numbers_are_usage_errors_and_write_nothing(tmp_path, args):
    out = tmp_path / ("out.png" if args[0] == "plot" else "out")
    proc = run_cli(*args, "--out", out, *(("--iterations", "5") if args[0] == "embed" else ()), cwd=tmp_path)
    assert one_line_error(proc), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_is_one_line(tmp_path):
    target = tmp_path / "no" / "such" / "R.zarr"
    proc = run_cli("embed", "school", "--iterations", "5", "--out", str(target), "--quiet")
    assert one_line_error(proc, "output directory"), proc.stderr
    # a read-only output directory (as root, mode bits do not stop writes: /sys refuses even root)
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0 and os.path.isdir("/sys"):
        read_only = Path("/sys")
    proc = run_cli("embed", "school", "--iterations", "5", "--out", str(read_only / "R.zarr"), "--quiet")
    assert one_line_error(proc, str(read_only)), proc.stderr
    assert not (read_only / "R.zarr").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli("plot", str(tmp_path / "none.zarr"), "--out", str(blocker / "p.png"))
    assert one_line_error(proc), proc.stderr


def test_malformed_checkpoint_and_corrupt_result_are_one_line(tmp_path):
    out = interrupted_run(tmp_path / "run.zarr")
    version = next(p for p in (out / "checkpoints").iterdir() if p.is_dir())
    coords = zarr.open_array(str(version / "state" / "coords"), mode="r+")
    coords[0, 0] = coords[0, 0] + 1.0  # bit rot: caught by the version's content hash
    proc = run_cli("resume", str(out))
    assert one_line_error(proc, "content hash mismatch"), proc.stderr
    zarr.open_group(str(version), mode="r+").attrs["content_hash"] = None
    state = zarr.open_group(str(version / "state"), mode="r+")
    del state["coords"]
    state.create_array("coords", data=np.zeros((3, 2)))  # wrong shape, no hash to catch it
    proc = run_cli("resume", str(out))
    assert one_line_error(proc, "is unreadable"), proc.stderr

    done = tmp_path / "done.zarr"
    result = scalemb.embed("school", model="tsne", iterations=10, out=done)
    assert len(zarr.open_group(str(done), mode="r").attrs["content_hash"]) == 64
    embedding = zarr.open_array(str(done / "embedding"), mode="r+")
    embedding[1, 1] = result.embedding[1, 1] * 2
    proc = run_cli("plot", str(done), "--out", str(tmp_path / "p.png"))
    assert one_line_error(proc, "content hash mismatch"), proc.stderr


def test_resume_does_not_connect_to_the_stored_scheduler(tmp_path):
    from scalemb.store.checkpoint import _config_hash

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    connections = []
    threading.Thread(target=lambda: connections.append(listener.accept()), daemon=True).start()
    out = interrupted_run(tmp_path / "run.zarr")
    group = zarr.open_group(str(out), mode="r+")
    meta = dict(group.attrs["scalemb_checkpoint"])
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    meta["config"] = {**meta["config"], "spec": {**meta["config"]["spec"], "scheduler": address}}
    # an edited checkpoint naming an arbitrary listener, its configuration hash recomputed by the editor (without
    # that the hash alone refuses it): the stored scheduler is still never contacted
    meta["config_hash"] = _config_hash(meta["config"])
    group.attrs["scalemb_checkpoint"] = meta
    proc = run_cli("resume", str(out))
    time.sleep(0.2)
    assert one_line_error(proc, "--scheduler"), proc.stderr
    assert connections == []
    listener.close()


@pytest.mark.slow
def test_sigterm_during_affinity_leaves_no_spill_directory(tmp_path):
    edges = tmp_path / "big.txt"
    assert run_cli("generate", "coauthor", "--authors", "200000", "--out", str(edges), "--quiet").returncode == 0
    out = tmp_path / "P.zarr"
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", "affinity", str(edges), "--out", str(out),
                             "--quiet"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not [p for p in tmp_path.iterdir() if p.name.startswith(".P.zarr.")] and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode in (130, 0), stderr
    assert sorted(p.name for p in tmp_path.iterdir()) in (["big.txt"], ["P.zarr", "big.txt"])
