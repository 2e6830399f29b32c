"""Content-addressed input snapshots: what a job reads is the input as it was when the job was submitted.

A job input under the data root (an upload, an edge list, a feature file, an affinity store directory) can be
replaced or edited by path at any time, also while a job reads it or after it is done (its metrics and report
read the input again).  So ``POST /jobs`` copies the input once into ``DATA_ROOT/snapshots/<sha256><suffix>``
and the job reads only that copy: ``sha256`` is the SHA-256 of the bytes copied (what ``sha256sum`` prints;
for a directory, of each file's relative path and SHA-256, in sorted order), computed while copying, so the
name is the content whatever happens to the original during or after the copy; ``suffix`` is the original's
file suffixes (how readers tell ``.npy`` from ``.csv`` or ``.gz``).  The copy is written under a temporary
name and renamed into place, then made read-only; an existing snapshot of the same content is reused.  The
job record keeps the hash (``input_sha256``) and the snapshot path; a snapshot is kept while any job record
references it: deleting a finished job (``DELETE /jobs/{id}``, or the retention) removes its snapshot unless
another job's record names it, and ``clean_snapshots``, when the service starts, deletes the unreferenced ones
and the temporary copies a killed service left.  Replicas of the service (PostgreSQL) share the directory: a
snapshot another replica has just made or reused (its modification time, set on reuse too) may belong to a
submission not yet recorded, so removal spares snapshots younger than a grace period there.
Built-in datasets are package data, not files under the data root: they need no snapshot.
"""
import hashlib
import os
import re
import shutil
import stat
import time
from pathlib import Path

DIRECTORY = "snapshots"
_BLOCK = 1 << 20
_SUFFIX = re.compile(r"^(\.[A-Za-z0-9_-]{1,16}){1,2}$")


def _suffix(name: str) -> str:
    """The last one or two suffixes of ``name`` (``.txt.gz``, ``.npy``, ``.zarr``), '' if unusual."""
    suffixes = Path(name).suffixes[-2:]
    for start in range(len(suffixes)):
        candidate = "".join(suffixes[start:])
        if _SUFFIX.fullmatch(candidate):
            return candidate
    return ""


def _copy_file(source: Path, target: Path, digest) -> None:
    with open(source, "rb") as src, open(target, "xb") as dst:
        while block := src.read(_BLOCK):
            digest.update(block)
            dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())


def _read_only(path: Path) -> None:
    mode = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
    if path.is_dir():
        for folder, _, files in os.walk(path):
            for name in files:
                os.chmod(Path(folder) / name, mode)
    else:
        os.chmod(path, mode)


def snapshot(root: Path, source: Path) -> tuple[str, Path]:
    """``(sha256, path)`` of the snapshot of ``source`` (a file or directory under ``root``), made now unless
    one of the same content and suffix exists.  ``OSError`` (a full disk included) leaves nothing behind."""
    folder = Path(root) / DIRECTORY
    folder.mkdir(exist_ok=True)
    source = Path(source)
    tmp = folder / f".tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        if source.is_dir():
            tmp.mkdir()
            digest = hashlib.sha256(b"scalemb-snapshot-directory-1\0")
            for folder_path, dirs, files in os.walk(source):
                dirs.sort()
                relative = Path(folder_path).relative_to(source)
                for name in dirs:
                    (tmp / relative / name).mkdir()
                for name in sorted(files):
                    inner = hashlib.sha256()
                    _copy_file(Path(folder_path) / name, tmp / relative / name, inner)
                    digest.update(f"{(relative / name).as_posix()}\0{inner.hexdigest()}\0".encode())
        else:
            digest = hashlib.sha256()
            _copy_file(source, tmp, digest)
        key = digest.hexdigest()
        target = folder / f"{key}{_suffix(source.name)}"
        if target.exists():
            _touch(target)
        else:
            _read_only(tmp)
            try:
                os.rename(tmp, target)  # a directory renamed onto an existing one fails: the other copy wins
            except OSError:
                if not target.exists():
                    raise
        return key, target
    finally:
        if tmp.exists():
            _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir():  # read-only files in writable directories: removable
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _older(path: Path, grace: float) -> bool:
    try:
        return grace <= 0 or path.lstat().st_mtime < time.time() - grace
    except OSError:
        return False


def remove_snapshot(root: Path, path, grace: float = 0.0) -> bool:
    """Remove snapshot ``path`` (a path under ``ROOT/snapshots`` only) unless modified within ``grace`` seconds.
    The caller has checked that no job record names it."""
    path = Path(path)
    folder = (Path(root) / DIRECTORY).resolve()
    if path.parent.resolve() != folder or not path.exists() or not _older(path, grace):
        return False
    _remove(path)
    return True


def clean_snapshots(root: Path, referenced, grace: float = 0.0) -> list:
    """Delete the snapshots no path in ``referenced`` names and the temporary copies, sparing those modified in
    the last ``grace`` seconds; returns them.  With ``grace`` 0, call only while no submission is under way
    (the service starting, alone on the data root)."""
    folder = Path(root) / DIRECTORY
    if not folder.is_dir():
        return []
    keep = {Path(p).name for p in referenced if p}
    removed = []
    for entry in folder.iterdir():
        if entry.name not in keep and _older(entry, grace):
            _remove(entry)
            removed.append(entry)
    return removed
