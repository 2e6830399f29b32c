"""The user-facing estimator: ``Embedder`` (scikit-learn style) and the ``embed`` function.

Pipeline: input -> ``Affinity`` P -> executor evaluating KL(P||Q) and its gradient by row blocks ->
optimiser -> best of ``restarts`` runs.  Initialisation follows the SNEST paper's code:
``s ~ 1e-4 N(0, 1)``, ``t ~ 1e-5 N(0, 1)``; restart k uses the random stream ``(seed, k)``.
"""
import time
from functools import partial
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ._version import __version__
from .affinity import Affinity, AffinityStore, coauthorship_affinity, is_affinity_store, normalized_affinity
from .datasets import DATASETS, load_dataset
from .engine import LocalExecutor
from .engine.cluster import affinity_store_for, dask_client
from .engine.distributed import DaskExecutor
from .init import Initializer, check_init
from .io.edgelist import read_edge_list
from .io.checkpoint import DEFAULT_EVERY as DEFAULT_CHECKPOINT_EVERY, Checkpointer
from .io.results import read_result, write_result
from .models import DEFAULT_MODEL, get_model
from .optim import make_optimizer, resolve_optimizer
from .progress import Progress
from .repulsion import REPULSION_METHODS, FFTParams

GRAPH_AFFINITIES = ("coauthorship", "normalized")


@dataclass
class EmbeddingResult:
    """A finished embedding: ``embedding`` is N x (ds + dt), space columns first, rows in ``node_ids`` order."""

    embedding: np.ndarray
    node_ids: np.ndarray
    kl: float
    kl_history: np.ndarray
    model: str
    space_dims: int
    time_dims: int
    iterations: int
    seed: int
    restart_kls: list = field(default_factory=list)
    wall_time: float = 0.0
    provenance: dict = field(default_factory=dict)
    optimizer: dict = field(default_factory=dict)
    repulsion: dict = field(default_factory=dict)  # {"method": "exact"} or {"method": "fft", **FFTParams}
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # wall time at each kl_history entry
    model_params: dict = field(default_factory=dict)  # the model is get_model(model, **model_params)

    def attrs(self) -> dict:
        attrs = {"model": self.model, "space_dims": self.space_dims, "time_dims": self.time_dims,
                 "iterations": self.iterations, "kl": self.kl, "seed": self.seed,
                 "restarts": len(self.restart_kls), "restart_kls": self.restart_kls,
                 "wall_time_s": self.wall_time, "scalemb_version": __version__,
                 "provenance": self.provenance, "optimizer": self.optimizer, "repulsion": self.repulsion}
        if self.model_params:  # models without parameters keep the attributes they always had
            attrs["model_params"] = self.model_params
        return attrs

    def save(self, path, overwrite: bool = False) -> Path:
        """Write the result as a Zarr v3 group (see ``scalemb.io.results``)."""
        return write_result(path, {"embedding": self.embedding, "node_ids": self.node_ids,
                                   "kl_history": self.kl_history}, self.attrs(), overwrite=overwrite)

    @classmethod
    def load(cls, path) -> "EmbeddingResult":
        arrays, attrs = read_result(path)
        return cls(arrays["embedding"], arrays["node_ids"], attrs["kl"], arrays["kl_history"], attrs["model"],
                   attrs["space_dims"], attrs["time_dims"], attrs["iterations"], attrs["seed"],
                   attrs.get("restart_kls", []), attrs.get("wall_time_s", 0.0), attrs.get("provenance", {}),
                   attrs.get("optimizer", {}), attrs.get("repulsion", {}), model_params=attrs.get("model_params", {}))


def load_affinity(data=None, graph_affinity: str = "coauthorship") -> Affinity:
    """Resolve an input: ``None`` (bundled GrQc), a built-in dataset name, an affinity store (Zarr), an
    edge-list path or an ``Affinity``."""
    if data is None:
        return load_dataset("grqc")
    if isinstance(data, Affinity):
        return data
    if isinstance(data, str) and data in DATASETS and not Path(data).exists():
        return load_dataset(data)
    if is_affinity_store(data):
        return AffinityStore(data).to_affinity()
    if graph_affinity not in GRAPH_AFFINITIES:
        raise ValueError(f"unknown graph affinity {graph_affinity!r}; choose one of {GRAPH_AFFINITIES}")
    graph = read_edge_list(data)
    return coauthorship_affinity(graph) if graph_affinity == "coauthorship" else normalized_affinity(graph)


def _with_source_hash(provenance: dict) -> dict:
    """``provenance`` with ``source_sha256``, the SHA-256 of the file the affinity was read from (an edge list or
    a feature file; an affinity store carries its own ``content_hash``): what reads the run's input again
    (metrics, report, transform: ``scalemb.metrics.evaluate.check_source``) refuses a file changed since."""
    from .io.atomic import file_sha256

    source = provenance.get("source")
    if source and "store" not in provenance and "source_sha256" not in provenance and \
            not str(source).startswith(("bundled:", "builtin:")) and Path(source).is_file():
        provenance["source_sha256"] = file_sha256(source)
    return provenance


def initial_coords(n_points: int, space_dims: int, time_dims: int, rng: np.random.Generator) -> np.ndarray:
    """Small random start, ``(ds + dt, N)``: space 1e-4 N(0,1), time 1e-5 N(0,1) (``scalemb.init``)."""
    from .init import random_coords

    return random_coords(n_points, space_dims, time_dims, rng)


class Embedder:
    """SNE-family embedding estimator.

    Parameters: ``model`` (a name of ``scalemb.models.MODEL_NAMES``, e.g. 'sne', 'tsne', 'snest', or a
    ``Model``), ``model_params`` (a dict: the model is ``get_model(model, **model_params)``), ``space_dims``,
    ``time_dims`` (default 1 for a model with time, else 0), ``iterations`` (maximum per restart), ``seed``,
    ``restarts`` (best KL kept), ``optimizer`` (a name, 'auto', 'dbd', 'sd' or 'gd', or an optimiser instance;
    'auto' is the model's ``default_optimizer``), ``n_threads``, ``quiet``,
    ``repulsion`` ('auto', 'exact' or 'fft': all pairs, or FFT-accelerated interpolation with ``fft_params``, a
    ``scalemb.repulsion.FFTParams``; 'auto' takes fft from the N measured in ``scalemb.repulsion.method``).
    Where it runs: in-process threads (default); ``scheduler`` (``'tcp://host:8786'``) an existing Dask
    cluster; ``workers`` a LocalCluster of that many processes started for the run.  On Dask the workers read
    their row partitions from an affinity store: a store input is used as is (it must be on storage the
    workers see), other inputs are written to a temporary store with the data-determined row-block layout
    (``scalemb.affinity.store.layout_partitions``) that in-process runs use too: any thread count, any number of
    workers, an edge list or a store written with the default partitions give the bit-identical embedding.
    After ``fit``: ``embedding_`` (N x (ds + dt)), ``kl_``, ``result_`` (an ``EmbeddingResult``).
    ``on_iteration``: optional ``f(restart, iteration, kl)`` called after every iteration (set it on the instance).
    ``init``: the start (``scalemb.init``): 'random', 'spectral' (graph eigenmap of P, openTSNE's scaling), 'pca'
    (kNN inputs built from a feature file) or a ``.npy`` path / array of shape (N, ds) or (N, ds + dt).
    ``model_params``: the named model's constructor parameters, ``get_model(model, **model_params)`` (e.g.
    ``{'lam': 0.5}`` for 'ee'; the CLI's ``--model-param NAME=VALUE``, the service's ``model_params``).
    """

    on_iteration = None
    stop = None  # optional f(restart, iteration, kl, coords) -> bool: True ends that restart's run there

    def __init__(self, model=DEFAULT_MODEL, space_dims: int = 2, time_dims: int | None = None,
                 iterations: int = 5000, seed: int = 0, restarts: int = 1, optimizer="auto",
                 n_threads: int | None = None, quiet: bool = True, repulsion: str = "auto",
                 fft_params: FFTParams | None = None, scheduler: str | None = None, workers: int | None = None,
                 init="random", model_params: dict | None = None):
        if not isinstance(model, str) and model is not None:  # a Model: recorded (checkpoints) by name and params
            model_params = {**model.params, **(model_params or {})}
            model = model.name
        self.model = model
        self.model_params = model_params
        self.space_dims = space_dims
        self.time_dims = time_dims
        self.iterations = iterations
        self.seed = seed
        self.restarts = restarts
        self.optimizer = optimizer
        self.n_threads = n_threads
        self.quiet = quiet
        self.repulsion = repulsion
        self.fft_params = fft_params
        self.scheduler = scheduler
        self.workers = workers
        self.init = init

    def _check(self):
        try:
            model = get_model(self.model, **(self.model_params or {}))
        except TypeError as exc:  # a parameter name the model's make_model does not take
            raise ValueError(f"model {self.model!r} does not take the parameters {self.model_params!r} ({exc})") \
                from None
        time_dims = self.time_dims if self.time_dims is not None else model.default_time_dims()
        model.check_dims(self.space_dims, time_dims)
        if int(self.iterations) < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if int(self.restarts) < 1:
            raise ValueError(f"restarts must be >= 1, got {self.restarts}")
        if not 0 <= int(self.seed) < 2 ** 32:
            raise ValueError(f"seed must be in 0..2^32-1, got {self.seed}")
        if self.repulsion not in REPULSION_METHODS:
            raise ValueError(f"unknown repulsion {self.repulsion!r}; choose one of {', '.join(REPULSION_METHODS)}")
        if self.repulsion == "fft":
            model.check_fft(self.space_dims, time_dims)
        check_init(self.init)
        return model, time_dims

    @contextmanager
    def _executor(self, data, graph_affinity: str, model, time_dims: int):
        """``(executor, node_ids, provenance)`` for ``data``: Dask workers or in-process threads."""
        options = {"repulsion": self.repulsion, "fft_params": self.fft_params}
        is_store = isinstance(data, (str, Path)) and is_affinity_store(data)
        if self.scheduler is None and self.workers is None:
            if is_store:
                store = AffinityStore(data)
                affinity, partitions = store.to_affinity(), store.partitions
            else:
                affinity, partitions = load_affinity(data, graph_affinity), None
            with LocalExecutor(affinity, model, self.space_dims, time_dims, n_threads=self.n_threads,
                               partitions=partitions, **options) as executor:
                yield executor, affinity.node_ids, _with_source_hash(dict(affinity.provenance))
            return
        with dask_client(self.scheduler, self.workers) as client, \
                affinity_store_for(data, graph_affinity, None, load_affinity) as path, \
                DaskExecutor(path, model, self.space_dims, time_dims, client, **options) as executor:
            store = executor.store  # the metadata the executor opened; P stays on the workers
            provenance = dict(store.provenance, content_hash=store.content_hash,
                              executor="dask", scheduler=client.scheduler.address)
            if is_store:
                provenance["store"] = str(path)
            yield executor, store.node_ids, _with_source_hash(provenance)

    def fit(self, data=None, graph_affinity: str = "coauthorship", checkpoint=None) -> "Embedder":
        """Embed ``data``.  ``checkpoint``: a ``scalemb.io.checkpoint.Checkpointer`` that writes checkpoints
        into the output store (or continues the run stored there) and saves the result there at the end."""
        model, time_dims = self._check()
        if graph_affinity not in GRAPH_AFFINITIES:
            raise ValueError(f"unknown graph affinity {graph_affinity!r}; choose one of {GRAPH_AFFINITIES}")
        optimizer = (make_optimizer(self.optimizer, model) if isinstance(self.optimizer, str)
                     else self.optimizer)
        if checkpoint is not None and isinstance(self.init, np.ndarray):
            raise ValueError("a checkpointed run records its init: pass the init array as a .npy path")
        start = time.perf_counter()
        best = None
        restart_kls = []
        with self._executor(data, graph_affinity, model, time_dims) as (executor, node_ids, provenance):
            optimizer = resolve_optimizer(optimizer, len(node_ids))  # 'auto' depends on the input's size
            repulsion = ({"method": executor.repulsion, **executor.fft_params.as_dict()}
                         if executor.repulsion in ("fft", "auto") else {"method": "exact"})
            initializer = Initializer(self.init, executor, self.space_dims, time_dims, provenance, self.seed)
            initializer.layout()  # a bad init (file) fails here, before the checkpoint store is written
            resumed = None if checkpoint is None else checkpoint.start(
                embedder=self, data=data, graph_affinity=graph_affinity, time_dims=time_dims, executor=executor,
                node_ids=node_ids, provenance=provenance, optimizer=optimizer, repulsion=repulsion)
            if resumed is not None:
                restart_kls, best, start = list(resumed.restart_kls), resumed.best, start - resumed.elapsed
            for k in range(0 if resumed is None else resumed.restart, self.restarts):
                rng = np.random.default_rng([self.seed, k])
                coords = initializer.coords(rng)
                label = f"restart {k + 1}/{self.restarts}" if self.restarts > 1 else model.name
                budget = optimizer.budget(self.iterations) if hasattr(optimizer, "budget") else self.iterations
                progress = Progress(budget, label, quiet=self.quiet, value=model.objective.name.upper(),
                                    listener=None if self.on_iteration is None else partial(self.on_iteration, k))
                extra = {} if self.stop is None else {"stop": partial(self.stop, k)}
                try:
                    if checkpoint is None:
                        run = optimizer.optimize(executor, coords, self.iterations, callback=progress, **extra)
                    else:
                        state = resumed.state if resumed is not None and k == resumed.restart else None
                        run = optimizer.optimize(executor, coords, self.iterations, callback=progress, state=state,
                                                 checkpoint=checkpoint.hook(k, restart_kls, best, start), **extra)
                finally:
                    progress.close()
                restart_kls.append(run.kl)
                if best is None or run.kl < best.kl:
                    best = run
        self.result_ = EmbeddingResult(
            embedding=np.ascontiguousarray(best.coords.T), node_ids=node_ids, kl=best.kl,
            kl_history=best.kl_history, model=model.name, space_dims=self.space_dims, time_dims=time_dims,
            iterations=best.iterations, seed=self.seed, restart_kls=restart_kls,
            wall_time=time.perf_counter() - start, provenance=provenance,
            optimizer=optimizer.params(), repulsion=repulsion, seconds=best.seconds, model_params=dict(model.params))
        self.embedding_ = self.result_.embedding
        self.kl_ = self.result_.kl
        self.run_, self.optimizer_ = best, optimizer  # the best restart's run (its final state continues it)
        self._fit_data = data  # what transform places new points against
        if checkpoint is not None:
            checkpoint.finish(self.result_, best)
        return self

    def continue_run(self, data, optimizer, n_iter: int, graph_affinity: str = "coauthorship",
                     verify=None) -> "Embedder":
        """Continue the fitted best run on ``data`` (the input ``fit`` had) for ``n_iter`` more iterations from
        its final optimiser state, with ``optimizer`` (the fitted one, or a copy with changed settings);
        ``verify(executor, node_ids, provenance)``, if given, checks the input before any iteration."""
        model, time_dims = self._check()
        if getattr(optimizer, "max_iterations", None) is not None:  # asked for n_iter more: past the budget
            optimizer = replace(optimizer, max_iterations=None)
        previous = self.result_
        state = self.run_.state
        total = int(state.iteration) + int(n_iter)
        start = time.perf_counter()
        with self._executor(data, graph_affinity, model, time_dims) as (executor, node_ids, provenance):
            if verify is not None:
                verify(executor, node_ids, provenance)
            progress = Progress(total, model.name, quiet=self.quiet, value=model.objective.name.upper())
            extra = {} if self.stop is None else {"stop": partial(self.stop, 0)}
            try:
                run = optimizer.optimize(executor, None, total, callback=progress, state=state, **extra)
            finally:
                progress.close()
        restart_kls = [run.kl if kl == previous.kl else kl for kl in previous.restart_kls]
        self.result_ = EmbeddingResult(
            embedding=np.ascontiguousarray(run.coords.T), node_ids=node_ids, kl=run.kl, kl_history=run.kl_history,
            model=model.name, space_dims=self.space_dims, time_dims=time_dims, iterations=run.iterations,
            seed=self.seed, restart_kls=restart_kls, wall_time=previous.wall_time + time.perf_counter() - start,
            provenance=provenance, optimizer=optimizer.params(), repulsion=previous.repulsion, seconds=run.seconds,
            model_params=dict(model.params))
        self.embedding_, self.kl_ = self.result_.embedding, self.result_.kl
        self.run_, self.optimizer_ = run, optimizer
        return self

    def fit_transform(self, data=None, graph_affinity: str = "coauthorship") -> np.ndarray:
        return self.fit(data, graph_affinity).embedding_

    def transform(self, new, reference=None, iterations: int = 300, free_hops: int = 0,
                  free_iterations: int = 30) -> np.ndarray:
        """Place new nodes or points into the fitted map, which stays fixed (``scalemb.placement``; with
        ``free_hops > 0`` the stored points within that many edges of a new one move in a second phase of at
        most ``free_iterations`` iterations: ``transform_result_`` holds the moved rows); returns
        their coordinates, ``M x (ds + dt)``.  ``new``: an edge-list path (``NEW_ID OTHER_ID [weight]``) for
        graph inputs, feature rows (array or path) for kNN inputs.  ``reference``: the reference feature rows
        when the fit input was an in-memory kNN ``Affinity`` (otherwise the provenance names them).  The whole
        map, old rows first: ``transform_result_``."""
        from .placement import PlacementOptimizer, Reference, place_into

        if not hasattr(self, "result_"):
            raise ValueError("fit the Embedder before transform")
        placement = None
        if reference is not None:
            data = getattr(self, "_fit_data", None)
            affinity = data if isinstance(data, Affinity) else load_affinity(data)
            placement = Reference("knn", affinity=affinity, features=np.asarray(reference, dtype=np.float64),
                                  knn={k: self.result_.provenance.get(k) for k in ("n_neighbors", "metric",
                                                                                   "perplexity", "lvq")})
        self.transform_result_ = place_into(self.result_, new, placement, PlacementOptimizer(iterations=iterations),
                                            seed=self.seed, n_threads=self.n_threads, free_hops=free_hops,
                                            free_iterations=free_iterations)
        return self.transform_result_.embedding[self.result_.node_ids.size:]


def embed(data=None, out=None, checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY, overwrite: bool = False,
          **kwargs) -> EmbeddingResult:
    """Embed ``data`` (see ``load_affinity``) and return an ``EmbeddingResult`` (``.embedding``, ``.kl``).

    Keyword arguments are ``Embedder``'s, plus ``graph_affinity`` for edge-list inputs.  With ``out`` the run
    keeps checkpoints there (every ``checkpoint_every`` iterations, 0: only on SIGINT/SIGTERM, which then
    raise ``RunInterrupted``; ``scalemb.resume(out)`` continues) and the result is saved there at the end.
    """
    graph_affinity = kwargs.pop("graph_affinity", "coauthorship")
    if out is None:
        return Embedder(**kwargs).fit(data, graph_affinity).result_
    with Checkpointer(out, every=checkpoint_every, overwrite=overwrite) as checkpoint:
        return Embedder(**kwargs).fit(data, graph_affinity, checkpoint=checkpoint).result_
