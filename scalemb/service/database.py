"""The job database: SQLite (the default, one service) or PostgreSQL (any number of replicas), one schema.

``scalemb serve --database URL``: ``sqlite:///PATH`` (relative paths under the data root; default
``DATA_ROOT/jobs.sqlite3``) or ``postgresql://USER@HOST:PORT/DB`` (``psycopg`` 3: ``pip install
'scalemb[postgres]'``).

SQLite's write-ahead log needs shared memory between the processes that open the file, which network file
systems do not provide (sqlite.org/wal.html, "WAL does not work over a network filesystem"): ``journal_mode=WAL``
is used only when the database file is on a local file system (``/proc/self/mounts``), else the rollback journal
(``DELETE``).  One service owns a SQLite database (the data root's ``flock``); replicas need PostgreSQL, where
jobs are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED`` (``scalemb.service.jobs.JobStore.claim``).

Migrations: ``schema_version`` holds one row, the schema's version; ``migrate`` applies the missing steps of
``MIGRATIONS`` in one transaction under a lock (PostgreSQL: a transaction-level advisory lock; SQLite:
``BEGIN IMMEDIATE``), so replicas starting together migrate once.  A database written by a newer scalemb (a
higher version) is refused.  A file of the first release (a ``jobs`` table, no version table) is version 1.

Statements are written with ``?`` placeholders; ``Database`` turns them into ``%s`` for psycopg.  ``NOW`` is the
database's clock in seconds since the epoch (leases compare against it, so replicas need not agree on time).
"""
import re
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ScalembError

# local file systems SQLite's WAL is safe on (shared memory works between the processes of one host)
LOCAL_FILE_SYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "zfs", "f2fs", "overlay", "reiserfs", "jfs",
                      "bcachefs", "ramfs"}

MIGRATIONS = {
    1: ["""CREATE TABLE IF NOT EXISTS jobs (
        id TEXT PRIMARY KEY, state TEXT NOT NULL, params TEXT NOT NULL, created {real} NOT NULL,
        started {real}, finished {real}, iteration INTEGER, kl {real}, kl_history TEXT NOT NULL DEFAULT '[]',
        error TEXT, resumed_from INTEGER, n_points INTEGER)"""],
    2: ["ALTER TABLE jobs ADD COLUMN owner TEXT",
        "ALTER TABLE jobs ADD COLUMN lease_until {real}",
        "ALTER TABLE jobs ADD COLUMN claim INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN metrics_state TEXT",
        "ALTER TABLE jobs ADD COLUMN metrics_error TEXT",
        "CREATE INDEX IF NOT EXISTS jobs_state_created ON jobs (state, created)",
        "CREATE TABLE IF NOT EXISTS job_log (seq {serial}, job_id TEXT NOT NULL, t {real} NOT NULL, "
        "line TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS job_log_job ON job_log (job_id, seq)"],
}
VERSION = max(MIGRATIONS)
POOL_SIZE = 8  # PostgreSQL connections per service (PostgreSQL's default max_connections is 100)
_MIGRATION_LOCK = 7_361_524_001  # the advisory lock key replicas migrate under (PostgreSQL)


def file_system_type(path: Path) -> str | None:
    """The type (``/proc/self/mounts``) of the file system holding ``path``: the longest mount point above it."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    path = str(Path(path).resolve())
    best, kind = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def wal_is_safe(path: Path) -> bool:
    return file_system_type(path) in LOCAL_FILE_SYSTEMS


class Database:
    """A connection per thread to ``url`` (see the module docstring); statements autocommit unless inside
    ``transaction()``."""

    def __init__(self, url: str | None, data_root: Path):
        self.url = url or "sqlite:///jobs.sqlite3"
        parts = urlsplit(self.url)
        self.dialect = {"sqlite": "sqlite", "postgresql": "postgresql", "postgres": "postgresql"}.get(parts.scheme)
        if self.dialect is None:
            raise ScalembError(f"--database {self._shown()}: use sqlite:///PATH or postgresql://USER@HOST/DB")
        self._lock = threading.RLock()  # SQLite: one connection shared by the threads, used under this lock
        if self.dialect == "sqlite":
            raw = self.url[len("sqlite:///"):] if self.url.startswith("sqlite:///") else ""
            if not raw:
                raise ScalembError(f"--database {self._shown()}: give a file, sqlite:///PATH")
            path = Path(raw)
            self.path = path if path.is_absolute() else Path(data_root) / path
            try:
                self._sqlite = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                               timeout=30)
            except sqlite3.Error as exc:
                raise ScalembError(f"--database {self._shown()}: cannot open {self.path} ({exc})") from None
            self.journal = "wal" if wal_is_safe(self.path.parent) else "delete"
            self._sqlite.execute(f"PRAGMA journal_mode={self.journal.upper()}")
            self.now = "((julianday('now') - 2440587.5) * 86400.0)"
        else:
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise ScalembError("--database postgresql://... needs psycopg: pip install 'scalemb[postgres]'") \
                    from None
            self.path, self.journal = None, None
            self.now = "extract(epoch from clock_timestamp())"
            self._slots, self._idle = threading.BoundedSemaphore(POOL_SIZE), []
            with self._borrow():  # fail at start, in one line, when the server is unreachable
                pass
        self.migrate()

    def _shown(self) -> str:
        """The URL without its password."""
        return re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", self.url)

    # -- connections ---------------------------------------------------------------------------------------
    def _open(self):
        import psycopg

        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"database {self._shown()} unreachable: {str(exc).splitlines()[0]}") from None

    @contextmanager
    def _borrow(self):
        """A PostgreSQL connection from the pool (at most ``POOL_SIZE`` open: the request threads of a replica
        share them), returned after use; a broken one is closed and replaced by the next borrower."""
        self._slots.acquire()
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed or conn.broken:
                conn = self._open()
            try:
                yield conn
            finally:
                if conn.closed or conn.broken or conn.info.transaction_status != 0:  # 0: idle
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - closing a broken connection
                        pass
                else:
                    with self._lock:
                        self._idle.append(conn)
        finally:
            self._slots.release()

    def _sql(self, statement: str) -> str:
        statement = statement.replace("{now}", self.now)
        return statement.replace("?", "%s") if self.dialect == "postgresql" else statement

    @contextmanager
    def transaction(self):
        """``cursor`` of a transaction (committed at the end, rolled back on an exception); SQLite: ``BEGIN
        IMMEDIATE`` (the write lock at once, so two claims never read the same queued job)."""
        if self.dialect == "sqlite":
            with self._lock:
                cursor = self._sqlite.cursor()
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    yield _Cursor(self, cursor)
                except BaseException:
                    cursor.execute("ROLLBACK")
                    raise
                cursor.execute("COMMIT")
            return
        try:
            with self._borrow() as conn, conn.transaction(), conn.cursor() as cursor:
                yield _Cursor(self, cursor)
        except _connection_errors() as exc:
            self._drop_idle()
            raise DatabaseUnavailable(f"database {self._shown()}: {str(exc).splitlines()[0]}") from None

    def execute(self, statement: str, params=()) -> list:
        """Run one statement (autocommit); its rows (a list of dicts) for a query, else ``[]``."""
        return self._retried(lambda cursor: cursor.execute(statement, params))

    def update(self, statement: str, params=()) -> int:
        """Run one statement; the number of rows it changed."""
        def run(cursor):
            cursor.execute(statement, params)
            return cursor.rowcount

        return self._retried(run)

    def _retried(self, run):
        """``run(cursor)`` on a pooled connection, once more on a new one when the first was found broken (a
        pooled connection the server closed meanwhile: a restart, a failover, an idle timeout; the other idle ones
        are dropped then too).  The service's
        single statements are idempotent (they set values; a log line may be written twice)."""
        for attempt in (0, 1):
            try:
                with self._autocommit() as cursor:
                    return run(cursor)
            except DatabaseUnavailable:
                if attempt or self.dialect == "sqlite":
                    raise
                self._drop_idle()  # the server closed one: it has likely closed the others too

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    @contextmanager
    def _autocommit(self):
        if self.dialect == "sqlite":
            with self._lock:
                yield _Cursor(self, self._sqlite.cursor())
            return
        try:
            with self._borrow() as conn, conn.cursor() as cursor:
                yield _Cursor(self, cursor)
        except _connection_errors() as exc:
            raise DatabaseUnavailable(f"database {self._shown()}: {str(exc).splitlines()[0]}") from None

    def close(self) -> None:
        if self.dialect == "sqlite":
            with self._lock:
                self._sqlite.close()
        else:
            self._drop_idle()

    # -- schema ----------------------------------------------------------------------------------------------
    def migrate(self) -> None:
        """Bring the schema to ``VERSION`` (see the module docstring)."""
        types = {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "real": "REAL"} if self.dialect == "sqlite" else \
            {"serial": "BIGSERIAL PRIMARY KEY", "real": "DOUBLE PRECISION"}
        with self.transaction() as cursor:
            if self.dialect == "postgresql":
                cursor.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
            cursor.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            rows = cursor.execute("SELECT version FROM schema_version")
            if rows:
                version = int(rows[0]["version"])
            else:
                version = 1 if self._has_jobs_table(cursor) else 0
                cursor.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            if version > VERSION:
                raise ScalembError(f"--database {self._shown()}: schema version {version} was written by a newer "
                                   f"scalemb (this one knows up to {VERSION}); upgrade scalemb")
            for step in range(version + 1, VERSION + 1):
                for statement in MIGRATIONS[step]:
                    cursor.execute(statement.format(**types))
            if version < VERSION:
                cursor.execute("UPDATE schema_version SET version = ?", (VERSION,))

    def _has_jobs_table(self, cursor) -> bool:
        if self.dialect == "sqlite":
            return bool(cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'jobs'"))
        return bool(cursor.execute("SELECT 1 AS one FROM information_schema.tables WHERE table_name = 'jobs' "
                                   "AND table_schema = current_schema()"))

    def version(self) -> int:
        return int(self.execute("SELECT version FROM schema_version")[0]["version"])


class DatabaseUnavailable(ScalembError):
    """The database server cannot be reached (a lost connection is reopened by the next statement)."""


def _connection_errors():
    import psycopg

    return (psycopg.OperationalError, psycopg.InterfaceError)


class _Cursor:
    """A DB-API cursor speaking ``?`` placeholders and answering rows as dicts."""

    def __init__(self, db: Database, cursor):
        self.db, self.cursor = db, cursor

    def execute(self, statement: str, params=()) -> list:
        self.cursor.execute(self.db._sql(statement), tuple(params))
        if self.cursor.description is None:
            return []
        names = [c[0] for c in self.cursor.description]
        return [dict(zip(names, row)) for row in self.cursor.fetchall()]

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


def database_error_types() -> tuple:
    """The exception types a database statement raises (for the service's error handler)."""
    types = [sqlite3.Error, DatabaseUnavailable]
    try:
        import psycopg

        types.append(psycopg.Error)
    except ImportError:
        pass
    return tuple(types)


def default_url(data_root: Path) -> str:
    return f"sqlite:///{Path(data_root).resolve() / 'jobs.sqlite3'}"


def describe(db: Database) -> str:
    if db.dialect == "sqlite":
        return f"sqlite {db.path} (journal {db.journal})"
    return f"postgresql {db._shown().split('@')[-1]}"


