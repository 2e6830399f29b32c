"""A job's input as the service receives it: a path confined to the data root (no absolute paths, ``..``,
symlinks leading out or the service's own files), snapshot when the job is submitted, or an object-storage URL
under ``--storage`` downloaded and snapshot; its affinity kind decided by ``scalemb.run.inputs`` (the one rule)
and a feature file checked before anything is queued."""
import os
import shutil
import time
from pathlib import Path

from fastapi import HTTPException

from ..errors import ScalembError
from ..io.storage import download, within
from ..run.inputs import check_knn_settings, input_kind
from .features import check_features
from .snapshots import snapshot

MAX_PATH_CHARS = 1024
# the service's own entries in the data root, never a job's input (with every name starting with '.': the
# service's temporary files and lock); "jobs.sqlite3" covers its -wal, -shm and -journal files too
SERVICE_ENTRIES = ("jobs", "stores", "snapshots", "jobs.sqlite3")

STORAGE_STATUS = {"missing": 404, "denied": 403, "credentials": 502, "unreachable": 502}


def confine(root: Path, relative: str) -> Path:
    """``root / relative`` resolved, or ``HTTPException``: 400 for absolute paths and ``..``, 403 when a
    symlink leads outside ``root``, 404 when missing."""
    if not relative or "\x00" in relative or len(relative) > MAX_PATH_CHARS:
        raise HTTPException(400, f"input path is empty, invalid or longer than {MAX_PATH_CHARS} characters")
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        raise HTTPException(400, "input path is not valid UTF-8 text") from None
    candidate = Path(relative)
    if candidate.is_absolute() or relative.startswith(("/", "\\")):
        raise HTTPException(400, f"input {relative!r}: absolute paths are refused; give a path relative to the "
                                 "data root")
    if ".." in candidate.parts:
        raise HTTPException(400, f"input {relative!r}: '..' is refused; give a path inside the data root")
    try:
        resolved = (root / candidate).resolve()
        if not resolved.is_relative_to(root) or _escaping_link(root, resolved):
            raise HTTPException(403, f"input {relative!r} resolves outside the data root (symlink); refused")
        if not resolved.exists():
            raise HTTPException(404, f"input {relative!r}: no such file under the data root")
        inside = resolved.relative_to(root).parts
        if not inside:
            raise HTTPException(400, f"input {relative!r} is the data root itself; name a file in it")
        if inside[0].startswith(SERVICE_ENTRIES) or any(part.startswith(".") for part in inside):
            raise HTTPException(403, f"input {relative!r} is one of the service's own files (its database, lock, "
                                     "jobs, stores, snapshots or temporary files); refused")
    except OSError as exc:
        raise HTTPException(400, f"input {relative!r}: not a usable path ({exc.strerror})") from None
    return resolved


def _escaping_link(root: Path, path: Path) -> bool:
    """Whether a directory input (an affinity store) holds a symlink leading outside ``root``."""
    if not path.is_dir():
        return False
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            entry = Path(folder) / name
            if entry.is_symlink() and not entry.resolve().is_relative_to(root):
                return True
    return False


def affinity_kind(job, input_path: str) -> str:
    """The job's affinity once its input is known ('auto' resolved: ``scalemb.service.features``); a feature file
    is read and checked here, so bad input is refused (422, naming the field or the file and line) before
    anything is queued or written."""

    path = input_path if not Path(input_path).is_absolute() else Path(input_path)  # a dataset stays a name
    try:
        kind = input_kind(path, job.affinity, "service", shown=job.input)
        check_knn_settings(kind, job.spec(), "service", shown=job.input)
        if kind == "knn":
            check_features(path, job.input)
    except ValueError as exc:
        raise HTTPException(422, str(exc).splitlines()[0][:500]) from None
    return kind


def input_snapshot(root: Path, relative: str) -> dict:
    """The job-record fields of input ``relative`` (a confined path): ``input_path``, the snapshot the job
    reads, ``snapshot`` (the same: the reference that keeps it) and ``input_sha256``; 422 for a directory that
    is not an affinity store (``scalemb.run.inputs.input_kind``: the one rule)."""
    path = confine(root, relative)
    try:
        input_kind(path, "auto", "service", shown=repr(relative))
    except ValueError as exc:
        raise HTTPException(422, f"input {exc}") from None
    key, copy = snapshot(root, path)
    return {"input_path": str(copy), "snapshot": str(copy), "input_sha256": key}


def remote_snapshot(root: Path, url: str, storage: str | None) -> dict:
    """``_input_snapshot`` of an object-storage input: ``url`` must lie under the service's ``--storage`` prefix
    (as a path must lie under the data root; 400 without one, 403 outside it); its objects are downloaded into a
    temporary directory of ``DATA_ROOT/snapshots`` and snapshot from there.  An unusable URL, a missing object
    or bucket, refused or missing credentials: one line naming the URL (400, 404, 403, 502)."""

    try:
        if storage is None:
            raise HTTPException(400, f"input {url!r}: object-storage inputs need the service's --storage")
        if not within(url, storage):
            raise HTTPException(403, f"input {url!r} is outside the service's storage {storage}; refused")
        folder = root / "snapshots"
        folder.mkdir(exist_ok=True)
        tmp = folder / f".tmp-{os.getpid()}-{time.monotonic_ns()}-download"
        tmp.mkdir()
        try:
            copy = tmp / url.rstrip("/").rsplit("/", 1)[-1]
            download(url, copy)
            key, path = snapshot(root, copy)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except ScalembError as exc:
        raise HTTPException(STORAGE_STATUS.get(getattr(exc, "kind", None), 400), str(exc).splitlines()[0]) from None
    return {"input_path": str(path), "snapshot": str(path), "input_sha256": key}

