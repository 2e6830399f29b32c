"""Job records (SQLite under the data root) and the runner threads that execute them.

A job's output store is ``DATA_ROOT/jobs/<id>/run.zarr``: a checkpointed run while it runs, the result once
done.  A job found ``running`` or ``queued`` when the service starts is queued again; a running one continues
from its last checkpoint (``Checkpointer(resume=True)``), or from the start if none was written yet.

A job reads its input's snapshot (``scalemb.service.snapshots``), never the path the request named.  Records
are JSON through ``scalemb.service.jsonsafe`` (a non-finite KL is stored and shown as ``null``).  A job that
fails (bad input, a diverged optimisation, a full disk) is ``failed`` with a one-line reason naming paths
relative to the data root, and its output directory is removed: a failed job has no result, and a partial
``run.zarr`` is never left to be read as one.  A full disk (``ENOSPC``/``EDQUOT``) fails the job rather than
retrying it: the space may not come back, and the client resubmits (a snapshot of its input is kept).  A
record that cannot be written to SQLite (the disk is full) stays current in memory and is written with the next
write that succeeds; a submission that cannot be written is refused (``disk_full`` tells the service to
answer 507).
"""
import errno
import logging
import os
import queue
import shutil
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from ..affinity.store import is_affinity_store
from ..run import Runner, RunSpec
from ..run.inputs import plan_of
from ..errors import ScalembError
from ..io.checkpoint import Checkpointer, RunInterrupted, read_checkpoint, read_config
from .features import knn_settings
from .jsonsafe import dumps, finite, loads
from .snapshots import clean_snapshots
from .stores import clean_stores, ensure_store, touch

logger = logging.getLogger("scalemb")

STATES = ("queued", "running", "done", "failed", "cancelled")
_SCHEMA = """CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, params TEXT NOT NULL, created REAL NOT NULL,
    started REAL, finished REAL, iteration INTEGER, kl REAL, kl_history TEXT NOT NULL DEFAULT '[]',
    error TEXT, resumed_from INTEGER, n_points INTEGER)"""
FLUSH_SECONDS = 0.5  # progress is written to SQLite at most this often per job


class QueueFull(Exception):
    """The queue holds ``max_queue`` jobs already."""


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the quota) is full: ``OSError`` ENOSPC/EDQUOT, or SQLite's FULL."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    return False


class JobStore:
    """Job records: an in-memory copy for fast reads, every change persisted to SQLite."""

    def __init__(self, path: Path):
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._lock = threading.Lock()
        self._jobs = {}
        self._unsaved = set()  # ids whose latest change SQLite refused (a full disk): written by the next write
        for row in self._db.execute("SELECT * FROM jobs ORDER BY created"):
            record = dict(zip([c[0] for c in self._db.execute("SELECT * FROM jobs LIMIT 0").description], row))
            record["params"] = loads(record["params"])
            record["kl_history"] = loads(record["kl_history"])
            self._jobs[record["id"]] = finite(record)  # rows written before non-finite floats became null

    def _persist(self, record):
        values = dict(finite(record), params=dumps(record["params"]), kl_history=dumps(record["kl_history"]))
        names = list(values)
        self._db.execute(f"INSERT OR REPLACE INTO jobs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                         [values[n] for n in names])

    def _save(self, job_id: str) -> None:
        """Persist ``job_id`` and any record a failed write left unsaved; a failure is logged, the records
        stay unsaved (current in memory) until a later write succeeds."""
        self._unsaved.add(job_id)
        try:
            for pending in sorted(self._unsaved):
                self._persist(self._jobs[pending])
                self._unsaved.discard(pending)
        except (sqlite3.Error, OSError) as exc:
            logger.warning("job records not saved (%d pending): %s", len(self._unsaved), exc)

    def add(self, params: dict, max_queue: int) -> dict:
        """A new queued job; raises ``QueueFull``, or the database's error when it cannot be written (nothing
        is added then)."""
        with self._lock:
            queued = sum(1 for r in self._jobs.values() if r["state"] == "queued")
            if queued >= max_queue:
                raise QueueFull(queued)
            record = {"id": uuid.uuid4().hex[:16], "state": "queued", "params": params, "created": time.time(),
                      "started": None, "finished": None, "iteration": None, "kl": None, "kl_history": [],
                      "error": None, "resumed_from": None, "n_points": None}
            self._persist(record)
            self._jobs[record["id"]] = record
            return dict(record)

    def get(self, job_id: str) -> dict | None:
        with self._lock:
            record = self._jobs.get(job_id)
            return None if record is None else dict(record, kl_history=list(record["kl_history"]))

    def list(self) -> list:
        with self._lock:
            return [dict(r, kl_history=None) for r in self._jobs.values()]

    def update(self, job_id: str, persist: bool = True, **changes) -> dict:
        with self._lock:
            record = self._jobs[job_id]
            record.update(changes)
            if persist:
                self._save(job_id)
            return dict(record)

    def progress(self, job_id: str, iteration: int, kl: float) -> None:
        """Record an iteration (in memory; ``flush`` persists)."""
        with self._lock:
            record = self._jobs[job_id]
            record["iteration"], record["kl"] = iteration, float(kl)
            history = record["kl_history"]
            del history[iteration:]  # a resumed or restarted run overwrites the tail
            history.append(float(kl))

    def flush(self, job_id: str) -> None:
        with self._lock:
            self._save(job_id)

    def close(self):
        with self._lock:
            self._db.close()


def job_spec(params: dict) -> RunSpec:
    """The ``RunSpec`` a job record stores (a record written before the spec: from its fields)."""
    return RunSpec.from_json(params["spec"]) if "spec" in params else RunSpec.from_front(params, "service")


class JobRunner:
    """``max_running`` threads taking job ids from a FIFO queue and running them."""

    def __init__(self, store: JobStore, data_root: Path, max_running: int, max_queue: int,
                 scheduler: str | None = None, checkpoint_every: int = 100, n_threads: int | None = None,
                 store_ttl_hours: float = 24.0):
        self.store, self.data_root = store, data_root
        self.store_ttl_hours = store_ttl_hours
        self.max_queue, self.scheduler = max_queue, scheduler
        self.checkpoint_every, self.n_threads = checkpoint_every, n_threads
        self._queue = queue.Queue()
        self._active = {}  # job id -> Checkpointer of the running job
        self._cancelled = set()
        self._evaluating = set()  # done jobs whose metrics are being computed (or failed)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        for record in store.list():  # jobs a previous service left unfinished
            if record["state"] in ("queued", "running") and record["params"].get("cancel_requested"):
                shutil.rmtree(self.run_dir(record["id"]) / "run.zarr", ignore_errors=True)
                store.update(record["id"], state="cancelled", finished=record["finished"] or time.time())
            elif record["state"] in ("queued", "running"):
                store.update(record["id"], state="queued")
                self._queue.put(record["id"])
        try:
            clean_snapshots(data_root, [r["params"].get("snapshot") for r in store.list()])
        except OSError as exc:
            logger.warning("cleaning %s/snapshots: %s", data_root.name, exc)
        self.clean_stores()
        self._threads = [threading.Thread(target=self._loop, name=f"scalemb-job-{i}", daemon=True)
                         for i in range(max_running)]
        for thread in self._threads:
            thread.start()

    def clean_stores(self) -> None:
        """Apply the stores' cleaning rule (``scalemb.service.stores``)."""
        in_use = [r["params"].get("store_path") for r in self.store.list() if r["state"] in ("queued", "running")]
        try:
            clean_stores(self.data_root, in_use, self.store_ttl_hours)
        except OSError as exc:
            logger.warning("cleaning %s/stores: %s", self.data_root.name, exc)

    def reason(self, exc: BaseException, params: dict) -> str:
        """The one-line reason a job failed: the input's snapshot named as the request named the input, every
        other path relative to the data root."""
        if disk_full(exc):
            return ("disk full: no space left on the data root's file system while the job ran; its partial "
                    "output was removed, resubmit once space is freed")
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if isinstance(exc, FloatingPointError):
            message = f"optimisation diverged: {exc}"
        if params.get("snapshot"):
            message = message.replace(params["snapshot"], params["input"])
        root = str(self.data_root)
        return message.replace(root + os.sep, "").replace(root, ".")[:2000]

    def _fail(self, job_id: str, exc: BaseException, params: dict) -> None:
        """Mark ``job_id`` failed with its reason and remove its output directory (a failed job has none)."""
        message = self.reason(exc, params)
        logger.warning("job %s failed: %s", job_id, message)
        shutil.rmtree(self.run_dir(job_id), ignore_errors=True)
        self.store.update(job_id, state="failed", error=message, finished=time.time())

    def _source(self, job_id: str, params: dict):
        """The input ``Embedder.fit`` reads: an affinity store input as is; with a scheduler, an affinity store
        under the data root (``scalemb.service.stores``); in-process, the input path of a graph.  A feature file's
        kNN affinity (as ``scalemb.Embedder(affinity='knn')`` builds it) is built into a data-root store on either
        path, so the run names its store and features (a transform job places new rows against them) and a
        resumed job reads the P it started with, whatever the neighbour search would find on a second try."""
        if params.get("store_path"):
            touch(Path(params["store_path"]))
            return params["store_path"]
        source, knn = params["input_path"], knn_settings(params)
        if is_affinity_store(source) or (self.scheduler is None and knn is None):
            return source
        path = str(ensure_store(self.data_root, source, params["graph_affinity"], knn=knn, n_jobs=self.n_threads))
        self.store.update(job_id, params={**params, "store_path": path})
        return path

    def run_dir(self, job_id: str) -> Path:
        return self.data_root / "jobs" / job_id

    def submit(self, params: dict) -> dict:
        record = self.store.add(params, self.max_queue)
        self._queue.put(record["id"])
        return record

    def cancel(self, job_id: str) -> dict:
        """Cancel a queued job at once, a running one at its next iteration."""
        with self._lock:
            record = self.store.get(job_id)
            if record["state"] == "queued":
                self._cancelled.add(job_id)
                return self.store.update(job_id, state="cancelled", finished=time.time())
            if record["state"] == "running":
                self._cancelled.add(job_id)
                # durable: a service killed before the job stops cancels it when it starts again
                self.store.update(job_id, params={**record["params"], "cancel_requested": True})
                checkpointer = self._active.get(job_id)
                if checkpointer is not None:
                    checkpointer.request_stop()
            return record

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the running jobs at their next iteration (they stay ``running`` and resume on restart)."""
        self._stopping.set()
        with self._lock:
            for checkpointer in self._active.values():
                checkpointer.request_stop()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout)

    def _loop(self):
        while not self._stopping.is_set():
            job_id = self._queue.get()
            if job_id is None or self._stopping.is_set():
                return
            with self._lock:
                if job_id in self._cancelled or self.store.get(job_id)["state"] != "queued":
                    continue
                self.store.update(job_id, state="running", started=self.store.get(job_id)["started"] or time.time())
            try:
                self._run(job_id)
            except Exception as exc:  # never lose a runner thread, never leave a job "running"
                if disk_full(exc):
                    self._fail(job_id, exc, {})
                else:
                    logger.exception("job %s: runner error", job_id)
                    shutil.rmtree(self.run_dir(job_id), ignore_errors=True)
                    self.store.update(job_id, state="failed", error=f"internal error ({type(exc).__name__})",
                                      finished=time.time())
            self.clean_stores()

    def _run(self, job_id: str):
        params = self.store.get(job_id)["params"]
        if params.get("kind") == "transform":
            return self._run_transform(job_id, params)
        out_dir = self.run_dir(job_id)
        out_dir.mkdir(parents=True, exist_ok=True)
        run = out_dir / "run.zarr"
        resume, resumed_from = False, None
        if run.exists():
            try:
                read_config(run)
                checkpoint = read_checkpoint(run)
                resume = True
                resumed_from = 0 if checkpoint is None else checkpoint.iteration
            except ScalembError as exc:
                if "has finished" in str(exc):  # the previous service died after the result was written
                    self._finish(job_id, run)
                    return
                shutil.rmtree(run, ignore_errors=True)
        if resume:
            record = self.store.get(job_id)
            self.store.update(job_id, resumed_from=resumed_from, kl_history=record["kl_history"][:resumed_from])
        embedder = Runner(job_spec(params).replace(n_jobs=self.n_threads, scheduler=self.scheduler))
        last_flush = [0.0]

        def on_iteration(restart, iteration, kl):
            self.store.progress(job_id, iteration, kl)
            now = time.monotonic()
            if now - last_flush[0] > FLUSH_SECONDS:
                last_flush[0] = now
                self.store.flush(job_id)

        embedder.on_iteration = on_iteration
        checkpointer = Checkpointer(run, every=self.checkpoint_every, resume=resume, handle_signals=False)
        with self._lock:
            if job_id in self._cancelled:
                self.store.update(job_id, state="cancelled", finished=time.time())
                return
            self._active[job_id] = checkpointer
        try:
            with checkpointer:
                embedder.fit(plan_of(self._source(job_id, params), params["graph_affinity"]), checkpoint=checkpointer)
        except RunInterrupted:
            if job_id in self._cancelled:
                shutil.rmtree(run, ignore_errors=True)
                self.store.update(job_id, state="cancelled", finished=time.time())
            else:
                self.store.flush(job_id)  # service stopping: stays "running", resumed on the next start
            return
        except Exception as exc:
            self._fail(job_id, exc, params)
            return
        finally:
            with self._lock:
                self._active.pop(job_id, None)
        self._finish(job_id, run)

    def metrics(self, job_id: str):
        """The done job's metrics (``metrics.json``), or ``None`` while they are computed: a background thread
        started when the job finished (or here, for a job finished before a restart)."""
        path = self.run_dir(job_id) / "metrics.json"
        if path.exists():
            return loads(path.read_text())
        self._start_evaluation(job_id)
        return None

    def _start_evaluation(self, job_id: str) -> None:
        with self._lock:
            if job_id in self._evaluating:
                return
            self._evaluating.add(job_id)
        threading.Thread(target=self._evaluate, args=(job_id,), name=f"scalemb-metrics-{job_id}", daemon=True).start()

    def _evaluate(self, job_id: str) -> None:
        """Write the run's quality metrics to ``metrics.json`` (a failure is logged and left at that: the job
        stays done, its metrics ``None``)."""
        from ..metrics import evaluate_run, to_json
        from ..report.page import write_text_atomic

        try:
            metrics = to_json(evaluate_run(self.run_dir(job_id) / "run.zarr", n_threads=self.n_threads))
            write_text_atomic(self.run_dir(job_id) / "metrics.json", dumps(metrics))
        except Exception as exc:  # noqa: BLE001 - metrics are an extra: never fail a finished job
            logger.warning("job %s: no metrics (%s)", job_id, self.reason(exc, self.store.get(job_id)["params"]))
            if disk_full(exc):  # tried again on the next request for them
                with self._lock:
                    self._evaluating.discard(job_id)

    def _run_transform(self, job_id: str, params: dict):
        """A ``POST /jobs/{id}/transform`` job: place new nodes into a done job's map (``scalemb.placement``).
        No checkpoints (placing is short): a restarted service runs it again unless its result was written."""
        from ..placement import PlacementOptimizer, transform_run

        run = self.run_dir(job_id) / "run.zarr"
        if not run.exists():
            self.run_dir(job_id).mkdir(parents=True, exist_ok=True)
            try:
                transform_run(self.run_dir(params["source_job"]) / "run.zarr", params["input_path"], run,
                              optimizer=PlacementOptimizer(iterations=params["iterations"]),
                              n_threads=self.n_threads, free_hops=params.get("free_hops", 0),
                              free_iterations=params.get("free_iterations", 30))
            except Exception as exc:  # bad input included: the job fails with the message
                self._fail(job_id, exc, params)
                return
        self._finish(job_id, run)

    def _finish(self, job_id: str, run: Path):
        """Mark the job done with its result's KL, or failed if the result is not finite (a diverged run that
        did not raise on the way: its numbers would be garbage)."""
        import numpy as np

        from ..embedding import EmbeddingResult

        result = EmbeddingResult.load(run)
        if not (np.isfinite(result.kl) and np.isfinite(result.embedding).all()):
            self._fail(job_id, FloatingPointError(f"the result is not finite (KL {float(result.kl)})"),
                       self.store.get(job_id)["params"])
            return
        self.store.update(job_id, state="done", finished=time.time(), iteration=int(result.iterations),
                          kl=float(result.kl), kl_history=[float(v) for v in result.kl_history],
                          n_points=int(result.embedding.shape[0]))
        self._start_evaluation(job_id)
