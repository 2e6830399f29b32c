"""The FastAPI application: jobs, uploads, results and plots, behind a bearer token, confined to a data root.

Routes (JSON bodies typed by ``scalemb.service.schemas``; errors are ``{"detail": "..."}``): ``POST /jobs``,
``GET /jobs?state=&limit=&offset=`` (oldest first), ``GET /jobs/{id}`` (with the quality metrics once done),
``DELETE /jobs/{id}`` (cancels a queued or running job; deletes a finished one with its files),
``GET /jobs/{id}/log``, ``GET /jobs/{id}/embedding?format=csv|parquet|npy|h5ad|zarr`` (``scalemb.store.export``, the
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
import fcntl
import hmac
import socket
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPBearer

from .._version import __version__
from ..errors import ScalembError
from . import schemas
from .database import Database, DatabaseUnavailable, database_error_types, describe
from .inputs import STORAGE_STATUS
from .jobs import LEASE_SECONDS, JobStore, disk_full
from .runner import JobRunner
from .jsonsafe import JSONResponse
from .routes import Service, router
from .uploads import DISK_FULL, remove_cut_off

PUBLIC_PATHS = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}

DOCS_STATIC = "/docs/static/"

REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"  # the only Internet URL ReDoc's bundle loads by itself


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


def _error(status: int, detail: str, headers=None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def _invalid(request: Request, exc: RequestValidationError):
    return _error(422, _one_line(exc))


async def _storage(request: Request, exc: Exception):
    """A full disk anywhere in a request: 507 (the handlers leave nothing half-written); an unreachable
    database: 503; else a 500."""
    if disk_full(exc):
        return _error(507, f"{DISK_FULL}; nothing was stored, retry once space is freed")
    if isinstance(exc, DatabaseUnavailable):
        return _error(503, f"{exc.args[0]}; retry shortly", {"Retry-After": "2"})
    raise exc


async def _object_storage(request: Request, exc: ScalembError):
    """The object store failed while a result was read (``scalemb.io.storage``): one line naming the URL,
    404/403/502 as for inputs (``STORAGE_STATUS``); any other ``ScalembError`` stays what it was."""
    kind = getattr(exc, "kind", None)
    if kind is None:
        raise exc
    return _error(STORAGE_STATUS.get(kind, 502), str(exc).splitlines()[0])


async def _guard(request: Request, call_next):
    """Every request but the public paths needs the bearer token (401); a declared body over its limit (the
    upload limit under ``/uploads/``) is refused before it is read (413)."""
    config = request.app.state.service.config
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


def create_app(config: ServiceConfig) -> FastAPI:
    """The service's ASGI application; the job database is opened (and migrated) here, jobs start running when
    the application starts."""
    root = Path(config.data_root).resolve()
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    (root / "uploads").mkdir(exist_ok=True)
    remove_cut_off(root, shared=config.database is not None)
    database = Database(config.database, root)
    service = Service(config, root)

    @asynccontextmanager
    async def lifespan(app):
        service.store = store = JobStore(database, config.lease_seconds)
        service.runner = JobRunner(store, root, config.max_running, config.max_queue, config.scheduler,
                                   config.checkpoint_every, config.n_threads, config.store_ttl_hours,
                                   config.retention_hours, config.storage)
        yield
        service.runner.stop()
        store.close()

    app = FastAPI(title="scalemb", version=__version__, lifespan=lifespan, default_response_class=JSONResponse,
                  description="SNE-family embedding jobs (SNE, t-SNE, space-time SNE). Every route but /health "
                              "and the documentation needs `Authorization: Bearer <token>` (the Authorize button).",
                  docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, limit=config.max_request_bytes)
    bearer = HTTPBearer(auto_error=False, description="the service's token ($SCALEMB_TOKEN or --token-file)")

    app.add_exception_handler(RequestValidationError, _invalid)
    for error_type in (OSError, DatabaseUnavailable, *database_error_types()):
        app.add_exception_handler(error_type, _storage)
    app.add_exception_handler(ScalembError, _object_storage)
    app.middleware("http")(_guard)
    _add_docs(app)

    @app.get("/health", response_model=schemas.Health)
    def health():
        return {"status": "ok", "version": __version__}

    app.include_router(router, dependencies=[Security(bearer)], responses=schemas.error_responses(401, 422))
    app.state.database, app.state.service = database, service
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

