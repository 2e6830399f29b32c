"""Atomic, crash-safe replacement of an output directory (a Zarr group), and the overwrite rules.

A new group is built inside a temporary ``.NAME.tmp-<pid>-<hex>/`` (below) and moved into place by one atomic
step: ``rename`` when ``NAME`` does not exist, else ``renameat2(RENAME_EXCHANGE)`` (Linux), which swaps the two
directories in one system call, so ``NAME`` always holds a complete group (the old one, or the new one); the
old group, now under the sibling's name, is then deleted.  Where the exchange is unavailable, the complete new
group is first renamed ``.NAME.ready-<pid>-<hex>`` (its name says it is complete), then ``NAME`` is renamed
``.NAME.old-<pid>-<hex>`` and the ready one renamed ``NAME``.

Recovery rule (``recover_directory``, run before every read or write of ``NAME``): if ``NAME`` is missing, the
newest ``.NAME.ready-*`` sibling is renamed ``NAME``, else the newest ``.NAME.old-*`` is; then every
``.NAME.old-*`` and ``.NAME.ready-*`` left and every ``.NAME.tmp-<pid>-*`` whose writer process ``pid`` no
longer runs is deleted.  A SIGKILL at any instant therefore leaves ``NAME`` complete, or (before the first
write finished) absent.

Overwrite rules (``check_output_path``): an existing target is replaced only with ``overwrite``, only when it
is a directory scalemb wrote (its ``zarr.json`` carries a scalemb marker: ``scalemb_checkpoint``,
``scalemb_version`` or ``scalemb``), never when it is, contains or lies inside one of the run's inputs; and
the replacement happens only once the new group is complete.

Temporaries (``make_temporary``): every temporary scalemb writes next to an output -- a group being built, a file
being exported, an ingest's spill files -- lives in a directory ``.NAME.TAG-<pid>-<hex>`` holding the marker file
``.scalemb-temporary`` (its content names the writer's pid).  ``reap_temporaries(NAME)`` (part of the recovery
rule, so run before every write of ``NAME``) deletes those whose writer no longer runs, and only those: the
name must match, the marker must be there and name the same pid (or the directory be a complete scalemb group,
or be empty or hold only part of that marker: a writer killed between making it and writing the marker);
a stray file or a directory scalemb did not write is never touched.  A writer interrupted by SIGINT/SIGTERM
removes its own at once (``atomic_directory``, ``atomic_file``), after letting zarr's I/O tasks finish
(``quiesce_zarr``).

Files scalemb writes for other tools (``atomic_file(..., marked=True)``: exports, reports) get a sidecar
``.NAME.scalemb`` holding the SHA-256 of their content; ``--overwrite`` replaces such a file only while the
sidecar still matches it (``is_scalemb_file``), so a file scalemb did not write -- or one edited since -- is
refused.

Locks (``lock_output``): a process writing an output over time (a checkpointed run: its store, and the ``OUT``
its ``OUT.next`` will replace) holds an advisory ``flock`` on ``NAME/.scalemb.lock`` until it is done; every
replacement of an existing ``NAME`` first takes that lock without waiting (``check_output_path``), so a second
writer -- ``--overwrite`` or ``resume`` on a live run's output -- gets a one-line error instead of swapping the
live run's files away.  The kernel drops the lock when its holder exits, even by SIGKILL.
"""
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from ..errors import ScalembError
from .markers import has_marker
from .._version import __version__
from .storage import check_output, is_url, output_target

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def is_scalemb_output(path) -> bool:
    """Whether ``path`` is a directory whose Zarr group attributes carry a scalemb marker."""
    meta = Path(path) / "zarr.json"
    try:
        attrs = json.loads(meta.read_text()).get("attributes", {})
    except (OSError, ValueError, AttributeError):
        return False
    return has_marker(attrs)


def _overlaps(path: Path, other) -> bool:
    try:
        a, b = path.resolve(), Path(other).resolve()
    except (OSError, RuntimeError, TypeError):
        return False
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


LOCK_NAME = ".scalemb.lock"
_held = {}  # resolved path -> open lock file of this process (flock conflicts between two opens in one process)


def _lock_fd(path: Path):
    """An open, exclusively ``flock``-ed lock file in directory ``path``; ``None`` if it cannot be created (a
    read-only directory: nothing can be written into it either); ``BlockingIOError`` if another holds it."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _holder(path: Path) -> str:
    try:
        return f" (pid {int((path / LOCK_NAME).read_text().split()[0])})"
    except (OSError, ValueError, IndexError):
        return ""


def lock_output(path) -> None:
    """Hold the advisory lock of output directory ``path`` for this process (until ``unlock_output`` or exit);
    ``ScalembError`` (one line) if another process holds it."""
    path = Path(path).resolve()
    if path in _held or not path.is_dir():
        return
    try:
        fd = _lock_fd(path)
    except BlockingIOError:
        raise ScalembError(f"{path}: in use by another running scalemb process{_holder(path)}; wait for it to "
                           "finish or stop it first") from None
    if fd is None:
        return
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[path] = fd


def unlock_output(path) -> None:
    """Release this process's lock of ``path`` (if it holds it)."""
    fd = _held.pop(Path(path).resolve(), None)
    if fd is not None:
        os.close(fd)


def check_unlocked(path) -> None:
    """``ScalembError`` if another process holds the lock of directory ``path`` (this process's own is fine)."""
    path = Path(path)
    try:
        resolved = path.resolve()
    except OSError:
        return
    if resolved in _held or not resolved.is_dir() or not (resolved / LOCK_NAME).exists():
        return
    try:
        fd = _lock_fd(resolved)
    except BlockingIOError:
        raise ScalembError(f"{path}: in use by another running scalemb process{_holder(resolved)}; refusing to "
                           "replace it while it writes there") from None
    if fd is not None:
        os.close(fd)


def check_output_path(path, overwrite: bool, inputs=(), kind: str = "directory") -> Path:
    """``path`` as a ``Path`` once it is known to be writable (``kind``: the output is a ``directory``, a
    ``file``, or a ``scalemb-file``: a file replaced only if scalemb wrote it, ``is_scalemb_file``).
    Refuses an existing target without ``overwrite``, a target that is (or holds) one of ``inputs``,
    an existing directory output scalemb did not write, a file where a directory is written (and the reverse),
    and a missing parent directory.  An object-storage URL (``scalemb.io.storage``) is checked there: a group
    only, as ``scalemb.io.storage.check_output`` says."""

    if is_url(path):
        if kind != "directory":
            raise ScalembError(f"{path}: only Zarr groups are written to object storage; write the file locally")
        return check_output(path, overwrite)
    path = Path(path)
    recover_directory(path)
    for source in inputs:
        if source is not None and isinstance(source, (str, Path)) and Path(source).exists() and \
                _overlaps(path, source):
            raise ScalembError(f"{path}: is (or holds) the input {source}; choose another output")
    if path.exists() or path.is_symlink():
        _check_replaceable(path, overwrite, kind)
    parent = path.resolve().parent
    if not parent.is_dir():
        raise ScalembError(f"{path.parent}: output directory does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ScalembError(f"{path.parent}: output directory is not writable")
    return path


def _check_replaceable(path: Path, overwrite: bool, kind: str) -> None:
    """An existing output ``path`` may be replaced: ``overwrite`` given, and scalemb wrote it (a directory with
    its marker and no running writer, a regular file, or a scalemb file its sidecar vouches for)."""
    if not overwrite:
        raise ScalembError(f"{path}: already exists (pass overwrite=True / --overwrite to replace it)")
    if kind == "directory" and not (path.is_dir() and not path.is_symlink() and is_scalemb_output(path)):
        raise ScalembError(f"{path}: exists and was not written by scalemb (no scalemb marker); refusing to "
                           "overwrite it: remove it yourself or choose another output")
    if kind == "directory":
        check_unlocked(path)
    if kind == "file" and (path.is_dir() or not path.is_file()):
        raise ScalembError(f"{path}: exists and is not a regular file; refusing to overwrite it")
    if kind == "scalemb-file" and not is_scalemb_file(path):
        raise ScalembError(f"{path}: exists and was not written by scalemb (or changed since: its "
                           f"{_sidecar(path).name} does not match); refusing to overwrite it: remove it "
                           "yourself or choose another output")


def hidden_sibling(path: Path, tag: str) -> Path:
    """A fresh hidden name next to ``path`` (``.NAME.TAG-<pid>-xxxxxxxx``)."""
    path = Path(path).resolve()
    return path.parent / f".{path.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _siblings(path: Path, tag: str) -> list:
    prefix = f".{path.name}.{tag}-"
    try:
        found = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime if p.exists() else 0.0)


def _alive(pid_text: str) -> bool:
    try:
        os.kill(int(pid_text), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


TEMP_MARKER = ".scalemb-temporary"
_TEMP_TAGS = ("tmp", "ingest")


def make_temporary(path, tag: str = "tmp") -> Path:
    """A fresh temporary directory ``.NAME.TAG-<pid>-<hex>`` next to ``path`` carrying the marker (module
    docstring), for ``reap_temporaries`` to find once its writer is gone."""
    if tag not in _TEMP_TAGS:
        raise ValueError(f"unknown temporary tag {tag!r}")
    tmp = hidden_sibling(path, tag)
    tmp.mkdir(mode=0o700)
    (tmp / TEMP_MARKER).write_text(f"scalemb {os.getpid()}\n")
    return tmp


def _temporary_pid(path: Path, name: str):
    """The writer pid of ``.NAME.TAG-<pid>-<hex>`` (``name`` is NAME), or ``None`` if the name is not one."""
    match = re.fullmatch(rf"\.{re.escape(name)}\.(?:{'|'.join(_TEMP_TAGS)})-(\d+)-[0-9a-f]{{8,12}}", path.name)
    return None if match is None else match.group(1)


def _ours(path: Path, pid: str) -> bool:
    """Whether directory ``path`` carries the temporary marker naming ``pid``, or is a complete scalemb group, or
    is what ``make_temporary`` leaves when killed between its ``mkdir`` and its marker's write: the directory
    empty, or holding only a marker that is a prefix of the one it writes (nothing in it to lose)."""
    if not path.is_dir() or path.is_symlink():
        return False
    try:
        if (path / TEMP_MARKER).read_text().split() == ["scalemb", pid]:
            return True
    except OSError:
        pass
    try:
        entries = [entry.name for entry in path.iterdir()]
        if not entries or (entries == [TEMP_MARKER] and (path / TEMP_MARKER).is_file()
                           and f"scalemb {pid}\n".startswith((path / TEMP_MARKER).read_text())):
            return True
    except (OSError, UnicodeDecodeError):
        pass
    return is_scalemb_output(path)


def reap_temporaries(path) -> list:
    """Delete the temporaries of ``path`` (module docstring) whose writer no longer runs; returns them."""
    path = Path(path)
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return []
    reaped = []
    for entry in entries:
        pid = _temporary_pid(entry, path.name)
        if pid is not None and not _alive(pid) and _ours(entry, pid):
            shutil.rmtree(entry, ignore_errors=True)
            reaped.append(entry)
    return reaped


def quiesce_zarr(timeout: float = 30.0) -> None:
    """Cancel zarr's I/O tasks left running by an interrupted call (``KeyboardInterrupt`` in the waiting thread
    does not stop them: they would go on writing into a directory being removed and print their tracebacks at
    exit) and wait until they have ended."""
    import asyncio
    import sys

    sync = sys.modules.get("zarr.core.sync")
    loop = getattr(sync, "loop", [None])[0] if sync is not None else None
    if loop is None or loop.is_closed() or not loop.is_running():
        return

    async def cancel_all() -> int:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    # other threads may still hand zarr new calls while the first tasks end: cancel in rounds until none is left
    deadline = time.monotonic() + timeout
    try:
        while asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - best effort: the caller removes the directory anyway
        pass
    # the process is stopping: a task a thread created after the last round is destroyed pending at exit, and
    # asyncio's report of it ("Task was destroyed but it is pending!") is about work cancelled on purpose
    logging.getLogger("asyncio").disabled = True


def _remove(tmp: Path, interrupted: bool = False) -> None:
    """Remove temporary ``tmp``; after a write ``interrupted`` by SIGINT/SIGTERM (the process is stopping: other
    threads' zarr calls need not go on) zarr's tasks are stopped first, and ``tmp`` removed again while an I/O
    thread still finishing its chunk re-creates it (bounded)."""
    if not interrupted:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    quiesce_zarr()
    deadline = time.monotonic() + 5
    while True:
        shutil.rmtree(tmp, ignore_errors=True)
        if not tmp.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}.scalemb")


def file_sha256(path) -> str:
    """SHA-256 of the bytes of file ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_scalemb_file(path) -> bool:
    """Whether regular file ``path`` is one scalemb wrote (``atomic_file(..., marked=True)``) and unchanged since:
    its sidecar records the SHA-256 of its content."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    try:
        meta = json.loads(_sidecar(path).read_text())
        return isinstance(meta, dict) and meta.get("sha256") == file_sha256(path)
    except (OSError, ValueError):
        return False


@contextmanager
def atomic_file(path, marked: bool = False):
    """Yield a path to write one file to, inside a fresh temporary (``make_temporary``) next to ``path``; on
    normal exit it replaces ``path`` (``os.replace``) and, with ``marked``, its sidecar records its SHA-256
    (``is_scalemb_file``); the temporary is removed in any case."""

    path = Path(path)
    tmp = make_temporary(path, "tmp")
    try:
        target = tmp / path.name
        yield target
        sidecar = None
        if marked:
            sidecar = tmp / TEMP_MARKER
            sidecar.write_text(json.dumps({"written_by": f"scalemb {__version__}",
                                           "sha256": file_sha256(target)}))
        os.replace(target, path)
        if sidecar is not None:
            os.replace(sidecar, _sidecar(path))
    except KeyboardInterrupt:
        _remove(tmp, interrupted=True)
        raise
    finally:
        _remove(tmp)


def recover_directory(path) -> None:
    """Apply the recovery rule (module docstring) to ``path``: restore ``path`` from a complete sibling left
    by a killed replacement and delete the leftovers of killed writers."""
    path = Path(path)
    try:
        path = path.resolve()
        if not path.parent.is_dir() or not path.name:
            return
    except OSError:
        return
    if not path.exists():
        for tag in ("ready", "old"):
            candidates = _siblings(path, tag)
            if candidates:
                os.replace(candidates[-1], path)
                break
    if path.exists():
        for tag in ("ready", "old"):
            for leftover in _siblings(path, tag):
                shutil.rmtree(leftover, ignore_errors=True)
    reap_temporaries(path)


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def replace_directory(new: Path, path: Path) -> None:
    """Move the complete directory ``new`` to ``path`` in one atomic step, replacing an existing ``path``
    (see the module docstring); ``new`` is consumed."""
    new, path = Path(new), Path(path)
    if not (path.exists() or path.is_symlink()):
        os.replace(new, path)
        return
    if _exchange(new, path):
        shutil.rmtree(new, ignore_errors=True)  # now the old group
        return
    ready = hidden_sibling(path, "ready")
    os.replace(new, ready)
    old = hidden_sibling(path, "old")
    os.replace(path, old)
    os.replace(ready, path)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_directory(path, overwrite: bool = False, inputs=()):
    """Yield a directory path (inside a fresh temporary, ``make_temporary``) to write a group into; on normal
    exit it replaces ``path`` (an existing one only when ``overwrite`` and scalemb wrote it:
    ``check_output_path``); the temporary is removed in any case.  An object-storage URL ``path``: the group is
    built in a local staging directory and published there (``scalemb.io.storage.output_target``)."""

    if is_url(path):
        with output_target(path, overwrite) as staged, atomic_directory(staged) as group:
            yield group
        return
    path = check_output_path(path, overwrite, inputs)
    tmp = make_temporary(path, "tmp")
    try:
        group = tmp / path.name
        yield group
        if path.exists():
            check_output_path(path, overwrite, inputs)  # still ours at the moment of replacing it
        replace_directory(group, path)
    except KeyboardInterrupt:
        _remove(tmp, interrupted=True)
        raise
    finally:
        _remove(tmp)
