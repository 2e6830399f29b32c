"""Methods and affinity metrics as registered units: the fronts look a name up here instead of branching on it.

A *method* turns an input into a stored map (an ``EmbeddingResult``): the neighbour-embedding runner (every model
of ``scalemb.models``: one method, the model a setting of it), the graph (Laplacian) eigenmap and Brand's kernel
eigenmap.  A ``Method`` declares what it needs (``needs``: any embed input's affinity P, or feature rows), what it
provides (``fit``; ``place``: new points into a stored map, None for the neighbour-embedding placement of
``scalemb.placement``; ``output``: a map minimising an objective, or a spectral map whose value is its
eigenvalues) and its own settings (``params``: ``scalemb.params.Param`` rows, the CLI's flags generated from
them).  The fronts (the CLI's ``embed`` and its report line, resume, ``transform``) call ``method_of(name)``.

An *affinity metric* is a kNN distance that is more than a name for a distance function: ``liram`` learns the
metric from labels (``scalemb.lvq``), ``poincare`` measures points in the Poincaré ball (CO-SNE's input,
``scalemb.affinity.hyperbolic``).  An ``AffinityMetric`` declares whether it learns from labels and provides the
affinity of feature rows and, where it can, the neighbours of new rows against a stored run's reference rows
(placement).  The plain distances (euclidean, cosine, ...) are the table's ``scalemb.affinity.knn.METRICS``.

The built-in units are named here by where they live (``"module:attribute"``) and imported on first use, so this
module sits below the packages that define them and no import runs back up; ``register_method`` /
``register_metric`` add units defined elsewhere.
"""
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .models.registry import model_names

OUTPUTS = ("objective", "spectral")  # a map minimising an objective (KL, E, ...) | a spectral map (eigenvalues)
NEEDS = ("affinity", "features")  # any embed input's P | feature rows


@dataclass(frozen=True)
class Method:
    """One way of making a map (module docstring).

    ``fit(source, values, *, out=None, overwrite=False, checkpoint_every=None, front="python", quiet=True)``
    -> ``EmbeddingResult``: ``values`` are the table's settings by row name (``scalemb.params.PARAMS``) and the
    method's own (``params``, missing ones at their defaults); with ``out`` the result is written there.
    ``place(result, new, *, reference=None, run_name=..., n_threads=None)`` -> the whole map's
    ``EmbeddingResult`` (stored rows first), or None: the neighbour-embedding placement (``scalemb.placement``).
    ``describe(result)``: the run's value in the CLI's report line (e.g. ``KL 1.2345, 300 iterations``)."""

    name: str
    summary: str
    output: str
    needs: str
    fit: Callable
    describe: Callable
    place: Callable | None = None
    params: tuple = ()

    def __post_init__(self):
        if self.output not in OUTPUTS or self.needs not in NEEDS:
            raise ValueError(f"method {self.name!r}: output must be one of {OUTPUTS}, needs one of {NEEDS}")

    def values(self, given: dict) -> dict:
        """``given`` with the method's own settings that it lacks at their defaults."""
        return {**{p.name: p.default for p in self.params}, **given}


@dataclass(frozen=True)
class AffinityMetric:
    """A kNN metric with its own affinity (module docstring).

    ``affinity(X, labels=None, *, perplexity, n_neighbors, random_state, n_jobs, source, **options)`` ->
    ``Affinity`` of the feature rows ``X`` (``labels``: one per row, for a metric learned from them; ``options``:
    the metric's own settings, ``check_options`` tests a dict of them).  ``neighbours(stored, X_new, X_ref, k)``
    -> ``(indices, distances)`` of each new row's ``k`` nearest reference rows, ``stored`` the run provenance's
    entry ``provenance_key`` (the fitted metric); None: placing new rows under this metric is not offered.
    ``fitted(affinity)``: the fitted metric an affinity carries (for the estimator's ``fitted_attribute``)."""

    name: str
    summary: str
    learns_from_labels: bool
    affinity: Callable
    neighbours: Callable | None = None
    provenance_key: str | None = None
    check_options: Callable | None = None
    fitted: Callable | None = None
    fitted_attribute: str | None = None


_LOCK = threading.RLock()
_METHODS = {  # name -> Method, or where the built-in one lives
    "eigenmap": "scalemb.eigenmaps.methods:GRAPH_EIGENMAP",
    "kernel-eigenmap": "scalemb.eigenmaps.methods:KERNEL_EIGENMAP",
}
_NEIGHBOUR_EMBEDDING = "scalemb.run.method:NEIGHBOUR_EMBEDDING"  # the method of every model name
_METRICS = {  # name -> AffinityMetric, or where the built-in one lives
    "liram": "scalemb.lvq.metric:LIRAM",
    "poincare": "scalemb.affinity.hyperbolic:POINCARE",
}


def _load(where):
    if not isinstance(where, str):
        return where
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr)


def register_method(method: Method) -> Method:
    """Add ``method`` (a ``Method``) under its name; ``ValueError`` if a model or another method has it."""
    if not isinstance(method, Method):
        raise TypeError(f"expected a Method, got {type(method).__name__}")
    with _LOCK:
        if method.name in model_names() or (method.name in _METHODS and _load(_METHODS[method.name]) is not method):
            raise ValueError(f"a model or method is already called {method.name!r}")
        _METHODS[method.name] = method
    return method


def register_metric(metric: AffinityMetric) -> AffinityMetric:
    """Add ``metric`` (an ``AffinityMetric``) under its name; ``ValueError`` if another one has it."""
    if not isinstance(metric, AffinityMetric):
        raise TypeError(f"expected an AffinityMetric, got {type(metric).__name__}")
    with _LOCK:
        if metric.name in _METRICS and _load(_METRICS[metric.name]) is not metric:
            raise ValueError(f"an affinity metric is already called {metric.name!r}")
        _METRICS[metric.name] = metric
    return metric


def method_names() -> tuple:
    """The registered methods besides the neighbour-embedding runner (whose names are the models')."""
    with _LOCK:
        return tuple(_METHODS)


def method_of(name: str) -> Method:
    """The method that makes maps called ``name``: a registered method, else the neighbour-embedding runner (the
    method of every model; a name no model has is refused there, by the model lookup, naming the models: a run
    of a model registered in another process stays readable here)."""
    with _LOCK:
        if name in _METHODS:
            _METHODS[name] = _load(_METHODS[name])
            return _METHODS[name]
    return _load(_NEIGHBOUR_EMBEDDING)


def metric_names() -> tuple:
    """The registered affinity metrics (the plain kNN distances are ``scalemb.affinity.knn.METRICS``)."""
    with _LOCK:
        return tuple(_METRICS)


def affinity_metric(name) -> AffinityMetric | None:
    """The registered affinity metric called ``name``, or None (a plain kNN distance, a callable, anything else)."""
    if not isinstance(name, str):
        return None
    with _LOCK:
        if name not in _METRICS:
            return None
        _METRICS[name] = _load(_METRICS[name])
        return _METRICS[name]


def label_metric_names() -> tuple:
    """The registered metrics learned from labels (``fit(X, y)``, ``scalemb affinity --labels``)."""
    return tuple(name for name in metric_names() if affinity_metric(name).learns_from_labels)
