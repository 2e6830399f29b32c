"""The two ways the tests run ``scalemb``: in this process, or as a real ``python -m scalemb`` subprocess.

``run_cli`` calls ``scalemb.cli.main.main(argv)`` (what the console entry point ``entry`` runs) here, with what a
process would see made the same: stdout and stderr captured to strings, the root logger without pytest's handlers (so
``logging.basicConfig`` in ``main`` writes the log lines to the captured stderr, and ``--quiet`` really
silences them), warnings printed to that stderr, an argparse ``SystemExit`` turned into its status and an
uncaught exception into a traceback on stderr with status 1 (what the interpreter does).  The SIGTERM
handler ``main`` installs, the working directory and the logging and warning settings are restored after the
call.  It saves the interpreter start and scalemb's imports that every subprocess pays (~2 CPU s; the model
kernels a subprocess needs are loaded from numba's disk cache, ``scalemb.numba_cache``, once compiled).

``run_cli_process`` is the real process, for what only a process shows: exit by signal, SIGINT/SIGTERM
handling, a second process on the same files, the console-script installation, environment variables.
"""
import contextlib
import io
import logging
import os
import re
import signal
import subprocess
import sys
import traceback
import warnings

from scalemb.cli.main import main


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """``scalemb *args`` in this process: a ``CompletedProcess`` with ``returncode``, ``stdout``, ``stderr``."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_sigterm, saved_sigint = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    saved_cwd = os.getcwd()

    def show(message, category, filename, lineno, file=None, line=None):
        err.write(warnings.formatwarning(message, category, filename, lineno, line))

    root.handlers = []
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = show
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors, --help, --version
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
            except Exception:  # what the interpreter prints for an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        for handler in root.handlers:  # the basicConfig handler main added, writing to ``err``
            handler.close()
        root.handlers = saved_handlers
        root.setLevel(saved_level)
        signal.signal(signal.SIGTERM, saved_sigterm)
        signal.signal(signal.SIGINT, saved_sigint)
        os.chdir(saved_cwd)
    return subprocess.CompletedProcess(["scalemb", *argv], code, out.getvalue(), err.getvalue())


def run_cli_process(*args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    """``python -m scalemb *args`` as a subprocess (``kwargs``: ``cwd``, ``env`` ... of ``subprocess.run``)."""
    return subprocess.run([sys.executable, "-m", "scalemb", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


PROGRESS_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} scalemb ")  # the CLI's log records (progress)


def message_lines(stderr: str) -> list:
    """The lines of ``stderr`` that are not the CLI's progress log records (``main``'s ``logging`` format): its
    messages, e.g. the one-line error."""
    return [line for line in stderr.strip().splitlines() if not PROGRESS_LINE.match(line)]
