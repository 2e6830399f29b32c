"""The runner threads that execute the service's jobs (``JobRunner``), claimed from ``scalemb.service.jobs.JobStore``.

A job's output store is ``DATA_ROOT/jobs/<id>/run.zarr``: a checkpointed run while it runs, the result once
done; with ``--storage URL`` the result is published at ``URL/jobs/<id>/run.zarr`` before the job is marked done
(``scalemb.io.storage.publish``: atomic), the local group is removed, and readers (downloads, metrics, transform
jobs) read the published copy (``result_path``).  A service that cannot renew its leases for two thirds of the
lease stops its jobs at their next iteration, before another may take them.  A job taken over continues from
its last checkpoint (``Checkpointer(resume=True)``), or from the start if none was written yet.

A job reads its input's snapshot (``scalemb.service.snapshots``), never the path the request named.  A job that
fails (bad input, a diverged optimisation, a full disk) is ``failed`` with a one-line reason naming paths
relative to the data root, and its output directory is removed: a failed job has no result, and a partial
``run.zarr`` is never left to be read as one.  A full disk (``ENOSPC``/``EDQUOT``) fails the job rather than
retrying it: the space may not come back, and the client resubmits (a snapshot of its input is kept).  The
quality metrics of a done job are a phase of their own (``metrics_state`` ``running``/``done``/``failed`` with
``metrics_error``); every phase writes lines to the job's log (``job_log``: ``GET /jobs/{id}/log``).
"""
import logging
import os
import shutil
import socket
import threading
import time
import traceback
import uuid
from pathlib import Path

import numpy as np

from ..embedding import EmbeddingResult
from ..errors import ScalembError
from ..store.checkpoint import RunInterrupted, read_checkpoint, read_config
from ..store.checkpointer import Checkpointer
from ..io.storage import join, local_input, publish, remove_output
from ..run import Runner, RunSpec
from ..run.inputs import input_kind, plan_of
from .features import knn_settings
from .jobs import ENDED, InUse, JobLogHandler, JobStore, SharedLock, disk_full
from .metrics_phase import MetricsPhase
from .snapshots import clean_snapshots, remove_snapshot
from .stores import clean_stores, ensure_store, touch
from ..placement import PlacementOptimizer, transform_run

logger = logging.getLogger("scalemb")
FLUSH_SECONDS = 0.5  # progress is written to the database at most this often per job
POLL_SECONDS = 0.5  # an idle runner thread looks for jobs (other replicas' submissions) this often


def job_spec(params: dict) -> RunSpec:
    """The ``RunSpec`` a job record stores (a record written before the spec: from its fields)."""
    return RunSpec.from_json(params["spec"]) if "spec" in params else RunSpec.from_front(params, "service")


class JobRunner:
    """``max_running`` threads claiming jobs from the database and running them; a heartbeat thread renewing
    their leases; with ``retention_hours``, finished jobs purged that long after they ended."""

    def __init__(self, store: JobStore, data_root: Path, max_running: int, max_queue: int,
                 scheduler: str | None = None, checkpoint_every: int = 100, n_threads: int | None = None,
                 store_ttl_hours: float = 24.0, retention_hours: float | None = None, storage: str | None = None):
        self.store, self.data_root, self.storage = store, data_root, storage
        self.store_ttl_hours, self.retention_hours = store_ttl_hours, retention_hours
        self.max_queue, self.scheduler = max_queue, scheduler
        self.checkpoint_every, self.n_threads = checkpoint_every, n_threads
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        # replicas: a snapshot made by another service's submission is recorded an instant later
        self.snapshot_grace = 0.0 if store.db.dialect == "sqlite" else 300.0
        self.submit_lock = SharedLock()  # submissions (snapshot + record) vs a purge removing a snapshot
        self._active = {}  # job id -> Checkpointer of the running job
        self._held = set()  # jobs (and metrics phases) this service holds a lease on
        self._cancelled = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._current = threading.local()
        self._handler = JobLogHandler(store, self._current)
        self.metrics_phase = MetricsPhase(self)
        logger.addHandler(self._handler)
        self._last_renewal = time.monotonic()
        if store.db.dialect == "sqlite":
            store.void_leases()
        try:
            clean_snapshots(data_root, store.referenced("snapshot"), self.snapshot_grace)
        except OSError as exc:
            logger.warning("cleaning %s/snapshots: %s", data_root.name, exc)
        self.clean_stores()
        self._threads = [threading.Thread(target=self._loop, name=f"scalemb-job-{i}", daemon=True)
                         for i in range(max_running)]
        self._threads.append(threading.Thread(target=self._heartbeat, name="scalemb-heartbeat", daemon=True))
        for thread in self._threads:
            thread.start()

    def running_here(self) -> int:
        """The number of jobs this service is running now."""
        with self._lock:
            return len(self._active)

    def clean_stores(self) -> None:
        """Apply the stores' cleaning rule (``scalemb.service.stores``)."""
        try:
            in_use = [r["params"].get("store_path") for r in self.store.list("queued")[0] + self.store.list(
                "running")[0]]
            clean_stores(self.data_root, in_use, self.store_ttl_hours)
        except OSError as exc:
            logger.warning("cleaning %s/stores: %s", self.data_root.name, exc)
        except self.store._errors as exc:
            logger.warning("cleaning %s/stores: database: %s", self.data_root.name, str(exc).splitlines()[0])

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
        if job_id in self.store.lost:
            return
        if isinstance(exc, ScalembError) and "in use by another running scalemb process" in str(exc):
            # another service still writes this job's output (it lost the job but has not stopped yet): leave
            # the job running; its lease expires and it is taken again
            self.store.log(job_id, "its output is still in use by another service; retried once its lease ends")
            self.store.lost.add(job_id)
            return
        message = self.reason(exc, params)
        logger.warning("job %s failed: %s", job_id, message)
        if not isinstance(exc, (ScalembError, FloatingPointError)) and exc.__traceback__ is not None:
            # an unexpected exception: where it was raised, for the job's log (the status keeps the one line)
            frames = traceback.extract_tb(exc.__traceback__)[-4:]
            where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
            self.store.log(job_id, self.reason(RuntimeError(f"raised at {where}"), params))
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
        if input_kind(source, params.get("affinity", "auto"), "service") == "precomputed" or (
                self.scheduler is None and knn is None):
            return source
        path = str(ensure_store(self.data_root, source, params["graph_affinity"], knn=knn, n_jobs=self.n_threads))
        self.store.update(job_id, params={**params, "store_path": path})
        return path

    def run_dir(self, job_id: str) -> Path:
        return self.data_root / "jobs" / job_id

    def result_url(self, job_id: str) -> str | None:
        """Where a done job's result is published with ``--storage`` (``STORAGE/jobs/<id>/run.zarr``), else None."""

        return None if self.storage is None else join(self.storage, "jobs", job_id, "run.zarr")

    def result_path(self, job_id: str) -> Path:
        """The done job ``job_id``'s result group to read: ``run.zarr`` in its directory, or with ``--storage``
        the local copy of its published result (``scalemb.io.storage.local_input``, cached in the job's
        directory, so it goes with the job)."""
        if self.storage is None:
            return self.run_dir(job_id) / "run.zarr"

        return Path(local_input(self.result_url(job_id), cache=self.run_dir(job_id) / ".objects"))

    def submit(self, params: dict) -> dict:
        record = self.store.add(params, self.max_queue)
        self.store.log(record["id"], f"queued ({params.get('kind', 'embed')} job)")
        self._wake.set()
        return record

    def cancel(self, job_id: str) -> dict:
        """Cancel a queued job at once, a running one at its next iteration (on whichever service runs it)."""
        if self.store.cancel_queued(job_id):
            with self._lock:
                self._cancelled.add(job_id)
            self.store.log(job_id, "cancelled while queued")
            return self.store.get(job_id)
        if self.store.request_cancel(job_id):  # durable: whoever runs it (or takes it over) cancels it
            self.store.log(job_id, "cancellation requested")
            with self._lock:
                self._cancelled.add(job_id)
                checkpointer = self._active.get(job_id)
            if checkpointer is not None:
                checkpointer.request_stop()
        return self.store.get(job_id)

    def purge(self, job_id: str) -> bool:
        """Delete finished job ``job_id``: its record and log, its files, and its input's snapshot unless another
        job reads it; ``InUse`` while a queued or running transform job reads its result; False if it is not a
        finished job."""
        record = self.store.get(job_id)
        if record is None or record["state"] not in ENDED:
            return False
        for other in self.store.list("queued")[0] + self.store.list("running")[0]:
            if other["params"].get("source_job") == job_id:
                raise InUse(other["id"])
        with self.submit_lock.exclusive():
            if not self.store.delete(job_id):
                return False
            shutil.rmtree(self.run_dir(job_id), ignore_errors=True)
            if self.storage is not None and record["state"] == "done":
                try:
                    remove_output(self.result_url(job_id))
                except ScalembError as exc:  # the record is gone: the object store's copy is left, said so
                    logger.warning("job %s: its published result was not deleted: %s", job_id, exc)
            snap = record["params"].get("snapshot")
            if snap and snap not in self.store.referenced("snapshot"):
                remove_snapshot(self.data_root, snap, self.snapshot_grace)
        return True

    def sweep(self) -> list:
        """Purge the jobs finished more than ``retention_hours`` ago (none without a retention); their ids."""
        if self.retention_hours is None:
            return []
        purged = []
        for job_id in self.store.expired(self.retention_hours):
            try:
                if self.purge(job_id):
                    purged.append(job_id)
            except InUse:
                continue
        if purged:
            logger.info("retention: purged %d jobs finished over %g hours ago", len(purged), self.retention_hours)
        return purged

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the running jobs at their next iteration (they stay ``running`` and resume on restart, here or on
        another replica once their lease expires)."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            for checkpointer in self._active.values():
                checkpointer.request_stop()
        for thread in self._threads:
            thread.join(timeout)
        logger.removeHandler(self._handler)

    def _heartbeat(self):
        """Renew this service's leases; stop jobs another service took, or all of them when renewing has failed
        for two thirds of the lease; pass on cancellations requested through other replicas; retry refused writes;
        apply the retention."""
        last_sweep = 0.0
        while not self._stopping.wait(self.store.lease / 10):
            with self._lock:
                held = set(self._held)
            evaluating = self.metrics_phase.evaluating()
            lost, cancel = self._renew(held, evaluating)
            with self._lock:
                for job_id in lost | cancel:
                    if job_id in cancel:
                        self._cancelled.add(job_id)
                    checkpointer = self._active.get(job_id)
                    if checkpointer is not None:
                        checkpointer.request_stop()
                if lost:
                    self.store.lost |= lost
            if self.retention_hours is not None and \
                    time.monotonic() - last_sweep > min(60.0, self.retention_hours * 360):
                last_sweep = time.monotonic()
                self._sweep_quietly()

    def _renew(self, held: set, evaluating: set) -> tuple[set, set]:
        """Renew the leases of the jobs held (and of those whose metrics are being computed): ``(lost, cancel)``,
        the jobs another service took and those whose cancellation another replica passed on.  When the database
        has refused renewals for two thirds of the lease, every held job counts as lost: another service may take
        them at the lease's end, so this one stops writing now."""
        try:
            lost, cancel = self.store.heartbeat(self.owner, held)
            for job_id in evaluating:
                self.store.renew(job_id)
            self._last_renewal = time.monotonic()
            self.store.retry_pending()
            return lost, cancel
        except self.store._errors as exc:
            logger.warning("renewing job leases: %s", str(exc).splitlines()[0])
            return (held if time.monotonic() - self._last_renewal > self.store.lease * 2 / 3 else set()), set()

    def _sweep_quietly(self) -> None:
        try:
            self.sweep()
        except (OSError,) + self.store._errors as exc:
            logger.warning("retention: %s", str(exc).splitlines()[0])

    def _loop(self):
        while not self._stopping.is_set():
            try:
                record = self.store.claim(self.owner)
            except self.store._errors as exc:
                logger.warning("claiming a job: %s", str(exc).splitlines()[0])
                record = None
            if record is None:
                self._wake.wait(POLL_SECONDS)
                self._wake.clear()
                continue
            job_id = record["id"]
            with self._lock:
                self._held.add(job_id)
            self._current.job = job_id
            try:
                self._execute(record)
            finally:
                self._current.job = None
                self._release(job_id)
            self.clean_stores()

    def _execute(self, record: dict) -> None:
        """Run a claimed job (or end one cancelled while queued); any exception fails it: a runner thread is never
        lost and a job never left "running"."""
        job_id = record["id"]
        try:
            self.store.log(job_id, f"claimed by {self.owner} (claim {record['claim']})")
            if record["cancel_requested"]:
                shutil.rmtree(self.run_dir(job_id) / "run.zarr", ignore_errors=True)
                self.store.update(job_id, state="cancelled", finished=record["finished"] or time.time())
                self.store.log(job_id, "cancelled")
            else:
                self._run(job_id)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if disk_full(exc):
                self._fail(job_id, exc, {})
            else:
                logger.exception("job %s: runner error", job_id)
                if job_id not in self.store.lost:
                    shutil.rmtree(self.run_dir(job_id), ignore_errors=True)
                    self.store.update(job_id, state="failed", error=f"internal error ({type(exc).__name__})",
                                      finished=time.time())

    def _release(self, job_id: str) -> None:
        """After a job's run: its end in its log, its metrics phase started once done, its claim released."""
        try:
            final = self.store.get(job_id) or {}
        except self.store._errors:  # the database is away: the log line is not worth a runner thread
            final = {}
        if final.get("state") in ENDED:
            self.store.log(job_id, f"{final['state']}" + (f": {final['error']}" if final.get("error") else ""))
        if final.get("state") == "done" and job_id not in self.store.lost:
            self.metrics_phase.start(job_id)  # after the "done" line: the log reads in order
        with self._lock:
            self._held.discard(job_id)
        self.store.release(job_id)

    def _resume_point(self, job_id: str, run: Path):
        """The iteration a job's existing output store resumes from (None: start afresh, an unreadable store
        removed), or ``"finished"`` when the previous service died after the result was written."""
        if not run.exists():
            return None
        try:
            read_config(run)
            checkpoint = read_checkpoint(run)
            return 0 if checkpoint is None else checkpoint.iteration
        except ScalembError as exc:
            if "has finished" in str(exc):
                return "finished"
            shutil.rmtree(run, ignore_errors=True)
            return None

    def _run(self, job_id: str):
        params = self.store.get(job_id)["params"]
        if params.get("kind") == "transform":
            return self._run_transform(job_id, params)
        out_dir = self.run_dir(job_id)
        out_dir.mkdir(parents=True, exist_ok=True)
        run = out_dir / "run.zarr"
        resumed_from = self._resume_point(job_id, run)
        if resumed_from == "finished":
            return self._finish(job_id, run)
        if resumed_from is not None:
            record = self.store.get(job_id)
            self.store.update(job_id, resumed_from=resumed_from, kl_history=record["kl_history"][:resumed_from])
            self.store.log(job_id, f"resuming from the checkpoint at iteration {resumed_from}")
        embedder = Runner(job_spec(params).replace(n_jobs=self.n_threads, scheduler=self.scheduler))
        last_flush = [0.0]

        def on_iteration(restart, iteration, kl):
            self.store.progress(job_id, iteration, kl)
            now = time.monotonic()
            if now - last_flush[0] > FLUSH_SECONDS:
                last_flush[0] = now
                self.store.flush(job_id)

        embedder.on_iteration = on_iteration
        checkpointer = Checkpointer(run, every=self.checkpoint_every, resume=resumed_from is not None,
                                    handle_signals=False)
        with self._lock:
            if job_id in self._cancelled:
                self.store.update(job_id, state="cancelled", finished=time.time())
                return
            self._active[job_id] = checkpointer
        try:
            with checkpointer:
                embedder.fit(plan_of(self._source(job_id, params), params["graph_affinity"]), checkpoint=checkpointer)
        except RunInterrupted:
            return self._interrupted(job_id, run)
        except Exception as exc:
            return self._fail(job_id, exc, params)
        finally:
            with self._lock:
                self._active.pop(job_id, None)
        self._finish(job_id, run)

    def _interrupted(self, job_id: str, run: Path) -> None:
        """A run stopped between iterations: lost to another service (left to it), cancelled (removed), or this
        service stopping (stays "running": resumed from its checkpoint on the next start)."""
        if job_id in self.store.lost:
            return
        if job_id in self._cancelled:
            shutil.rmtree(run, ignore_errors=True)
            self.store.update(job_id, state="cancelled", finished=time.time())
        else:
            self.store.flush(job_id)
            self.store.log(job_id, "interrupted: the service stopped; the job resumes from its checkpoint")

    def _run_transform(self, job_id: str, params: dict):
        """A ``POST /jobs/{id}/transform`` job: place new nodes into a done job's map (``scalemb.placement``).
        No checkpoints (placing is short): a restarted service runs it again unless its result was written."""

        run = self.run_dir(job_id) / "run.zarr"
        if not run.exists():
            self.run_dir(job_id).mkdir(parents=True, exist_ok=True)
            try:
                transform_run(self.result_path(params["source_job"]), params["input_path"], run,
                              optimizer=PlacementOptimizer(iterations=params.get("iterations")),
                              n_threads=self.n_threads, free_hops=params.get("free_hops"),
                              free_exaggeration=params.get("free_exaggeration"),
                              free_stored_attraction=params.get("free_stored_attraction"),
                              **({} if params.get("free_iterations") is None else
                                 {"free_iterations": params["free_iterations"]}))
            except Exception as exc:  # bad input included: the job fails with the message
                self._fail(job_id, exc, params)
                return
        self._finish(job_id, run)

    def _finish(self, job_id: str, run: Path):
        """Mark the job done with its result's KL, or failed if the result is not finite (a diverged run that
        did not raise on the way: its numbers would be garbage)."""

        result = EmbeddingResult.load(run)
        if not (np.isfinite(result.kl) and np.isfinite(result.embedding).all()):
            self._fail(job_id, FloatingPointError(f"the result is not finite (KL {float(result.kl)})"),
                       self.store.get(job_id)["params"])
            return
        if self.storage is not None:  # published before the job is done: a done job's result is there
            if job_id in self.store.lost:
                return

            try:
                publish(run, self.result_url(job_id), overwrite=True)
            except ScalembError as exc:
                self._fail(job_id, exc, self.store.get(job_id)["params"])
                return
        self.store.update(job_id, state="done", finished=time.time(), iteration=int(result.iterations),
                          kl=float(result.kl), kl_history=[float(v) for v in result.kl_history],
                          n_points=int(result.embedding.shape[0]))
        if self.storage is not None and job_id not in self.store.lost:
            shutil.rmtree(run, ignore_errors=True)  # the published copy is the result now
