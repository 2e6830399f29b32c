"""The FastAPI application: jobs, uploads, results and plots, behind a bearer token, confined to a data root.

Routes (JSON; errors are ``{"detail": "..."}``): ``POST /jobs``, ``GET /jobs``, ``GET /jobs/{id}`` (with the
quality metrics once done), ``DELETE /jobs/{id}``, ``GET /jobs/{id}/embedding?format=csv|npy``,
``GET /jobs/{id}/plot.png``, ``GET /jobs/{id}/report`` and ``GET /jobs/{id}/map`` (HTML pages),
``POST /jobs/{id}/transform`` (place new nodes into a done job's map: a new job),
``PUT /uploads/{name}`` (raw body), ``GET /health`` and ``GET /openapi.json`` (both without a token).

A job reads a snapshot of its input taken when it is submitted (``scalemb.service.snapshots``): an upload may be
replaced at any time without changing what a queued, running or done job reads.  Every JSON body goes through
``scalemb.service.jsonsafe`` (non-finite floats as ``null``).  A full disk answers 507 and leaves nothing
half-written.
"""
import csv
import hmac
import io
import os
import re
import sqlite3
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from .._version import __version__
from ..datasets import DATASETS
from .jobs import JobRunner, JobStore, QueueFull, disk_full
from .jsonsafe import JSONResponse
from .snapshots import snapshot

PUBLIC_PATHS = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
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

    def __post_init__(self):
        if not 0 <= self.store_ttl_hours < float("inf"):  # NaN or < 0 would delete every unused store
            raise ValueError(f"store_ttl_hours must be a finite number >= 0, got {self.store_ttl_hours!r}")


class _JobBase(BaseModel):
    """The service-only fields of a job and its checks; the embedding settings are added from the parameter table
    by ``_job_request`` (one row of ``scalemb.params.PARAMS`` per field: name, default, help, choices, bounds)."""

    model_config = ConfigDict(extra="forbid")
    input: str = Field(description="built-in dataset (grqc, school), or a path relative to the data root: an "
                                   "edge list, a feature matrix (.npy, .csv, .tsv: kNN affinities), an affinity "
                                   "store, or an upload (uploads/NAME)")

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
    iterations: int = Field(300, ge=1, le=100_000)
    free_hops: int = Field(0, ge=0, le=100, description="stored points within this many edges of a new node move "
                                                        "too, in a second phase (0: the stored map stays fixed)")
    free_iterations: int = Field(30, ge=1, le=100_000)


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
    from ..run.inputs import check_knn_settings, input_kind
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
    is not an affinity store."""
    from ..affinity.store import is_affinity_store

    path = confine(root, relative)
    if path.is_dir() and not is_affinity_store(path):
        raise HTTPException(422, f"input {relative!r} is a directory but not an affinity store")
    key, copy = snapshot(root, path)
    return {"input_path": str(copy), "snapshot": str(copy), "input_sha256": key}


def _public(record: dict, history: bool = True) -> dict:
    hidden = ("input_path", "store_path", "snapshot", "cancel_requested", "spec")
    params = {k: v for k, v in record["params"].items() if k not in hidden}
    started, finished = record["started"], record["finished"]
    end = finished if finished is not None else time.time()
    out = {"id": record["id"], "state": record["state"], "params": params, "iteration": record["iteration"],
           "kl": record["kl"], "error": record["error"], "resumed_from": record["resumed_from"],
           "n_points": record["n_points"],
           "timing": {"created": record["created"], "started": started, "finished": finished,
                      "elapsed_s": None if started is None else round(end - started, 3)}}
    if history:
        out["kl_history"] = record["kl_history"]
    return out


def create_app(config: ServiceConfig) -> FastAPI:
    """The service's ASGI application; jobs start running when the application starts."""
    root = Path(config.data_root).resolve()
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    (root / "uploads").mkdir(exist_ok=True)
    for partial in (root / "uploads").glob(".*.part"):  # uploads cut off by a killed service
        partial.unlink(missing_ok=True)
    state = {}

    @asynccontextmanager
    async def lifespan(app):
        store = JobStore(root / "jobs.sqlite3")
        state["store"] = store
        state["runner"] = JobRunner(store, root, config.max_running, config.max_queue, config.scheduler,
                                    config.checkpoint_every, config.n_threads, config.store_ttl_hours)
        yield
        state["runner"].stop()
        store.close()

    app = FastAPI(title="scalemb", version=__version__, lifespan=lifespan, default_response_class=JSONResponse,
                  description="SNE-family embedding jobs (SNE, t-SNE, space-time SNE).")
    app.add_middleware(BodyLimit, limit=config.max_request_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return _error(422, _one_line(exc))

    @app.exception_handler(OSError)
    @app.exception_handler(sqlite3.Error)
    async def storage(request: Request, exc: Exception):
        """A full disk anywhere in a request: 507 (the handlers leave nothing half-written); else a 500."""
        if disk_full(exc):
            return _error(507, f"{DISK_FULL}; nothing was stored, retry once space is freed")
        raise exc

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if config.token is not None and request.url.path not in PUBLIC_PATHS:
            header = request.headers.get("authorization", "")
            scheme, _, supplied = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(supplied.strip().encode(), config.token.encode()):
                return _error(401, "missing or invalid bearer token (Authorization: Bearer <token>)",
                              {"WWW-Authenticate": "Bearer"})
        limit = config.max_upload_bytes if request.url.path.startswith("/uploads/") else config.max_request_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return _error(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
        return await call_next(request)

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

    @app.get("/health")
    def health():
        return {"status": "ok", "version": __version__}

    @app.post("/jobs", status_code=201)
    def submit(job: JobRequest):
        """Queue an embedding job; 429 when the queue is full."""
        params = job.model_dump()
        if job.input in DATASETS and not (root / job.input).exists():
            params.update(input_path=job.input, input_sha256=None)  # package data: immutable
        else:
            params.update(_input_snapshot(root, job.input))
        params["affinity"] = _affinity_kind(job, params["input_path"])
        params["spec"] = job.spec().replace(affinity=params["affinity"]).to_json()  # what the job runs
        try:
            record = state["runner"].submit(params)
        except QueueFull as exc:
            return _error(429, f"queue full: {exc.args[0]} jobs are waiting (limit {config.max_queue}); retry "
                               "later", {"Retry-After": "5"})
        return {"id": record["id"], "state": record["state"]}

    @app.post("/jobs/{job_id}/transform", status_code=201)
    def transform(job_id: str, request: TransformRequest):
        """Place new nodes into done job ``job_id``'s map, which stays fixed: a new job whose result is the
        whole map (old rows first); 409 unless that job is done, 429 when the queue is full."""
        source = _done(job_id)
        params = {"kind": "transform", "source_job": job_id, "input": request.new,
                  **_input_snapshot(root, request.new), "iterations": request.iterations,
                  "free_hops": request.free_hops, "free_iterations": request.free_iterations,
                  "model": source["params"].get("model")}
        try:
            record = state["runner"].submit(params)
        except QueueFull as exc:
            return _error(429, f"queue full: {exc.args[0]} jobs are waiting (limit {config.max_queue}); retry "
                               "later", {"Retry-After": "5"})
        return {"id": record["id"], "state": record["state"]}

    @app.get("/jobs")
    def list_jobs():
        return {"jobs": [_public(r, history=False) for r in state["store"].list()]}

    @app.get("/jobs/{job_id}")
    def status(job_id: str):
        """The job; once done also ``metrics`` (``scalemb.metrics.to_json`` of the run; ``null`` while they are
        computed, in the background once the job is done)."""
        record = _job(job_id)
        out = _public(record)
        if record["state"] == "done":
            out["metrics"] = state["runner"].metrics(job_id)
        return out

    @app.delete("/jobs/{job_id}")
    def cancel(job_id: str):
        """Cancel a queued or running job (a running one stops at its next iteration)."""
        record = _job(job_id)
        if record["state"] in ("done", "failed", "cancelled"):
            raise HTTPException(409, f"job {job_id} is already {record['state']}")
        record = state["runner"].cancel(job_id)
        return {"id": job_id, "state": record["state"] if record["state"] != "running" else "cancelling"}

    @app.get("/jobs/{job_id}/embedding")
    def embedding(job_id: str, format: Literal["csv", "npy"] = Query("csv")):
        """The embedding (N x (space + time)): csv with a node_id column and a header, or npy (float64)."""
        _done(job_id)
        from ..embedding import EmbeddingResult

        result = EmbeddingResult.load(state["runner"].run_dir(job_id) / "run.zarr")
        if format == "npy":
            buffer = io.BytesIO()
            np.save(buffer, result.embedding)
            return Response(buffer.getvalue(), media_type="application/octet-stream",
                            headers={"Content-Disposition": f'attachment; filename="{job_id}.npy"'})
        names = [f"space{i + 1}" for i in range(result.space_dims)] + [f"time{i + 1}" for i in range(result.time_dims)]
        text = io.StringIO()  # the csv module quotes ids holding commas or quotes (string ids from Parquet input)
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(["node_id", *names])
        writer.writerows([node, *(repr(float(v)) for v in row)]
                         for node, row in zip(result.node_ids.tolist(), result.embedding))
        return Response(text.getvalue(), media_type="text/csv")

    @app.get("/jobs/{job_id}/plot.png", response_class=Response)
    def plot(job_id: str):
        """The result's figure (layout and KL history), PNG."""
        _done(job_id)
        cached = state["runner"].run_dir(job_id) / "plot.png"
        if not cached.exists():
            from ..plot import plot_png

            tmp = cached.with_name(f".plot.{os.getpid()}.{time.monotonic_ns()}.png")
            try:
                tmp.write_bytes(plot_png(state["runner"].run_dir(job_id) / "run.zarr"))
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
                write_text_atomic(cached, build(state["runner"].run_dir(job_id) / "run.zarr"))
            except ScalembError as exc:
                raise HTTPException(422, str(exc).splitlines()[0]) from None
        return HTMLResponse(cached.read_text(encoding="utf-8"))

    @app.get("/jobs/{job_id}/report", response_class=HTMLResponse)
    def report(job_id: str):
        """The run report of ``scalemb report`` (self-contained HTML: metrics, maps, KL curve)."""
        from ..report import build_report

        return _page(job_id, "report.html", lambda run: build_report(run, map_href=f"/jobs/{job_id}/map")[0])

    @app.get("/jobs/{job_id}/map", response_class=HTMLResponse)
    def map_page(job_id: str):
        """The interactive map page (self-contained HTML canvas: pan, zoom, hover, find a node)."""
        from ..report.mappage import build_map_page

        return _page(job_id, "map.html", build_map_page)

    @app.put("/uploads/{name}", status_code=201)
    async def upload(name: str, request: Request):
        """Store the raw request body as ``uploads/NAME`` (an edge list, optionally gzipped); use
        ``"input": "uploads/NAME"`` in ``POST /jobs``.  Replacing an upload never changes a job submitted
        before: jobs read snapshots.  507 when the disk is full (the previous upload of NAME, if any, stays)."""
        if not UPLOAD_NAME.fullmatch(name):
            raise HTTPException(400, f"upload name {name[:80]!r}: use letters, digits, '.', '_' and '-' only")
        target = root / "uploads" / name
        tmp = target.with_name(f".{name}.{time.monotonic_ns()}.part")
        size, full = 0, None
        try:
            with open(tmp, "wb") as handle:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > config.max_upload_bytes:
                        raise HTTPException(413, f"upload exceeds the limit of {config.max_upload_bytes} bytes")
                    if full is None:
                        try:
                            handle.write(chunk)
                        except OSError as exc:  # read the rest, so the client gets the answer, not a reset
                            if not disk_full(exc):
                                raise
                            full = exc
                if full is None:
                    handle.flush()
                    os.fsync(handle.fileno())
            if full is not None:
                raise full
            os.replace(tmp, target)
        except OSError as exc:
            if disk_full(exc):
                raise HTTPException(507, f"{DISK_FULL}: uploads/{name} was not stored; retry once space is "
                                         "freed") from None
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return {"input": f"uploads/{name}", "bytes": size}

    return app


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

    lock = lock_data_root(config.data_root)
    sock = bind_socket(host, port)
    print(f"scalemb serve: http://{host}:{port} data root {Path(config.data_root).resolve()}", file=sys.stderr,
          flush=True)
    try:
        uvicorn.Server(uvicorn.Config(create_app(config), host=host, port=port, log_level="warning",
                                      access_log=False)).run(sockets=[sock])
    finally:
        sock.close()
        lock.close()
