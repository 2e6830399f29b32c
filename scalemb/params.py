"""The one table of embedding settings: the estimator's parameters (``scalemb.Embedder``), the service's job fields
(``scalemb.service.app.JobRequest``: type, default, help, choices -> Literal, bounds) and the kNN flags of
``scalemb embed`` (``add_param_arguments``) are generated from it; the older CLI flags are checked against it
(``tests/test_params.py``).

Each ``Param`` names a setting once: its default, a one-line help, the choices if any, and the CLI flag /
service field that set it (``None``: not offered there, e.g. Python objects such as callbacks).  A model's own
constructor parameters (EE's ``lam``, CO-SNE's ``gamma``...) are not rows here: the table names no model.  They
travel as one dict, ``model_params`` (CLI ``--model-param NAME=VALUE``, service field ``model_params``), and the
model is ``get_model(model, **model_params)``, whose ``make_model`` checks them.
"""
from dataclasses import dataclass, field

from .affinity.knn import METRICS as KNN_METRICS
from .models import DEFAULT_MODEL, ModelChoices
from .optim import OPTIMIZER_NAMES

_SAME = object()


@dataclass(frozen=True)
class Param:
    name: str
    default: object
    help: str
    choices: tuple | None = None
    cli: str | None = None  # the `scalemb embed` flag
    service: str | None = None  # the service's job field
    type: object = None  # the value's type where a JSON field / CLI flag sets it (the service schema's annotation)
    bounds: dict = field(default_factory=dict)  # pydantic bounds of that value (ge, gt, le, lt)
    effective: object = _SAME  # what the default means, spelt out by the CLI and the service (e.g. seed None -> 0)

    @property
    def outer_default(self):
        """The default the CLI flag and the service field show: ``effective`` if the table gives one."""
        return self.default if self.effective is _SAME else self.effective


MODELS = ModelChoices()  # scalemb.models' model modules and the registered models, read at each use
AFFINITY_KINDS = ("auto", "graph", "knn", "precomputed")
GRAPH_AFFINITIES = ("coauthorship", "normalized")

PARAMS = (
    Param("model", DEFAULT_MODEL, "the model (scalemb.models), e.g. sne, tsne or snest (space-time SNE)", MODELS,
          "--model", "model"),
    Param("model_params", None, "the model's parameters, a dict: the model is get_model(model, **model_params)",
          None, "--model-param", "model_params", dict[str, float | int | str] | None),
    Param("space_dims", 2, "space dimensions", None, "--space", "space", int, {"ge": 1, "le": 16}),
    Param("time_dims", None, "time dimensions (default 1 for a model with time, e.g. snest, else 0)", None,
          "--time", "time", int | None, {"ge": 0, "le": 16}),
    Param("affinity", "auto", "how P is made from the input: 'graph' (an edge list, adjacency or graph), 'knn' "
          "(features), 'precomputed' (the input is P), 'auto' (from the input's type)", AFFINITY_KINDS,
          "--affinity", "affinity"),
    Param("graph_affinity", "coauthorship", "graph affinity: co-authorship normalisation or C / sum C",
          GRAPH_AFFINITIES, "--graph-affinity", "graph_affinity"),
    Param("perplexity", 30.0, "kNN affinities: target perplexity (lowered to fit small inputs)", None,
          "--perplexity", "perplexity", float, {"ge": 1.0, "le": 1e6}),
    Param("n_neighbors", None, "kNN affinities: neighbours per point (default min(N - 1, 3 perplexity))", None,
          "--n-neighbors", "n_neighbors", int | None, {"ge": 1, "le": 10_000}),
    Param("metric", "euclidean", "kNN affinities: distance (in Python also 'liram': learned from the labels of "
          "fit(X, y), scalemb.lvq)", tuple(KNN_METRICS), "--metric", "metric"),
    Param("metric_params", None, "metric='liram': the scalemb.lvq.LiRaMLVQ settings, a dict (prototypes_per_class, "
          "rank, epochs, ...; default: LiRaMLVQ's)"),
    Param("init", None, "initial coordinates (None: the SNEST paper's small random start)"),
    Param("iterations", 5000, "maximum iterations per restart", None, "--iterations", "iterations", int,
          {"ge": 1, "le": 1_000_000}),
    Param("random_state", None, "seed of the random start (None: 0); restart k uses the stream (seed, k)",
          None, "--seed", "seed", int, {"ge": 0, "lt": 2 ** 32}, effective=0),
    Param("seed", None, "alias of random_state (kept from earlier versions)"),
    Param("restarts", 1, "independent restarts; the best KL is kept", None, "--restarts", "restarts", int,
          {"ge": 1, "le": 100}),
    Param("optimizer", "auto", "'auto', 'dbd', 'sd', 'gd' (or, in Python, an optimiser instance)", OPTIMIZER_NAMES,
          "--optimizer", "optimizer"),
    Param("n_jobs", None, "threads (None or -1: every CPU usable)", None, "--threads"),
    Param("n_threads", None, "alias of n_jobs (kept from earlier versions)"),
    Param("repulsion", "auto", "'exact' (all pairs), 'fft' (interpolated on a grid) or 'auto' (by N)",
          ("auto", "exact", "fft"), "--repulsion", "repulsion"),
    Param("fft_params", None, "a scalemb.repulsion.FFTParams for repulsion='fft'"),
    Param("scheduler", None, "address of a Dask scheduler to run on", None, "--scheduler"),
    Param("workers", None, "start a local Dask cluster of this many worker processes", None, "--workers"),
    Param("callbacks", None, "callable or list of callables (iteration, kl, embedding) -> bool; True stops"),
    Param("callbacks_every_iters", 1, "call the callbacks every this many iterations"),
    Param("quiet", True, "no progress output", None, "--quiet", effective=False),
)

PARAM_NAMES = tuple(p.name for p in PARAMS)
KNN_PARAMS = ("perplexity", "n_neighbors", "metric")  # the settings of kNN affinities (feature input only)
DEFAULTS = {p.name: p.default for p in PARAMS}

