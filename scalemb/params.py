"""The one table of embedding settings.  Every front is generated from it: the estimator's parameters
(``scalemb.Embedder``), the ``scalemb embed`` flags (``scalemb.cli.main.add_param_arguments``), the service's job
fields (``scalemb.service.requests.JobRequest``: type, default, help, choices -> Literal, bounds) and the run's value
``scalemb.run.RunSpec`` (one field per row marked ``run``), which is what checkpoints, job records and results store.

Each ``Param`` names a setting once: its default, a one-line help, the choices or bounds, and the CLI flag /
service field that set it (``None``: not offered there, e.g. Python objects such as callbacks).  ``Param.check``
is the one validation of a value: every front refuses a bad value with its message, naming the setting as that
front spells it (``--space``, ``space``, ``space_dims``).  A model's own constructor parameters (EE's ``lam``,
CO-SNE's ``gamma``...) are not rows here: the table names no model.  They travel as one dict, ``model_params``
(CLI ``--model-param NAME=VALUE``, service field ``model_params``), and the model is
``get_model(model, **model_params)``, whose ``make_model`` checks them.

The perplexity default and the neighbour rule are written once, beside the kNN affinity that defines them
(``scalemb.affinity.knn.PERPLEXITY``, ``default_neighbours``).
"""
import math
import numbers
from dataclasses import dataclass, field

from .affinity.knn import METRICS as KNN_METRICS, PERPLEXITY
from .init import check_init
from .models import DEFAULT_MODEL, ESTIMATOR_MODEL, ModelChoices
from .optim import OPTIMIZER_NAMES
from .optim.descent import CURVATURES, PRECONDITIONERS, SOLVERS
from .repulsion import REPULSION_METHODS
from .repulsion.spec import BOX_WIDTH_RANGE, FFT_ACCURACY_CHOICES

_SAME = object()
_BAD = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a text", dict: "a dict"}


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
    run: bool = True  # a field of the run's value (scalemb.run.RunSpec); False: how a Python caller is served
    alias_of: str | None = None  # a deprecated second name of row ``alias_of`` (the estimator's edge only)
    estimator: str | None = None  # the estimator's (scikit-learn's) name of a run field named otherwise; the
    # row's own name then stays the run's field, the CLI's and the service's, and is a deprecated estimator alias
    estimator_default: object = _SAME  # the estimator's default where it differs from the run's (the CLI's and
    # the service's): scalemb.Embedder() is 2-D t-SNE, the user's expectation, while `scalemb embed` keeps SNEST
    words: tuple = ()  # texts that stand for themselves beside numbers (learning_rate 'auto')
    validate: object = None  # the row's own check(value) -> None, raising ValueError (instead of type and bounds)

    @property
    def outer_default(self):
        """The default the CLI flag and the service field show: ``effective`` if the table gives one."""
        return self.default if self.effective is _SAME else self.effective

    def describe(self) -> str:
        """What a value must be, in words (the tail of every front's message)."""
        if isinstance(self.choices, (tuple, ModelChoices)):
            return f"one of {', '.join(map(str, self.choices))}"
        kind = _KINDS.get(_base(self.type), "a value")
        limits = [f"{op} {_number(self.bounds[key])}" for key, op in (("ge", ">="), ("gt", ">"), ("le", "<="),
                                                                      ("lt", "<")) if key in self.bounds]
        words = f" or {', '.join(map(repr, self.words))}" if self.words else ""
        return f"{kind}{' ' + ' and '.join(limits) if limits else ''}{words}"

    def check(self, value, name: str | None = None, shown: str | None = None):
        """``value`` as this row takes it (an integral float as an int), or ``ValueError``
        ``"NAME: must be ..., got VALUE"`` (``name``: the front's spelling of the setting, default the row's;
        ``shown``: the value as the user typed it)."""
        name = name or self.name
        if shown is not None:
            try:
                return self.check(value, name)
            except ValueError as exc:
                raise ValueError(str(exc).rsplit(", got ", 1)[0] + f", got {shown}") from None
        if value is None and (self.default is None or _optional(self.type)):
            return None
        if self.words and isinstance(value, (str, int)) and value in self.words:
            return value
        if self.validate is not None:
            try:
                self.validate(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            return value
        checked = self._checked(value)
        if checked is _BAD:
            raise ValueError(f"{name}: must be {self.describe()}, got {_shown(value)}")
        return checked

    def _checked(self, value):
        """``value`` as the row's kind takes it, or ``_BAD``."""
        if isinstance(self.choices, (tuple, ModelChoices)):
            return value if isinstance(value, str) and value in self.choices else _BAD
        base = _base(self.type)
        if base in (int, float):
            number = value if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
            if number is None or not math.isfinite(number) or (base is int and number != int(number)) or \
                    not _within(number, self.bounds):
                return _BAD
            return int(number) if base is int else float(number)
        return value if base not in _KINDS or isinstance(value, base) else _BAD

    def parse(self, text: str):
        """A command-line ``text`` as this row's value (``check``ed), or ``ValueError`` as ``check`` gives it."""
        base = _base(self.type)
        if text in map(str, self.words):
            return self.words[[str(w) for w in self.words].index(text)]
        if base not in (int, float) or isinstance(self.choices, (tuple, ModelChoices)):
            return self.check(text, self.cli)
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{self.cli}: must be {self.describe()}, got {text!r}") from None
        if base is int and math.isfinite(value) and value == int(value) and "." not in text and \
                "e" not in text.lower():
            value = int(text)
        return self.check(value, self.cli, shown=text)


def _base(kind):
    """The non-None type of an annotation (``int | None`` -> int; ``dict[...] | None`` -> dict)."""
    import typing

    args = [a for a in typing.get_args(kind) if a is not type(None)] if typing.get_args(kind) and \
        typing.get_origin(kind) is not dict else [kind]
    base = args[0] if args else kind
    return typing.get_origin(base) or base


def _optional(kind) -> bool:
    import typing

    return type(None) in typing.get_args(kind)


def _within(value, bounds: dict) -> bool:
    return all((op != "ge" or value >= b) and (op != "gt" or value > b) and (op != "le" or value <= b) and
               (op != "lt" or value < b) for op, b in bounds.items())


def _number(value) -> str:
    return f"{value:g}".replace("e+0", "e").replace("e+", "e") if isinstance(value, float) else str(value)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _check_init_value(value):
    if value is not None and not hasattr(value, "shape") and not isinstance(value, str):
        raise ValueError(f"must be one of random, spectral, pca or a .npy file, got {_shown(value)}")
    try:
        check_init(value)
    except ValueError:
        raise ValueError(f"must be one of random, spectral, pca or a .npy file, got {_shown(value)}") from None


MODELS = ModelChoices()  # scalemb.models' model modules and the registered models, read at each use
AFFINITY_KINDS = ("auto", "graph", "knn", "precomputed")
GRAPH_AFFINITIES = ("coauthorship", "normalized")
_HUGE = 10 ** 9

PARAMS = (
    Param("model", DEFAULT_MODEL, "the model (scalemb.models), e.g. sne, tsne or snest (space-time SNE); the "
          "estimator scalemb.Embedder defaults to tsne", MODELS, "--model", "model",
          estimator_default=ESTIMATOR_MODEL),
    Param("model_params", None, "the model's parameters, a dict: the model is get_model(model, **model_params)",
          None, "--model-param", "model_params", dict[str, float | int | str] | None),
    Param("space_dims", 2, "space dimensions", None, "--space", "space", int, {"ge": 1, "le": 16},
          estimator="n_components"),
    Param("time_dims", None, "time dimensions (default 1 for a model with time, e.g. snest, else 0)", None,
          "--time", "time", int | None, {"ge": 0, "le": 16}),
    Param("affinity", "auto", "how P is made from the input: 'graph' (an edge list, adjacency or graph), 'knn' "
          "(features), 'precomputed' (the input is P), 'auto' (from the input's type)", AFFINITY_KINDS,
          "--affinity", "affinity"),
    Param("graph_affinity", "coauthorship", "graph affinity: co-authorship normalisation C_ij (1/deg_i + 1/deg_j) "
          "or C / sum C", GRAPH_AFFINITIES, "--graph-affinity", "graph_affinity"),
    Param("perplexity", PERPLEXITY, "kNN affinities: target perplexity (lowered to fit small inputs)", None,
          "--perplexity", "perplexity", float, {"ge": 1.0, "le": 1e6}),
    Param("n_neighbors", None, "kNN affinities: neighbours per point (default min(N - 1, 3 perplexity))", None,
          "--n-neighbors", "n_neighbors", int | None, {"ge": 1, "le": 10_000}),
    Param("metric", "euclidean", "kNN affinities: distance (in Python also 'liram': learned from the labels of "
          "fit(X, y), scalemb.lvq; 'precomputed': fit(D) on a square distance matrix; and a callable f(u, v) -> "
          "distance of two feature rows, exact kNN)", tuple(KNN_METRICS),
          "--metric", "metric"),
    Param("metric_params", None, "metric='liram': the scalemb.lvq.LiRaMLVQ settings, a dict (prototypes_per_class, "
          "rank, epochs, ...; default: LiRaMLVQ's)", type=dict | None),
    Param("init", None, "the start: random (1e-4 N(0,1), the SNEST paper's; None: random), spectral (graph "
          "eigenmap of P), pca (kNN inputs from features: a feature file, in Python also an array), or an "
          "(N, space [+ time]) .npy file in node order (in Python also an array)", None, "--init", None, str | None,
          validate=_check_init_value),
    Param("iterations", 5000, "maximum iterations per restart", None, "--iterations", "iterations", int,
          {"ge": 1, "le": 1_000_000}, estimator="max_iter"),
    Param("random_state", None, "seed of the random start (None: 0); restart k uses the stream (seed, k)",
          None, "--seed", "seed", int | None, {"ge": 0, "lt": 2 ** 32}, effective=0),
    Param("seed", None, "deprecated alias of random_state", run=False, alias_of="random_state"),
    Param("restarts", 1, "independent restarts; the best KL is kept", None, "--restarts", "restarts", int,
          {"ge": 1, "le": 100}),
    Param("optimizer", "auto", "dbd: delta-bar-delta; sd: spectral direction + line search; gd: gradient + line "
          "search; auto: the model's default, e.g. sd for tsne/snest, dbd for sne (in Python also an optimiser "
          "instance)", OPTIMIZER_NAMES, "--optimizer", "optimizer"),
    Param("solver", None, "sd: lu (sparse factorisation of the curvature), cg (matrix-free preconditioned "
          "conjugate gradient) or auto (lu below 20000 points, cg with the jacobi preconditioner from there); "
          "default auto", SOLVERS, "--solver", "solver"),
    Param("preconditioner", None, "sd with cg: lu (a lagged factorisation, default), amg (aggregation multigrid) "
          "or jacobi", PRECONDITIONERS, "--preconditioner", "preconditioner"),
    Param("curvature", None, "sd: iterate (L(P o K) at the current point, default) or fixed (L(P))", CURVATURES,
          "--curvature", "curvature"),
    Param("learning_rate", None, "dbd: space learning rate (default auto = max(1, N/12))", None,
          "--learning-rate", "learning_rate", float | None, {"gt": 0.0}, words=("auto",)),
    Param("time_ratio", None, "dbd: time learning rate / space learning rate (default 0.002)", None,
          "--time-ratio", "time_ratio", float | None, {"gt": 0.0}),
    Param("max_step_norm", None, "clip each point's space step to this norm (dbd: openTSNE's default 5; sd/gd: "
          "a per-point trust region that keeps the layout compact; default off, except in the schedules at scale)",
          None, "--max-step-norm", "max_step_norm", float | None, {"gt": 0.0}),
    Param("kl_every", None, "dbd: compute the KL only every K-th iteration (the other history entries are NaN; "
          "default 1)", None, "--kl-every", "kl_every", int | None, {"ge": 1, "le": _HUGE}),
    Param("exaggeration", None, "early exaggeration factor (default: dbd 4, sd/gd 1 = off)", None,
          "--exaggeration", "exaggeration", float | None, {"gt": 0.0}, estimator="early_exaggeration"),
    Param("exaggeration_iterations", None, "iterations with exaggeration (default: dbd 100, sd/gd 0)", None,
          "--exaggeration-iterations", "exaggeration_iterations", int | None, {"ge": 0, "le": _HUGE}),
    Param("tol", None, "stop when the mean relative KL decrease per iteration falls below this (0: never; default: "
          "dbd 1e-7, sd/gd 1e-5)", None, "--tol", "tol", float | None, {"ge": 0.0}),
    Param("n_jobs", None, "threads at most (None: every CPU usable; in Python also -1); in-process evaluations "
          "use them where measured to pay", None, "--threads", None,
          int | None, {"ge": 1, "le": 4096}, words=(-1,)),
    Param("n_threads", None, "deprecated alias of n_jobs", run=False, alias_of="n_jobs"),
    Param("repulsion", "auto", "the all-pairs term: exact (N^2), fft (interpolated on a grid, O(N)) or auto (fft "
          "from the measured crossover N)", REPULSION_METHODS, "--repulsion", "repulsion"),
    Param("fft_points", None, "fft: interpolation points per box and space dimension (default per model and "
          "dimension, scalemb.repulsion.DEFAULT_INTERPOLATION)", None, "--fft-points", "fft_points", int | None,
          {"ge": 2, "le": 64}),
    Param("fft_box_width", None, "fft: space box width (default per model and dimension)", None, "--fft-box-width",
          "fft_box_width", float | None, {"ge": BOX_WIDTH_RANGE[0], "le": BOX_WIDTH_RANGE[1]}),
    Param("fft_max_nodes", None, "fft: cap on the grid's node count (default min(2^23, max(2^14, 64 N)) without "
          "time, min(2^23, max(2^14, 16 N)) r with r time components)", None, "--fft-max-nodes", "fft_max_nodes",
          int | None, {"ge": 1, "le": 2 ** 31}),
    Param("fft_accuracy", "auto", "fft: how the default grid is chosen: fast (wider boxes), default, high (one "
          "more point per box), auto (by the model and size, e.g. fast for tsne from 10000 points, else default)",
          FFT_ACCURACY_CHOICES, "--fft-accuracy", "fft_accuracy"),
    Param("fft_time_points", None, "fft: Chebyshev nodes on the time axis (default 8 + 5 T for time extent T)",
          type=int | None, bounds={"ge": 2, "le": 1024}),
    Param("fft_min_boxes", 1, "fft: fewest boxes per space dimension", type=int, bounds={"ge": 1, "le": 4096}),
    Param("fft_time_band", True, "fft: with a time axis, let the grid span only the cheapest time band",
          type=bool),
    Param("fft_params", None, "a scalemb.repulsion.FFTParams for repulsion='fft' (Python; the fft_* settings "
          "spelt as one object)", run=False),
    Param("scheduler", None, "address of a Dask scheduler to run on (e.g. tcp://host:8786; INPUT should then be "
          "an affinity store the workers can read)", None, "--scheduler", type=str | None),
    Param("workers", None, "start a local Dask cluster of this many worker processes x 1 thread for the run",
          None, "--workers", type=int | None, bounds={"ge": 1, "le": 1024}),
    Param("client", None, "a running distributed.Client to run on (the user's cluster: used, never closed), or "
          "True for the one active in this process (distributed.get_client()); INPUT is written as an affinity "
          "store the workers read", run=False),
    Param("callbacks", None, "callable or list of callables (iteration, kl, embedding) -> bool; True stops",
          run=False),
    Param("callbacks_every_iters", 1, "call the callbacks every this many iterations", run=False, type=int,
          bounds={"ge": 1}),
    Param("verbose", False, "progress output (the CLI shows it unless --quiet)", run=False, type=bool),
    Param("quiet", None, "no progress output", None, "--quiet", effective=False, run=False, type=bool,
          alias_of="verbose"),  # the CLI's flag; in Python a deprecated alias, inverted: quiet=True is verbose=False
)

PARAM_NAMES = tuple(p.name for p in PARAMS)
BY_NAME = {p.name: p for p in PARAMS}
KNN_PARAMS = ("perplexity", "n_neighbors", "metric")  # the settings of kNN affinities (feature input only)
OPTIMIZER_PARAMS = ("solver", "preconditioner", "curvature", "learning_rate", "time_ratio", "max_step_norm",
                    "kl_every", "exaggeration", "exaggeration_iterations", "tol")  # make_optimizer's options
FFT_PARAMS = {"fft_points": "points", "fft_box_width": "box_width", "fft_max_nodes": "max_nodes",
              "fft_accuracy": "accuracy", "fft_time_points": "time_points", "fft_min_boxes": "min_boxes",
              "fft_time_band": "time_band"}  # row -> scalemb.repulsion.FFTParams field
DEFAULTS = {p.name: p.default for p in PARAMS}


def estimator_name(p: Param) -> str:
    """The estimator's name of row ``p`` (scikit-learn's spelling where the row has one)."""
    return p.estimator or p.name


# the estimator's parameters: every row by its estimator name, then the run fields' own names that the estimator
# spells otherwise, as deprecated aliases (default None: not given)
ESTIMATOR_ALIASES = {p.name: p for p in PARAMS if p.estimator}
ESTIMATOR_NAMES = tuple(estimator_name(p) for p in PARAMS) + tuple(ESTIMATOR_ALIASES)
ESTIMATOR_DEFAULTS = {**{estimator_name(p): p.default if p.estimator_default is _SAME else p.estimator_default
                         for p in PARAMS}, **dict.fromkeys(ESTIMATOR_ALIASES)}
