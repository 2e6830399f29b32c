"""An optimiser's per-point state on the Dask workers (``scalemb.engine.held``'s contract, for ``DaskExecutor``).

Each worker keeps the rows of its partitions of every held array (coordinates, gradient, increments, gains,
best iterate) in its own memory, beside the partitions of P: one dict per worker (``{partition: {name: rows}}``),
the result of a task pinned there (``held_put``) whose future the client holds.  Later tasks pinned to the same
worker get that very object (Dask hands a task its in-memory inputs as they are) and change its rows in place.
So the rows live exactly as long as the future: released by ``close``, and by the scheduler when the client
disconnects.  Per evaluation:

1. each worker reports its partitions' coordinate extent (min, max: exact in any order); with a time axis,
   their time-bin counts and the points outside the chosen band (integers and a few points) -- the client builds
   the grid from these summaries alone (``repulsion.grid.grid_from_summaries``), as ``grid_for`` does from all
   points;
2. the halo exchange and FFT pass run as for client-held coordinates (``DaskExecutor._halo_partials``), the
   workers' own rows now coming from their held coordinates; each worker evaluates its partitions and keeps the
   rows of attraction and repulsion, returning Z and ``sum p log w`` per partition (and a time band's outlier
   reactions, ``(d, outliers)``);
3. the client sums them in partition order (``blocks.sum_partials``, as ``reduce_blocks`` does) and sends back Z
   (and the summed reactions); each worker forms its rows of the gradient (``Objective.gradient``, elementwise)
   and reports whether they are finite.

The optimiser's steps are row-block functions (``HeldState.map``) run where the rows are.  So per delta-bar-delta
iteration the client sends and receives scalars and vectors of ``d`` numbers, never O(N), and the numbers are
the in-process executor's bit for bit (the same block functions on the same rows, reduced in the same order).

The spectral direction (``optim.descent_held``) also needs the curvature weights at the held coordinates and
Laplacian products of held vectors (CG's ``p``).  Both are one client wait each, two dependent task steps on the
workers (``_halo_round``): each worker applies what is pending to its rows and cuts the columns the other workers'
halos need (``held_cut``); each worker assembles its own rows and the pieces it received and computes
(``held_curvature``: the weights stay in its box beside the rows, with ``L(C)``'s diagonal; ``held_laplacian``:
the product's rows held, followed by a row-block function such as CG's ``p . Ap``).

A layout the workers cannot evaluate on their halos -- a capped grid, whose near field reads every point, or
``auto`` choosing the exact kernel -- is evaluated the client-held way for that evaluation: the coordinates are
gathered, evaluated, and the gradient's rows sent back (O(N), counted in the executor's stats).

Checkpoints: the workers write their partitions' rows straight into the output store (``write_rows``: even
partitions, then odd ones, so no chunk has two writers at once) and return each partition's digest; the client
writes only the version's small metadata and switches the pointer once every worker has reported
(``scalemb.store.checkpoint.write_checkpoint``).  A rewind reads them back the same way (``load_rows``).

Faults: the held rows live only in the workers' memory.  A worker lost mid-run loses them: the optimiser rewinds to
its last checkpoint (the workers alive re-read their rows from the store) or to its start (re-derived from the
seed), and replays; where it cannot, the run stops with ``WorkersLostError`` (the CLI exits 4) and continues from
its last checkpoint (``scalemb resume``).
"""
import pickle

import numpy as np

from ..repulsion.grid import band_outliers, grid_from_summaries
from .blocks import Evaluation, sum_partials
from .faults import SchedulerLostError, WorkerLeft, WorkersLostError
from .held import HeldRowsLost, digest_block, write_block, write_result_block
from .held_tasks import (
    HeldStateLost, held_put, held_load, held_apply, held_apply_formed, held_band_counts, held_own, held_cut,
    held_pick, held_curvature, held_laplacian, held_ensure, held_finish_view, held_gradient, held_put_rows, unpacked,
    rows_extent, rows_copy)


class HeldWorkersLost(WorkersLostError, HeldRowsLost):
    """A worker holding the optimiser's rows was lost: the optimiser rewinds to its last exported state and holds
    it again (``DaskHeld.recover``); where it cannot, the run stops like any lost cluster (exit 4, the last
    checkpoint intact)."""


class DaskHeld:
    """Held arrays on the workers of a ``DaskExecutor`` (module docstring); ``engine.held``'s interface."""
    remote = True  # lost with a worker: the optimiser rewinds to a checkpoint or its start

    def __init__(self, executor, arrays: dict):
        self.ex = executor
        self.n_points = executor.n_points
        self._put_all(arrays)

    @property
    def bounds(self) -> list:
        """The blocks (partitions) the rows are held by, ``[(r0, r1), ...]`` in order."""
        return [(int(a), int(b)) for a, b in self.ex.partitions]

    def write_rows(self, directory: str, fields: dict) -> dict:
        """Each worker writes its partitions' rows into ``directory/field`` (even partitions, then odd ones:
        ``engine.held``); ``{field: [digest per partition]}``.  Returns only once every task has ended, so that
        nothing writes into ``directory`` after a failure is raised (the caller removes it)."""
        return self._write(directory, fields, write_block)

    def write_result_rows(self, directory: str, fields: dict) -> dict:
        """``write_rows`` with ``engine.held.write_result_block``: also each partition's coordinates into the
        result's ``directory/embedding`` (a finished run's final write); its digests under ``embedding``."""
        return self._write(directory, fields, write_result_block)

    def _write(self, directory: str, fields: dict, writer) -> dict:
        extent = self._extent  # the writes move no point: the extent hint stays valid
        self.map(_noop)  # the pending shift applied first (as every later task would)
        digests = {}
        for parity in (0, 1):
            starts = frozenset(r0 for k, (r0, _) in enumerate(self.bounds) if k % 2 == parity)
            plan = self.ex._halo_state()[0]
            self._check_holders(plan)
            with self.ex._one_graph():
                futures = [self.ex._submit(held_apply, self._boxes[w], plan.parts[w], None, writer,
                                           (directory, fields, starts), worker=w) for w in plan.workers]
            self.ex.stats["bytes_sent"] += len(futures) * _size((directory, fields, starts))
            try:
                batches = self._gather(futures)
            except BaseException:
                _settle(futures, 60.0)  # the other workers' writes end before the caller removes the directory
                raise
            self.ex.stats["bytes_received"] += _size(batches)
            for k, result in enumerate(self._by_partition(batches)):
                if result is not None:
                    for field, digest in result.items():
                        digests.setdefault(field, [None] * len(self.bounds))[k] = digest
        self._extent = extent
        return digests

    def load_rows(self, directory: str, fields: dict) -> dict:
        """After ``HeldWorkersLost``: wait until every partition of P is held again, then each worker reads its
        partitions' rows of ``directory/field`` (``{name: field}``); ``{field: [digest per partition]}`` of what
        was read."""
        self.close()
        self._recover()
        executor = self.ex
        self._reset()
        self._dims = {name: self._dims.get(name, executor.space_dims) for name in fields}
        plan = self._plan()
        for w in plan.workers:
            ks = plan.parts[w]
            self._boxes[w] = executor._submit(held_load, directory, fields, ks, [executor.partitions[k] for k in ks],
                                              worker=w)
        self._guard(lambda: executor._settle(list(self._boxes.values())))
        parts = self.map(digest_block, fields)
        return {field: [p[field] for p in parts] for field in fields.values()}

    def _reset(self) -> None:
        self._boxes = {}
        self._shift = None
        self._extent = None
        self._pending = None  # a deferred gradient's (z, exaggeration, outliers, reaction): formed by the next map
        self.gradient_finite = None

    def _put_all(self, arrays: dict) -> None:
        """Send each worker its partitions' rows of ``arrays`` (its box: ``held_put``)."""
        executor = self.ex
        self._reset()
        self._dims = {name: int(a.shape[0]) for name, a in arrays.items()}
        plan = self._plan()
        for w in plan.workers:
            ks = plan.parts[w]
            parts = [{name: np.ascontiguousarray(a[:, slice(*executor.partitions[k])]) for name, a in arrays.items()}
                     for k in ks]
            data = executor.client.scatter(parts, workers=[w], hash=False)
            self._boxes[w] = executor._submit(held_put, data, ks, [executor.partitions[k][0] for k in ks], worker=w)
            executor.stats["bytes_sent"] += sum(a.nbytes for p in parts for a in p.values())
        self._guard(lambda: executor._settle(list(self._boxes.values())))

    def recover(self, arrays: dict) -> None:
        """After ``HeldWorkersLost``: wait until every partition of P is held again (``DaskExecutor._recover``,
        within its recovery deadline, else ``WorkersLostError``), then hold ``arrays`` (a state the optimiser
        exported) on the workers holding them now."""
        self.close()
        self._recover()
        self._put_all(arrays)

    def _recover(self) -> None:
        """``DaskExecutor._recover``, the scheduler's loss reported as such (``SchedulerLostError``)."""
        try:
            self.ex._recover()
        except Exception as exc:  # noqa: BLE001
            self.ex._raise_if_scheduler_lost(exc)
            raise

    # --- plumbing

    def _plan(self):
        plan = self.ex._halo_state()[0]
        self._holders = {w: list(plan.parts[w]) for w in plan.workers}
        return plan

    def _gather(self, futures) -> list:
        return self._guard(lambda: self.ex._gather(futures))

    def _guard(self, fn):
        """``fn()``; a worker lost meanwhile took held rows with it: ``HeldWorkersLost``.  A failure with every
        holder alive (after a few seconds for the scheduler to notice a death) is the task's own: raised."""
        try:
            return fn()
        except (SchedulerLostError, HeldWorkersLost):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a lost worker raised
            self.ex._raise_if_scheduler_lost(exc)  # the scheduler gone: no rewind can help (the CLI exits 4)
            # a holder seen leaving during the wait (``WorkerLeft``) rewinds even if it is back: its rows may be gone
            if isinstance(exc, (HeldStateLost, WorkerLeft)) or "HeldStateLost" in repr(exc) or self._lost_a_holder():
                raise HeldWorkersLost(f"a Dask worker holding the optimiser's rows was lost ({exc.__class__.__name__}"
                                      f": {exc})") from None
            raise

    def _lost_a_holder(self, wait: float = 5.0) -> bool:
        import time

        end = time.monotonic() + wait
        while True:
            if self.ex._holder_left():
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.25)

    def _per_worker(self, fn, *args, shift=None) -> list:
        """``fn(box, ks, shift, *args)`` on every worker holding rows; results in partition order (each worker's
        list of per-partition results, concatenated)."""
        return self._by_partition(self._per_worker_args(fn, lambda w: args, shift=shift))

    def _by_partition(self, batches: list) -> list:
        """Per-worker lists of per-partition values, as one list in partition order."""
        plan = self.ex._halo_state()[0]
        results = [None] * len(self.ex.partitions)
        for w, batch in zip(plan.workers, batches):
            for k, value in zip(plan.parts[w], unpacked(batch)):
                results[k] = value
        return results

    def _take_shift(self):
        shift, self._shift = self._shift, None
        return shift

    # --- the HeldState interface

    def map(self, fn, *args) -> list:
        self._extent = None  # ``fn`` may move the points
        if self._pending is None:
            return self._per_worker(held_apply, fn, args, shift=self._take_shift())
        return self._forming_pending(lambda pending_of: self._per_worker_args(
            held_apply_formed, lambda w: (pending_of(w), fn, args), shift=self._take_shift()))

    def _forming_pending(self, submit) -> list:
        """``submit(pending_of)``: the workers' ``(flags, results)`` from tasks that first form the deferred
        gradient's rows (``pending_of(w)``: ``held_gradient``'s arguments for worker w's partitions, None without
        one).  The gradient is no longer pending; its flags are kept as ``gradient_finite``; the results, in
        partition order."""
        pending, self._pending = self._pending, None
        plan = self.ex._halo_state()[0]
        batches = submit(lambda w: None if pending is None else self._pending_args(pending, plan.parts[w]))
        if pending is not None:
            self.gradient_finite = all(f for flags, _ in batches for f in flags)
        return self._by_partition([results for _, results in batches])

    def _pending_args(self, pending: tuple, ks: list) -> tuple:
        z, exaggeration, outliers, reaction = pending
        return ([self.ex.partitions[k] for k in ks], z, exaggeration, self.ex.model.objective, self.n_points,
                outliers, reaction)

    def _per_worker_args(self, fn, args_of, shift=None) -> list:
        """``fn(box, ks, shift, *args_of(w))`` on every worker holding rows: the per-worker results."""
        plan = self.ex._halo_state()[0]
        self._check_holders(plan)
        with self.ex._one_graph():
            futures = [self.ex._submit(fn, self._boxes[w], plan.parts[w], shift, *args_of(w), worker=w)
                       for w in plan.workers]
        self.ex.stats["bytes_sent"] += sum(_size((shift, args_of(w))) for w in plan.workers)
        batches = self._gather(futures)
        self.ex.stats["bytes_received"] += _size(batches)
        return batches

    def ensure(self, shapes: dict) -> None:
        missing = {name: int(d) for name, d in shapes.items() if name not in self._dims}
        if not missing:
            return
        self._dims.update(missing)
        extent = self._extent
        self.map(held_ensure, missing)
        self._extent = extent  # no point moved

    def set_curvature(self, exaggeration: float, fixed: bool, after=None) -> list:
        """The curvature weights at the held coordinates, computed and kept on each worker beside its partitions'
        rows (their coordinates' halo exchanged worker to worker: ``_halo_batches``); ``diag`` held; the
        diagonal's sum per partition, or ``(sum, after's result)`` with ``after = (fn, args)`` run on the rows
        last.  A deferred gradient's rows are formed in the same tasks (one client round trip fewer)."""
        return self._guard(lambda: self._set_curvature(exaggeration, fixed, after))

    def _set_curvature(self, exaggeration: float, fixed: bool, after) -> list:
        ex = self.ex
        return self._forming_pending(lambda pending_of: self._halo_batches(
            "coords", None, held_curvature,
            lambda w: (ex._model_arg, ex.space_dims, exaggeration, fixed, pending_of(w), after)))

    def laplacian(self, source: str, target: str, before=None, after=None) -> list:
        """``target <- L(C) source`` in one client round trip (``_halo_round``), ``before`` applied to the rows
        first, ``after`` to the product's rows."""
        return self._guard(lambda: self._halo_round(source, before, held_laplacian, target, after))

    def _halo_round(self, name: str, before, fn, *args) -> list:
        """``_halo_batches`` with the same ``args`` for every worker, a deferred gradient formed first: the
        per-partition results, in partition order."""
        self._form_pending()
        return self._by_partition(self._halo_batches(name, before, fn, lambda w: args))

    def _halo_batches(self, name: str, before, fn, args_of) -> list:
        """``fn(box, ks, view, name, cut, received, *args_of(w))`` on every worker w, on its compact columns of the
        held array ``name``, in two dependent task steps and one client wait: each worker v applies the pending
        shift and ``before`` to its rows and cuts the columns each other worker's halo needs (``held_cut``); each
        worker w assembles its own rows and the pieces it receives (worker to worker) and runs ``fn``.  The
        workers' results; the coordinates' extent hint survives (they did not move)."""
        ex = self.ex
        plan, views, needs = ex._halo_state()
        self._check_holders(plan)
        extent, shift = self._extent, self._take_shift()
        targets = {v: [w for w in plan.workers if (v, w) in needs] for v in plan.workers}
        with ex._one_graph():
            cuts = {v: ex._submit(held_cut, self._boxes[v], plan.parts[v], shift, name, before,
                                  [needs[v, w] for w in targets[v]], worker=v) for v in plan.workers}
            pieces = {}
            for v in plan.workers:
                for i, w in enumerate(targets[v]):
                    pieces[v, w] = cuts[v] if len(targets[v]) == 1 else ex._submit(held_pick, cuts[v], i, worker=v)
            futures = [ex._submit(fn, self._boxes[w], plan.parts[w], views[w], name, cuts[w],
                                  [pieces[v, w] for v in plan.sources(w)], *args_of(w), worker=w)
                       for w in plan.workers]
        ex.stats["bytes_sent"] += len(cuts) * _size((shift, name, before))
        ex.stats["bytes_sent"] += sum(_size((name, args_of(w))) for w in plan.workers)
        ex.stats["bytes_between_workers"] += sum(plan.pieces.values()) * \
            self._dims.get(name, ex.space_dims) * 8
        batches = self._gather(futures)
        ex.stats["bytes_received"] += _size(batches)
        self._extent = extent
        return batches

    def _form_pending(self) -> None:
        if self._pending is not None:
            self.map(_noop)

    def _check_holders(self, plan) -> None:
        """``HeldWorkersLost`` if the partitions are no longer held by the workers holding the optimiser's rows."""
        if {w: list(plan.parts[w]) for w in plan.workers} != self._holders:
            raise HeldWorkersLost("the partitions moved to other Dask workers (a worker left); the optimiser's "
                                  "rows stayed with the old ones")

    def extent_hint(self, lo: np.ndarray, hi: np.ndarray) -> None:
        self._extent = (np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))

    def shift(self, vector: np.ndarray) -> None:
        if self._shift is not None:
            self.map(_noop)
        self._shift = np.asarray(vector, dtype=np.float64)
        self._extent = None

    def gather(self, *names) -> dict:
        parts = self.map(rows_copy, names)
        return {name: np.concatenate([p[i] for p in parts], axis=1) for i, name in enumerate(names)}

    def put(self, name: str, array: np.ndarray) -> None:
        self._put_rows(name, [array[:, r0:r1] for r0, r1 in self.ex.partitions])

    def _put_rows(self, name: str, rows: list) -> None:
        plan = self.ex._halo_state()[0]
        with self.ex._one_graph():
            futures = [self.ex._submit(held_put_rows, self._boxes[w], plan.parts[w], name,
                                       [rows[k] for k in plan.parts[w]], worker=w) for w in plan.workers]
        self.ex.stats["bytes_sent"] += sum(r.nbytes for r in rows)
        self._gather(futures)

    def evaluate(self, exaggeration: float, with_kl: bool, iteration: int | None = None,
                 defer: bool = False) -> Evaluation:
        self._pending, self.gradient_finite = None, None
        return self._guard(lambda: self._evaluate(exaggeration, with_kl, iteration, defer))

    def _evaluate(self, exaggeration: float, with_kl: bool, iteration: int | None, defer: bool) -> Evaluation:
        ex = self.ex
        n, ds = self.n_points, ex.space_dims
        if self._extent is not None:
            lo, hi = self._extent
        else:
            extents = self.map(rows_extent)
            lo = np.minimum.reduce([e[0] for e in extents])
            hi = np.maximum.reduce([e[1] for e in extents])
        self._extent = None
        auto = ex.auto_repulsion
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            if auto is not None:
                auto.decide(auto.unbuildable(n))
            return self._not_finite()
        try:
            grid = grid_from_summaries(
                ex.model, ds, lo, hi, n, ex.fft_params,
                lambda lo_t, h: np.sum(self._per_worker_args(held_band_counts, lambda w: (ds, lo_t, h),
                                                             shift=self._take_shift()), axis=0),
                lambda band: self._outliers(band))
        except FloatingPointError:
            if auto is not None:
                auto.decide(auto.unbuildable(n))
            return self._not_finite()
        if grid.capped:  # its near field reads every point: evaluated with the coordinates on the client
            return self._on_client(exaggeration, with_kl, iteration, None)
        if auto is not None:
            choice = auto.decide(auto.predict_on(grid, n))
            if choice.method != "fft":
                return self._on_client(exaggeration, with_kl, iteration, choice)
        plan = ex._halo_state()[0]
        shift = self._take_shift()
        with ex._one_graph():  # the rows' tasks and the evaluation's in one graph (``_halo_partials`` sends it)
            own = {w: ex._submit(held_own, self._boxes[w], plan.parts[w], shift, worker=w) for w in plan.workers}
            ex.stats["bytes_sent"] += len(own) * _size(shift)
            results, grid_z = ex._halo_partials(grid, with_kl, own, ex.space_dims + ex.time_dims,
                                                keep=lambda w: (held_finish_view, self._boxes[w], plan.parts[w]))
        ex.stats["bytes_received"] += _size(results)
        z, plogw, reaction = sum_partials(results, grid_z)
        value, total = ex.model.objective.values(plogw, z, ex._entropy, exaggeration, with_kl, n)
        if defer:  # formed by the next ``map``, in the same task (one round trip fewer)
            self._pending = (z, exaggeration, grid.outliers, reaction)
            return Evaluation(float(value), float(total), None, float(z), None)
        flags = self._gradient(z, exaggeration, grid.outliers, reaction)
        self.gradient_finite = all(flags)
        return Evaluation(float(value), float(total), None, float(z), self.gradient_finite)

    def _gradient(self, z, exaggeration, outliers, reaction) -> list:
        ex = self.ex
        plan = ex._halo_state()[0]
        with ex._one_graph():
            futures = [ex._submit(held_gradient, self._boxes[w], plan.parts[w],
                                  [ex.partitions[k] for k in plan.parts[w]], z, exaggeration, ex.model.objective,
                                  self.n_points, outliers, reaction, worker=w) for w in plan.workers]
        ex.stats["bytes_sent"] += len(futures) * _size((z, exaggeration, outliers, reaction))
        flags = [f for batch in self._gather(futures) for f in batch]
        ex.stats["bytes_received"] += _size(flags)
        return flags

    def _outliers(self, band) -> tuple:
        parts = self.map(_band_outliers_at, self.ex.space_dims, band)
        return (np.concatenate([p[0] for p in parts]).astype(np.int64),
                np.ascontiguousarray(np.concatenate([p[1] for p in parts], axis=1)))

    def _not_finite(self) -> Evaluation:
        nan = float("nan")
        self.gradient_finite = False
        return Evaluation(nan, nan, None, nan, False)

    def _on_client(self, exaggeration, with_kl, iteration, choice) -> Evaluation:
        """The client-held way, for one evaluation (module docstring)."""
        coords = self.gather("coords")["coords"]
        ev = self.ex.evaluate(coords, exaggeration, with_kl=with_kl, iteration=iteration, choice=choice)
        self.put("gradient", ev.gradient)
        ev.finite = self.gradient_finite = bool(np.isfinite(ev.gradient).all())
        ev.gradient = None
        return ev

    def close(self) -> None:
        """Release the workers' boxes (the scheduler drops them; it does too when the client disconnects)."""
        for future in getattr(self, "_boxes", {}).values():
            future.release()
        self._boxes = {}


def _settle(futures: list, timeout: float) -> None:
    """Wait (at most ``timeout`` seconds) until none of ``futures`` is pending, whatever their outcome."""
    import time

    end = time.monotonic() + timeout
    while any(f.status == "pending" for f in futures) and time.monotonic() < end:
        time.sleep(0.05)


def _noop(rows: dict) -> None:
    return None


def _band_outliers_at(rows: dict, space_dims: int, band: tuple) -> tuple:
    """``band_outliers`` of a partition's rows with their global row numbers (``rows['_r0']``: its first)."""
    return band_outliers(rows["coords"], space_dims, band, rows["_r0"])


def _size(value) -> int:
    """Bytes ``value`` takes on the wire (pickled), for the executor's client-traffic counters."""
    return len(pickle.dumps(value, protocol=5))
