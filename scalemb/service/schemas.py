"""The service's response bodies as pydantic models: what ``/openapi.json`` (and so ``/docs``) shows.

Timestamps are ISO-8601 in UTC (``2026-11-27T10:15:02.123Z``).  Every error is ``{"detail": "<one line>"}``
(``Error``), the 422 of a request that fails validation included.
"""
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field

State = Literal["queued", "running", "done", "failed", "cancelled"]


def iso(epoch: float | None) -> datetime | None:
    """Seconds since the epoch as a UTC ``datetime`` (serialised as ISO-8601)."""
    return None if epoch is None else datetime.fromtimestamp(epoch, timezone.utc)


class Error(BaseModel):
    detail: str = Field(description="what went wrong, one line")


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class JobCreated(BaseModel):
    id: str
    state: State


class Timing(BaseModel):
    created: datetime = Field(description="submitted (ISO-8601, UTC)")
    started: datetime | None = Field(description="first started running")
    finished: datetime | None = Field(description="ended (done, failed or cancelled)")
    elapsed_s: float | None = Field(description="seconds from started to finished (or to now while running)")


class JobSummary(BaseModel):
    id: str
    kind: Literal["embed", "transform"]
    state: State
    params: dict[str, Any] = Field(description="the request's settings (and the input's SHA-256)")
    iteration: int | None = Field(description="the last iteration done")
    kl: float | None = Field(description="KL(P||Q) at that iteration (null when not finite)")
    error: str | None = Field(description="why the job failed, one line")
    resumed_from: int | None = Field(description="the checkpoint's iteration it continued from after a restart")
    n_points: int | None
    metrics_state: Literal["running", "done", "failed"] | None = Field(
        description="the quality-metrics phase of a done job")
    metrics_error: str | None = Field(description="why the metrics phase failed (the job stays done)")
    timing: Timing


class Job(JobSummary):
    kl_history: list[float | None] = Field(description="KL at every iteration (of the best restart)")
    metrics: dict[str, Any] | None = Field(None, description="once done: scalemb.metrics.to_json of the run "
                                                             "(null while computed, or when the phase failed)")


class JobList(BaseModel):
    jobs: list[JobSummary]
    total: int = Field(description="jobs matching the filter")
    limit: int
    offset: int


class Cancelled(BaseModel):
    id: str
    state: Literal["cancelled", "cancelling"]


class Deleted(BaseModel):
    id: str
    deleted: Literal[True]


class LogLine(BaseModel):
    time: datetime
    line: str


class JobLog(BaseModel):
    id: str
    lines: list[LogLine]


class Upload(BaseModel):
    input: str = Field(description="the path to name in POST /jobs")
    bytes: int
    sha256: str


def error_responses(*codes: int, html: bool = False) -> dict:
    """OpenAPI ``responses`` declaring ``Error`` for ``codes`` (``html``: on a route answering HTML, whose
    errors are JSON all the same)."""
    described = {400: "bad path or body", 401: "missing or invalid bearer token", 403: "refused path",
                 404: "no such job or file", 409: "the job is not in a state allowing this",
                 413: "body too large", 422: "invalid request: the first problem, one line",
                 429: "queue full", 507: "the data root's disk is full"}
    if html:
        json = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        return {code: {"description": described.get(code, "error"), "content": json} for code in codes}
    return {code: {"model": Error, "description": described.get(code, "error")} for code in codes}
