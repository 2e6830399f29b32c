"""The runner: one ``RunSpec`` in, one ``EmbeddingResult`` out.

Pipeline: input (``scalemb.run.inputs``) -> affinity P -> executor evaluating KL(P||Q) and its gradient by row
blocks (in-process threads, or Dask workers reading an affinity store) -> optimiser -> best of ``restarts`` runs.
Initialisation follows the SNEST paper's code: ``s ~ 1e-4 N(0, 1)``, ``t ~ 1e-5 N(0, 1)``; restart k uses the
random stream ``(seed, k)``.  The row-block layout depends on the data only (``layout_partitions``), so any
thread count, any number of workers, an edge list or a store written with the default partitions give the
bit-identical embedding.
"""
import time
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

import numpy as np

from ..engine import LocalExecutor
from ..engine.cluster import dask_client, resolve_client
from ..engine.distributed import DaskExecutor
from ..init import Initializer
from ..store.results import EmbeddingResult
from ..affinity.knn import from_point_distances
from ..models import get_model
from ..optim import make_optimizer, resolve_optimizer
from ..progress import Progress, phase, reporting
from .inputs import input_hash, input_reference, plan_of, resolve
from .spec import RunSpec
from ..affinity import Affinity
from ..io.atomic import file_sha256
from ..io.storage import output_target
from ..placement import PlacementOptimizer, Reference, knn_settings, place_into
from ..store.checkpoint import DEFAULT_EVERY, read_final_state
from ..store.checkpointer import Checkpointer


def _with_source_hash(provenance: dict) -> dict:
    """``provenance`` with ``source_sha256``, the SHA-256 of the file the affinity was read from (an edge list or
    a feature file; an affinity store carries its own ``content_hash``): what reads the run's input again
    (metrics, report, transform: ``scalemb.metrics.evaluate.check_source``) refuses a file changed since."""
    from pathlib import Path

    source = provenance.get("source")
    if source and "store" not in provenance and "source_sha256" not in provenance and \
            not str(source).startswith(("bundled:", "builtin:")) and Path(source).is_file():
        provenance["source_sha256"] = file_sha256(source)
    return provenance


@contextmanager
def executor_for(spec: RunSpec, plan, model, time_dims: int, client=None):
    """``(executor, node_ids, provenance)`` for the input ``plan`` (an ``InputPlan``) where ``spec`` says the run
    executes: Dask workers (``client``, the user's ``distributed.Client`` or True for the active one; else
    ``scheduler`` or ``workers``) reading an affinity store, or in-process threads.
    ``model`` None: an executor of the row-block maps and Laplacian products only (the eigenmaps)."""
    options = {"repulsion": spec.repulsion, "fft_params": spec.fft_params()}
    scheduler = spec.scheduler
    if client is not None:
        if scheduler is not None or spec.workers is not None:
            raise ValueError("client: give a Dask client, a scheduler address or a number of workers, not several")
        scheduler = resolve_client(client)
    if scheduler is None and spec.workers is None:
        affinity, partitions = plan.load()
        with LocalExecutor(affinity, model, spec.space_dims, time_dims, n_threads=spec.threads,
                           partitions=partitions, **options) as executor:
            yield executor, affinity.node_ids, _with_source_hash(dict(affinity.provenance))
        return
    with dask_client(scheduler, spec.workers) as client, plan.store() as path, \
            DaskExecutor(path, model, spec.space_dims, time_dims, client, **options) as executor:
        store = executor.store  # the metadata the executor opened; P stays on the workers
        provenance = dict(store.provenance, content_hash=store.content_hash,
                          executor="dask", scheduler=client.scheduler.address)
        if plan.store_path is not None:
            provenance["store"] = str(path)
        yield executor, store.node_ids, _with_source_hash(provenance)


def _start(initializer, seed: int, restart: int) -> np.ndarray:
    """Restart ``restart``'s start: the random stream ``(seed, restart)``."""
    return initializer.coords(np.random.default_rng([seed, restart]))


def row_blocks(executor, n: int) -> list:
    """The result's hash blocks (``scalemb.store.results``): the executor's row blocks where they are row ranges of
    the input's order (an affinity store's partitions, or the layout partitions), else one block of all rows;
    the same for either executor on the same store."""
    bounds = getattr(executor, "bounds", None)
    if getattr(executor, "point_order", "given") != "given" or not bounds:
        return [[0, int(n)]]
    return [[int(a), int(b)] for a, b in bounds]


def stop_rule(optimizer):
    """``(start, window, tol)`` of ``optimizer``'s stalled rule (``scalemb.optim.base.stalled``), from which the
    progress bar estimates the iterations a run makes; None for an optimiser without one."""
    tol, window = getattr(optimizer, "tol", None), getattr(optimizer, "window", None)
    if tol is None or window is None:
        return None
    start = optimizer._stall_start() if hasattr(optimizer, "_stall_start") else \
        getattr(optimizer, "exaggeration_iterations", 0) or 0
    return int(start), int(window), float(tol)


class Runner:
    """Runs ``spec`` on an input (``fit``), continues the best run (``continue_run``), places new points into the
    map (``transform``).  Beside the spec, the Python-only values JSON cannot hold: ``init`` (an array; else the
    spec's ``init``), ``optimizer`` (an optimiser instance; else built from the spec's optimiser settings),
    ``quiet``; and the hooks ``on_iteration(restart, iteration, kl)`` and ``stop(restart, iteration, kl,
    coords) -> bool`` (set on the instance).  After ``fit``: ``result_``, ``embedding_``, ``kl_``, ``run_`` and
    ``optimizer_`` (the best restart's run and the resolved optimiser)."""

    on_iteration = None
    stop = None
    embedding_ = property(lambda self: self.result_.embedding)  # read from the output store if the workers wrote it

    def __init__(self, spec: RunSpec, init=None, optimizer=None, quiet: bool = True, client=None):
        self.spec = spec
        self.client = client
        self.init = init if init is not None else (spec.init if spec.init is not None else "random")
        self.optimizer = optimizer
        self.quiet = quiet
        self.features = None  # the in-memory feature rows of a kNN input, for init 'pca' (a file: its provenance)

    # the spec's settings as the engine names them
    model = property(lambda self: self.spec.model)
    model_params = property(lambda self: self.spec.model_params)
    space_dims = property(lambda self: self.spec.space_dims)
    time_dims = property(lambda self: self.spec.time_dims)
    iterations = property(lambda self: self.spec.iterations)
    seed = property(lambda self: self.spec.seed)
    restarts = property(lambda self: self.spec.restarts)
    n_threads = property(lambda self: self.spec.threads)
    repulsion = property(lambda self: self.spec.repulsion)
    scheduler = property(lambda self: self.spec.scheduler)
    workers = property(lambda self: self.spec.workers)

    def _check(self):
        """``(model, time_dims)``: the model built from the spec, its dimensions and FFT support checked."""
        spec = self.spec
        try:
            model = get_model(spec.model, **(spec.model_params or {}))
        except TypeError as exc:  # a parameter name the model's make_model does not take
            raise ValueError(f"model {spec.model!r} does not take the parameters {spec.model_params!r} ({exc})") \
                from None
        time_dims = spec.time_dims if spec.time_dims is not None else model.default_time_dims()
        model.check_dims(spec.space_dims, time_dims)
        if spec.repulsion == "fft":
            model.check_fft(spec.space_dims, time_dims)
        return model, time_dims

    def _make_optimizer(self, model):
        if self.optimizer is not None and not isinstance(self.optimizer, str):
            return self.optimizer
        name = self.optimizer if isinstance(self.optimizer, str) else self.spec.optimizer
        return make_optimizer(name, model, **self.spec.optimizer_options())

    def _executor(self, data, graph_affinity: str, model, time_dims: int):
        return executor_for(self.spec, plan_of(data, graph_affinity), model, time_dims, self.client)

    def fit(self, data=None, graph_affinity: str | None = None, checkpoint=None) -> "Runner":
        """Embed ``data`` (``_fit``), its phases reported with their times unless ``quiet``
        (``scalemb.progress``)."""
        with reporting(not self.quiet):
            return self._fit(data, graph_affinity, checkpoint)

    def _fit(self, data=None, graph_affinity: str | None = None, checkpoint=None) -> "Runner":
        """Embed ``data`` (an ``InputPlan`` from ``scalemb.run.resolve``, or an input read as given).
        ``checkpoint``: a ``scalemb.store.checkpointer.Checkpointer`` that writes checkpoints into the output store (or
        continues the run stored there) and saves the result there at the end."""
        spec = self.spec
        data = plan_of(data, graph_affinity or spec.graph_affinity)
        if data.graph_affinity != spec.graph_affinity:  # the run records the graph affinity it read the input with
            spec = self.spec = spec.replace(graph_affinity=data.graph_affinity)
        model, time_dims = self._check()
        optimizer = self._make_optimizer(model)
        if checkpoint is not None and isinstance(self.init, np.ndarray):
            raise ValueError("a checkpointed run records its init: pass the init array as a .npy path")
        start = time.perf_counter()
        best = None
        restart_kls = []
        with self._executor(data, data.graph_affinity, model, time_dims) as (executor, node_ids, provenance):
            # 'auto' depends on the input's size, on whether P was made from distances between points and on the
            # budget (a schedule longer than it is shortened)
            optimizer = resolve_optimizer(optimizer, len(node_ids), from_point_distances(provenance), spec.iterations)
            repulsion = ({"method": executor.repulsion, **executor.fft_params.as_dict()}
                         if executor.repulsion in ("fft", "auto") else {"method": "exact"})
            initializer = Initializer(self.init, executor, spec.space_dims, time_dims, provenance, spec.seed,
                                      features=self.features)
            with phase("initialisation", self.init if isinstance(self.init, str) else "array"):
                initializer.layout()  # a bad init (file) fails here, before the checkpoint store is written
            resumed = None if checkpoint is None else checkpoint.start(
                spec=spec.to_json(), source=data.source, input_ref=input_reference(data.source),
                input_hash=input_hash(provenance, executor, node_ids), time_dims=time_dims, executor=executor,
                node_ids=node_ids, provenance=provenance, optimizer=optimizer, repulsion=repulsion)
            if resumed is not None:
                restart_kls, best, start = list(resumed.restart_kls), resumed.best, start - resumed.elapsed
            for k in range(0 if resumed is None else resumed.restart, spec.restarts):
                if getattr(optimizer, "derives_start", False):  # re-derived on a rewind, not kept as a copy
                    coords = partial(_start, initializer, spec.seed, k)
                else:
                    coords = _start(initializer, spec.seed, k)
                label = f"restart {k + 1}/{spec.restarts}" if spec.restarts > 1 else model.name
                budget = optimizer.budget(spec.iterations) if hasattr(optimizer, "budget") else spec.iterations
                progress = Progress(budget, label, quiet=self.quiet, value=model.objective.name.upper(),
                                    listener=None if self.on_iteration is None else partial(self.on_iteration, k),
                                    stop_rule=stop_rule(optimizer))
                extra = {} if self.stop is None else {"stop": partial(self.stop, k)}
                try:
                    if checkpoint is None:
                        run = optimizer.optimize(executor, coords, spec.iterations, callback=progress, **extra)
                    else:
                        state = resumed.state if resumed is not None and k == resumed.restart else None
                        # one restart: the workers holding the rows write the result (more: the best is chosen
                        # by the client, which holds each finished restart's coordinates)
                        hook = checkpoint.hook(k, restart_kls, best, start, final_rows=spec.restarts == 1)
                        run = optimizer.optimize(executor, coords, spec.iterations, callback=progress, state=state,
                                                 checkpoint=hook, **extra)
                except BaseException as exc:
                    progress.close(interrupted=exc)
                    raise
                progress.close(run.kl)
                restart_kls.append(run.kl)
                if best is None or run.kl < best.kl:
                    best = run
            blocks = row_blocks(executor, len(node_ids))
        self.result_ = EmbeddingResult(  # the workers wrote the embedding (``best.written``): read when asked
            embedding=None if best.coords is None else np.ascontiguousarray(best.coords.T), node_ids=node_ids,
            kl=best.kl, kl_history=best.kl_history, model=model.name, space_dims=spec.space_dims, time_dims=time_dims,
            iterations=best.iterations, seed=spec.seed, restart_kls=restart_kls,
            wall_time=time.perf_counter() - start, provenance=provenance,
            optimizer=optimizer.params(), repulsion=repulsion, seconds=best.seconds, model_params=dict(model.params),
            row_blocks=blocks)
        self.kl_ = self.result_.kl
        self.run_, self.optimizer_ = best, optimizer  # the best restart's run (its final state continues it)
        self._fit_data = data  # what transform places new points against
        if checkpoint is not None:
            checkpoint.finish(self.result_, best)
        return self

    def continue_run(self, data, optimizer, n_iter: int, graph_affinity: str | None = None,
                     verify=None) -> "Runner":
        """Continue the fitted best run on ``data`` (the input ``fit`` had) for ``n_iter`` more iterations from
        its final optimiser state, with ``optimizer`` (the fitted one, or a copy with changed settings);
        ``verify(executor, node_ids, provenance)``, if given, checks the input before any iteration."""
        model, time_dims = self._check()
        if getattr(optimizer, "max_iterations", None) is not None:  # asked for n_iter more: past the budget
            optimizer = replace(optimizer, max_iterations=None)
        previous = self.result_
        state = self.run_.state
        if getattr(self.run_, "written", None) is not None:  # the workers wrote its arrays into the result's store

            state = read_final_state(previous.__dict__["_store"])[1]
        total = int(state.iteration) + int(n_iter)
        start = time.perf_counter()
        with self._executor(data, graph_affinity or self.spec.graph_affinity, model, time_dims) as \
                (executor, node_ids, provenance):
            if verify is not None:
                verify(executor, node_ids, provenance)
            progress = Progress(total, model.name, quiet=self.quiet, value=model.objective.name.upper(),
                                stop_rule=stop_rule(optimizer))
            extra = {} if self.stop is None else {"stop": partial(self.stop, 0)}
            try:
                run = optimizer.optimize(executor, None, total, callback=progress, state=state, **extra)
            except BaseException as exc:
                progress.close(interrupted=exc)
                raise
            progress.close(run.kl)
            blocks = row_blocks(executor, len(node_ids))
        restart_kls = [run.kl if kl == previous.kl else kl for kl in previous.restart_kls]
        self.result_ = EmbeddingResult(
            embedding=np.ascontiguousarray(run.coords.T), node_ids=node_ids, kl=run.kl, kl_history=run.kl_history,
            model=model.name, space_dims=self.spec.space_dims, time_dims=time_dims, iterations=run.iterations,
            seed=self.spec.seed, restart_kls=restart_kls, wall_time=previous.wall_time + time.perf_counter() - start,
            provenance=provenance, optimizer=optimizer.params(), repulsion=previous.repulsion, seconds=run.seconds,
            model_params=dict(model.params), row_blocks=blocks)
        self.kl_ = self.result_.kl
        self.run_, self.optimizer_ = run, optimizer
        return self

    def fit_transform(self, data=None, graph_affinity: str | None = None) -> np.ndarray:
        return self.fit(data, graph_affinity).embedding_

    def transform(self, new, reference=None, iterations: int | None = None, free_hops: int | None = None,
                  free_iterations: int | None = None) -> np.ndarray:
        """Place new nodes or points into the fitted map (``scalemb.placement``; ``None``: its defaults; with
        ``free_hops > 0``, the default for new graph nodes, the stored points within that many edges of a new one
        move in a second phase of at most ``free_iterations`` iterations: ``transform_result_`` holds the moved
        rows); returns
        their coordinates, ``M x (ds + dt)``.  ``new``: an edge-list path (``NEW_ID OTHER_ID [weight]``) for
        graph inputs, feature rows (array or path) for kNN inputs.  ``reference``: the reference feature rows
        when the fit input was an in-memory kNN ``Affinity`` (otherwise the provenance names them).  The whole
        map, old rows first: ``transform_result_``."""

        if not hasattr(self, "result_"):
            raise ValueError("fit the Embedder before transform")
        placement = None
        if reference is not None:
            data = getattr(self, "_fit_data", None)
            affinity = data if isinstance(data, Affinity) else plan_of(data).load()[0]
            placement = Reference("knn", affinity=affinity, features=np.asarray(reference, dtype=np.float64),
                                  knn=knn_settings(self.result_.provenance))
        free = {} if free_iterations is None else {"free_iterations": free_iterations}
        self.transform_result_ = place_into(self.result_, new, placement, PlacementOptimizer(iterations=iterations),
                                            seed=self.spec.seed, n_threads=self.spec.threads, free_hops=free_hops,
                                            **free)
        return self.transform_result_.embedding[self.result_.node_ids.size:]


def run(spec: RunSpec, source=None, out=None, checkpoint_every: int | None = None, overwrite: bool = False,
        front: str = "python", **extra) -> EmbeddingResult:
    """Run ``spec`` on ``source`` (resolved by ``scalemb.run.resolve``) and return the result; with ``out`` the
    run keeps checkpoints there (every ``checkpoint_every`` iterations, 0: only on SIGINT/SIGTERM, which then
    raise ``RunInterrupted``; ``scalemb.resume(out)`` continues) and the result is saved there at the end.  An
    object-storage URL ``out`` is written on local disk (checkpoints included) and published there once the run
    is done (``scalemb.io.storage.output_target``): an interrupted run publishes nothing.
    ``extra``: the ``Runner``'s Python-only values (``init``, ``optimizer``, ``quiet``)."""

    runner = Runner(spec, **extra)
    runner._check()
    with reporting(not runner.quiet):
        plan = resolve(source, spec, front)
        if out is None:
            return runner.fit(plan).result_
        every = DEFAULT_EVERY if checkpoint_every is None else checkpoint_every
        with output_target(out, overwrite) as target, \
                Checkpointer(target, every=every, overwrite=overwrite) as checkpoint:
            return held_in_memory(runner.fit(plan, checkpoint=checkpoint).result_, target != out)


def held_in_memory(result: EmbeddingResult, staged: bool) -> EmbeddingResult:
    """``result``, its embedding read now if the workers wrote it into a ``staged`` local copy of an
    object-storage output, which is removed once published (``io.storage.output_target``)."""
    if staged:
        result.embedding  # noqa: B018 - the read is the point
    return result
