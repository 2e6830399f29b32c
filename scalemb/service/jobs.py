"""Job records in a database (``scalemb.service.database``): ``JobStore`` adds, claims, leases, updates and
logs jobs; ``scalemb.service.runner.JobRunner`` executes them.

A job runs on the service (replica) that claimed it: ``JobStore.claim`` takes the oldest queued job, or a
running one whose lease has expired (its service was killed or lost the database), in one transaction with
``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL (SQLite: ``BEGIN IMMEDIATE``), sets ``owner``, a lease
(``--lease-seconds``, on the database's clock) and increments ``claim``.  The owner renews the leases of its
jobs every tenth of the lease; every write it makes about a job is fenced by the claim number (``... WHERE claim
= ?``), so a service that lost a job (its lease expired and another took it) changes nothing.  With SQLite one
service owns the database (the data root's ``flock``), so the leases of its previous life are void when it
starts.

Records are JSON through ``scalemb.service.jsonsafe`` (a non-finite KL is stored and shown as ``null``).  A write
about a running job that the database refuses (a full disk, a lost connection) stays current in memory and is
written with the next write that succeeds; a submission that cannot be written is refused (``disk_full`` tells
the service to answer 507).
"""
import errno
import logging
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager

from .database import Database, database_error_types
from .jsonsafe import dumps, finite, loads

logger = logging.getLogger("scalemb")

STATES = ("queued", "running", "done", "failed", "cancelled")
ENDED = ("done", "failed", "cancelled")
LEASE_SECONDS = 30.0  # default of ``scalemb serve --lease-seconds``; leases are renewed every tenth of it, and a
# service that could not renew them for two thirds of it stops its jobs (another may take them once it has passed)
COLUMNS = ("id", "state", "params", "created", "started", "finished", "iteration", "kl", "kl_history", "error",
           "resumed_from", "n_points", "owner", "lease_until", "claim", "cancel_requested", "metrics_state",
           "metrics_error")
SUMMARY = ", ".join(c for c in COLUMNS if c != "kl_history")
LOG_LINES = 2000  # lines kept per job (the first ones; the last line says how many were left out)


class QueueFull(Exception):
    """The queue holds ``max_queue`` jobs already."""


class SharedLock:
    """Many holders of ``shared()`` at once (submissions taking snapshots) or one of ``exclusive()`` (a purge
    checking that no record names a snapshot before removing it)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class InUse(Exception):
    """A finished job cannot be deleted while another job reads it (``args[0]``: that job's id)."""


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the quota) is full: ``OSError`` ENOSPC/EDQUOT, or SQLite's FULL."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    return False


def _record(row: dict) -> dict:
    record = dict(row)
    record["params"] = loads(record["params"])
    if "kl_history" in record:
        record["kl_history"] = loads(record["kl_history"])
    record["cancel_requested"] = bool(record.get("cancel_requested")) or bool(
        record["params"].get("cancel_requested"))
    return finite(record)  # rows written before non-finite floats became null


class JobStore:
    """Job records in ``db`` (read from the database: any replica's changes are seen); the running jobs of this
    service (``hold``) keep their progress in memory between flushes, and writes the database refused wait in
    ``_pending`` for the next one that succeeds."""

    def __init__(self, db: Database, lease_seconds: float = LEASE_SECONDS):
        self.db, self.lease = db, float(lease_seconds)
        self._lock = threading.RLock()
        self._live = {}  # id -> record of a job this service runs (progress newer than the database)
        self._claims = {}  # id -> claim number this service holds
        self._pending = {}  # id -> changes the database refused, written by the next write that succeeds
        self.lost = set()  # ids whose claim another service took over
        self._errors = database_error_types()
        self.iterations_total = 0  # optimiser iterations this service's jobs have run (the /metrics counter)

    # -- reading -------------------------------------------------------------------------------------------
    def get(self, job_id: str) -> dict | None:
        with self._lock:
            live = self._live.get(job_id)
            if live is not None:
                return dict(live, kl_history=list(live["kl_history"]))
            pending = dict(self._pending.get(job_id, {}))
        rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        return {**_record(rows[0]), **pending}

    def list(self, state: str | None = None, limit: int | None = None, offset: int = 0) -> tuple[list, int]:
        """``(records without their KL history, total)``: the jobs in ``state`` (all if ``None``), oldest first,
        ``limit`` of them from ``offset``."""
        where, args = ("WHERE state = ?", (state,)) if state else ("", ())
        total = int(self.db.execute(f"SELECT COUNT(*) AS n FROM jobs {where}", args)[0]["n"])
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        rows = self.db.execute(f"SELECT {SUMMARY} FROM jobs {where} ORDER BY created, id{page}", args)
        records = []
        with self._lock:
            for row in rows:
                record = _record(row)
                live = self._live.get(record["id"])
                record.update({k: v for k, v in (live or self._pending.get(record["id"], {})).items()
                               if k != "kl_history"})
                records.append(dict(record, kl_history=None))
        return records, total

    def count(self, state: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) AS n FROM jobs WHERE state = ?", (state,))[0]["n"])

    def counts(self) -> dict:
        """``{state: number of jobs}`` over the whole database (every replica's jobs), one query."""
        return {row["state"]: int(row["n"])
                for row in self.db.execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")}

    def referenced(self, key: str) -> set:
        """The values of ``params[key]`` over every record (the snapshots and stores jobs read)."""
        return {loads(row["params"]).get(key) for row in self.db.execute("SELECT params FROM jobs")} - {None}

    # -- writing -------------------------------------------------------------------------------------------
    def add(self, params: dict, max_queue: int) -> dict:
        """A new queued job; raises ``QueueFull``, or the database's error when it cannot be written (nothing
        is added then)."""
        with self.db.transaction() as cursor:
            queued = int(cursor.execute("SELECT COUNT(*) AS n FROM jobs WHERE state = 'queued'")[0]["n"])
            if queued >= max_queue:
                raise QueueFull(queued)
            record = {"id": uuid.uuid4().hex[:16], "state": "queued", "params": params, "created": time.time(),
                      "started": None, "finished": None, "iteration": None, "kl": None, "kl_history": [],
                      "error": None, "resumed_from": None, "n_points": None}
            values = dict(finite(record), params=dumps(params), kl_history="[]")
            cursor.execute(f"INSERT INTO jobs ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                           list(values.values()))
        return dict(record, claim=0, owner=None, cancel_requested=False, metrics_state=None, metrics_error=None)

    def _write(self, job_id: str, changes: dict) -> bool:
        """One fenced write of ``changes``; False when this service no longer holds the job's claim."""
        values = finite(dict(changes))
        for key in ("params", "kl_history"):
            if key in values:
                values[key] = dumps(values[key])
        if "cancel_requested" in values:
            values["cancel_requested"] = int(bool(values["cancel_requested"]))
        sets = ", ".join(f"{name} = ?" for name in values)
        claim = self._claims.get(job_id)
        fence, args = (" AND claim = ?", [claim]) if claim is not None else ("", [])
        changed = self.db.update(f"UPDATE jobs SET {sets} WHERE id = ?{fence}", [*values.values(), job_id, *args])
        if changed == 0 and claim is not None:
            self.lost.add(job_id)
            logger.warning("job %s: taken over by another service; this one stops it", job_id)
            return False
        return True

    def update(self, job_id: str, persist: bool = True, **changes) -> dict:
        """Apply ``changes`` (in memory for a job this service runs; written at once unless ``persist`` is
        False).  A write the database refuses is kept and retried by the next write."""
        with self._lock:
            live = self._live.get(job_id)
            if live is not None:
                live.update(changes)
            if persist:
                pending = self._pending.setdefault(job_id, {})
                if live is not None:  # the progress since the last flush goes with it (a failure's last KL)
                    pending.update(iteration=live["iteration"], kl=live["kl"], kl_history=list(live["kl_history"]))
                pending.update(changes)
                self._save()
            record = self._live.get(job_id)
        return dict(record) if record is not None else self.get(job_id)

    def _save(self) -> None:
        """Write every pending change (under ``_lock``); a failure is logged, the changes stay pending."""
        try:
            for pending in sorted(self._pending):
                self._write(pending, self._pending[pending])
                del self._pending[pending]
        except self._errors + (OSError,) as exc:
            logger.warning("job records not saved (%d pending): %s", len(self._pending), str(exc).splitlines()[0])

    def retry_pending(self) -> None:
        with self._lock:
            if self._pending:
                self._save()

    def progress(self, job_id: str, iteration: int, kl: float) -> None:
        """Record an iteration (in memory; ``flush`` persists)."""
        with self._lock:
            self.iterations_total += 1
            record = self._live[job_id]
            record["iteration"], record["kl"] = iteration, float(kl)
            history = record["kl_history"]
            del history[iteration:]  # a resumed or restarted run overwrites the tail
            history.append(float(kl))

    def flush(self, job_id: str) -> None:
        with self._lock:
            record = self._live.get(job_id)
            if record is not None:
                self._pending.setdefault(job_id, {}).update(
                    iteration=record["iteration"], kl=record["kl"], kl_history=list(record["kl_history"]))
                self._save()

    # -- claims ----------------------------------------------------------------------------------------------
    def claim(self, owner: str) -> dict | None:
        """Take the oldest queued job, or a running one whose lease expired: its record (``claim`` set), or None."""
        skip = " FOR UPDATE SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        with self.db.transaction() as cursor:
            rows = cursor.execute(
                f"SELECT id FROM jobs WHERE state = 'queued' OR (state = 'running' AND (lease_until IS NULL OR "
                f"lease_until < {{now}})) ORDER BY created, id LIMIT 1{skip}")
            if not rows:
                return None
            job_id = rows[0]["id"]
            cursor.execute("UPDATE jobs SET state = 'running', owner = ?, claim = claim + 1, "
                           "lease_until = {now} + ?, started = COALESCE(started, ?) WHERE id = ?",
                           (owner, self.lease, time.time(), job_id))
            row = cursor.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE id = ?", (job_id,))[0]
        record = _record(row)
        with self._lock:
            self._claims[job_id] = record["claim"]
            self._live[job_id] = record
            self._pending.pop(job_id, None)
            self.lost.discard(job_id)
        return dict(record)

    def release(self, job_id: str, end: bool = True) -> None:
        """Forget this service's hold of ``job_id`` (after writing what is pending)."""
        with self._lock:
            if job_id in self._pending:
                self._save()
            if job_id not in self._pending:
                self._claims.pop(job_id, None)
            self._live.pop(job_id, None)

    def heartbeat(self, owner: str, ids) -> tuple[set, set]:
        """Renew the leases of ``ids`` (jobs this service holds): ``(lost, cancel)``, the ids another service took
        and the ids whose cancellation was requested (possibly through another replica)."""
        lost, cancel = set(), set()
        for job_id in ids:
            claim = self._claims.get(job_id)
            if claim is None:
                continue
            rows = self.db.execute("UPDATE jobs SET lease_until = {now} + ? WHERE id = ? AND claim = ? "
                                   "RETURNING cancel_requested", (self.lease, job_id, claim))
            if not rows:
                lost.add(job_id)
            elif rows[0]["cancel_requested"]:
                cancel.add(job_id)
        with self._lock:
            self.lost |= lost
        return lost, cancel

    def void_leases(self) -> None:
        """Expire every lease (SQLite: the service starting owns the database alone)."""
        self.db.update("UPDATE jobs SET lease_until = NULL WHERE lease_until IS NOT NULL")

    def cancel_queued(self, job_id: str) -> bool:
        return self.db.update("UPDATE jobs SET state = 'cancelled', finished = ? WHERE id = ? AND state = 'queued'",
                              (time.time(), job_id)) == 1

    def request_cancel(self, job_id: str) -> bool:
        return self.db.update("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND state = 'running'",
                              (job_id,)) == 1

    def claim_metrics(self, job_id: str, owner: str) -> bool:
        """Take the metrics phase of done job ``job_id`` (not started, or its evaluator's lease expired)."""
        return self.db.update(
            "UPDATE jobs SET metrics_state = 'running', metrics_error = NULL, owner = ?, lease_until = {now} + ? "
            "WHERE id = ? AND state = 'done' AND (metrics_state IS NULL OR (metrics_state = 'running' AND "
            "(lease_until IS NULL OR lease_until < {now})))", (owner, self.lease, job_id)) == 1

    def set_metrics(self, job_id: str, state: str, error: str | None = None) -> None:
        self.db.update("UPDATE jobs SET metrics_state = ?, metrics_error = ? WHERE id = ?", (state, error, job_id))

    def renew(self, job_id: str) -> None:
        """Renew the lease of a done job's metrics phase."""
        self.db.update("UPDATE jobs SET lease_until = {now} + ? WHERE id = ?", (self.lease, job_id))

    def delete(self, job_id: str) -> bool:
        """Delete the record of finished job ``job_id`` and its log; False if it is not finished (or gone)."""
        with self.db.transaction() as cursor:
            cursor.execute("DELETE FROM jobs WHERE id = ? AND state IN ('done', 'failed', 'cancelled')", (job_id,))
            if cursor.rowcount != 1:
                return False
            cursor.execute("DELETE FROM job_log WHERE job_id = ?", (job_id,))
        return True

    def expired(self, hours: float) -> list:
        """Ids of the jobs that finished more than ``hours`` ago."""
        cutoff = time.time() - hours * 3600
        return [row["id"] for row in self.db.execute(
            "SELECT id FROM jobs WHERE state IN ('done', 'failed', 'cancelled') AND finished < ?", (cutoff,))]

    # -- logs ------------------------------------------------------------------------------------------------
    def log(self, job_id: str, line: str) -> None:
        """Append ``line`` to the job's log (never raises: a log is not worth failing a job for)."""
        try:
            self.db.update("INSERT INTO job_log (job_id, t, line) VALUES (?, ?, ?)",
                           (job_id, time.time(), line.replace("\n", " | ")[:2000]))
        except self._errors + (OSError,) as exc:
            logger.debug("job %s: log line not stored (%s)", job_id, exc)

    def log_lines(self, job_id: str) -> list:
        return self.db.execute(f"SELECT t, line FROM job_log WHERE job_id = ? ORDER BY seq LIMIT {LOG_LINES}",
                               (job_id,))

    def close(self):
        self.db.close()


class JobLogHandler(logging.Handler):
    """Records of the ``scalemb`` logger emitted by a thread working on a job (``_current.job``) go to that
    job's log too."""

    def __init__(self, store: JobStore, current: threading.local):
        super().__init__(logging.INFO)
        self.store, self.current = store, current

    def emit(self, record):
        job_id = getattr(self.current, "job", None)
        if job_id is None or getattr(self.current, "writing", False):
            return
        self.current.writing = True
        try:
            self.store.log(job_id, f"{record.levelname.lower()}: {record.getMessage()}")
        finally:
            self.current.writing = False
