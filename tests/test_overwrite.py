"""--overwrite replaces only what scalemb wrote, never the input, only once the new result is complete; the
replacement itself is one atomic step with a recovery rule (``scalemb.io.atomic``)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import scalemb
from scalemb.embedding import EmbeddingResult
from scalemb.io.atomic import hidden_sibling, recover_directory
from scalemb.store.checkpointer import Checkpointer
from scalemb.optim import make_optimizer

from .cli_runner import run_cli


def test_overwrite_refuses_directories_scalemb_did_not_write_and_the_input(tmp_path):
    foreign = tmp_path / "u"
    foreign.mkdir()
    (foreign / "s").write_text("x")
    proc = run_cli("embed", "school", "--iterations", "5", "--out", str(foreign), "--overwrite", "--quiet")
    assert proc.returncode == 2 and "not written by scalemb" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and (foreign / "s").read_text() == "x"

    edges = tmp_path / "e.txt"
    edges.write_text("1 2\n2 3\n3 1\n3 4\n")
    proc = run_cli("embed", str(edges), "--iterations", "5", "--out", str(edges), "--overwrite", "--quiet")
    assert proc.returncode == 2 and "is (or holds) the input" in proc.stderr
    assert edges.read_text() == "1 2\n2 3\n3 1\n3 4\n"
    proc = run_cli("affinity", str(edges), "--out", str(edges), "--overwrite", "--quiet")
    assert proc.returncode == 2 and edges.read_text() == "1 2\n2 3\n3 1\n3 4\n"
    proc = run_cli("embed", "school", "--iterations", "5", "--out", ".", "--overwrite", "--quiet")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_old_result_survives_a_diverging_overwrite_and_is_replaced_by_a_good_one(tmp_path):
    out = tmp_path / "R.zarr"
    good = scalemb.embed("school", model="tsne", iterations=20, out=out)
    with pytest.raises(FloatingPointError):
        scalemb.embed("school", model="sne", iterations=500, out=out, overwrite=True, checkpoint_every=5,
                      optimizer=make_optimizer("dbd", "sne", learning_rate=1e6, max_backoffs=1, tol=0))
    assert np.array_equal(EmbeddingResult.load(out).embedding, good.embedding)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R.zarr"]
    new = scalemb.embed("school", model="tsne", iterations=30, seed=1, out=out, overwrite=True)
    assert np.array_equal(EmbeddingResult.load(out).embedding, new.embedding)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R.zarr"]


def test_interrupted_overwrite_keeps_old_result_and_resume_replaces_it(tmp_path):
    out = tmp_path / "R.zarr"
    good = scalemb.embed("school", model="tsne", iterations=20, out=out)

    def stop(checkpointer, restart, iteration):
        checkpointer.request_stop()

    with pytest.raises(scalemb.RunInterrupted) as info:
        with Checkpointer(out, every=10, overwrite=True, on_checkpoint=stop) as checkpointer:
            scalemb.Embedder(model="tsne", iterations=40, random_state=2).fit("school", checkpoint=checkpointer)
    assert np.array_equal(EmbeddingResult.load(out).embedding, good.embedding)
    assert info.value.path == tmp_path / "R.zarr.next"
    result = scalemb.resume(info.value.path)
    assert np.array_equal(EmbeddingResult.load(out).embedding, result.embedding)
    assert not (tmp_path / "R.zarr.next").exists()
    assert np.array_equal(result.embedding, scalemb.embed("school", model="tsne", iterations=40, seed=2).embedding)


def _sigkill_between_renames(tmp_path, exchange: bool):
    """A writer replacing OUT is SIGKILLed right after its first rename (the fallback sequence) or right after
    the exchange (before the old group is deleted)."""
    out = tmp_path / "R.zarr"
    code = f"""
import os, signal, sys
import scalemb
from scalemb.io import atomic
real = os.replace
if {not exchange}:
    atomic._exchange = lambda a, b: False
    def replace(a, b):
        real(a, b)
        if ".old-" in str(b):
            os.kill(os.getpid(), signal.SIGKILL)
    atomic.os.replace = replace
else:
    real_exchange = atomic._exchange
    def exchange(a, b):
        assert real_exchange(a, b)
        os.kill(os.getpid(), signal.SIGKILL)
    atomic._exchange = exchange
scalemb.embed("school", model="tsne", iterations=30, seed=5, out=sys.argv[1], overwrite=True)
"""
    first = scalemb.embed("school", model="tsne", iterations=20, out=out)
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    return out, first


@pytest.mark.slow
def test_sigkill_during_fallback_replacement_recovers_the_new_result(tmp_path):
    out, first = _sigkill_between_renames(tmp_path, exchange=False)
    assert not out.exists()  # killed between the two renames
    loaded = EmbeddingResult.load(out)  # the recovery rule restores the complete new result
    assert np.array_equal(loaded.embedding, scalemb.embed("school", model="tsne", iterations=30, seed=5).embedding)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".R.zarr.")]


@pytest.mark.slow
def test_sigkill_after_exchange_leaves_new_result_and_leftover_is_cleaned(tmp_path):
    out, first = _sigkill_between_renames(tmp_path, exchange=True)
    loaded = EmbeddingResult.load(out)
    assert np.array_equal(loaded.embedding, scalemb.embed("school", model="tsne", iterations=30, seed=5).embedding)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".R.zarr.")]


def test_recovery_keeps_writers_that_are_alive(tmp_path):
    out = tmp_path / "R.zarr"
    live = hidden_sibling(out, "tmp")
    live.mkdir()
    dead = tmp_path / f".R.zarr.tmp-{2 ** 22 + 7}-deadbeef"  # above pid_max's default: no such process
    dead.mkdir()
    (dead / ".scalemb-temporary").write_text(f"scalemb {2 ** 22 + 7}\n")  # the marker scalemb writes in its own
    recover_directory(out)
    assert live.exists() and not dead.exists() and os.getpid() == int(live.name.split("-")[-2])
