"""The service's request bodies: ``JobRequest``, generated from the parameter table (one field per
``scalemb.params.PARAMS`` row with a service name), and ``TransformRequest``."""
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from ..params import PARAMS
from ..run import Runner, RunSpec


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

        return RunSpec.from_front(self.model_dump(), "service")

    @model_validator(mode="after")
    def _runner_accepts(self):
        """The runner's own checks (dimensions per model, fft support) at submission, not when the job runs."""

        Runner(self.spec())._check()
        return self


def _job_request():
    """``JobRequest``: ``_JobBase`` plus one field per ``PARAMS`` row with a service name: its type (choices ->
    ``Literal``), default (``Param.outer_default``), description (the help) and bounds."""

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
    free_exaggeration: float | None = Field(None, gt=0, le=100, description="that phase's attraction of the pairs "
                                            "with a new node, times this (default: scalemb transform's)")
    free_stored_attraction: float | None = Field(None, gt=0, le=100, description="that phase's attraction of the "
                                                 "moving stored nodes' other pairs, times this (default: scalemb "
                                                 "transform's)")

