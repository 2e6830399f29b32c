"""The scikit-learn estimator: ``scalemb.Embedder`` and its model presets ``SNE``, ``TSNE``, ``SNEST``.

``fit(X)`` turns what a user holds into the affinity P (``_as_input``), then runs ``scalemb.embedding.Embedder``
(the engine-level runner: executor, optimiser, restarts, checkpoints) on it.  The estimator's parameters are
generated from the one parameter table ``scalemb.params.PARAMS``: ``__init__`` takes them as keywords and only
stores them (scikit-learn's contract: ``get_params``/``set_params``/``clone`` work; validation happens in
``fit``).

Inputs ``fit`` takes (``affinity='auto'`` picks the kind from the type):

* a feature array ``N x d`` -> kNN affinities (``scalemb.affinity.knn``: ``perplexity``, ``n_neighbors``,
  ``metric``); ``affinity='precomputed'`` and a square array: P itself;
* a square SciPy sparse matrix -> a weighted adjacency (``graph_affinity``), or P itself with
  ``affinity='precomputed'``;
* an AnnData -> ``.obsp['connectivities']`` if present, else ``.X``; the embedding is written to
  ``.obsm['X_scalemb']``;
* a networkx graph -> its weighted adjacency (``weight`` edge attribute, default 1); ``node_ids_`` holds the
  graph's nodes in row order, as an edge list's ids: all integers (int64) or all strings (a graph mixing them,
  or with strings equal but for case, is refused as the edge-list reader refuses them);
* a ``(indices, distances)`` pair of ``N x k`` arrays (umap-learn's ``precomputed_knn``) -> kNN affinities;
* a path (edge list, feature file with ``affinity='knn'``, affinity store), a built-in dataset name, an
  ``Affinity``, or None (bundled GrQc), as ``scalemb.embed`` takes them.

``metric='liram'`` with ``fit(X, y)`` (a feature array and its labels): supervised affinities under a LiRaM LVQ
metric learned from ``y`` (``scalemb.lvq.supervised_affinity``; ``metric_params`` are the ``LiRaMLVQ`` settings,
its seed defaults to ``random_state``); the fitted LVQ model is ``lvq_`` and sits in ``result_.provenance['lvq']``.

``transform(X_new)`` places new feature rows into a map fitted to a feature array (``scalemb.placement``: the
fitted rows stay fixed), so the estimator is a Pipeline step; the new rows of one call are placed jointly (the
whole map's KL couples them through the normalisation and their mutual repulsion), so a row's place depends a
little on the rows placed with it.  New graph nodes are placed by the engine-level
``scalemb.embedding.Embedder.transform`` (an edge list).  ``get_feature_names_out``: ``tsne0, tsne1, ...``.
"""
import inspect
import numbers
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin

from .affinity import Affinity
from .io.edges import graph_from_edges
from .methods import affinity_metric, label_metric_names
from .models import ESTIMATOR_MODEL
from .affinity.knn import default_neighbours
from .params import BY_NAME, DEFAULTS, ESTIMATOR_ALIASES, ESTIMATOR_DEFAULTS, ESTIMATOR_NAMES, PARAMS, estimator_name
from .datasets import recorded_graph
from .placement import PlacementOptimizer, Reference, place, place_into, reference_of
from .placement.affinity import extended_graph_affinity, networkx_new_edges, read_new_edges
from .progress import reporting
from .run.inputs import fitting_perplexity, knn_features_affinity, object_kind, resolve  # noqa: F401 - kept importable
from .run.objects import (callable_metric_affinity, distance_matrix_affinity, graph_affinity, knn_pair_affinity,
                          networkx_adjacency)
from .run.runner import Runner
from .run.spec import RUN_PARAMS, RunSpec, fft_settings

OBSM_KEY = "X_scalemb"


class Embedder(TransformerMixin, BaseEstimator):
    """SNE-family embedding as a scikit-learn estimator (parameters: ``scalemb.params.PARAMS``).

    After ``fit``: ``embedding_`` (N x (ds + dt), space columns first), ``kl_`` (also ``kl_divergence_``,
    scikit-learn's ``TSNE`` name), ``kl_history_``, ``n_iter_``,
    ``result_`` (a ``scalemb.EmbeddingResult``), ``node_ids_`` (the input's node of each row),
    ``n_features_in_`` for feature arrays.  ``optimize(n_iter, **overrides)`` continues the fitted run.
    """

    _model_default = ESTIMATOR_MODEL

    def __init__(self, **params):  # the signature is generated from scalemb.params (see below)
        unknown = sorted(set(params) - set(ESTIMATOR_NAMES))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected parameter(s) {', '.join(unknown)}")
        defaults = dict(ESTIMATOR_DEFAULTS, model=self._model_default)
        for name in ESTIMATOR_NAMES:
            setattr(self, name, params.get(name, defaults[name]))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False  # a sparse matrix is an adjacency (square), not features
        tags.non_deterministic = False
        return tags

    # ------------------------------------------------------------------ settings

    def _seed(self) -> int:
        value = self.random_state if self.random_state is not None else self.seed
        if value is None:
            return 0
        if isinstance(value, np.random.RandomState):
            return int(value.randint(np.iinfo(np.int32).max))
        if isinstance(value, np.random.Generator):
            return int(value.integers(np.iinfo(np.int32).max))
        return BY_NAME["random_state"].check(value)  # the table's one check (an int, or a NumPy generator above)

    def _threads(self):
        value = self.n_jobs if self.n_jobs is not None else self.n_threads
        value = BY_NAME["n_jobs"].check(value)  # the table's one check: None, -1 (every CPU) or a positive int
        return None if value in (None, -1) else value

    def _verbose(self) -> bool:
        """``verbose``, or the inverse of the deprecated ``quiet`` where that is given."""
        if self.quiet is not None:
            return not BY_NAME["quiet"].check(self.quiet)
        return BY_NAME["verbose"].check(self.verbose)

    def _value(self, p):
        """``(value, the name it was given by)`` of run row ``p``: its estimator name (``n_components``,
        ``max_iter``, ``early_exaggeration``), or the row's own name, a deprecated alias (FutureWarning)."""
        import warnings

        name = estimator_name(p)
        value = getattr(self, name)
        if p.name in ESTIMATOR_ALIASES and getattr(self, p.name) is not None:
            if value != p.default:
                raise ValueError(f"{p.name} and {name} are one setting; give {name} only")
            warnings.warn(f"{p.name} is a deprecated alias of {name}; use {name}", FutureWarning, stacklevel=5)
            return getattr(self, p.name), p.name
        return value, name

    def _callbacks(self) -> list:
        if self.callbacks is None:
            return []
        callbacks = [self.callbacks] if callable(self.callbacks) else list(self.callbacks)
        for cb in callbacks:
            if not callable(cb):
                raise ValueError(f"callbacks must be callables (iteration, kl, embedding) -> bool, got {cb!r}")
        if not isinstance(self.callbacks_every_iters, numbers.Integral) or self.callbacks_every_iters < 1:
            raise ValueError(f"callbacks_every_iters must be a positive int, got {self.callbacks_every_iters!r}")
        return callbacks

    def _spec(self):
        """``(RunSpec, init array or None, optimiser instance or None)`` of the estimator's parameters: the
        aliases (``seed``, ``n_threads``, deprecated), a NumPy random generator, ``n_jobs=-1``, an ``FFTParams`` and
        an optimiser instance translated here, at the edge; every value checked by its table row (a row the
        estimator spells as scikit-learn does, e.g. ``n_components`` for ``space_dims``, named so in messages)."""
        import warnings

        for alias in (p for p in PARAMS if p.alias_of and getattr(self, p.name) is not None):
            warnings.warn(f"{alias.name} is a deprecated alias of {alias.alias_of}; use {alias.alias_of}",
                          FutureWarning, stacklevel=4)
        values = {}
        for p in RUN_PARAMS:
            value, name = self._value(p)
            values[p.name] = p.check(value, name) if p.name in ESTIMATOR_ALIASES else value
        values.update(random_state=self._seed(), n_jobs=self._threads())
        if self.fft_params is not None:
            given = [p.name for p in RUN_PARAMS if p.name.startswith("fft_") and values[p.name] != DEFAULTS[p.name]]
            if given:
                raise ValueError(f"fft_params and {', '.join(given)} both set the FFT grid; give one")
            values.update(fft_settings(self.fft_params))
        model = values["model"]
        if not isinstance(model, str) and model is not None:  # a Model: recorded by name and parameters
            values.update(model=model.name, model_params={**model.params, **(values["model_params"] or {})})
        optimizer = values["optimizer"]
        if not isinstance(optimizer, str):
            values["optimizer"] = getattr(optimizer, "name", "auto")
            if values["optimizer"] not in ("dbd", "sd", "gd"):
                values["optimizer"] = "auto"
        init = values["init"]
        array = init if hasattr(init, "shape") else None
        values["init"] = None if array is not None else (None if init is None else str(init))
        if callable(values["metric"]) or values["metric"] == "precomputed" or \
                values["metric"] in label_metric_names():  # a Python function / the input is the distance
            # matrix / learned from the labels (fit(X, y), scalemb.methods): not kNN metrics of the table
            values["metric"] = DEFAULTS["metric"]
        return RunSpec.from_values(values), array, None if isinstance(optimizer, str) else optimizer

    def _runner(self):
        spec, init, optimizer = self._spec()
        runner = Runner(spec, init=init, optimizer=optimizer, quiet=not self._verbose(), client=self.client)
        callbacks, every = self._callbacks(), self.callbacks_every_iters
        if callbacks:
            def stop(restart, iteration, kl, coords):
                if iteration % every:
                    return False
                embedding = coords.T  # N x (ds + dt), a read-only view for the callbacks
                embedding = embedding.view()
                embedding.flags.writeable = False
                return any([bool(cb(iteration, kl, embedding)) for cb in callbacks])

            runner.stop = stop
        return runner

    # ------------------------------------------------------------------ inputs

    def _as_input(self, X, spec):
        """``(data for the runner, node ids of the rows or None, AnnData to write to or None)``: a path, a
        dataset name or None as every front reads one (``scalemb.run.resolve``); the in-memory kinds
        (``scalemb.run.inputs.object_kind``) here."""

        kind = object_kind(X)
        if callable(self.metric) and kind not in ("array", "anndata"):
            raise ValueError("metric: a callable metric needs a dense feature array (points x features); "
                             f"got {type(X).__name__}")
        if kind == "source":
            return resolve(X, spec), None, None
        if kind == "affinity":
            return X, None, None
        if kind == "pair":
            return knn_pair_affinity(X, self.perplexity, self._threads()), None, None
        return {"anndata": self._from_anndata, "networkx": self._from_networkx, "sparse": self._from_sparse,
                "array": self._from_array}[kind](X)

    def _from_networkx(self, X):
        A, names = networkx_adjacency(X)
        return self._graph(A, "networkx graph", names), names, None

    def _from_sparse(self, X):
        if X.ndim != 2 or X.shape[0] != X.shape[1]:
            raise ValueError(f"a sparse input is an adjacency or affinity matrix and must be square; got shape "
                             f"{X.shape} (for sparse features, densify them)")
        if self.affinity == "knn":
            raise ValueError("affinity='knn' needs dense features; a sparse input is a graph")
        if self.affinity == "precomputed":
            return Affinity(X, np.arange(X.shape[0]), {"source": "precomputed"}), None, None
        return self._graph(X, "sparse adjacency"), None, None

    def _graph(self, A, source: str, names=None):
        """P of the adjacency ``A`` (``run.objects.graph_affinity``); the graph is kept, its nodes named as the user
        named them (``names``: a networkx graph's), for ``transform`` to grow it by new nodes."""
        affinity, graph = graph_affinity(A, self.graph_affinity, source, names)
        if names is not None:
            graph = graph_from_edges(names[graph.node_ids[graph.src]], names[graph.node_ids[graph.dst]],
                                     graph.weight, source)
        self._graph_input = graph
        return affinity

    def _from_array(self, X):
        from sklearn.utils.validation import validate_data

        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2, reset=True)
        if self.affinity == "precomputed":
            if X.shape[0] != X.shape[1]:
                raise ValueError(f"affinity='precomputed' needs a square P, got shape {X.shape}")
            return Affinity(sp.csr_matrix(X), np.arange(X.shape[0]), {"source": "precomputed"}), None, None
        if self.affinity == "graph":
            return self._graph(X, "adjacency array"), None, None
        if self.metric == "precomputed":
            return distance_matrix_affinity(X, self.perplexity, self.n_neighbors, self._threads()), None, None
        return self._knn(X), None, None

    def _knn(self, X):
        self._features = X  # the reference rows transform places new rows against
        if callable(self.metric):
            return callable_metric_affinity(X, self.metric, self.perplexity, self.n_neighbors, self._threads())
        return knn_features_affinity(X, self.perplexity, self.n_neighbors, self.metric, self._seed(), self._threads())

    def _from_anndata(self, adata):
        if "connectivities" in adata.obsp and self.affinity in ("auto", "graph", "precomputed"):
            C = adata.obsp["connectivities"]
            if self.affinity == "precomputed":
                return Affinity(C, np.arange(adata.n_obs), {"source": "anndata.obsp"}), None, adata
            return self._graph(C, "AnnData .obsp['connectivities']"), None, adata
        if self.affinity == "graph":
            raise ValueError("affinity='graph' needs an AnnData with .obsp['connectivities']")
        if adata.X is None:
            raise ValueError("the AnnData has neither .obsp['connectivities'] nor .X: nothing to embed")
        X = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
        return self._from_array(X)[0], None, adata

    # ------------------------------------------------------------------ fitting

    def _learned(self, metric, X, y):
        """Supervised affinities of the feature array ``X`` under the registered ``metric`` learned from ``y``
        (``scalemb.methods.AffinityMetric``, e.g. LiRaM LVQ); the fitted metric is kept in its
        ``fitted_attribute`` (``lvq_``)."""
        from sklearn.utils.validation import validate_data

        named = f"metric={metric.name!r}"
        if y is None:
            raise ValueError(f"{named} learns the metric from labels: call fit(X, y) with one label per row")
        if object_kind(X) != "array" or isinstance(X, tuple):
            raise ValueError(f"{named} needs a dense feature array X (points x features) with labels y")
        if self.affinity not in ("auto", "knn"):
            raise ValueError(f"{named} builds kNN affinities; affinity={self.affinity!r} does not apply")
        options = {} if self.metric_params is None else self.metric_params
        if metric.check_options is not None:
            metric.check_options(options)
        options = dict(options)
        seed = options.pop("random_state", self._seed())
        # non-finite values are left to the metric's check, which names the row and column
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2, ensure_all_finite=False, reset=True)
        if not isinstance(self.perplexity, numbers.Real) or not self.perplexity >= 1:
            raise ValueError(f"perplexity must be a number >= 1, got {self.perplexity!r}")
        n = X.shape[0]
        neighbours = default_neighbours(n, self.perplexity, self.n_neighbors)
        affinity = metric.affinity(X, y, perplexity=fitting_perplexity(self.perplexity, neighbours),
                                   n_neighbors=neighbours, random_state=seed, n_jobs=self._threads(), **options)
        if metric.fitted_attribute is not None:
            setattr(self, metric.fitted_attribute, metric.fitted(affinity))
        return affinity

    def fit(self, X=None, y=None, *, checkpoint=None, graph_affinity=None):
        """Embed ``X`` (see the module docstring for the inputs); ``y``: the labels with ``metric='liram'``,
        otherwise ignored.  ``checkpoint``: a
        ``scalemb.store.checkpointer.Checkpointer`` (as ``scalemb.embed`` uses).  ``graph_affinity``: overrides the
        parameter for this call (the earlier ``fit(data, graph_affinity)`` form)."""
        if isinstance(y, str):  # the earlier fit(data, graph_affinity) form: y is a label vector here
            raise TypeError(f"fit(X, y): y={y!r} looks like a graph affinity; pass graph_affinity={y!r} as a "
                            "keyword or set the estimator's graph_affinity")
        if isinstance(X, (np.ndarray, list)):  # scikit-learn's contract: too few samples is named first
            from sklearn.utils import check_array

            check_array(X, dtype=None, ensure_min_samples=2, ensure_all_finite=False, ensure_2d=False)

        runner = self._runner()
        runner._check()  # the settings, before any work on the input
        with reporting(not runner.quiet):  # verbose: each phase with its time (scalemb.progress)
            return self._fit(runner, X, y, checkpoint, graph_affinity)

    def _fit(self, runner, X, y, checkpoint, graph_affinity):
        self._features = self._graph_input = None
        learned = label_metric_names()
        if self.metric_params is not None and self.metric not in learned:
            raise ValueError(f"metric_params are the settings of {' or '.join(f'metric={n!r}' for n in learned)}, "
                             f"not of metric={self.metric!r}")
        if self.metric in learned:
            data, node_ids, adata = self._learned(affinity_metric(self.metric), X, y), None, None
        else:
            data, node_ids, adata = self._as_input(X, runner.spec)
        runner.features = self._features  # init 'pca' of a feature array (None for other inputs)
        runner.fit(data, graph_affinity, checkpoint=checkpoint)
        self._set_fitted(runner, data, node_ids)
        if adata is not None:
            adata.obsm[OBSM_KEY] = self.embedding_
        return self

    def transform(self, X):
        """Place new points into the fitted map, which stays fixed (``scalemb.placement``, the engine's
        placement); deterministic for a fixed ``random_state``.  Returns ``M x (ds + dt)``, one row per new
        point; the fitted state is not changed.

        * A map fitted to a feature array: ``X`` are new feature rows (M x d, the fitted width).  Each starts at
          the weighted median of its kNN among the fitted rows and is optimised on the whole map's KL with the
          fitted rows fixed.
        * A map fitted to a graph (an edge list, a networkx graph, a sparse adjacency, an AnnData graph): ``X`` is
          the new nodes' edges, an edge-list path or a networkx graph.  Each edge is undirected and may list its
          ends in either order; the end that is not a fitted node is the new one.  A networkx graph may be the
          grown graph itself: its edges between two fitted nodes are the fitted graph's and are skipped.  The
          rows follow ``transform_node_ids_`` (the new nodes, sorted).

        Raises ``NotFittedError`` before ``fit`` and ``ValueError`` for rows of another width, an edge between
        two fitted nodes in a file, or a map fitted to P, a kNN pair, distances or with metric='liram'."""
        from sklearn.utils.validation import check_is_fitted, validate_data

        check_is_fitted(self, "result_")
        if self._graph_reference() is not None:
            return self._transform_nodes(X)
        features = getattr(self, "_fitted_features", None)
        if features is None:
            raise ValueError(f"{type(self).__name__}.transform places new feature rows into a map fitted to a "
                             "feature array, or new nodes into a map fitted to a graph; this one was fitted to "
                             "an affinity, a kNN pair, distances or with metric='liram'")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        provenance = self.result_.provenance
        knn = {k: provenance.get(k) for k in ("n_neighbors", "metric", "perplexity")}
        if callable(getattr(self, "_fitted_metric", None)):  # the fit's callable (its provenance holds its name)
            knn["metric"] = self._fitted_metric
        reference = Reference("knn", affinity=self._fitted_data, features=features, knn=knn)
        placed = place_into(self.result_, X, reference, PlacementOptimizer(), seed=self._seed(),
                            n_threads=self._threads(), free_hops=0)
        return np.ascontiguousarray(placed.embedding[self.result_.node_ids.size:])

    def _graph_reference(self):
        """``(Reference, EmbeddingResult with the node ids as the user names them)`` of a map fitted to a graph,
        else None."""
        import dataclasses

        graph = getattr(self, "_fitted_graph", None)
        provenance = self.result_.provenance
        if graph is not None:
            rule = provenance.get("affinity") or self.graph_affinity
            return Reference("graph", graph=graph, rule=rule), dataclasses.replace(self.result_,
                                                                                   node_ids=np.asarray(graph.node_ids))

        kind, source = recorded_graph(provenance)
        if provenance.get("method") is None and not provenance.get("store") and \
                (kind == "dataset" or (isinstance(source, str) and Path(source).is_file())):
            return reference_of(f"{type(self).__name__} fit", provenance, self.result_.node_ids), self.result_
        return None

    def _transform_nodes(self, X):
        reference, result = self._graph_reference()
        old_ids = np.asarray(result.node_ids)
        kind = object_kind(X)
        if kind == "source" and X is not None:  # an edge-list path
            new_ids, src, dst, weight = read_new_edges(X, old_ids)
        elif kind == "networkx":
            new_ids, src, dst, weight = networkx_new_edges(X, old_ids)
        else:
            raise ValueError(f"{type(self).__name__} was fitted to a graph: transform takes the new nodes' edges, "
                             f"an edge-list path or a networkx graph, got {type(X).__name__}")
        P = extended_graph_affinity(reference.graph, reference.rule, old_ids, new_ids, src, dst, weight)
        # free_hops=0: transform is a function of the fitted map, which stays where fit put it (a free phase would
        # place the new nodes next to stored rows moved out of embedding_)
        placed, _ = place(result.model, result.space_dims, np.ascontiguousarray(result.embedding.T), P,
                          PlacementOptimizer(), self._seed(), self._threads(), free_hops=0)
        self.transform_node_ids_ = new_ids
        return np.ascontiguousarray(placed.coords.T)

    def get_feature_names_out(self, input_features=None):
        """``["tsne0", "tsne1", ...]``: the class name, lower case, and the column (as scikit-learn's
        ``ClassNamePrefixFeaturesOutMixin``), one per embedding column."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "result_")
        prefix = type(self).__name__.lower()
        return np.asarray([f"{prefix}{i}" for i in range(self.embedding_.shape[1])], dtype=object)

    def fit_transform(self, X=None, y=None, **fit_params):
        return self.fit(X, y, **fit_params).embedding_

    def _set_fitted(self, runner, data, node_ids):
        self._fitted_runner, self._fitted_data = runner, data
        self._fitted_features = getattr(self, "_features", None)
        self._fitted_graph = getattr(self, "_graph_input", None)
        self._fitted_metric = self.metric
        self.result_ = runner.result_
        self.embedding_ = self.result_.embedding
        self.kl_ = self.kl_divergence_ = self.result_.kl
        self.kl_history_ = self.result_.kl_history
        self.n_iter_ = int(self.result_.iterations)
        self.node_ids_ = self.result_.node_ids if node_ids is None else node_ids

    def optimize(self, n_iter: int, **overrides) -> "Embedder":
        """Continue the fitted embedding for ``n_iter`` more iterations with its optimiser state (gains,
        momentum, step sizes: as if the run had been asked for that many more); ``overrides`` replace fields of
        the optimiser (e.g. ``exaggeration=1.0``, ``tol=0``).  The history and the result are extended."""
        import dataclasses

        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "result_")
        if not isinstance(n_iter, numbers.Integral) or n_iter < 1:
            raise ValueError(f"n_iter must be a positive int, got {n_iter!r}")
        runner = self._fitted_runner
        optimizer = dataclasses.replace(runner.optimizer_, **overrides) if overrides else runner.optimizer_
        runner.continue_run(self._fitted_data, optimizer, int(n_iter))
        self._set_fitted(runner, self._fitted_data, self.node_ids_)
        return self


def _generated_init(cls, model: str):
    """``__init__`` of ``cls`` with the keyword-only signature of ``scalemb.params.PARAMS`` (``model``
    defaulting to ``model``), so ``get_params``/``clone`` see every setting."""
    base = Embedder.__init__

    def __init__(self, **params):
        base(self, **params)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                     default=model if name == "model" else ESTIMATOR_DEFAULTS[name])
                   for name in ESTIMATOR_NAMES]
    __init__.__signature__ = inspect.Signature(parameters)
    __init__.__qualname__ = f"{cls.__name__}.__init__"
    __init__.__doc__ = "Store the settings (see ``scalemb.params.PARAMS``); nothing is checked until ``fit``."
    cls.__init__ = __init__
    cls._model_default = model
    return cls


_generated_init(Embedder, ESTIMATOR_MODEL)


@lambda cls: _generated_init(cls, "sne")
class SNE(Embedder):
    """``Embedder`` with ``model='sne'`` (Gaussian output kernel) by default."""


@lambda cls: _generated_init(cls, "tsne")
class TSNE(Embedder):
    """``Embedder`` with ``model='tsne'`` (Student-t output kernel) by default."""


@lambda cls: _generated_init(cls, "snest")
class SNEST(Embedder):
    """``Embedder`` with ``model='snest'`` (space-time SNE, one time dimension) by default."""


@lambda cls: _generated_init(cls, "cosne")
class CoSNE(Embedder):
    """``Embedder`` with ``model='cosne'`` (CO-SNE: the Poincaré ball, hyperbolic Cauchy kernel) by default; its
    own parameters (``gamma``, ``lam1``, ``lam2``...) go in ``model_params``."""


@lambda cls: _generated_init(cls, "ee")
class ElasticEmbedding(Embedder):
    """``Embedder`` with ``model='ee'`` (the elastic embedding) by default; its ``lam`` goes in
    ``model_params``."""
