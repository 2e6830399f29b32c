"""A real PostgreSQL server for the tests and benchmarks: Debian's ``postgresql`` package (``initdb``,
``pg_ctl``), a cluster of its own in a temporary directory, listening on a free loopback port (and a socket
in that directory), stopped at the end.  As root, the cluster runs as the ``postgres`` user the package
creates (PostgreSQL refuses to run as root).  ``PostgresServer.binaries()`` is ``None`` where the package is
not installed (the tests skip, naming it; ``.ci/run`` installs it)."""
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PostgresServer:
    """``initdb`` + ``pg_ctl start`` in ``directory`` (a new temporary one by default); ``url(db)`` names a
    database (``create_database`` makes one)."""

    def __init__(self, directory=None):
        bindir = self.binaries()
        if bindir is None:
            raise RuntimeError(self.MISSING)
        self.bindir = Path(bindir)
        self._own_dir = directory is None
        self.dir = Path(directory or tempfile.mkdtemp(prefix="scalemb-pg-"))
        self.dir.mkdir(parents=True, exist_ok=True)  # (its parents must be searchable by the postgres user)
        self.data = self.dir / "data"
        self.user = "postgres" if os.geteuid() == 0 else None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        if self.user:
            os.chmod(self.dir, 0o755)
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "scalemb", "-A", "trust", "-E", "UTF8", "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c max_connections=200", "start")
        self._databases = 0

    MISSING = ("PostgreSQL server binaries (initdb, pg_ctl) are not installed: apt-get install -y postgresql "
               "(.ci/run installs it)")

    @staticmethod
    def binaries():
        """The directory holding Debian's ``initdb`` and ``pg_ctl``, or None."""
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if found:
            return str(Path(found[-1]).parent)
        initdb = shutil.which("initdb")
        return str(Path(initdb).resolve().parent) if initdb else None

    def _run(self, tool, *args):
        command = [str(self.bindir / tool), *args]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def url(self, database="postgres") -> str:
        return f"postgresql://scalemb@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database="postgres") -> list:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def create_database(self) -> str:
        """A new empty database: its URL."""
        self._databases += 1
        name = f"t{os.getpid()}_{self._databases}_{time.monotonic_ns() % 10**6}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def kill_connections(self, database_url: str) -> int:
        """Terminate every server process serving ``database_url``'s database (what a failover or a network cut
        does to the clients): how many."""
        name = database_url.rsplit("/", 1)[1]
        rows = self.sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
                        "AND pid <> pg_backend_pid()")
        return len(rows)

    def stop(self):
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
