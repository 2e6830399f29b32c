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
"""
import dataclasses
import hashlib
import logging
import operator
import pickle
import time
import uuid
from concurrent.futures import CancelledError

import numpy as np

from ..affinity.affinity import RowBlock
from ..affinity.store import AffinityStore
from ..errors import InputError, ScalembError
from .faults import SchedulerLostError, WorkersLostError  # noqa: F401 - re-exported: where callers import them
from .faults import WorkerLeft as _WorkerLeft
from ..models import model_ref
from ..repulsion.convolution import convolution_shares, fft_dtype
from ..repulsion.spec import FFTParams
from . import halo as halo_fns
from .base import Executor
from .blocks import reduce_blocks
from .dask_factor import RemoteFactorization
from .dask_keys import task_key
from .fft_pass import fft_grid
from .held import LocalHeld
from .held_dask import DaskHeld

logger = logging.getLogger("scalemb")


# Workers that each sum all W charge grids themselves (``DaskExecutor._sum_grids``); above it, a tree.
DIRECT_SUM_WORKERS = 4
# How many workers share one evaluation's convolution (None: as many as it has shares, at most W; 1: one worker
# convolves).  1 by default: with the workers on one machine the convolving worker's FFT threads (``-1``: every
# CPU) use the cores the others leave while they wait for its potentials, and each further share repeats the
# forward transform beside the others' threads (measured slower on a loaded 2-core machine: docs/scaling.md).
# None suits workers on separate machines, whose cores the others cannot use.
CONVOLVING_WORKERS = 1
RECOVERY_TIMEOUT = 120.0  # seconds a recovery may take before the run gives up (WorkersLostError)
_POLL = 5.0  # seconds between checks that every partition holder is still alive while waiting for a call


# --------------------------------------------------------------------------- functions run on the workers

def run_partitions(fn, arguments: list) -> list:
    """``[fn(*args) for args in arguments]``: one worker's partitions in one task."""
    return [fn(*args) for args in arguments]


def load_partition(store_path: str, r0: int, r1: int) -> RowBlock:
    """Partition ``[r0, r1)`` of the store's P (runs on a worker; checked against the store's halo metadata)."""
    return AffinityStore(store_path).read_partition(r0, r1)


def entropy_partition(block: RowBlock) -> float:
    return block.entropy_term()


# ------------------------------------------------------------------------------------------------ client

def _is_scheduler_loss(client, exc: BaseException | None = None) -> bool:
    """The client is not connected (it reconnects, then closes) or a future was cancelled for that reason."""
    return client.status != "running" or "scheduler-connection-lost" in str(exc)


class DaskExecutor(Executor):
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
        self.halo = bool(halo)
        self._halo = None  # (HaloLayout, {worker: view future}, {(v, w): needs future}) for the current holders
        self._plan_shares, self._full = {}, None  # the workers' plan shares (futures); the plan with its arrays
        self.stats = {"calls": 0, "bytes_sent": 0, "bytes_received": 0, "bytes_between_workers": 0,
                      "halo_evaluations": 0, "recoveries": 0}
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
        # contiguous runs of partitions per worker: neighbouring rows share columns, so a worker's halo is
        # smaller than with the partitions dealt round robin (placement never changes a result)
        n_parts = len(self.partitions)
        self._blocks = [client.submit(load_partition, path, r0, r1, key=f"scalemb-P-{token}-{k}",
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

    # --- fault handling

    def _run(self, fn, retries: int | None = None):
        """``fn()``, repeated after a recovery when a worker was lost (at most ``retries`` times); a failure
        with every partition holder alive is the task's own and is raised at once."""
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - distributed raises many types for lost workers
                self._raise_if_scheduler_lost(exc)
                if attempt == retries or not self._transient(exc):
                    if isinstance(exc, _WorkerLeft) and retries:  # every retry spent on lost workers: exit 4
                        raise WorkersLostError(f"Dask workers kept leaving ({retries + 1} tries); the last "
                                               "checkpoint, if any, is intact") from None
                    raise
                logger.warning("Dask call failed (%s: %s); recovering (attempt %d of %d)",
                               exc.__class__.__name__, exc, attempt + 1, retries)
                try:
                    self._recover()
                except Exception as lost:  # noqa: BLE001
                    self._raise_if_scheduler_lost(lost)
                    raise

    def _transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a fault that a recovery and a repeat of the call cure: a partition holder has left,
        or a future was cancelled by the scheduler (its key forgotten, or a dependency lost with a worker: seen
        with every holder alive, after a worker holding a factor or a halo piece died).  A task's own failure is
        an error, never a cancellation, so it is still raised at once."""
        return isinstance(exc, (_WorkerLeft, CancelledError)) or self._holder_left()

    def _holder_left(self) -> bool:
        """Whether a worker that held partitions has left the cluster (the scheduler asked up to three times, a
        second apart: under load one request can time out, which is no evidence of a loss)."""
        for attempt in range(3):
            try:
                alive = set(self.client.scheduler_info()["workers"])
                break
            except Exception:  # noqa: BLE001 - the recovery will tell what is wrong
                if attempt == 2:
                    return True
                time.sleep(1.0)
        return any(h is not None and h not in alive for h in self._holders)

    def _raise_if_scheduler_lost(self, exc: BaseException) -> None:
        if _is_scheduler_loss(self.client, exc):
            raise SchedulerLostError(f"lost the Dask scheduler ({exc.__class__.__name__}: {exc}); "
                                     "the last checkpoint, if any, is intact") from None

    def _locate(self) -> list:
        """Address of the worker holding each partition (the first holder)."""
        who_has = self.client.who_has(self._blocks)
        return [min(who_has[f.key]) if who_has.get(f.key) else None for f in self._blocks]

    def _alive(self) -> list:
        return sorted(self.client.scheduler_info()["workers"])

    def _wait_for(self, futures, timeout: float | None = None, pinned=()) -> None:
        """Block until ``futures`` have finished (done or failed), checking every ``_POLL`` seconds that no
        partition holder (nor a worker in ``pinned``, which the tasks are restricted to) has left: a task waiting
        for a worker that will never come back (every worker lost at once leaves tasks ``no-worker``) must not
        wait for ever.  Raises ``WorkersLostError`` when a holder has left (``_run`` then recovers), when
        ``timeout`` seconds pass, or when one of the tasks has been ``no-worker`` (its allowed workers are all
        gone: it can never run) for ``recovery_timeout`` seconds.

        The wait runs on this executor's client (``distributed.wait`` would run it on the process's default
        client, the latest one created: with several clients in one process, as the service's concurrent jobs
        have, the futures' events were bound to another client's loop, and a later wait on their own loop failed
        with "bound to a different event loop")."""
        # not at module level: benchmarks/distributed.py would shadow it; ``_wait`` is ``distributed.wait``'s
        # coroutine, run here on this client's loop
        from distributed.client import _wait

        def wait(futures, timeout):
            return self.client.sync(_wait, futures, timeout=timeout)

        end = None if timeout is None else time.monotonic() + timeout
        no_workers_since = None
        stuck_since = None
        while True:
            step = _POLL if end is None else max(0.0, min(_POLL, end - time.monotonic()))
            try:
                wait(futures, timeout=step)
                return
            except (TimeoutError, UnboundLocalError):
                # UnboundLocalError: distributed's ``utils.sync`` (2026.8) when its coroutine ends in a
                # CancelledError (a BaseException it does not catch) -- the timed wait cancelled in a race, seen in
                # 3 of 100 jobs with two services' clients on one cluster under load: a step like a timeout
                now = time.monotonic()
                if end is not None and now >= end:
                    raise WorkersLostError(f"the Dask workers did not finish within {timeout:.0f} s") from None
                if _is_scheduler_loss(self.client):
                    raise SchedulerLostError("lost the Dask scheduler while waiting for the workers; the last "
                                             "checkpoint, if any, is intact") from None
                if self._holder_left() or (pinned and not set(pinned) <= set(self._alive())):
                    raise _WorkerLeft("a Dask worker holding partitions left during the call") from None
                if self._alive():
                    no_workers_since = None
                elif no_workers_since is None:
                    no_workers_since = now
                elif now - no_workers_since > self.recovery_timeout:
                    raise WorkersLostError(f"the Dask cluster has had no workers for {self.recovery_timeout:.0f} "
                                           "s") from None
                stuck = self._unrunnable(futures)
                if not stuck:
                    stuck_since = None
                elif stuck_since is None:
                    stuck_since = now
                elif now - stuck_since > self.recovery_timeout:
                    raise WorkersLostError(f"Dask task {stuck[0]} has waited {now - stuck_since:.0f} s for a worker "
                                           "it may run on (its allowed workers are gone); the last checkpoint, if "
                                           "any, is intact") from None

    def _unrunnable(self, futures) -> list:
        """Keys of ``futures`` the scheduler holds as ``no-worker`` (no worker they may run on is alive)."""
        keys = [f.key for f in futures if f.status == "pending"]
        if not keys:
            return []

        def no_worker(dask_scheduler, keys):
            return [k for k in keys if k in dask_scheduler.tasks and dask_scheduler.tasks[k].state == "no-worker"]

        try:
            return self.client.run_on_scheduler(no_worker, keys=keys)
        except Exception:  # noqa: BLE001 - a check only: the scheduler's loss is noticed by the caller
            return []

    def _gather(self, futures, pinned=()) -> list:
        """``client.gather(futures)`` once they have finished (``_wait_for``: never waits for ever)."""
        self._wait_for(futures, pinned=pinned)
        return self.client.gather(futures)

    def _wait_for_partitions(self, timeout: float | None = None) -> list:
        """Block until every partition is in worker memory (at most ``timeout`` seconds: ``WorkersLostError``);
        return their holders.  A failed partition task raises its error."""
        self._wait_for(self._blocks, timeout)
        for f in self._blocks:
            if f.status == "error":
                f.result()  # raises the task's error
            if f.status != "finished":
                raise WorkersLostError(f"partition {f.key} is {f.status}")
        return self._locate()

    def _reload(self) -> None:
        """Load again, under new keys, every partition not finished in worker memory (lost, cancelled, failed by
        a killed worker, or stuck waiting for workers that left), on the live workers: the same rows from the same
        store, so the same numbers."""
        workers = self._alive()
        if not workers:
            return
        self._reloads += 1
        n_parts = len(self.partitions)
        for k, ((r0, r1), f) in enumerate(zip(self.partitions, self._blocks)):
            if f.status == "finished":
                continue
            f.release()
            self._blocks[k] = self.client.submit(load_partition, self._path, r0, r1,
                                                 key=f"scalemb-P-{self._token}-{k}-r{self._reloads}",
                                                 workers=[workers[k * len(workers) // n_parts]],
                                                 allow_other_workers=True)

    def _recover(self) -> None:
        """After a worker loss: wait until every partition is held again, recompute the curvature weights.

        One bounded wait: every partition must be back in worker memory within ``recovery_timeout`` seconds,
        else ``WorkersLostError``.  Lost partitions are recomputed from the store by the scheduler; those still
        not held after a short wait (tasks left ``no-worker`` when every worker died at once, or failed as
        ``KilledWorker``) are loaded again under new keys on the workers alive then (``_reload``).  A recovery
        interrupted by another such fault (``_transient``: a worker leaving, a future cancelled while the
        curvature is recomputed) starts again, at most ``retries`` more times."""
        self.stats["recoveries"] += 1
        for attempt in range(self.retries + 1):
            try:
                return self._recover_once()
            except Exception as exc:  # noqa: BLE001 - distributed raises many types for lost workers
                self._raise_if_scheduler_lost(exc)
                if isinstance(exc, WorkersLostError) or attempt == self.retries or not self._transient(exc):
                    raise
                logger.warning("recovery interrupted (%s: %s); recovering again (attempt %d of %d)",
                               exc.__class__.__name__, exc, attempt + 1, self.retries)

    def _recover_once(self) -> None:
        self._halo, self._plan_shares, self._full = None, {}, None  # the partitions may have moved: plan again
        deadline = time.monotonic() + self.recovery_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkersLostError(f"the Dask workers did not hold every partition again within "
                                       f"{self.recovery_timeout:.0f} s of losing them; the last checkpoint, if "
                                       "any, is intact")
            try:
                self._holders = self._wait_for_partitions(min(remaining, 3 * _POLL))
                if None not in self._holders and not self._holder_left():
                    break
            except SchedulerLostError:
                if _is_scheduler_loss(self.client):
                    raise
            except Exception as exc:  # noqa: BLE001 - a partition task failed with its worker
                if _is_scheduler_loss(self.client, exc):
                    raise
            self._reload()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        if self._curvature_args is not None:
            self._compute_curvature()

    # --- per-call helpers

    def _scatter(self, value) -> list:
        """``value`` (an array, or an object holding arrays) sent once to each worker holding partitions: the
        future to use for each partition."""
        holders = [h for h in self._holders if h is not None]
        by_worker = {w: self.client.scatter(value, workers=[w], hash=False) for w in sorted(set(holders))}
        self.stats["bytes_sent"] += _nbytes(value) * len(by_worker)
        fallback = next(iter(by_worker.values()))
        return [by_worker.get(h, fallback) for h in self._holders]

    def _ship(self, args) -> list:
        """Per argument, its value for each partition: arguments holding more than 16 KB of arrays are sent once
        to each worker (the same object passed again within one call reuses its scatter); small ones travel with
        the tasks."""
        shipped = []
        for arg in args:
            if _nbytes(arg) > 1 << 14:
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
        futures = [self.client.submit(fn, b, *[values[k] for values in shipped], workers=[h] if h else None,
                                      allow_other_workers=True, key=task_key(fn))
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
        futures = [self.client.submit(run_partitions, fn, [[args[k] for args in per_partition_args] for k in ks],
                                      workers=[h] if h else None, allow_other_workers=True, key=task_key(fn))
                   for h, ks in per_worker.items()]
        results = [None] * len(self._holders)
        for ks, batch in zip(per_worker.values(), self._gather(futures)):
            for k, result in zip(ks, batch):
                results[k] = result
        self.stats["bytes_received"] += sum(_nbytes(r) for r in results)
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

    def _submit(self, fn, *args, worker=None, strict=True):
        """``fn(*args)`` as a task on ``worker``.  ``strict``: only there -- the halo exchange's tasks must run
        where their data is (a loosely restricted task may be stolen by another worker, which then fetches the
        inputs: measured, every worker's own rows crossed over in Laplacian products).  They all read data
        scattered to their worker, so a lost worker fails them (and ``_run`` recovers) instead of leaving them
        waiting for it."""
        return self.client.submit(fn, *args, workers=None if worker is None else [worker],
                                  allow_other_workers=not strict, key=task_key(fn))

    def _halo_state(self):
        """The ``HaloPlan`` of the current holders, each worker's relabelled partitions (``WorkerView``
        futures) and the positions each worker cuts for each other one; built once, again after a recovery."""
        if self._halo is not None:
            return self._halo
        holders = list(self._holders)
        if any(h is None for h in holders):
            holders = self._wait_for_partitions(self.recovery_timeout)
            self._holders = holders
        workers = sorted(set(holders))
        parts = {w: [k for k, h in enumerate(holders) if h == w] for w in workers}
        listed = [parts[w] for w in workers]
        # each worker plans its own share from its halo (kept there); the client keeps sizes (``HaloLayout``)
        shares = {w: self._submit(halo_fns.worker_plan, self.partitions, listed, i,
                                  self._submit(halo_fns.own_halo, [self.partitions[k] for k in parts[w]],
                                               *[self._blocks[k] for k in parts[w]], worker=w, strict=False),
                                  worker=w)
                  for i, w in enumerate(workers)}
        sizes = dict(zip(workers, self._gather([self._submit(halo_fns.plan_sizes, shares[w], worker=w)
                                                for w in workers])))
        pieces = {(v, w): sizes[w][j] for w in workers for j, v in enumerate(workers) if j in sizes[w]}
        plan = halo_fns.HaloLayout(workers, parts, pieces)
        views = {w: self._submit(halo_fns.plan_view, shares[w], *[self._blocks[k] for k in parts[w]], worker=w)
                 for w in workers}
        # the positions v cuts for w, moved to v once (a task there), not fetched again by every cut
        index = {w: i for i, w in enumerate(workers)}
        needs = {(v, w): self._submit(halo_fns.plan_needs, shares[w], index[v], worker=v) for (v, w) in pieces}
        self._settle(list(views.values()) + list(needs.values()))
        self._plan_shares = shares
        self._halo = (plan, views, needs)
        return self._halo

    def _full_plan(self) -> "halo_fns.HaloPlan":
        """The plan with its arrays (``halo.full_plan``), gathered from the workers' shares for the paths whose
        vectors are on the client (which hold O(N) there anyway); kept while the placement lasts."""
        plan = self._halo_state()[0]
        if self._full is None or self._full[0] is not plan:
            shares = dict(zip(plan.workers, self._gather([self._plan_shares[w] for w in plan.workers])))
            self._full = (plan, halo_fns.full_plan(self.partitions, plan.workers, plan.parts, shares))
        return self._full[1]

    def _scatter_each(self, values: dict) -> dict:
        """``{w: future}``: each ``values[w]`` scattered to worker ``w`` only, all in one wait (``client.scatter``
        one worker at a time waits W times)."""
        import asyncio

        async def scatter_all():
            return await asyncio.gather(*[self.client._scatter(value, workers=[w], hash=False)
                                          for w, value in values.items()])

        futures = dict(zip(values, self.client.sync(scatter_all)))
        self.stats["bytes_sent"] += sum(_nbytes(v) for v in values.values())
        return futures

    def _exchange(self, X: np.ndarray | None, own: dict | None = None, dims: int | None = None) -> tuple:
        """Each worker's own rows of ``X`` (``(d, N)``, internal order), sent by the client -- or ``own``, futures
        of those rows already on the workers (``d = dims``) -- and the pieces of each worker's halo, cut by the
        workers that own them: futures ``own[w]``, ``pieces[v, w]``."""
        plan, views, needs = self._halo_state()
        if own is None:
            own = self._scatter_each({w: np.ascontiguousarray(X[:, halo_fns.own_rows(self.partitions, plan.parts[w])])
                                      for w in plan.workers})
            dims = X.shape[0]
        pieces = {key: self._submit(halo_fns.take_columns, own[key[0]], needs[key], worker=key[0])
                  for key in needs}
        self.stats["bytes_between_workers"] += sum(plan.pieces.values()) * dims * 8
        return own, pieces

    def _assemble(self, X: np.ndarray | None, own: dict | None = None, dims: int | None = None) -> dict:
        """Each worker's compact columns of ``X`` (or of the own rows ``own``, see ``_exchange``): futures, one
        per worker (``halo.assemble``)."""
        plan, views, _ = self._halo_state()
        own, pieces = self._exchange(X, own, dims)
        return {w: self._submit(halo_fns.assemble, views[w], own[w], *[pieces[v, w] for v in plan.sources(w)],
                                worker=w) for w in plan.workers}

    def _evaluate_blocks(self, coords, exaggeration, with_kl, use_fft, choice):
        """With FFT repulsion on an uncapped grid: the halo exchange (``_evaluate_halo``); otherwise every
        worker gets all of Y (the exact all-pairs repulsion and a capped grid's near field read every point)."""
        if self.halo and use_fft:
            grid = fft_grid(self.model, self.space_dims, coords, self.fft_params,
                            None if choice is None else choice.grid, self._warn_capped)
            if grid is not None and not grid.capped:
                return self._evaluate_halo(coords, grid, exaggeration, with_kl)
        return super()._evaluate_blocks(coords, exaggeration, with_kl, use_fft, choice)

    def _evaluate_halo(self, coords, grid, exaggeration, with_kl):
        plan = self._halo_state()[0]
        own = self._scatter_each({w: np.ascontiguousarray(coords[:, halo_fns.own_rows(self.partitions, plan.parts[w])])
                                  for w in plan.workers})
        results, grid_z = self._halo_partials(grid, with_kl, own, coords.shape[0])
        self.stats["bytes_received"] += sum(_nbytes(r) for r in results)
        return reduce_blocks(results, coords.shape, self._entropy, exaggeration, z_outside_blocks=grid_z,
                             with_kl=with_kl, objective=self.model.objective, outliers=grid.outliers)

    def _halo_partials(self, grid, with_kl: bool, own: dict, dims: int, keep=None) -> tuple:
        """``(per-partition results, grid Z)`` of one FFT evaluation at the workers' own rows ``own`` (futures per
        worker, ``(dims, rows)``); ``keep(w)``: instead of ``halo.finish_view``, the arguments ``(fn, *args)`` of
        the worker function that finishes the evaluation and keeps the rows there (``engine.held_dask``).

        The schedule, per worker: the halo pieces it cuts for the others (``_exchange``: they travel meanwhile);
        its own rows in box order (``visit_view``) and their charges (``spread_view``), which need no halo; its
        compact columns (``assemble``) and the rows' attraction (``attraction_view``: it needs no potentials, so it
        runs while the grids travel and are convolved); on each of the first K workers (K: as many as the
        convolution has shares, ``repulsion.convolution.convolution_shares``, at most W) the summed charges
        (``add_grids``) and its share of the convolution (``convolve_part``); then the rows' repulsion from all
        the shares (``finish_view``).  Tasks are submitted in that order, the order a worker runs those ready."""
        plan, views, _ = self._halo_state()
        self.stats["calls"] += 1
        self.stats["halo_evaluations"] += 1
        workers = plan.workers
        # the grid goes to each worker once (a task holding it), not with every task that uses it
        on = {w: self._submit(halo_fns.relay, grid, worker=w) for w in workers}
        own, pieces = self._exchange(None, own, dims)  # the halo pieces cut first: they travel while spreading
        visits = {w: self._submit(halo_fns.visit_view, views[w], own[w], on[w], worker=w) for w in workers}
        grids = [self._submit(halo_fns.spread_view, views[w], own[w], on[w], visits[w], worker=w) for w in workers]
        X = {w: self._submit(halo_fns.assemble, views[w], own[w], *[pieces[v, w] for v in plan.sources(w)],
                             worker=w) for w in workers}
        attraction = {w: self._submit(halo_fns.attraction_view, views[w], X[w], self._model_arg, self.space_dims,
                                      with_kl, worker=w) for w in workers}
        shares = convolution_shares(grid) if CONVOLVING_WORKERS is None else CONVOLVING_WORKERS
        k = max(1, min(len(workers), shares))
        totals = self._sum_grids(grids, workers, k)
        parts = [self._submit(halo_fns.convolve_part, on[workers[i]], totals[i], i, k, self._fft_workers,
                              worker=workers[i]) for i in range(k)]
        futures = []
        for w in workers:
            fn, *extra = (halo_fns.finish_view,) if keep is None else keep(w)
            futures.append(self._submit(fn, views[w], own[w], on[w], visits[w], attraction[w], parts, *extra,
                                        worker=w))
        z_future = self._submit(halo_fns.convolution_z, parts[-1], worker=workers[k - 1])
        *batches, grid_z = self._gather(futures + [z_future])  # one wait: the client's round trips are latency
        results = [None] * len(self.partitions)
        for w, batch in zip(workers, batches):
            for j, res in zip(plan.parts[w], batch):
                results[j] = res
        potential_bytes = grid.n_potentials * np.dtype(fft_dtype(self.space_dims)).itemsize
        self.stats["bytes_between_workers"] += (len(workers) - 1) * grid.n_nodes * potential_bytes
        self.stats["bytes_between_workers"] += _summed_grid_transfers(len(workers), k) * grid.n_nodes * 8
        self.stats["bytes_sent"] += len(workers) * len(pickle.dumps(grid, protocol=5))  # the grid, once per worker
        return results, grid_z

    def _sum_grids(self, grids: list, workers: list, k: int) -> list:
        """The summed charge grids on each of ``workers[:k]`` (futures): with few workers
        (``DIRECT_SUM_WORKERS``) each of them sums all the grids (fetched at once, no dependent rounds); else a
        pairwise tree among the workers into the first, then copies down a tree (``_broadcast``).  Integer sums:
        the same grid either way."""
        if len(workers) <= DIRECT_SUM_WORKERS:
            return [self._submit(halo_fns.add_grids, grids[i], *(grids[:i] + grids[i + 1:]), worker=workers[i])
                    for i in range(k)]
        grids = list(grids)
        for round_ in halo_fns.tree_pairs(workers):  # pairwise sums among the workers, never via the client
            for i, j in round_:
                grids[i] = self._submit(halo_fns.add_grids, grids[i], grids[j], worker=workers[i])
        return self._broadcast(grids[0], workers[:k])

    def _broadcast(self, future, workers: list) -> list:
        """``future``'s value on every worker, by a tree of copies (round r: workers ``0 .. 2^r - 1`` send to
        ``2^r .. 2^{r+1} - 1``): the root sends log2(W) times, not W."""
        copies = [future] + [None] * (len(workers) - 1)
        step = 1
        while step < len(workers):
            for i in range(min(step, len(workers) - step)):
                copies[i + step] = self._submit(halo_fns.relay, copies[i], worker=workers[i + step])
            step *= 2
        return copies

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
    ``('execute', span id, task prefix, activity, unit)`` and never drops them; the scheduler opens a new
    "default" span each time the cluster's unannotated tasks have all finished, so a run of many short waits (an
    optimiser's iterations) opens one span per wait and a worker's statistics grow with every job.  Nothing reads
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


def _summed_grid_transfers(workers: int, k: int) -> int:
    """Charge grids that travel between workers to leave the sum on ``k`` of ``workers`` (``_sum_grids``)."""
    if workers <= DIRECT_SUM_WORKERS:
        return k * (workers - 1)
    return workers - 1 + k - 1


def _nbytes(value) -> int:
    """Bytes of the arrays in ``value`` (an array, or a dataclass / object holding arrays); functions (a grid
    spec's plan and near pair, compiled or not) and classes hold none."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if callable(value) or isinstance(value, type):
        return 0
    if dataclasses.is_dataclass(value):
        return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    attributes = getattr(value, "__dict__", None)
    return sum(_nbytes(v) for v in attributes.values()) if isinstance(attributes, dict) else 0
