"""The FastAPI application: jobs, uploads, results and plots, behind a bearer token, confined to a data root.

Routes (JSON bodies typed by ``scalemb.service.schemas``; errors are ``{"detail": "..."}``): ``POST /jobs``,
``GET /jobs?state=&limit=&offset=`` (oldest first), ``GET /jobs/{id}`` (with the quality metrics once done),
``DELETE /jobs/{id}`` (cancels a queued or running job; deletes a finished one with its files),
``GET /jobs/{id}/log``, ``GET /jobs/{id}/embedding?format=csv|parquet|npy|h5ad|zarr`` (``scalemb.io.export``, the
writer of ``scalemb export``), ``GET /jobs/{id}/plot.png``, ``GET /jobs/{id}/report`` and ``GET /jobs/{id}/map``
(HTML pages), ``POST /jobs/{id}/transform`` (place new nodes into a done job's map: a new job),
``PUT /uploads/{name}`` (a raw body or a one-file multipart form).  Without a token: ``GET /health``,
``/openapi.json``, and the Swagger UI (``/docs``) and ReDoc (``/redoc``) pages, whose scripts the service serves
itself (``/docs/static``, from the ``fastapi-offline`` package): they work without Internet access.

A job reads a snapshot of its input taken when it is submitted (``scalemb.service.snapshots``): an upload may be
replaced at any time without changing what a queued, running or done job reads.  Every JSON body goes through
``scalemb.service.jsonsafe`` (non-finite floats as ``null``).  A full disk answers 507 and leaves nothing
half-written.
"""
import hashlib
import hmac
import os
import re
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from .._version import __version__
from ..run.inputs import input_kind, is_dataset
from ..io.export import FORMATS, MEDIA_TYPES, SUFFIXES
from . import schemas
from .database import Database, DatabaseUnavailable, database_error_types, describe
from .jobs import ENDED, LEASE_SECONDS, InUse, JobRunner, JobStore, QueueFull, disk_full
from ..io.storage import is_url
from .jsonsafe import JSONResponse
from .snapshots import snapshot

PUBLIC_PATHS = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
DOCS_STATIC = "/docs/static/"
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"  # the only Internet URL ReDoc's bundle loads by itself
UPLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# the service's own entries in the data root, never a job's input (with every name starting with '.': the
# service's temporary files and lock); "jobs.sqlite3" covers its -wal, -shm and -journal files too
SERVICE_ENTRIES = ("jobs", "stores", "snapshots", "jobs.sqlite3")
DISK_FULL = "insufficient storage: the data root's file system is full"


@dataclass
class ServiceConfig:
    """Settings of ``scalemb serve`` (see the CLI help)."""

    data_root: Path
    token: str | None  # None: no authentication (--insecure-no-auth)
    scheduler: str | None = None
    max_queue: int = 64
    max_running: int = 2
    checkpoint_every: int = 100
    max_request_bytes: int = 64 * 1024
    max_upload_bytes: int = 256 * 1024 * 1024
    n_threads: int | None = None
    store_ttl_hours: float = 24.0  # DATA_ROOT/stores cleaning rule (scalemb.service.stores)
    database: str | None = None  # scalemb.service.database URL; None: sqlite DATA_ROOT/jobs.sqlite3
    retention_hours: float | None = None  # finished jobs purged this long after they end; None: kept
    lease_seconds: float = LEASE_SECONDS  # a job whose service stopped renewing its lease this long is taken over
    storage: str | None = None  # object-storage URL prefix: s3:// inputs under it, results published there

    def __post_init__(self):
        if not 0 <= self.store_ttl_hours < float("inf"):  # NaN or < 0 would delete every unused store
            raise ValueError(f"store_ttl_hours must be a finite number >= 0, got {self.store_ttl_hours!r}")
        if self.retention_hours is not None and not 0 < self.retention_hours < float("inf"):
            raise ValueError(f"retention_hours must be a finite number > 0, got {self.retention_hours!r}")
        if not 1 <= self.lease_seconds <= 3600:
            raise ValueError(f"lease_seconds must be in [1, 3600], got {self.lease_seconds!r}")


class _JobBase(BaseModel):
    """The service-only fields of a job and its checks; the embedding settings are added from the parameter table
    by ``_job_request`` (one row of ``scalemb.params.PARAMS`` per field: name, default, help, choices, bounds)."""

    model_config = ConfigDict(extra="forbid")
    input: str = Field(description="built-in dataset (grqc, school), or a path relative to the data root: an "
                                   "edge list, a feature matrix (.npy, .csv, .tsv: kNN affinities), an affinity "
                                   "store, or an upload (uploads/NAME); or an object URL (s3://...) under the "
                                   "service's --storage")

    @field_validator("*", mode="before")
    @classmethod
    def _table_row(cls, value, info):
        """A setting's one check (``scalemb.params.Param.check``): the message every front gives, after the
        field's name."""
        from ..params import PARAMS

        row = next((p for p in PARAMS if p.service == info.field_name), None)
        if row is None:
            return value
        try:
            return row.check(value, row.service)
        except ValueError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None

    def constructor_params(self) -> dict:
        """The model's constructor parameters (checked by its ``make_model`` when the job is submitted)."""
        return dict(self.model_params or {})

    def spec(self):
        """The job's ``scalemb.run.RunSpec`` (the table's fields of the request)."""
        from ..run import RunSpec

        return RunSpec.from_front(self.model_dump(), "service")

    @model_validator(mode="after")
    def _runner_accepts(self):
        """The runner's own checks (dimensions per model, fft support) at submission, not when the job runs."""
        from ..run import Runner

        Runner(self.spec())._check()
        return self


def _job_request():
    """``JobRequest``: ``_JobBase`` plus one field per ``PARAMS`` row with a service name: its type (choices ->
    ``Literal``), default (``Param.outer_default``), description (the help) and bounds."""
    from ..params import PARAMS

    fields = {}
    for p in PARAMS:
        if p.service is None:
            continue
        if isinstance(p.choices, tuple):
            annotation = Literal[p.choices]
        else:
            annotation = p.type if p.type is not None else type(p.default)
        if p.words:
            annotation = annotation | Literal[p.words]
        fields[p.service] = (annotation, Field(p.outer_default, description=p.help, **p.bounds))
    request = create_model("JobRequest", __base__=_JobBase, **fields)
    request.__doc__ = "An embedding job; the settings are ``scalemb.params.PARAMS`` rows (the CLI's names)."
    return request


JobRequest = _job_request()


MAX_PATH_CHARS = 1024


def _one_line(exc: RequestValidationError) -> str:
    """The first validation error as one line naming the field, never echoing the submitted value."""
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    message = str(first.get("msg", "invalid")).replace("Value error, ", "").splitlines()[0][:300]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {message}{more}"


class BodyLimit:
    """ASGI middleware: a request body (Content-Length or chunked) over ``limit`` bytes is refused with 413
    before the application reads it; uploads (``/uploads/``) are limited by their own handler while streaming."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith("/uploads/"):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, receive, send)
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                response = _error(413, f"request body exceeds the limit of {self.limit} bytes")
                return await response(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class TransformRequest(BaseModel):
    """New nodes or points to place into a done job's map (``scalemb transform``)."""

    model_config = ConfigDict(extra="forbid")
    new: str = Field(description="path relative to the data root (e.g. uploads/NAME): the new nodes' edge list "
                                 "'NEW_ID OTHER_ID [weight]' (graph jobs) or feature rows (kNN jobs)")
    iterations: int | None = Field(None, ge=1, le=100_000, description="placement iterations at most (default: "
                                                                        "scalemb transform's)")
    free_hops: int | None = Field(None, ge=0, le=100, description="stored points within this many edges of a new "
                                  "node move too, in a second phase (0: the stored map stays fixed; default: "
                                  "scalemb transform's, 1 hop for new graph nodes unless that frees most of the map)")
    free_iterations: int | None = Field(None, ge=1, le=100_000, description="iterations of that phase at most "
                                                                             "(default: scalemb transform's)")


def _error(status: int, detail: str, headers=None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


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


def _affinity_kind(job, input_path: str) -> str:
    """The job's affinity once its input is known ('auto' resolved: ``scalemb.service.features``); a feature file
    is read and checked here, so bad input is refused (422, naming the field or the file and line) before
    anything is queued or written."""
    from ..run.inputs import check_knn_settings
    from .features import check_features

    path = input_path if not Path(input_path).is_absolute() else Path(input_path)  # a dataset stays a name
    try:
        kind = input_kind(path, job.affinity, "service", shown=job.input)
        check_knn_settings(kind, job.spec(), "service", shown=job.input)
        if kind == "knn":
            check_features(path, job.input)
    except ValueError as exc:
        raise HTTPException(422, str(exc).splitlines()[0][:500]) from None
    return kind


def _input_snapshot(root: Path, relative: str) -> dict:
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


STORAGE_STATUS = {"missing": 404, "denied": 403, "credentials": 502, "unreachable": 502}


def _remote_snapshot(root: Path, url: str, storage: str | None) -> dict:
    """``_input_snapshot`` of an object-storage input: ``url`` must lie under the service's ``--storage`` prefix
    (as a path must lie under the data root; 400 without one, 403 outside it); its objects are downloaded into a
    temporary directory of ``DATA_ROOT/snapshots`` and snapshot from there.  An unusable URL, a missing object
    or bucket, refused or missing credentials: one line naming the URL (400, 404, 403, 502)."""
    import shutil

    from ..errors import ScalembError
    from ..io.storage import download, within

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


def _public(record: dict, history: bool = True) -> dict:
    """A job record as ``schemas.JobSummary`` (``history``: ``schemas.Job``, without its metrics)."""
    hidden = ("input_path", "store_path", "snapshot", "cancel_requested", "spec")
    params = {k: v for k, v in record["params"].items() if k not in hidden}
    started, finished = record["started"], record["finished"]
    end = finished if finished is not None else time.time()
    out = {"id": record["id"], "kind": record["params"].get("kind", "embed"), "state": record["state"],
           "params": params, "iteration": record["iteration"], "kl": record["kl"], "error": record["error"],
           "resumed_from": record["resumed_from"], "n_points": record["n_points"],
           "metrics_state": record.get("metrics_state"), "metrics_error": record.get("metrics_error"),
           "timing": {"created": schemas.iso(record["created"]), "started": schemas.iso(started),
                      "finished": schemas.iso(finished),
                      "elapsed_s": None if started is None else round(end - started, 3)}}
    if history:
        out["kl_history"] = record["kl_history"]
    return out


def _sniff(name: str, head: bytes) -> str | None:
    """Why the first bytes of upload ``name`` do not match its name (a ``.gz`` that is not gzip, a ``.npy``
    without NumPy's magic, ...), or None."""
    magic = {".gz": (b"\x1f\x8b", "gzip"), ".npy": (b"\x93NUMPY", "a NumPy .npy file"),
             ".parquet": (b"PAR1", "a Parquet file"), ".zip": (b"PK", "a zip file")}
    for suffix, (start, what) in magic.items():
        if name.endswith(suffix) and not head.startswith(start):
            return f"uploads/{name}: the body is not {what} (its name ends in {suffix})"
    if head.startswith(b"--") and b"content-disposition: form-data" in head[:2048].lower():
        return (f"uploads/{name}: the body is a multipart form sent without Content-Type multipart/form-data; "
                "send it with curl -F 'file=@PATH' (or the raw file with --data-binary @PATH)")
    return None


class _Multipart:
    """A streaming ``multipart/form-data`` reader (python-multipart) passing the bytes of the one file part (a
    part with a filename, or named 'file') to ``write``; ``error`` says why the form is refused."""

    def __init__(self, content_type: str, write):
        from python_multipart.multipart import MultipartParser, parse_options_header

        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        self.error = None if boundary else "multipart upload without a boundary in its Content-Type"
        self.write, self.files, self._in_file = write, 0, False
        self._field, self._value, self._headers = b"", b"", {}
        self._options = parse_options_header
        callbacks = {"on_part_begin": self._begin, "on_header_field": self._header_field,
                     "on_header_value": self._header_value, "on_header_end": self._header_end,
                     "on_headers_finished": self._headers_finished, "on_part_data": self._data}
        self.parser = MultipartParser(boundary, callbacks) if boundary else None

    def _begin(self):
        self._headers, self._in_file = {}, False

    def _header_field(self, data, start, end):
        self._field += data[start:end]

    def _header_value(self, data, start, end):
        self._value += data[start:end]

    def _header_end(self):
        self._headers[self._field.lower()] = self._value
        self._field, self._value = b"", b""

    def _headers_finished(self):
        _, options = self._options(self._headers.get(b"content-disposition", b""))
        if b"filename" in options or options.get(b"name") == b"file":
            self.files += 1
            self._in_file = self.files == 1

    def _data(self, data, start, end):
        if self._in_file:
            self.write(data[start:end])

    def feed(self, chunk: bytes) -> None:
        if self.parser is not None:
            self.parser.write(chunk)

    def finish(self) -> None:
        if self.parser is None:
            return
        from python_multipart.multipart import MultipartState

        try:
            self.parser.finalize()
        except Exception as exc:  # noqa: BLE001 - a malformed form, whatever the parser says
            self.error = f"malformed multipart upload ({type(exc).__name__})"
        if self.error is None and self.parser.state != MultipartState.END:  # the parser does not check this
            self.error = "the multipart upload ends before its closing boundary (cut off?)"
            return
        if self.error is None and self.files != 1:
            self.error = (f"a multipart upload holds one file part (a part with a filename, or named 'file'); "
                          f"got {self.files}")


PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")


def prometheus_text(store: JobStore, runner) -> str:
    """The service's metrics in Prometheus' text format 0.0.4 (``# HELP``/``# TYPE`` then samples)."""
    counts = store.counts()
    lines = ["# HELP scalemb_jobs Jobs in the database by state (all replicas).", "# TYPE scalemb_jobs gauge"]
    lines += [f'scalemb_jobs{{state="{name}"}} {counts.get(name, 0)}' for name in JOB_STATES]
    lines += ["# HELP scalemb_queue_length Jobs waiting to run (all replicas).", "# TYPE scalemb_queue_length gauge",
              f"scalemb_queue_length {counts.get('queued', 0)}",
              "# HELP scalemb_jobs_running_here Jobs this replica is running.",
              "# TYPE scalemb_jobs_running_here gauge", f"scalemb_jobs_running_here {runner.running_here()}",
              "# HELP scalemb_iterations_total Optimiser iterations run by this replica's jobs.",
              "# TYPE scalemb_iterations_total counter", f"scalemb_iterations_total {store.iterations_total}",
              "# HELP scalemb_info The service's version.", "# TYPE scalemb_info gauge",
              f'scalemb_info{{version="{__version__}"}} 1']
    return "\n".join(lines) + "\n"


def create_app(config: ServiceConfig) -> FastAPI:
    """The service's ASGI application; the job database is opened (and migrated) here, jobs start running when
    the application starts."""
    root = Path(config.data_root).resolve()
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    (root / "uploads").mkdir(exist_ok=True)
    for partial in (root / "uploads").glob(".*.part"):  # uploads cut off by a killed service
        try:
            if config.database is None or partial.stat().st_mtime < time.time() - 3600:  # replicas: not theirs
                partial.unlink(missing_ok=True)
        except OSError:
            pass
    database = Database(config.database, root)
    state = {"database": database}

    @asynccontextmanager
    async def lifespan(app):
        store = JobStore(database, config.lease_seconds)
        state["store"] = store
        state["runner"] = JobRunner(store, root, config.max_running, config.max_queue, config.scheduler,
                                    config.checkpoint_every, config.n_threads, config.store_ttl_hours,
                                    config.retention_hours, config.storage)
        yield
        state["runner"].stop()
        store.close()

    app = FastAPI(title="scalemb", version=__version__, lifespan=lifespan, default_response_class=JSONResponse,
                  description="SNE-family embedding jobs (SNE, t-SNE, space-time SNE). Every route but /health "
                              "and the documentation needs `Authorization: Bearer <token>` (the Authorize button).",
                  docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, limit=config.max_request_bytes)
    bearer = HTTPBearer(auto_error=False, description="the service's token ($SCALEMB_TOKEN or --token-file)")
    api = APIRouter(dependencies=[Security(bearer)], responses=schemas.error_responses(401, 422))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return _error(422, _one_line(exc))

    @app.exception_handler(OSError)
    @app.exception_handler(DatabaseUnavailable)
    async def storage(request: Request, exc: Exception):
        """A full disk anywhere in a request: 507 (the handlers leave nothing half-written); an unreachable
        database: 503; else a 500."""
        if disk_full(exc):
            return _error(507, f"{DISK_FULL}; nothing was stored, retry once space is freed")
        if isinstance(exc, DatabaseUnavailable):
            return _error(503, f"{exc.args[0]}; retry shortly", {"Retry-After": "2"})
        raise exc

    from ..errors import ScalembError

    @app.exception_handler(ScalembError)
    async def object_storage(request: Request, exc: ScalembError):
        """The object store failed while a result was read (``scalemb.io.storage``): one line naming the URL,
        404/403/502 as for inputs (``STORAGE_STATUS``); any other ``ScalembError`` stays what it was."""
        kind = getattr(exc, "kind", None)
        if kind is None:
            raise exc
        return _error(STORAGE_STATUS.get(kind, 502), str(exc).splitlines()[0])

    for error_type in database_error_types():
        if error_type is not DatabaseUnavailable:
            app.add_exception_handler(error_type, storage)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        path = request.url.path
        if config.token is not None and path not in PUBLIC_PATHS and not path.startswith(DOCS_STATIC):
            header = request.headers.get("authorization", "")
            scheme, _, supplied = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(supplied.strip().encode(), config.token.encode()):
                return _error(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                              {"WWW-Authenticate": "Bearer"})
        limit = config.max_upload_bytes if path.startswith("/uploads/") else config.max_request_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return _error(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
        return await call_next(request)

    _add_docs(app)

    def _job(job_id: str) -> dict:
        record = state["store"].get(job_id)
        if record is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return record

    def _done(job_id: str) -> dict:
        record = _job(job_id)
        if record["state"] != "done":
            raise HTTPException(409, f"job {job_id} is {record['state']}; results exist once it is done")
        return record

    def _queue(params: dict) -> dict:
        try:
            record = state["runner"].submit(params)
        except QueueFull as exc:
            raise HTTPException(429, f"queue full: {exc.args[0]} jobs are waiting (limit {config.max_queue}); "
                                     "retry later", {"Retry-After": "5"}) from None
        return {"id": record["id"], "state": record["state"]}

    @app.get("/health", response_model=schemas.Health)
    def health():
        return {"status": "ok", "version": __version__}

    @api.get("/metrics", response_class=Response,
             responses={200: {"content": {PROMETHEUS: {"schema": {"type": "string"}}}}})
    def metrics():
        """Prometheus text exposition: jobs by state and the queue length over the whole database (every
        replica), this replica's running jobs, and a counter of the optimiser iterations its jobs ran (the
        iteration rate is ``rate(scalemb_iterations_total[1m])``)."""
        return Response(prometheus_text(state["store"], state["runner"]), media_type=PROMETHEUS)

    @api.post("/jobs", status_code=201, response_model=schemas.JobCreated,
              responses=schemas.error_responses(400, 403, 404, 413, 429, 507))
    def submit(job: JobRequest):
        """Queue an embedding job; 429 when the queue is full."""
        params = job.model_dump()
        with state["runner"].submit_lock.shared():
            if is_dataset(job.input, root):
                params.update(input_path=job.input, input_sha256=None)  # package data: immutable
            elif is_url(job.input):
                params.update(_remote_snapshot(root, job.input, config.storage))
            else:
                params.update(_input_snapshot(root, job.input))
            params["affinity"] = _affinity_kind(job, params["input_path"])
            params["spec"] = job.spec().replace(affinity=params["affinity"]).to_json()  # what the job runs
            return _queue(params)

    @api.post("/jobs/{job_id}/transform", status_code=201, response_model=schemas.JobCreated,
              responses=schemas.error_responses(400, 403, 404, 409, 429, 507))
    def transform(job_id: str, request: TransformRequest):
        """Place new nodes into done job ``job_id``'s map (``scalemb transform``: the stored points next to new
        graph nodes may move): a new job whose result is the whole map (old rows first); 409 unless that job is
        done, 429 when the queue is full."""
        source = _done(job_id)
        with state["runner"].submit_lock.shared():
            params = {"kind": "transform", "source_job": job_id, "input": request.new,
                      **_input_snapshot(root, request.new), "iterations": request.iterations,
                      "free_hops": request.free_hops, "free_iterations": request.free_iterations,
                      "model": source["params"].get("model")}
            return _queue(params)

    @api.get("/jobs", response_model=schemas.JobList)
    def list_jobs(state_: schemas.State | None = Query(None, alias="state", description="only jobs in this state"),
                  limit: int = Query(100, ge=1, le=1000, description="at most this many jobs"),
                  offset: int = Query(0, ge=0, description="skip this many (oldest first)")):
        """The jobs, oldest first (without their KL histories), ``limit`` of them from ``offset``; ``total``
        counts every job matching ``state``."""
        records, total = state["store"].list(state_, limit, offset)
        return {"jobs": [_public(r, history=False) for r in records], "total": total, "limit": limit,
                "offset": offset}

    @api.get("/jobs/{job_id}", response_model=schemas.Job, responses=schemas.error_responses(404))
    def status(job_id: str):
        """The job; once done also ``metrics`` (``scalemb.metrics.to_json`` of the run; ``null`` while they are
        computed, in the background once the job is done, or when that phase failed: ``metrics_error``)."""
        record = _job(job_id)
        out = _public(record)
        if record["state"] == "done":
            out["metrics"] = state["runner"].metrics(record)
        return out

    @api.delete("/jobs/{job_id}", response_model=schemas.Cancelled | schemas.Deleted,
                responses=schemas.error_responses(404, 409))
    def delete(job_id: str):
        """A queued job is cancelled at once, a running one at its next iteration (``cancelling``); a finished
        job (done, failed, cancelled) is deleted with its files and its input's snapshot, unless another job reads
        them (the snapshot stays while another job's record names it; 409 while a transform job reads its
        result)."""
        record = _job(job_id)
        if record["state"] in ENDED:
            try:
                if state["runner"].purge(job_id):
                    return {"id": job_id, "deleted": True}
            except InUse as exc:
                raise HTTPException(409, f"job {job_id} is read by job {exc.args[0]} (a transform of its map); "
                                         "delete it once that job has ended") from None
            record = _job(job_id)
            raise HTTPException(409, f"job {job_id} is {record['state']}")
        record = state["runner"].cancel(job_id)
        return {"id": job_id, "state": "cancelled" if record["state"] == "cancelled" else "cancelling"}

    @api.get("/jobs/{job_id}/log", response_model=schemas.JobLog, responses=schemas.error_responses(404))
    def job_log(job_id: str):
        """What happened to the job, one line per event: queued, claimed (by which service), resumed, warnings
        of its run, its end (with the reason of a failure), its metrics phase."""
        _job(job_id)
        return {"id": job_id, "lines": [{"time": schemas.iso(row["t"]), "line": row["line"]}
                                        for row in state["store"].log_lines(job_id)]}

    @api.get("/jobs/{job_id}/embedding", response_class=Response, responses={
        200: {"description": "the embedding file", "content": {t: {} for t in sorted(set(MEDIA_TYPES.values()))}},
        **schemas.error_responses(404, 409, 507)})
    def embedding(job_id: str, format: Literal[FORMATS] = Query("csv", description="csv and parquet: columns "
                  "node_id, s1.., t1..; npy: the float64 matrix; h5ad: AnnData (obsm X_scalemb); zarr: the result "
                  "group in a zip store")):
        """The embedding (N x (space + time)) as ``scalemb export`` writes it (``scalemb.io.export``)."""
        _done(job_id)
        from ..io.export import write_embedding

        run_dir = state["runner"].run_dir(job_id)
        cached = run_dir / f"embedding{SUFFIXES[format]}"
        if not cached.exists():
            tmp = run_dir / f".embedding.{os.getpid()}.{time.monotonic_ns()}{SUFFIXES[format]}"
            try:
                write_embedding(state["runner"].result_path(job_id), format, tmp)
                os.replace(tmp, cached)
            finally:
                tmp.unlink(missing_ok=True)
        return FileResponse(cached, media_type=MEDIA_TYPES[format], filename=f"{job_id}{SUFFIXES[format]}")

    @api.get("/jobs/{job_id}/plot.png", response_class=Response,
             responses={200: {"content": {"image/png": {}}}, **schemas.error_responses(404, 409)})
    def plot(job_id: str):
        """The result's figure (layout and KL history), PNG."""
        _done(job_id)
        cached = state["runner"].run_dir(job_id) / "plot.png"
        if not cached.exists():
            from ..plot import plot_png

            tmp = cached.with_name(f".plot.{os.getpid()}.{time.monotonic_ns()}.png")
            try:
                tmp.write_bytes(plot_png(state["runner"].result_path(job_id)))
                os.replace(tmp, cached)
            finally:
                tmp.unlink(missing_ok=True)
        return Response(cached.read_bytes(), media_type="image/png")

    def _page(job_id: str, name: str, build) -> HTMLResponse:
        """A cached HTML page of a done job (built once, written atomically)."""
        from ..errors import ScalembError
        from ..report.page import write_text_atomic

        _done(job_id)
        cached = state["runner"].run_dir(job_id) / name
        if not cached.exists():
            try:
                write_text_atomic(cached, build(state["runner"].result_path(job_id)))
            except ScalembError as exc:
                raise HTTPException(422, str(exc).splitlines()[0]) from None
        return HTMLResponse(cached.read_text(encoding="utf-8"))

    @api.get("/jobs/{job_id}/report", response_class=HTMLResponse,
             responses=schemas.error_responses(401, 404, 409, 422, html=True))
    def report(job_id: str):
        """The run report of ``scalemb report`` (self-contained HTML: metrics, maps, KL curve)."""
        from ..report import build_report

        return _page(job_id, "report.html", lambda run: build_report(run, map_href=f"/jobs/{job_id}/map")[0])

    @api.get("/jobs/{job_id}/map", response_class=HTMLResponse,
             responses=schemas.error_responses(401, 404, 409, 422, html=True))
    def map_page(job_id: str):
        """The interactive map page (self-contained HTML canvas: pan, zoom, hover, find a node)."""
        from ..report.mappage import build_map_page

        return _page(job_id, "map.html", build_map_page)

    @api.put("/uploads/{name}", status_code=201, response_model=schemas.Upload,
             responses=schemas.error_responses(400, 413, 507), openapi_extra={"requestBody": {
                 "required": True, "content": {
                     "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                     "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
                         "file": {"type": "string", "format": "binary"}}}}}}})
    async def upload(name: str, request: Request):
        """Store the request body as ``uploads/NAME`` (an edge list, optionally gzipped, or a feature matrix):
        the raw body (``curl --data-binary @FILE``) or the one file of a multipart form (``curl -F file=@FILE``).
        Refused: an empty file, a form without exactly one file part, a body that does not match its name (a
        ``.gz`` that is not gzip, a ``.npy`` without NumPy's header, a form sent as a raw body).  Use ``"input":
        "uploads/NAME"`` in ``POST /jobs``.  Replacing an upload never changes a job submitted before: jobs read
        snapshots.  507 when the disk is full (the previous upload of NAME, if any, stays)."""
        if not UPLOAD_NAME.fullmatch(name):
            raise HTTPException(400, f"upload name {name[:80]!r}: use letters, digits, '.', '_' and '-' only")
        target = root / "uploads" / name
        tmp = target.with_name(f".{name}.{time.monotonic_ns()}.part")
        size, full, head, digest = 0, None, bytearray(), hashlib.sha256()
        try:
            with open(tmp, "wb") as handle:
                def write(chunk):
                    nonlocal size, full
                    size += len(chunk)
                    if size > config.max_upload_bytes:
                        raise HTTPException(413, f"upload exceeds the limit of {config.max_upload_bytes} bytes")
                    if len(head) < 4096:
                        head.extend(chunk[:4096 - len(head)])
                    digest.update(chunk)
                    if full is None:
                        try:
                            handle.write(chunk)
                        except OSError as exc:  # read the rest, so the client gets the answer, not a reset
                            if not disk_full(exc):
                                raise
                            full = exc

                content_type = request.headers.get("content-type", "")
                form = _Multipart(content_type, write) if content_type.lower().startswith("multipart/") else None
                async for chunk in request.stream():
                    if form is None:
                        write(chunk)
                    elif form.error is None:
                        form.feed(chunk)
                if form is not None:
                    form.finish()
                    if form.error is not None:
                        raise HTTPException(400, f"uploads/{name}: {form.error}")
                if full is None:
                    handle.flush()
                    os.fsync(handle.fileno())
            if full is not None:
                raise full
            if size == 0:
                raise HTTPException(400, f"uploads/{name}: the body is empty; nothing was stored")
            mismatch = _sniff(name, bytes(head))
            if mismatch is not None:
                raise HTTPException(400, f"{mismatch}; nothing was stored")
            os.replace(tmp, target)
        except OSError as exc:
            if disk_full(exc):
                raise HTTPException(507, f"{DISK_FULL}: uploads/{name} was not stored; retry once space is "
                                         "freed") from None
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return {"input": f"uploads/{name}", "bytes": size, "sha256": digest.hexdigest()}

    app.include_router(api)
    app.state.database = database
    return app


def _add_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with their scripts and styles served from ``/docs/static``
    (the files of the ``fastapi-offline`` package, MIT): no CDN, so they work offline."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.staticfiles import StaticFiles

    try:
        import fastapi_offline
    except ImportError:  # the page says what is missing rather than loading scripts from the Internet
        @app.get("/docs", include_in_schema=False)
        def no_docs():
            return _error(501, "the documentation pages need fastapi-offline: pip install 'scalemb[service]' "
                               "(the schema is at /openapi.json)")
        return
    static = Path(fastapi_offline.__file__).parent / "static"
    redoc_js = []  # the bundle, read once

    @app.get(f"{DOCS_STATIC}redoc.standalone.js", include_in_schema=False)
    def redoc_bundle():
        """ReDoc's bundle with the one image it fetches from the Internet (the Redocly logo in its sidebar,
        ``REDOC_LOGO``) pointed at the service's own favicon, so the page makes no request outside it."""
        from fastapi.responses import Response

        if not redoc_js:
            redoc_js.append((static / "redoc.standalone.js").read_text(encoding="utf-8")
                            .replace(REDOC_LOGO, f"{DOCS_STATIC}favicon.png"))
        return Response(redoc_js[0], media_type="text/javascript")

    app.mount(DOCS_STATIC.rstrip("/"), StaticFiles(directory=static), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    def swagger():
        return get_swagger_ui_html(openapi_url="/openapi.json", title="scalemb - Swagger UI",
                                   oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_js_url=f"{DOCS_STATIC}swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_STATIC}swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_STATIC}favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_redirect():
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title="scalemb - ReDoc",
                              redoc_js_url=f"{DOCS_STATIC}redoc.standalone.js",
                              redoc_favicon_url=f"{DOCS_STATIC}favicon.png", with_google_fonts=False)


def lock_data_root(root: Path):
    """An exclusive, non-blocking ``flock`` on ``DATA_ROOT/.scalemb-serve.lock`` held for the process's life
    (the returned file object); ``ScalembError`` if another ``scalemb serve`` holds it.  Two services on one
    data root would requeue and resume each other's jobs."""
    import fcntl

    from ..errors import ScalembError

    handle = open(Path(root) / ".scalemb-serve.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise ScalembError("the data root is in use by another scalemb serve (lock .scalemb-serve.lock held); "
                           "stop it first") from None
    return handle


def bind_socket(host: str, port: int):
    """A listening TCP socket on ``host:port``, bound before any job runs; ``ScalembError`` if it is busy."""
    import socket

    from ..errors import ScalembError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ScalembError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ScalembError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(config: ServiceConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the service with uvicorn until SIGINT/SIGTERM; running jobs checkpoint and resume on restart.
    Order: lock the data root, bind the port, then start the application (and its job runner)."""
    import uvicorn

    # SQLite: one service per data root; PostgreSQL: replicas share it, jobs claimed through the database
    lock = lock_data_root(config.data_root) if not _shared_database(config.database) else None
    sock = bind_socket(host, port)
    try:
        app = create_app(config)
        print(f"scalemb serve: http://{host}:{port} data root {Path(config.data_root).resolve()}, jobs in "
              f"{describe(app.state.database)}", file=sys.stderr, flush=True)
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                      access_log=False)).run(sockets=[sock])
    finally:
        sock.close()
        if lock is not None:
            lock.close()


def _shared_database(url: str | None) -> bool:
    return bool(url) and url.split(":", 1)[0] in ("postgresql", "postgres")
