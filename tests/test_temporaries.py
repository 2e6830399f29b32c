"""Temporaries scalemb leaves when killed are reaped once their writer is gone -- only those, never what scalemb
did not write -- and files scalemb wrote for other tools are recognised (and replaced by ``--overwrite``) by
their sidecar hash."""
import os
import signal
import subprocess
import sys
import time

import pytest

from scalemb.io.atomic import TEMP_MARKER, is_scalemb_file, reap_temporaries

from .cli_runner import run_cli


def _killed_writer(out, tag: str) -> str:
    """The temporary a writer of ``out`` killed by SIGKILL leaves (made by the real ``make_temporary``, a partial
    file inside); returns its name."""
    code = ("import os, sys; from scalemb.io.atomic import make_temporary; "
            f"t = make_temporary(sys.argv[1], {tag!r}); (t / 'partial').write_text('half'); print(t.name, flush=True); "
            "os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run.zarr"
    assert run_cli("embed", "school", "--model", "tsne", "--iterations", "5", "--out", out, "--quiet").returncode == 0
    return out


@pytest.mark.slow
def test_killed_exports_temporaries_are_reaped_and_nothing_else(run, tmp_path):
    target = tmp_path / "map.csv"
    dead = _killed_writer(target, "tmp")
    assert (tmp_path / dead / TEMP_MARKER).exists()
    # look-alikes scalemb did not write: same name pattern, no marker / a marker naming another pid / a file
    foreign = tmp_path / f".map.csv.tmp-{2 ** 22 + 7}-0123abcd"
    foreign.mkdir()
    (foreign / "precious").write_text("mine")
    other = tmp_path / f".map.csv.tmp-{2 ** 22 + 9}-89abcdef"
    other.mkdir()
    (other / TEMP_MARKER).write_text("scalemb 1\n")
    stray = tmp_path / f".map.csv.tmp-{2 ** 22 + 11}-aaaabbbb"
    stray.write_text("a file")
    live = tmp_path / f".map.csv.tmp-{os.getpid()}-ccccdddd"
    live.mkdir()
    (live / TEMP_MARKER).write_text(f"scalemb {os.getpid()}\n")
    proc = run_cli("export", run, "--format", "csv", "--out", target)
    assert proc.returncode == 0, proc.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert dead not in left
    assert {foreign.name, other.name, stray.name, live.name} <= set(left)
    assert (foreign / "precious").read_text() == "mine"


def test_a_writer_killed_between_mkdir_and_marker_leaves_nothing_the_reaper_keeps(tmp_path):
    """``make_temporary`` makes the directory, then writes its marker: a SIGKILL between the two leaves the
    directory empty (or its marker partly written), which the reaper removes once the writer is gone -- the
    restarted service's result directory kept such a ``.run.zarr.tmp-*``; a look-alike holding anything else,
    or a live writer's, stays."""
    out = tmp_path / "run.zarr"
    dead = 2 ** 22 + 13  # above pid_max's default of 2 ** 22: no process has it
    empty = tmp_path / f".run.zarr.tmp-{dead}-0123abcd"
    empty.mkdir()
    partial = tmp_path / f".run.zarr.tmp-{dead}-4567abcd"
    partial.mkdir()
    (partial / TEMP_MARKER).write_text("scalemb 41")
    other_pid = tmp_path / f".run.zarr.tmp-{dead}-89abcdef"
    other_pid.mkdir()
    (other_pid / TEMP_MARKER).write_text("scalemb 7\n")
    holding = tmp_path / f".run.zarr.tmp-{dead}-aaaabbbb"
    holding.mkdir()
    (holding / "precious").write_text("mine")
    live = tmp_path / f".run.zarr.tmp-{os.getpid()}-ccccdddd"
    live.mkdir()
    reaped = reap_temporaries(out)
    assert sorted(p.name for p in reaped) == sorted([empty.name, partial.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([other_pid.name, holding.name, live.name])
    assert (holding / "precious").read_text() == "mine"


@pytest.mark.slow
def test_killed_ingest_spill_is_reaped_by_the_next_ingest(tmp_path):
    from scalemb.io.coauthor_generator import write_coauthor_edge_list

    edges = write_coauthor_edge_list(tmp_path / "edges.txt", 300, seed=1)
    out = tmp_path / "P.zarr"
    dead = _killed_writer(out, "ingest")
    old_style = tmp_path / ".P.zarr.ingest-0123456789ab"  # no pid, no marker: not provably scalemb's
    old_style.mkdir()
    proc = run_cli("affinity", edges, "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / dead).exists() and old_style.exists()
    assert reap_temporaries(out) == []


@pytest.mark.slow
def test_sigterm_during_the_store_write_leaves_nothing_and_one_line(tmp_path):
    """SIGTERM while zarr writes the affinity store: zarr's I/O tasks are stopped, the temporary removed, and the
    run ends with one line (it left ``.OUT.tmp-*`` and ~250 lines of asyncio tracebacks)."""
    from scalemb.io.coauthor_generator import write_coauthor_edge_list

    # 3e5 authors: the store write takes ~1.5 s on a quiet machine; with 1e5 (~0.6 s) the signal could land after
    # it, during interpreter shutdown, where Python has restored SIGTERM's default action (rc -15)
    edges = write_coauthor_edge_list(tmp_path / "edges.txt", 300_000, seed=1)
    out = tmp_path / "P.zarr"
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", "affinity", str(edges), "--out", str(out)],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any(".P.zarr.tmp-" in p.name for p in tmp_path.iterdir()) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edges.txt"]


def test_overwrite_replaces_scalemb_files_and_refuses_others(run, tmp_path):
    for fmt in ("csv", "npy"):
        target = tmp_path / f"map.{fmt}"
        assert run_cli("export", run, "--format", fmt, "--out", target).returncode == 0
        assert is_scalemb_file(target)
        proc = run_cli("export", run, "--format", fmt, "--out", target, "--overwrite")
        assert proc.returncode == 0, proc.stderr  # scalemb's own file: replaced (it was always refused)
        with open(target, "ab") as handle:
            handle.write(b"\n")  # edited since: no longer what scalemb wrote
        proc = run_cli("export", run, "--format", fmt, "--out", target, "--overwrite")
        assert proc.returncode == 2 and "was not written by scalemb" in proc.stderr, proc.stderr
    foreign = tmp_path / "notes.csv"
    foreign.write_text("mine\n")
    proc = run_cli("export", run, "--format", "csv", "--out", foreign, "--overwrite")
    assert proc.returncode == 2 and foreign.read_text() == "mine\n"
    page, metrics = tmp_path / "report.html", tmp_path / "m.json"
    for _ in range(2):
        proc = run_cli("report", run, "--out", page, "--json", metrics, "--overwrite", "--quiet")
        assert proc.returncode == 0, proc.stderr
    assert is_scalemb_file(page) and is_scalemb_file(metrics)
    page.write_text("<html>my own page</html>")
    proc = run_cli("report", run, "--out", page, "--overwrite", "--quiet")
    assert proc.returncode == 2 and page.read_text() == "<html>my own page</html>"
