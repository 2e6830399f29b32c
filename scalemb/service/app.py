"""The FastAPI application: jobs, uploads, results and plots, behind a bearer token, confined to a data root.

Routes (JSON; errors are ``{"detail": "..."}``): ``POST /jobs``, ``GET /jobs``, ``GET /jobs/{id}``,
``DELETE /jobs/{id}``, ``GET /jobs/{id}/embedding?format=csv|npy``, ``GET /jobs/{id}/plot.png``,
``POST /jobs/{id}/transform`` (place new nodes into a done job's map: a new job),
``PUT /uploads/{name}`` (raw body), ``GET /health`` and ``GET /openapi.json`` (both without a token).
"""
import hmac
import io
import os
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from .._version import __version__
from ..datasets import DATASETS
from ..embedding import GRAPH_AFFINITIES
from .jobs import JobRunner, JobStore, QueueFull

PUBLIC_PATHS = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
UPLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


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


class JobRequest(BaseModel):
    """An embedding job; the names are the CLI's (``scalemb embed``)."""

    model_config = ConfigDict(extra="forbid")
    input: str = Field(description="built-in dataset (grqc, school), or a path relative to the data root: an "
                                   "edge list, an affinity store, or an upload (uploads/NAME)")
    model: Literal["sne", "tsne", "snest"] = "snest"
    space: int = Field(2, ge=1, le=16)
    time: int | None = Field(None, ge=0, le=16, description="default 1 for snest, 0 otherwise")
    optimizer: Literal["auto", "dbd", "sd", "gd"] = "auto"
    iterations: int = Field(5000, ge=1, le=1_000_000)
    seed: int = 0
    restarts: int = Field(1, ge=1, le=100)
    repulsion: Literal["auto", "exact", "fft"] = "auto"
    graph_affinity: Literal[GRAPH_AFFINITIES] = "coauthorship"


class TransformRequest(BaseModel):
    """New nodes or points to place into a done job's map (``scalemb transform``)."""

    model_config = ConfigDict(extra="forbid")
    new: str = Field(description="path relative to the data root (e.g. uploads/NAME): the new nodes' edge list "
                                 "'NEW_ID OTHER_ID [weight]' (graph jobs) or feature rows (kNN jobs)")
    iterations: int = Field(300, ge=1, le=100_000)


def _error(status: int, detail: str, headers=None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def confine(root: Path, relative: str) -> Path:
    """``root / relative`` resolved, or ``HTTPException``: 400 for absolute paths and ``..``, 403 when a
    symlink leads outside ``root``, 404 when missing."""
    if not relative or "\x00" in relative:
        raise HTTPException(400, "input path is empty or invalid")
    candidate = Path(relative)
    if candidate.is_absolute() or relative.startswith(("/", "\\")):
        raise HTTPException(400, f"input {relative!r}: absolute paths are refused; give a path relative to the "
                                 "data root")
    if ".." in candidate.parts:
        raise HTTPException(400, f"input {relative!r}: '..' is refused; give a path inside the data root")
    resolved = (root / candidate).resolve()
    if not resolved.is_relative_to(root):
        raise HTTPException(403, f"input {relative!r} resolves outside the data root (symlink); refused")
    if not resolved.exists():
        raise HTTPException(404, f"input {relative!r}: no such file under the data root")
    return resolved


def _public(record: dict, history: bool = True) -> dict:
    params = {k: v for k, v in record["params"].items() if k != "input_path"}
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
    state = {}

    @asynccontextmanager
    async def lifespan(app):
        store = JobStore(root / "jobs.sqlite3")
        state["store"] = store
        state["runner"] = JobRunner(store, root, config.max_running, config.max_queue, config.scheduler,
                                    config.checkpoint_every, config.n_threads)
        yield
        state["runner"].stop()
        store.close()

    app = FastAPI(title="scalemb", version=__version__, lifespan=lifespan,
                  description="SNE-family embedding jobs (SNE, t-SNE, space-time SNE).")

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
            params["input_path"] = job.input
        else:
            params["input_path"] = str(confine(root, job.input))
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
                  "input_path": str(confine(root, request.new)), "iterations": request.iterations,
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
        return _public(_job(job_id))

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
        lines = ["node_id," + ",".join(names)]
        lines += [f"{node}," + ",".join(repr(float(v)) for v in row)
                  for node, row in zip(result.node_ids.tolist(), result.embedding)]
        return Response("\n".join(lines) + "\n", media_type="text/csv")

    @app.get("/jobs/{job_id}/plot.png", response_class=Response)
    def plot(job_id: str):
        """The result's figure (layout and KL history), PNG."""
        _done(job_id)
        cached = state["runner"].run_dir(job_id) / "plot.png"
        if not cached.exists():
            from ..plot import plot_png

            tmp = cached.with_name(f".plot.{os.getpid()}.{time.monotonic_ns()}.png")
            tmp.write_bytes(plot_png(state["runner"].run_dir(job_id) / "run.zarr"))
            os.replace(tmp, cached)
        return Response(cached.read_bytes(), media_type="image/png")

    @app.put("/uploads/{name}", status_code=201)
    async def upload(name: str, request: Request):
        """Store the raw request body as ``uploads/NAME`` (an edge list, optionally gzipped); use
        ``"input": "uploads/NAME"`` in ``POST /jobs``."""
        if not UPLOAD_NAME.match(name):
            raise HTTPException(400, f"upload name {name!r}: use letters, digits, '.', '_' and '-' only")
        target = root / "uploads" / name
        tmp = target.with_name(f".{name}.{time.monotonic_ns()}.part")
        size = 0
        try:
            with open(tmp, "wb") as handle:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > config.max_upload_bytes:
                        raise HTTPException(413, f"upload exceeds the limit of {config.max_upload_bytes} bytes")
                    handle.write(chunk)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return {"input": f"uploads/{name}", "bytes": size}

    return app


def serve(config: ServiceConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the service with uvicorn until SIGINT/SIGTERM; running jobs checkpoint and resume on restart."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(create_app(config), host=host, port=port, log_level="warning",
                                  access_log=False)).run()
