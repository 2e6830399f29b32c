"""Fault handling of the Dask executor (``engine.distributed.DaskExecutor``, which inherits it): every call to the
cluster runs through ``_run``, which tells a lost worker or a cancelled future (recovered: the partitions held
again, reloaded from the store where the scheduler cannot recompute them, the curvature recomputed, the call
repeated) from a task's own error (raised at once) and from a lost scheduler (``SchedulerLostError``); waits never
wait for ever (``_wait_for``).  The module docstring of ``engine.distributed`` ("Faults") says what is recovered and
why the results stay the same.

``DaskRecovery`` is a base class holding no state of its own: it reads and sets the executor's ``client``,
``retries``, ``recovery_timeout``, ``stats``, ``partitions``, ``_blocks`` (the partitions' futures), ``_holders``,
``_path``, ``_token``, ``_reloads``, the halo plan (``_halo``, ``_plan_shares``, ``_full``: dropped, the partitions
may have moved) and ``_curvature_args`` / ``_compute_curvature`` (the curvature recomputed where it was last set).
"""
import logging
import time
from concurrent.futures import CancelledError

from ..affinity.affinity import RowBlock
from ..affinity.store import AffinityStore
from .faults import SchedulerLostError, WorkersLostError
from .faults import WorkerLeft as _WorkerLeft

logger = logging.getLogger("scalemb")

RECOVERY_TIMEOUT = 120.0  # seconds a recovery may take before the run gives up (WorkersLostError)
_POLL = 5.0  # seconds between checks that every partition holder is still alive while waiting for a call


def load_partition(store_path: str, r0: int, r1: int) -> RowBlock:
    """Partition ``[r0, r1)`` of the store's P (runs on a worker; checked against the store's halo metadata)."""
    return AffinityStore(store_path).read_partition(r0, r1)


def _is_scheduler_loss(client, exc: BaseException | None = None) -> bool:
    """The client is not connected (it reconnects, then closes) or a future was cancelled for that reason."""
    return client.status != "running" or "scheduler-connection-lost" in str(exc)


class _Stall:
    """Since when a condition has held, polled by ``DaskRecovery._wait_for``."""

    def __init__(self):
        self.since = None

    def held_for(self, holds: bool, now: float) -> float:
        """Seconds the condition has held at ``now`` (0 at the first poll that finds it, and whenever it does
        not hold)."""
        if not holds:
            self.since = None
            return 0.0
        if self.since is None:
            self.since = now
        return now - self.since


class DaskRecovery:
    """The fault handling ``DaskExecutor`` inherits (module docstring)."""

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

        self._send_graph()  # tasks of an open graph (``_one_graph``) first: they may be what is waited for
        self.stats["waits"] += 1  # the client's dependent round trips
        end = None if timeout is None else time.monotonic() + timeout
        no_workers, stuck = _Stall(), _Stall()
        while True:
            step = _POLL if end is None else max(0.0, min(_POLL, end - time.monotonic()))
            try:
                wait(futures, timeout=step)
                return
            except (TimeoutError, UnboundLocalError):
                # UnboundLocalError: distributed's ``utils.sync`` (2026.8) when its coroutine ends in a
                # CancelledError (a BaseException it does not catch) -- the timed wait cancelled in a race, seen in
                # 3 of 100 jobs with two services' clients on one cluster under load: a step like a timeout
                self._check_waiting(futures, end, timeout, pinned, no_workers, stuck)

    def _check_waiting(self, futures, end, timeout, pinned, no_workers, stuck) -> None:
        """One poll of ``_wait_for`` that found ``futures`` unfinished: raise if its deadline ``end`` has passed,
        the scheduler or a partition holder (or a ``pinned`` worker) is gone, or the cluster has had no workers,
        or a task no worker it may run on, for ``recovery_timeout`` seconds (``no_workers``, ``stuck``:
        ``_Stall``s carried from poll to poll).  Called while the wait's timeout is handled: its errors are raised
        ``from None``."""
        now = time.monotonic()
        if end is not None and now >= end:
            raise WorkersLostError(f"the Dask workers did not finish within {timeout:.0f} s") from None
        if _is_scheduler_loss(self.client):
            raise SchedulerLostError("lost the Dask scheduler while waiting for the workers; the last checkpoint, "
                                     "if any, is intact") from None
        if self._holder_left() or (pinned and not set(pinned) <= set(self._alive())):
            raise _WorkerLeft("a Dask worker holding partitions left during the call") from None
        if no_workers.held_for(not self._alive(), now) > self.recovery_timeout:
            raise WorkersLostError(f"the Dask cluster has had no workers for {self.recovery_timeout:.0f} s") from None
        unrunnable = self._unrunnable(futures)
        waited = stuck.held_for(bool(unrunnable), now)
        if waited > self.recovery_timeout:
            raise WorkersLostError(f"Dask task {unrunnable[0]} has waited {waited:.0f} s for a worker it may run on "
                                   "(its allowed workers are gone); the last checkpoint, if any, is intact") from None

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
            self._blocks[k] = self._task(load_partition, self._path, r0, r1,
                                         key=f"scalemb-P-{self._token}-{k}-r{self._reloads}",
                                         workers=[workers[k * len(workers) // n_parts]], allow_other_workers=True)

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
