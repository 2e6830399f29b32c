"""Dask executor: the row-block kernels on Dask workers that keep their partitions of P resident.

Same interface and same numbers as ``LocalExecutor`` given the same row blocks: the optimiser cannot tell
them apart.

* **Partitions.**  Partition ``k`` of the affinity store (``AffinityStore.partitions``) is read by a task
  pinned to its worker (``AffinityStore.read_rows``: only that partition's chunks); the client reads
  the store's metadata only.  The executor holds the partitions' futures, so they stay in worker memory for
  the whole run; no graph is rebuilt and nothing is reloaded per iteration.
* **Placement.**  Partition ``k`` of K goes to worker ``k W / K``: contiguous runs of partitions per worker,
  whose rows share columns, so the workers' halos are smaller than with partitions dealt round robin.
* **Halo exchange** (``scalemb.engine.halo``, the default; ``halo=False`` turns it off).  Per evaluation the
  client sends each worker only its own rows of Y (N·d numbers in all); each worker receives the rows of its
  halo from the workers that own them.  With FFT repulsion each worker visits its own rows in box order once and
  spreads their charges (fixed point: partial grids sum exactly in any order) and computes their attraction
  while the grids are summed on, and the convolution is split among, up to as many workers as it has shares
  (its potential columns, or time components); each worker then interpolates its own rows from all the shares
  (``_halo_partials``).  The curvature
  weights use the same exchange; a Laplacian product of the spectral direction is one task round instead (the
  client sends each worker its own rows and its halo of V: ``laplacian_matvec``).  The exact all-pairs
  repulsion and a capped FFT grid (whose near field reads every point) still send all of Y to every worker,
  as one scattered key *per worker*: a single ``scatter(..., broadcast=True)`` key would be thinned out by the
  Active Memory Manager's ReduceReplicas policy, after which tasks fetch it again from the one remaining holder.
* **Reduction.**  One task per partition runs next to its block; partials are gathered in partition order
  and reduced by the same functions as the local executor (``reduce_blocks``), so the result is identical
  for any number of workers and equals ``LocalExecutor(..., blocks=store partitions)`` bit for bit.
* **Spectral direction.**  The curvature weights C of each partition stay on its worker
  (``set_curvature``); ``laplacian_matvec`` is a row-block product there; the sparse factorisation of
  ``L(C) + mu I`` is built and kept on one worker (``factorize_curvature``), so the client never holds P; its
  solves are pinned to that worker, and it pickles as its inputs (``dask_factor.WorkerFactor``: scipy's SuperLU
  cannot be pickled), so a move by the scheduler costs a refactorisation, never a transfer retried for ever.
* **Faults.**  A partition whose worker died is recomputed from the store by the scheduler on a live worker
  (its future keeps the lineage).  Scattered coordinates and curvature weights on the dead worker are lost,
  so the call is repeated after planning the halos for the new placement and recomputing the curvature at the
  coordinates it was last set at (same numbers, same result), at most ``retries`` times.  A future the scheduler
  cancelled (a key forgotten, a dependency lost with a worker) is such a fault too, whether it surfaces in a
  call, in the recovery itself (which then starts again) or under the curvature factorisation (built again); a
  task's own error is raised at once.  A lost scheduler raises ``SchedulerLostError``.

The executor's halo exchange is ``engine.dask_halo.HaloExchange`` and its fault handling
``engine.dask_recovery.DaskRecovery``, both inherited; this module holds its set-up, the per-call helpers, the
curvature and the Laplacian products.
"""
import contextlib
import hashlib
import operator
import uuid

import dask
import numpy as np

from ..affinity.affinity import RowBlock
from ..affinity.store import AffinityStore
from ..errors import InputError, ScalembError
from .faults import SchedulerLostError, WorkersLostError  # noqa: F401 - re-exported: where callers import them
from ..models import model_ref
from ..repulsion.spec import FFTParams
from . import halo as halo_fns
from .base import Executor
from .dask_factor import RemoteFactorization
from .dask_graph import TaskGraph
from .dask_halo import HaloExchange, array_bytes
from .dask_recovery import RECOVERY_TIMEOUT, DaskRecovery, load_partition
from .dask_keys import task_key
from .held import LocalHeld
from .held_dask import DaskHeld


# --------------------------------------------------------------------------- functions run on the workers

def run_partitions(fn, arguments: list) -> list:
    """``[fn(*args) for args in arguments]``: one worker's partitions in one task."""
    return [fn(*args) for args in arguments]


def entropy_partition(block: RowBlock) -> float:
    return block.entropy_term()


# ------------------------------------------------------------------------------------------------ client

class DaskExecutor(DaskRecovery, HaloExchange, Executor):
    """Evaluates a model's objective and its gradient with P's row partitions resident on Dask workers.

    ``store``: an affinity store path (``scalemb affinity``); its partitions are the row blocks.  ``client``:
    a ``distributed.Client``.  ``repulsion``/``fft_params`` and the coordinate layout and every method are
    those of ``LocalExecutor`` (``scalemb.engine.base.Executor``).  ``halo``: exchange halos among the workers
    (module docstring); False: send all of Y to every worker and spread the charges on the client (kept for
    measurements, ``benchmarks/halo_traffic.py``).  ``stats``: calls, payload bytes sent to and gathered from
    the workers, bytes between workers (halo pieces, grids, potentials), evaluations by halo, recoveries.
    The workers get the model as a ``ModelRef`` (``models.model_ref(model)``: name, parameters, and where a
    registered model was defined) and rebuild it once per process.
    """

    def __init__(self, store, model, space_dims: int, time_dims: int, client, retries: int = 3,
                 repulsion: str = "exact", fft_params: FFTParams | None = None, halo: bool = True,
                 recovery_timeout: float = RECOVERY_TIMEOUT):
        if model is not None:
            model.check_dims(space_dims, time_dims)
        self.store = AffinityStore(store)
        self.store.verify_hash()
        self._setup(model, space_dims, time_dims, self.store.n_points, repulsion, fft_params,
                    None if model is None else model_ref(model))
        self.client = client
        self.retries = retries
        self.recovery_timeout = float(recovery_timeout)
        bounds = self.store.partitions
        self.partitions = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self.bounds = self.partitions
        self._scattered = {}
        self._graph = None  # a graph being collected (``_one_graph``)
        self.halo = bool(halo)
        self._halo = None  # (HaloLayout, {worker: view future}, {(v, w): needs future}) for the current holders
        self._plan_shares, self._full = {}, None  # the workers' plan shares (futures); the plan with its arrays
        self.stats = {"calls": 0, "bytes_sent": 0, "bytes_received": 0, "bytes_between_workers": 0,
                      "halo_evaluations": 0, "recoveries": 0, "waits": 0}
        self._holders = []
        workers = sorted(self._run(lambda: client.scheduler_info()["workers"]))
        if not workers:  # e.g. restarting after a loss: wait for one, as a recovery would
            try:
                self._run(lambda: client.wait_for_workers(1, timeout=min(self.recovery_timeout, 30.0)))
            except TimeoutError:
                raise WorkersLostError(f"the Dask cluster at {client.scheduler.address} has no workers") from None
            workers = sorted(self._run(lambda: client.scheduler_info()["workers"]))
        path = str(self.store.path.resolve())
        # keys name the store's content, its path and this executor: two runs on one store in one process (the
        # service's concurrent jobs) sharing keys deadlocked in set_curvature, so each run loads its own rows
        token = f"{(self.store.content_hash or '')[:16]}-{hashlib.sha1(path.encode()).hexdigest()[:12]}-" \
                f"{uuid.uuid4().hex[:8]}"
        self._path, self._token, self._reloads = path, token, 0
        # every task of this run in one Dask span ("scalemb <token>" on the dashboard): left to Dask, each idle
        # moment opens a new default span, and a worker keeps every span's task statistics (``_forget_span_metrics``)
        # -- ~70 keys an iteration, measured, which grew a worker's memory over a long run
        self._span = {"name": (f"scalemb {token}",), "ids": (str(uuid.uuid4()),)}
        # contiguous runs of partitions per worker: neighbouring rows share columns, so a worker's halo is
        # smaller than with the partitions dealt round robin (placement never changes a result)
        n_parts = len(self.partitions)
        self._blocks = [self._task(load_partition, path, r0, r1, key=f"scalemb-P-{token}-{k}",
                                   workers=[workers[k * len(workers) // n_parts]], allow_other_workers=True)
                        for k, (r0, r1) in enumerate(self.partitions)]
        # the workers chosen count as the holders until the partitions are loaded: one of them leaving while they
        # load is a worker loss like any other (recovered: ``_run``), not a wait for tasks left ``no-worker``
        self._holders = [workers[k * len(workers) // n_parts] for k in range(n_parts)]
        try:
            self._holders = self._run(self._wait_for_partitions)
        except SchedulerLostError:
            raise
        except InputError as exc:  # the store's structure, checked where a partition is read
            self.close()
            raise InputError(exc.path, exc.reason, exc.line) from None
        except Exception as exc:  # noqa: BLE001 - whatever the workers' read raised
            self.close()
            raise ScalembError(f"the Dask workers could not read the affinity store {path} "
                               f"({exc.__class__.__name__}: {exc}); it must be on storage every worker sees "
                               "(write one with `scalemb affinity`)") from None
        self._entropy = sum(self._run(lambda: self._per_partition(entropy_partition, self._blocks)))

    @property
    def n_points(self) -> int:
        return self.store.n_points

    # --- per-call helpers

    def _scatter(self, value) -> list:
        """``value`` (an array, or an object holding arrays) sent once to each worker holding partitions: the
        future to use for each partition."""
        holders = [h for h in self._holders if h is not None]
        by_worker = {w: self.client.scatter(value, workers=[w], hash=False) for w in sorted(set(holders))}
        self.stats["bytes_sent"] += array_bytes(value) * len(by_worker)
        fallback = next(iter(by_worker.values()))
        return [by_worker.get(h, fallback) for h in self._holders]

    def _ship(self, args) -> list:
        """Per argument, its value for each partition: arguments holding more than 16 KB of arrays are sent once
        to each worker (the same object passed again within one call reuses its scatter); small ones travel with
        the tasks."""
        shipped = []
        for arg in args:
            if array_bytes(arg) > 1 << 14:
                key = id(arg)
                if key not in self._scattered:
                    self._scattered[key] = (arg, self._scatter(arg))
                shipped.append(self._scattered[key][1])
            else:
                shipped.append([arg] * len(self._blocks))
        return shipped

    def map_blocks(self, fn, *args) -> list:
        """``[fn(block_k, *args) for every partition k]`` on the partitions' workers, in partition order."""
        return self._per_partition(fn, self._blocks, *self._ship(args))

    def _keep(self, fn, *args) -> list:
        """``fn(block_k, *args)`` for every partition k, left on the partition's worker: their futures (a failure
        surfaces here, not in a later use)."""
        shipped = self._ship(args)
        with self._one_graph():
            futures = [self._task(fn, b, *[values[k] for values in shipped], workers=[h] if h else None,
                                  allow_other_workers=True)
                       for k, (b, h) in enumerate(zip(self._blocks, self._holders))]
        self._settle(futures)
        return futures

    def _settle(self, futures) -> None:
        """Wait for ``futures`` to finish where they run and raise the first failure (a failure surfaces here,
        not in a later use), without bringing their values to the client (``Future.exception`` waits and fetches
        only an error; no module-level ``distributed`` import: ``benchmarks/distributed.py`` would shadow it)."""
        self._wait_for(futures)
        for f in futures:
            if f.exception() is not None:
                f.result()  # raises the task's error

    def _map_kept(self, fn, kept, *args) -> list:
        """``fn(block_k, kept_k, *args)`` next to partition k, gathered in partition order."""
        return self._per_partition(fn, self._blocks, kept, *self._ship(args))

    def _call(self, fn):
        """``fn()`` under the fault handling (``_run``), with this call's scatters forgotten before and after."""
        def attempt():
            self._scattered = {}
            try:
                return fn()
            finally:
                self._scattered = {}

        return self._run(attempt)

    def _per_partition(self, fn, *per_partition_args) -> list:
        """``fn(arg_k...)`` next to partition k for every k, gathered in partition order: one task per worker
        per call, running that worker's partitions in turn (measured, t-SNE fft at N = 2e5, 8 partitions on
        2 workers: 0.20 s per evaluation with a task per partition, 0.175 s batched)."""
        self.stats["calls"] += 1
        per_worker = {}
        for k, holder in enumerate(self._holders):
            per_worker.setdefault(holder, []).append(k)
        with self._one_graph():
            futures = [self._task(run_partitions, fn, [[args[k] for args in per_partition_args] for k in ks],
                                  workers=[h] if h else None, allow_other_workers=True, key=task_key(fn))
                       for h, ks in per_worker.items()]
        results = [None] * len(self._holders)
        for ks, batch in zip(per_worker.values(), self._gather(futures)):
            for k, result in zip(ks, batch):
                results[k] = result
        self.stats["bytes_received"] += sum(array_bytes(r) for r in results)
        return results

    # --- the executor interface (evaluate, set_curvature, laplacian_matvec, curvature_diagonal: Executor)

    @property
    def _point_affinity(self):
        """The affinity store (the points in its order, which is the blocks'), for a model's ``point_term``."""
        return self.store

    def hold(self, arrays: dict):
        """An optimiser's per-point arrays held on the workers, each partition's rows beside it
        (``engine.held_dask.DaskHeld``), where the evaluations can run there: the halo exchange on, FFT or auto
        repulsion, a model without a ``point_term`` (which needs every point on the client); else on the client
        (``engine.held.LocalHeld``)."""

        if self.halo and self.repulsion in ("fft", "auto") and self.model is not None and \
                self.model.point_term is None:
            return DaskHeld(self, arrays)
        return LocalHeld(self, arrays)

    def factorize_curvature(self, mu: float, ordering=None, kind: str = "lu") -> RemoteFactorization:
        """The sparse factorisation (``kind='lu'``) or multigrid preconditioner (``'amg'``) of ``L(C) + mu I``,
        built and kept on a worker."""
        self._check_curvature()
        return RemoteFactorization(self, mu, ordering, kind)

    # --- halo exchange (scalemb.engine.halo)

    def _submit(self, fn, *args, worker=None, strict=True, key=None, priority=0):
        """``fn(*args)`` as a task on ``worker``.  ``strict``: only there -- the halo exchange's tasks must run
        where their data is (a loosely restricted task may be stolen by another worker, which then fetches the
        inputs: measured, every worker's own rows crossed over in Laplacian products).  They all read data
        scattered to their worker, so a lost worker fails them (and ``_run`` recovers) instead of leaving them
        waiting for it.  ``key``: the task's key (default: named by ``fn``, ``task_key``).  ``priority``: Dask's
        (higher first, among the tasks ready on a worker; tasks submitted within 100 ms of each other otherwise tie
        and a worker runs them in the order of their keys)."""
        return self._task(fn, *args, workers=None if worker is None else [worker], allow_other_workers=not strict,
                          key=key, priority=priority)

    def _task(self, fn, *args, key=None, **options):
        """``client.submit(fn, *args, **options)`` in this run's span, keyed ``key`` or by the operation
        (``task_key``): every task of the executor is submitted here.  Inside ``_one_graph`` the task is added
        to its graph instead (sent at the next wait or at the end of the block)."""
        key = key or task_key(fn)
        if self._graph is not None:
            return self._graph.add(key, fn, args, options)
        with dask.annotate(span=self._span):
            return self.client.submit(fn, *args, key=key, **options)

    @contextlib.contextmanager
    def _one_graph(self):
        """The tasks submitted inside the block reach the scheduler as one graph (``engine.dask_graph``: one
        message and one graph update instead of one each, the stream's 10-ms batching not waited for), sent when
        the block ends or before anything waits for a task (``_wait_for``); nested blocks join the outer one.  An
        error inside drops the tasks not yet sent."""
        if self._graph is not None:
            yield
            return
        self._graph = TaskGraph(self.client)
        try:
            yield
            self._send_graph()
        finally:
            self._graph = None

    def _send_graph(self) -> None:
        """Send the open graph's tasks (``_one_graph``), in this run's span."""
        if self._graph is not None:
            with dask.annotate(span=self._span):
                self._graph.send()

    def _compute_curvature(self) -> None:
        if not self.halo:
            return super()._compute_curvature()
        coords, exaggeration, fixed = self._curvature_args
        if self.model is None and not fixed:
            raise RuntimeError("this executor has no model: only the fixed curvature 4 P is available")
        self._weights = None
        plan, views, _ = self._halo_state()
        X = self._assemble(coords)
        weights = [None] * len(self.partitions)
        for w in plan.workers:
            batch = self._submit(halo_fns.curvature_view, views[w], X[w], self._model_arg, self.space_dims,
                                 exaggeration, fixed, worker=w)
            for i, k in enumerate(plan.parts[w]):
                weights[k] = self._submit(operator.getitem, batch, i, worker=w)
        self._settle(weights)
        self._weights = weights

    def laplacian_matvec(self, V: np.ndarray) -> np.ndarray:
        """``L(C) V`` by row blocks in one task round: the client sends each worker its compact columns of V (own
        rows and halo, ``halo.laplacian_compact``), all at once, then one task per worker multiplies."""
        if not self.halo:
            return super().laplacian_matvec(V)
        self._check_curvature()
        V = self._to_internal(V)

        def product():
            plan, views, _ = self._halo_state()
            columns = self._full_plan().columns
            compact = self._scatter_each({w: np.ascontiguousarray(V[:, columns[w]]) for w in plan.workers})
            futures = [self._submit(halo_fns.laplacian_compact, views[w], compact[w],
                                    *[self._weights[k] for k in plan.parts[w]], worker=w) for w in plan.workers]
            self.stats["calls"] += 1
            out = np.empty_like(V)
            for w, batch in zip(plan.workers, self._gather(futures)):
                for k, rows in zip(plan.parts[w], batch):
                    r0, r1 = self.partitions[k]
                    out[:, r0:r1] = rows
            for f in compact.values():
                f.release()
            self.stats["bytes_received"] += out.nbytes
            return out

        return self._to_input(self._call(product))

    def close(self) -> None:
        try:
            self._release_futures()
        finally:
            try:  # statistics only: a lost scheduler or worker must not turn a finished run into a failure
                if self.client.status == "running" and not self._holder_left():
                    self.client.run(_forget_span_metrics, on_error="ignore")
            except Exception:  # noqa: BLE001
                pass

    def _release_futures(self) -> None:
        if self._halo is not None:
            _, views, needs = self._halo
            for f in list(views.values()) + list(needs.values()) + list(self._plan_shares.values()):
                f.release()
            self._halo, self._plan_shares, self._full = None, {}, None
        for futures in (self._blocks, self._weights or []):
            for f in futures:
                f.release()
        self._blocks, self._weights = [], None


def _forget_span_metrics(dask_worker=None) -> int:
    """Drop a worker's per-span task statistics of the spans none of its tasks belong to any more (runs on each
    worker through ``client.run``, in its event loop, where they are written); returns how many.

    Why: a worker adds every finished task's timings to ``digests_total`` and ``digests_max`` under
    ``('execute', span id, task prefix, activity, unit)`` and never drops them.  A run's tasks are one span
    (``DaskExecutor._task``), so within a run they stay a few keys per operation; this drops the ended run's, which
    would otherwise add up job after job on a long-lived worker (the service's), as would any tasks left to Dask's
    "default" spans (a new one each time the cluster goes idle).  Nothing reads
    these on the worker (the heartbeats send ``digests_total_since_heartbeat``, a copy reset at each beat), so
    dropping a finished span's keys loses no metric."""
    live = {getattr(ts, "span_id", None) for ts in dask_worker.state.tasks.values()}
    dropped = 0
    for digests in (dask_worker.digests_total, dask_worker.digests_max):
        stale = [k for k in digests if isinstance(k, tuple) and len(k) == 5 and k[0] == "execute" and k[1] not in live]
        for k in stale:
            del digests[k]
        dropped += len(stale)
    return dropped
