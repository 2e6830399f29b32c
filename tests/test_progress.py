"""Progress: each phase with its time (estimator ``verbose=True``, the CLI by default), the optimisation's bar
(``tqdm.auto``) whose total is the expected iteration count, and a truthful message on Ctrl-C before the first
checkpoint."""
import io
import logging
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from scalemb.progress import Progress, expected_iterations, phase, reporting
from tests.cli_runner import run_cli

PHASES = ("kNN", "perplexity calibration", "initialisation", "optimisation")


def _features(tmp_path, n=300, d=8, seed=0):
    path = tmp_path / "X.npy"
    np.save(path, np.random.default_rng(seed).standard_normal((n, d)))
    return path


@pytest.mark.slow
def test_estimator_verbose_reports_each_phase_with_its_time_in_a_fresh_process():
    """A user's ``TSNE(verbose=True).fit(X)`` in a plain Python process (no logging configured) shows every
    phase with its time on stderr; the default (verbose=False) shows nothing."""
    code = textwrap.dedent("""
        import sys, numpy as np, scalemb
        X = np.random.default_rng(0).standard_normal((200, 5))
        scalemb.TSNE(verbose=sys.argv[1] == "1", max_iter=60).fit(X)
    """)
    loud = subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr
    for name in PHASES:
        assert any(line.startswith(f"scalemb {name}") and " done in " in line and line.endswith(" s") or
                   f"{name} done in" in line for line in loud.stderr.splitlines()), (name, loud.stderr)
    quiet = subprocess.run([sys.executable, "-c", code, "0"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "scalemb" not in quiet.stderr, quiet.stderr


def test_cli_reports_phases_by_default_and_quiet_silences_them(tmp_path):
    X = _features(tmp_path)
    loud = run_cli("embed", X, "--model", "tsne", "--iterations", "40", "--out", tmp_path / "a.zarr")
    assert loud.returncode == 0, loud.stderr
    for name in ("reading", *PHASES):
        assert f"{name} done in" in loud.stderr, (name, loud.stderr)
    quiet = run_cli("embed", X, "--model", "tsne", "--iterations", "40", "--out", tmp_path / "b.zarr", "--quiet")
    assert quiet.returncode == 0 and "done in" not in quiet.stderr, quiet.stderr


def test_phase_reports_an_interruption_and_reraises(caplog):
    with caplog.at_level(logging.INFO, logger="scalemb"):
        with reporting(True), pytest.raises(KeyboardInterrupt):
            with phase("kNN", "10 points"):
                raise KeyboardInterrupt
        with phase("silent"):  # outside reporting(True): nothing
            pass
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "kNN (10 points) ..." and messages[1].startswith("kNN interrupted after ")
    assert not any("silent" in m for m in messages)


def test_reporting_attaches_a_handler_only_when_nothing_shows_info_and_restores_the_logger():
    log = logging.getLogger("scalemb")
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []  # a fresh session: no handler anywhere
    try:
        stream = io.StringIO()
        before = (log.level, log.handlers[:])
        with reporting(True, stream=stream):
            log.info("hello")
        log.info("after")  # the handler is gone again
        assert stream.getvalue() == "scalemb hello\n"
        assert (log.level, log.handlers) == before
    finally:
        root.handlers = saved


def _power_law_history(b=1.3, c=0.05, start=100, stop=3000):
    """A KL history whose relative decrease per iteration after ``start`` is ``c (t - start)^-b`` exactly."""
    kl = [5.0] * (start + 1)
    for t in range(start + 1, stop):
        kl.append(kl[-1] * (1.0 - c * (t - start) ** -b))
    return kl


def test_expected_iterations_follows_a_power_law_decrease_to_the_tolerance():
    start, window, tol, b, c = 100, 50, 1e-5, 1.3, 0.05
    history = _power_law_history(b, c, start)
    true_stop = next(t for t in range(start + window, len(history))
                     if history[t - window] - history[t] < tol * window * abs(history[t]))
    assert expected_iterations(history[:start + window - 1], 5000, start, window, tol) == 5000  # too early
    for t, within in ((start + 2 * window, 0.25), (start + 4 * window, 0.05), (true_stop - 10, 0.01)):
        guess = expected_iterations(history[:t + 1], 5000, start, window, tol)
        assert abs(guess - true_stop) <= within * true_stop, (t, guess, true_stop)
    assert expected_iterations(history[:true_stop + 1], 5000, start, window, tol) == true_stop + 1
    assert expected_iterations(history[:400], 300, start, window, tol) == 300  # capped by the budget
    assert expected_iterations(history[:400], 5000, start, window, 0.0) == 5000  # tol 0: never stops early


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_is_tqdm_auto_and_its_total_is_the_expected_count():
    from tqdm.auto import tqdm

    start, window, tol = 100, 50, 1e-5
    history = _power_law_history(start=start)
    progress = Progress(5000, "tsne", stream=_Terminal(), stop_rule=(start, window, tol))
    assert isinstance(progress._bar, tqdm)
    for it in range(401):
        progress(it, history[it])
    assert progress._bar.total == progress.expected < 5000
    progress.close(history[400])
    assert progress._bar is None
    silent = Progress(5000, "tsne", quiet=True, stream=_Terminal())
    assert silent._bar is None


@pytest.mark.slow
def test_ctrl_c_during_knn_says_nothing_was_written(tmp_path):
    """SIGINT while the kNN search runs (before any checkpoint store exists): exit 130, the phase reported as
    interrupted, a message that says nothing was written, and no output left."""
    X = tmp_path / "X.npy"
    np.save(X, np.random.default_rng(0).standard_normal((30_000, 50)))
    out = tmp_path / "run.zarr"
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", "embed", str(X), "--model", "tsne", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if "kNN (" in line or not line:
            break
    assert proc.poll() is None, "".join(lines)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=240)
    stderr = "".join(lines) + rest
    assert proc.returncode == 130, stderr
    assert "kNN interrupted after" in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last == f"scalemb: interrupted before the first checkpoint; nothing written ({out} does not exist)", last
    assert not out.exists() and not (tmp_path / "run.zarr.next").exists()


def _embed_interrupted(cli, monkeypatch, tmp_path, embed) -> str:
    """Run ``scalemb embed school`` through ``cli.main`` with ``embed`` in place of the CLI's ``_embed`` (the SIGINT
    handler restored after), check exit 130, return the output path."""
    monkeypatch.setattr(cli, "_embed", embed)
    out = tmp_path / "run.zarr"
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["embed", "school", "--out", str(out)]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    return out


def test_an_error_raised_after_ctrl_c_is_reported_as_the_interruption(tmp_path, monkeypatch, capsys):
    """A KeyboardInterrupt raised inside a C extension can surface as another exception (numba compiling through
    llvmlite's ctypes turned one into ``AttributeError: 'PipelineTuningOptions' object has no attribute
    '_as_parameter_'``): after SIGINT the CLI still reports the interruption, exit 130; without a signal the same
    exception is not swallowed."""
    import os

    from scalemb.cli import main as cli

    def compile_through_ctypes(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise AttributeError("'PipelineTuningOptions' object has no attribute '_as_parameter_'") from None
        raise AssertionError("SIGINT did not arrive")

    out = _embed_interrupted(cli, monkeypatch, tmp_path, compile_through_ctypes)
    previous = signal.getsignal(signal.SIGINT)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"scalemb: interrupted before the first checkpoint; nothing written ({out} does not exist)"

    def broken(args):
        raise AttributeError("a real bug")

    monkeypatch.setattr(cli, "_embed", broken)
    try:
        with pytest.raises(AttributeError, match="a real bug"):
            cli.main(["embed", "school", "--out", str(out)])
    finally:
        signal.signal(signal.SIGINT, previous)


def test_interruption_note_tells_what_is_on_disk(tmp_path):
    import scalemb
    from scalemb.store.checkpoint import interruption_note
    from scalemb.store.checkpointer import Checkpointer

    out = tmp_path / "run.zarr"
    assert "nothing written" in interruption_note(out)
    with Checkpointer(out, every=0, handle_signals=False) as checkpoint:
        checkpoint.request_stop()
        with pytest.raises(scalemb.RunInterrupted):
            scalemb.TSNE(max_iter=30).fit("school", checkpoint=checkpoint)
    note = interruption_note(out)
    assert note.startswith(f"interrupted; {out} keeps the last checkpoint (restart 1, iteration ") and \
        note.endswith(f"(scalemb resume {out})"), note
    finished = tmp_path / "done.zarr"
    scalemb.embed("school", iterations=5, out=finished)
    assert interruption_note(finished) == f"interrupted before the first checkpoint; {finished} is as it was"


def test_a_ctrl_c_swallowed_inside_a_c_callback_still_interrupts_the_run(tmp_path, monkeypatch, capsys, caplog):
    """llvmlite's ctypes callbacks swallow a KeyboardInterrupt raised while numba compiles ("Exception ignored on
    calling ctypes callback function"; CI saw a run go on for 40 s of kNN and a whole optimisation after Ctrl-C):
    the phase that was running ends as interrupted when it returns, the CLI exits 130 and writes nothing; a phase
    without a signal ends normally."""
    import ctypes
    import os

    from scalemb.cli import main as cli

    def swallowed():  # raise inside a ctypes callback, as llvmlite's object-cache notification does
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("SIGINT did not arrive")

    callback = ctypes.CFUNCTYPE(None)(swallowed)
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: ignored.append(unraisable.exc_type))

    def embed(args):
        with reporting(True), phase("kNN"):
            callback()
        raise AssertionError("the phase ended normally after SIGINT")

    out = _embed_interrupted(cli, monkeypatch, tmp_path, embed)
    assert ignored == [KeyboardInterrupt]  # the interrupt really was swallowed by ctypes
    err = capsys.readouterr().err
    assert "kNN interrupted after" in caplog.text, caplog.text
    assert err.strip().splitlines()[-1] == (f"scalemb: interrupted before the first checkpoint; nothing written "
                                            f"({out} does not exist)")
    assert not out.exists()
    with phase("quiet"):
        pass
