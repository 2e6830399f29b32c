"""The service's authenticated routes (``create_app`` mounts them behind the bearer token): jobs, their logs,
results, pages and transforms, uploads and the Prometheus metrics.  Each route reads the application's
``Service`` (its settings, data root, job store and runner) through FastAPI's dependency injection."""
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from .._version import __version__
from ..errors import ScalembError
from ..store.export import FORMATS, MEDIA_TYPES, SUFFIXES, write_embedding
from ..io.storage import is_url
from ..run.inputs import is_dataset
from . import schemas
from .inputs import affinity_kind, input_snapshot, remote_snapshot
from .jobs import ENDED, InUse, JobStore, QueueFull
from .runner import JobRunner
from .requests import JobRequest, TransformRequest
from .uploads import store_upload
from ..plot import plot_png
from ..report import build_report
from ..report.mappage import build_map_page
from ..report.page import write_text_atomic

PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

JOB_STATES = ("queued", "running", "done", "failed", "cancelled")


@dataclass
class Service:
    """What the routes share: the settings (``ServiceConfig``), the resolved data root, and the job store and
    runner, which ``create_app``'s lifespan opens when the application starts."""

    config: object
    root: Path
    store: JobStore | None = None
    runner: JobRunner | None = None

    def job(self, job_id: str) -> dict:
        record = self.store.get(job_id)
        if record is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return record

    def done(self, job_id: str) -> dict:
        record = self.job(job_id)
        if record["state"] != "done":
            raise HTTPException(409, f"job {job_id} is {record['state']}; results exist once it is done")
        return record

    def queue(self, params: dict) -> dict:
        try:
            record = self.runner.submit(params)
        except QueueFull as exc:
            raise HTTPException(429, f"queue full: {exc.args[0]} jobs are waiting (limit {self.config.max_queue}); "
                                     "retry later", {"Retry-After": "5"}) from None
        return {"id": record["id"], "state": record["state"]}

    def page(self, job_id: str, name: str, build) -> HTMLResponse:
        """A cached HTML page of a done job (built once, written atomically)."""

        self.done(job_id)
        cached = self.runner.run_dir(job_id) / name
        if not cached.exists():
            try:
                write_text_atomic(cached, build(self.runner.result_path(job_id)))
            except ScalembError as exc:
                raise HTTPException(422, str(exc).splitlines()[0]) from None
        return HTMLResponse(cached.read_text(encoding="utf-8"))


def service(request: Request) -> Service:
    """The application's ``Service`` (``app.state.service``)."""
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(service)]
router = APIRouter()


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


@router.get("/metrics", response_class=Response,
         responses={200: {"content": {PROMETHEUS: {"schema": {"type": "string"}}}}})
def metrics(svc: ServiceDep):
    """Prometheus text exposition: jobs by state and the queue length over the whole database (every
    replica), this replica's running jobs, and a counter of the optimiser iterations its jobs ran (the
    iteration rate is ``rate(scalemb_iterations_total[1m])``)."""
    return Response(prometheus_text(svc.store, svc.runner), media_type=PROMETHEUS)

@router.post("/jobs", status_code=201, response_model=schemas.JobCreated,
          responses=schemas.error_responses(400, 403, 404, 413, 429, 507))
def submit(svc: ServiceDep, job: JobRequest):
    """Queue an embedding job; 429 when the queue is full."""
    params = job.model_dump()
    with svc.runner.submit_lock.shared():
        if is_dataset(job.input, svc.root):
            params.update(input_path=job.input, input_sha256=None)  # package data: immutable
        elif is_url(job.input):
            params.update(remote_snapshot(svc.root, job.input, svc.config.storage))
        else:
            params.update(input_snapshot(svc.root, job.input))
        params["affinity"] = affinity_kind(job, params["input_path"])
        params["spec"] = job.spec().replace(affinity=params["affinity"]).to_json()  # what the job runs
        return svc.queue(params)

@router.post("/jobs/{job_id}/transform", status_code=201, response_model=schemas.JobCreated,
          responses=schemas.error_responses(400, 403, 404, 409, 429, 507))
def transform(svc: ServiceDep, job_id: str, request: TransformRequest):
    """Place new nodes into done job ``job_id``'s map (``scalemb transform``: the stored points next to new
    graph nodes may move): a new job whose result is the whole map (old rows first); 409 unless that job is
    done, 429 when the queue is full."""
    source = svc.done(job_id)
    with svc.runner.submit_lock.shared():
        params = {"kind": "transform", "source_job": job_id, "input": request.new,
                  **input_snapshot(svc.root, request.new), "iterations": request.iterations,
                  "free_hops": request.free_hops, "free_iterations": request.free_iterations,
                  "free_exaggeration": request.free_exaggeration,
                  "free_stored_attraction": request.free_stored_attraction,
                  "model": source["params"].get("model")}
        return svc.queue(params)

@router.get("/jobs", response_model=schemas.JobList)
def list_jobs(svc: ServiceDep,
              state_: schemas.State | None = Query(None, alias="state", description="only jobs in this state"),
              limit: int = Query(100, ge=1, le=1000, description="at most this many jobs"),
              offset: int = Query(0, ge=0, description="skip this many (oldest first)")):
    """The jobs, oldest first (without their KL histories), ``limit`` of them from ``offset``; ``total``
    counts every job matching ``state``."""
    records, total = svc.store.list(state_, limit, offset)
    return {"jobs": [_public(r, history=False) for r in records], "total": total, "limit": limit,
            "offset": offset}

@router.get("/jobs/{job_id}", response_model=schemas.Job, responses=schemas.error_responses(404))
def status(svc: ServiceDep, job_id: str):
    """The job; once done also ``metrics`` (``scalemb.metrics.to_json`` of the run; ``null`` while they are
    computed, in the background once the job is done, or when that phase failed: ``metrics_error``)."""
    record = svc.job(job_id)
    out = _public(record)
    if record["state"] == "done":
        out["metrics"] = svc.runner.metrics_phase.metrics(record)
    return out

@router.delete("/jobs/{job_id}", response_model=schemas.Cancelled | schemas.Deleted,
            responses=schemas.error_responses(404, 409))
def delete(svc: ServiceDep, job_id: str):
    """A queued job is cancelled at once, a running one at its next iteration (``cancelling``); a finished
    job (done, failed, cancelled) is deleted with its files and its input's snapshot, unless another job reads
    them (the snapshot stays while another job's record names it; 409 while a transform job reads its
    result)."""
    record = svc.job(job_id)
    if record["state"] in ENDED:
        try:
            if svc.runner.purge(job_id):
                return {"id": job_id, "deleted": True}
        except InUse as exc:
            raise HTTPException(409, f"job {job_id} is read by job {exc.args[0]} (a transform of its map); "
                                     "delete it once that job has ended") from None
        record = svc.job(job_id)
        raise HTTPException(409, f"job {job_id} is {record['state']}")
    record = svc.runner.cancel(job_id)
    return {"id": job_id, "state": "cancelled" if record["state"] == "cancelled" else "cancelling"}

@router.get("/jobs/{job_id}/log", response_model=schemas.JobLog, responses=schemas.error_responses(404))
def job_log(svc: ServiceDep, job_id: str):
    """What happened to the job, one line per event: queued, claimed (by which service), resumed, warnings
    of its run, its end (with the reason of a failure), its metrics phase."""
    svc.job(job_id)
    return {"id": job_id, "lines": [{"time": schemas.iso(row["t"]), "line": row["line"]}
                                    for row in svc.store.log_lines(job_id)]}

@router.get("/jobs/{job_id}/embedding", response_class=Response, responses={
    200: {"description": "the embedding file", "content": {t: {} for t in sorted(set(MEDIA_TYPES.values()))}},
    **schemas.error_responses(404, 409, 507)})
def embedding(svc: ServiceDep, job_id: str,
              format: Literal[FORMATS] = Query("csv", description="csv and parquet: columns "
              "node_id, s1.., t1..; npy: the float64 matrix; h5ad: AnnData (obsm X_scalemb); zarr: the result "
              "group in a zip store")):
    """The embedding (N x (space + time)) as ``scalemb export`` writes it (``scalemb.store.export``)."""
    svc.done(job_id)

    run_dir = svc.runner.run_dir(job_id)
    cached = run_dir / f"embedding{SUFFIXES[format]}"
    if not cached.exists():
        tmp = run_dir / f".embedding.{os.getpid()}.{time.monotonic_ns()}{SUFFIXES[format]}"
        try:
            write_embedding(svc.runner.result_path(job_id), format, tmp)
            os.replace(tmp, cached)
        finally:
            tmp.unlink(missing_ok=True)
    return FileResponse(cached, media_type=MEDIA_TYPES[format], filename=f"{job_id}{SUFFIXES[format]}")

@router.get("/jobs/{job_id}/plot.png", response_class=Response,
         responses={200: {"content": {"image/png": {}}}, **schemas.error_responses(404, 409)})
def plot(svc: ServiceDep, job_id: str):
    """The result's figure (layout and KL history), PNG."""
    svc.done(job_id)
    cached = svc.runner.run_dir(job_id) / "plot.png"
    if not cached.exists():
        tmp = cached.with_name(f".plot.{os.getpid()}.{time.monotonic_ns()}.png")
        try:
            tmp.write_bytes(plot_png(svc.runner.result_path(job_id)))
            os.replace(tmp, cached)
        finally:
            tmp.unlink(missing_ok=True)
    return Response(cached.read_bytes(), media_type="image/png")

@router.get("/jobs/{job_id}/report", response_class=HTMLResponse,
         responses=schemas.error_responses(401, 404, 409, 422, html=True))
def report(svc: ServiceDep, job_id: str):
    """The run report of ``scalemb report`` (self-contained HTML: metrics, maps, KL curve)."""

    return svc.page(job_id, "report.html", lambda run: build_report(run, map_href=f"/jobs/{job_id}/map")[0])

@router.get("/jobs/{job_id}/map", response_class=HTMLResponse,
         responses=schemas.error_responses(401, 404, 409, 422, html=True))
def map_page(svc: ServiceDep, job_id: str):
    """The interactive map page (self-contained HTML canvas: pan, zoom, hover, find a node)."""

    return svc.page(job_id, "map.html", build_map_page)


@router.put("/uploads/{name}", status_code=201, response_model=schemas.Upload,
            responses=schemas.error_responses(400, 413, 507), openapi_extra={"requestBody": {
                "required": True, "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
                        "file": {"type": "string", "format": "binary"}}}}}}})
async def upload(svc: ServiceDep, name: str, request: Request):
    """Store the request body as ``uploads/NAME`` (an edge list, optionally gzipped, or a feature matrix):
    the raw body (``curl --data-binary @FILE``) or the one file of a multipart form (``curl -F file=@FILE``).
    Refused: an empty file, a form without exactly one file part, a body that does not match its name (a
    ``.gz`` that is not gzip, a ``.npy`` without NumPy's header, a form sent as a raw body).  Use ``"input":
    "uploads/NAME"`` in ``POST /jobs``.  Replacing an upload never changes a job submitted before: jobs read
    snapshots.  507 when the disk is full (the previous upload of NAME, if any, stays)."""
    return await store_upload(svc.root, name, request, svc.config.max_upload_bytes)
