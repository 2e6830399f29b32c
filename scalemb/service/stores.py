"""Affinity stores for service jobs that run on a Dask cluster, and for feature jobs anywhere:
``DATA_ROOT/stores/<key>.zarr``.

Dask workers read P by path, so a job's input must be an affinity store on storage the workers see: the data
root (a shared volume in ``deploy/kubernetes``), never the service's temporary directory.  A non-store input
(an upload, an edge list under the data root, a built-in dataset) is ingested once into
``stores/<key>.zarr``, ``key`` the SHA-256 of (the input's bytes, or the dataset name and scalemb version;
the graph affinity; the partition count; a feature file's kNN settings), so later jobs on the same input reuse
it.  A feature job's kNN P is kept here in-process too: its run names the store and the feature file (a
transform job reads both), and a resumed job reads the P it started with.  Ingestion runs under an
exclusive ``flock`` on ``stores/<key>.lock`` and writes atomically, so concurrent jobs on one input ingest it
once and nobody sees a half-written store.  The job records the store it used and resumes from it after a
restart, whatever happened to the original file since.

Cleaning rule: a store's modification time is its last use (set when a job starts on it).  When the service
starts and after every job, a store that no queued or running job uses and that was last used more than
``ttl_hours`` ago (``scalemb serve --store-ttl-hours``, default 24) is deleted, with its lock file.
"""
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from .._version import __version__
from ..affinity.store import is_affinity_store
from ..run.inputs import InputPlan
from .features import knn_affinity_of

DIRECTORY = "stores"
_READ = 1 << 20


def input_key(source: str, graph_affinity: str, n_partitions: int | None, knn: dict | None = None) -> str:
    """The store key of ``source`` (a file path or a built-in dataset name); ``knn``: a feature file's kNN
    settings (``scalemb.service.features.knn_settings``), hashed too (graph keys are unchanged)."""
    digest = hashlib.sha256(f"scalemb-store-1\0{graph_affinity}\0{n_partitions}\0".encode())
    if knn is not None:
        digest.update(f"knn\0{json.dumps(knn, sort_keys=True)}\0".encode())
    path = Path(source)
    if path.is_file():
        with open(path, "rb") as handle:
            while block := handle.read(_READ):
                digest.update(block)
    else:
        digest.update(f"dataset\0{source}\0{__version__}".encode())
    return digest.hexdigest()


def ensure_store(root: Path, source: str, graph_affinity: str, n_partitions: int | None = None,
                 knn: dict | None = None, n_jobs: int | None = None) -> Path:
    """``DATA_ROOT/stores/<key>.zarr`` holding ``source``'s P, ingested now unless already there; ``n_partitions``
    None: the data-determined row-block layout every run uses, so cluster jobs equal in-process ones bit for bit.
    ``knn``: ``source`` is a feature file; P is its kNN affinity with these settings (``n_jobs`` threads)."""

    folder = Path(root) / DIRECTORY
    folder.mkdir(exist_ok=True)
    key = input_key(source, graph_affinity, n_partitions, knn)
    path = folder / f"{key}.zarr"
    with open(folder / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_affinity_store(path):  # not cached yet (a store is written whole or not at all)
            data = source if knn is None else knn_affinity_of(source, knn, n_jobs)
            InputPlan("graph" if knn is None else "knn", source, data, graph_affinity).write_store(path, n_partitions)
        touch(path)
    return path


def touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def clean_stores(root: Path, in_use, ttl_hours: float) -> list:
    """Delete the stores no job in ``in_use`` (paths) uses and last used over ``ttl_hours`` ago; returns them.
    ``ttl_hours`` must be a finite number >= 0 (``ValueError``): NaN or a negative age would delete every store
    not in use."""
    if not (isinstance(ttl_hours, (int, float)) and 0 <= ttl_hours < float("inf")):
        raise ValueError(f"store ttl must be a finite number of hours >= 0, got {ttl_hours!r}")
    folder = Path(root) / DIRECTORY
    if not folder.is_dir():
        return []
    keep = {Path(p).name for p in in_use if p}
    cutoff = time.time() - ttl_hours * 3600
    removed = []
    for store in folder.glob("*.zarr"):
        if store.name in keep:
            continue
        lock_path = folder / f"{store.name[:-len('.zarr')]}.lock"
        with open(lock_path, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # being ingested or used right now
            try:
                if store.stat().st_mtime >= cutoff:
                    continue
            except OSError:
                continue
            shutil.rmtree(store, ignore_errors=True)
            lock_path.unlink(missing_ok=True)
            removed.append(store)
    return removed
