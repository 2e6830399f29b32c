"""The halo exchange of the Dask executor (``engine.distributed.DaskExecutor``, which inherits it): each worker's
halo plan and relabelled partitions (``_halo_state``), its own rows sent by the client and its halo cut and sent by
the workers that own those rows (``_exchange``, ``_assemble``), and one FFT evaluation scheduled over the workers
(``_halo_partials``: spreading, the grids summed among the workers, the convolution on up to
``CONVOLVING_WORKERS``, the rows' attraction and repulsion where they live).  The module docstring of
``engine.distributed`` ("Halo exchange") says what travels where; ``engine.halo`` holds the functions the tasks run.

``HaloExchange`` is a base class holding no state of its own: it reads the executor's ``client``, ``partitions``,
``_blocks``, ``_holders``, ``stats``, model and FFT settings, calls its ``_submit``, ``_gather``, ``_settle`` and
``_wait_for_partitions``, and keeps the plan in ``_halo``, ``_plan_shares`` and ``_full`` (dropped by a recovery).
"""
import dataclasses
import pickle

import numpy as np

from ..repulsion.convolution import convolution_shares, fft_dtype
from . import halo as halo_fns
from .blocks import reduce_blocks
from .fft_pass import fft_grid

# Workers that each sum all W charge grids themselves (``halo.convolve_grids``); above it, a tree (``_sum_grids``).
DIRECT_SUM_WORKERS = 4
# How many workers share one evaluation's convolution (None: as many as it has shares, at most W; 1: one worker
# convolves).  1 by default: with the workers on one machine the convolving worker's FFT threads (``-1``: every
# CPU) use the cores the others leave while they wait for its potentials, and each further share repeats the
# forward transform beside the others' threads (measured slower on a loaded 2-core machine: docs/scaling.md).
# None suits workers on separate machines, whose cores the others cannot use.
CONVOLVING_WORKERS = 1
# A grid whose pickle is at most this size goes in every task that reads it (no task holding it on each worker:
# a task fewer per worker and evaluation); a larger one (SNEST's time band: ~19 KB) once per worker.
GRID_IN_TASKS_BYTES = 4096
# Up to this many own rows a worker, the box order of an evaluation is made in the tasks that read it (twice: a
# task and a dependent hop fewer, ~6-8 ms of Dask latency); above, once, in a task of its own (measured on one
# thread: 8.6 ms for 75,000 rows, 28 ms for 384,000).
VISIT_IN_TASKS_ROWS = 50_000
# Whether the potentials go back to a worker packed as the boxes its rows occupy (``halo.restrict_share``), as its
# charges came.  It costs a dependent task on the convolving worker after its convolution (a Dask hop, ~6 ms, and
# the packing) and the unpacking on the other, about what the bytes it saves take on loopback (2 workers at 1.5e5
# points: 0.422 against 0.426 s per iteration, pooled rounds, runs scattered 1.2-1.45x); on a slower link the
# bytes dominate (18 MB of potentials -> ~5 MB: at 1 Gb/s 0.392 against 0.530 s per iteration).  False: whole.
PACK_POTENTIALS = True


def _summed_grid_transfers(workers: int, k: int) -> int:
    """Charge grids that travel between workers to leave the sum on ``k`` of ``workers`` (``_sum_grids``)."""
    if workers <= DIRECT_SUM_WORKERS:
        return k * (workers - 1)
    return workers - 1 + k - 1


def array_bytes(value) -> int:
    """Bytes of the arrays in ``value`` (an array, or a dataclass / object holding arrays); functions (a grid
    spec's plan and near pair, compiled or not) and classes hold none."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if callable(value) or isinstance(value, type):
        return 0
    if dataclasses.is_dataclass(value):
        return sum(array_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    attributes = getattr(value, "__dict__", None)
    return sum(array_bytes(v) for v in attributes.values()) if isinstance(attributes, dict) else 0


class HaloExchange:
    """The halo exchange ``DaskExecutor`` inherits (module docstring)."""

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
        self.stats["bytes_sent"] += sum(array_bytes(v) for v in values.values())
        return futures

    def _exchange(self, X: np.ndarray | None, own: dict | None = None, dims: int | None = None,
                  priority: int = 0) -> tuple:
        """Each worker's own rows of ``X`` (``(d, N)``, internal order), sent by the client -- or ``own``, futures
        of those rows already on the workers (``d = dims``) -- and the pieces of each worker's halo, cut by the
        workers that own them: futures ``own[w]``, ``pieces[v, w]``."""
        plan, views, needs = self._halo_state()
        if own is None:
            own = self._scatter_each({w: np.ascontiguousarray(X[:, halo_fns.own_rows(self.partitions, plan.parts[w])])
                                      for w in plan.workers})
            dims = X.shape[0]
        pieces = {key: self._submit(halo_fns.take_columns, own[key[0]], needs[key], worker=key[0], priority=priority)
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
        self.stats["bytes_received"] += sum(array_bytes(r) for r in results)
        return reduce_blocks(results, coords.shape, self._entropy, exaggeration, z_outside_blocks=grid_z,
                             with_kl=with_kl, objective=self.model.objective, outliers=grid.outliers)

    def _halo_partials(self, grid, with_kl: bool, own: dict, dims: int, keep=None) -> tuple:
        """``(per-partition results, grid Z)`` of one FFT evaluation at the workers' own rows ``own`` (futures per
        worker, ``(dims, rows)``); ``keep(w)``: instead of ``halo.finish_view``, the arguments ``(fn, *args)`` of
        the worker function that finishes the evaluation and keeps the rows there (``engine.held_dask``).

        The schedule, per worker: the halo pieces it cuts for the others (``_exchange``: they travel meanwhile);
        its own rows' charges in box order (``spread_view``), which need no halo; on each of the first K workers
        (K: as many as the convolution has shares, ``repulsion.convolution.convolution_shares``, at most W;
        ``CONVOLVING_WORKERS``) the summed charges and its share of the convolution (``convolve_grids``; above
        ``DIRECT_SUM_WORKERS``, ``add_grids`` in a tree and ``convolve_part``); the rows' attraction on the
        compact columns and their box order (``prepare_view``: no potentials needed, so on the other workers it
        runs while the grids travel and are convolved, on a convolving worker after its share); then the rows'
        repulsion from all the shares (``finish_prepared``)."""
        plan, views, _ = self._halo_state()
        self.stats["calls"] += 1
        self.stats["halo_evaluations"] += 1
        workers = plan.workers
        # Per evaluation and worker: the rows, the cut, the charges, ``prepare_view``, the interpolation (it was 7
        # tasks and three hops before the charges: each task costs the scheduler CPU and each dependent step a Dask
        # hop).  The grid rides in the tasks if small (``GRID_IN_TASKS_BYTES``); the box order is made where it is
        # read for few rows a worker (``VISIT_IN_TASKS_ROWS``).  Priorities give each worker the order (equal, it
        # ran its ready tasks in the order of their names): the pieces the others wait for, the charges, the sum
        # and convolution, the attraction, the interpolation.
        with self._one_graph():  # one message to the scheduler (``engine.dask_graph``), sent by the wait
            blob = len(pickle.dumps(grid, protocol=5))
            on = {w: grid for w in workers} if blob <= GRID_IN_TASKS_BYTES else \
                {w: self._submit(halo_fns.relay, grid, worker=w, priority=5) for w in workers}
            own, pieces = self._exchange(None, own, dims, priority=4)
            rows = max(sum(self.partitions[j][1] - self.partitions[j][0] for j in plan.parts[w]) for w in workers)
            if rows <= VISIT_IN_TASKS_ROWS:
                visits = {w: None for w in workers}
            else:
                visits = {w: self._submit(halo_fns.visit_view, views[w], own[w], on[w], worker=w, priority=3)
                          for w in workers}
            shares = convolution_shares(grid) if CONVOLVING_WORKERS is None else CONVOLVING_WORKERS
            k = max(1, min(len(workers), shares))
            # the convolving workers' charges whole, the others' packed (the boxes their rows occupy:
            # ``halo.spread_packed``), unless they are summed in a tree (``add_grids``)
            packs = len(workers) <= DIRECT_SUM_WORKERS
            grids = [self._submit(halo_fns.spread_packed if packs and i >= k else halo_fns.spread_view, views[w],
                                  own[w], on[w], visits[w], worker=w, priority=3) for i, w in enumerate(workers)]
            if packs:  # each convolving worker sums all the grids itself, in its task
                parts = [self._submit(halo_fns.convolve_grids, on[workers[i]], i, k, self._fft_workers, grids[i],
                                      *(grids[:i] + grids[i + 1:]), worker=workers[i], priority=2) for i in range(k)]
            else:
                totals = self._sum_grids(grids, workers, k)
                parts = [self._submit(halo_fns.convolve_part, on[workers[i]], totals[i], i, k, self._fft_workers,
                                      worker=workers[i], priority=2) for i in range(k)]
            # a convolving worker's attraction runs beside its convolution (which leaves it the worker's slot:
            # ``halo.convolve_grids``), so it waits for the same charges; started before them it held up the
            # potentials every worker waits for (2 workers at 1.5e5 points: the other worker idle ~25 ms an
            # evaluation), started after the convolution it was ~30 ms of every evaluation's critical path
            after = [grids[:i] + grids[i + 1:] if packs else parts[i] for i in range(k)]
            prepared = {w: self._submit(halo_fns.prepare_view, views[w], own[w],
                                        [pieces[v, w] for v in plan.sources(w)], on[w], self._model_arg,
                                        self.space_dims, with_kl, visits[w], after[i] if i < k else None, worker=w,
                                        priority=1) for i, w in enumerate(workers)}
            # with ``PACK_POTENTIALS``, a worker whose charges went packed gets the shares packed alike (its rows'
            # boxes: ``restrict_share``, on the convolving worker after its convolution); a time axis' go whole
            restricted = PACK_POTENTIALS and packs and grid.time_in is None
            futures = []
            for i, w in enumerate(workers):
                fn, *extra = (halo_fns.finish_prepared,) if keep is None else keep(w)
                shares_of = parts if i < k or not restricted else \
                    [self._submit(halo_fns.restrict_share, parts[j], grids[i], on[workers[j]], worker=workers[j],
                                  priority=2) for j in range(k)]
                futures.append(self._submit(fn, views[w], own[w], on[w], prepared[w], shares_of, *extra, worker=w))
            z_future = self._submit(halo_fns.convolution_z, parts[-1], worker=workers[k - 1])
        *batches, grid_z = self._gather(futures + [z_future])  # one wait: the client's round trips are latency
        results = [None] * len(self.partitions)
        for w, batch in zip(workers, batches):
            for j, res in zip(plan.parts[w], batch):
                results[j] = res
        # whole grids' bytes: an upper bound where they travel packed (the occupied boxes' share, known on the
        # workers only)
        potential_bytes = grid.n_potentials * np.dtype(fft_dtype(self.space_dims)).itemsize
        self.stats["bytes_between_workers"] += (len(workers) - 1) * grid.n_nodes * potential_bytes
        self.stats["bytes_between_workers"] += _summed_grid_transfers(len(workers), k) * grid.n_nodes * 8
        # the grid in the 3W + K tasks that read it, or once per worker (``relay``)
        self.stats["bytes_sent"] += (3 * len(workers) + k if blob <= GRID_IN_TASKS_BYTES else len(workers)) * blob
        return results, grid_z

    def _sum_grids(self, grids: list, workers: list, k: int) -> list:
        """The summed charge grids on each of ``workers[:k]`` (futures), for more than ``DIRECT_SUM_WORKERS``
        workers (with fewer, each convolving worker sums all the grids in its convolution's task,
        ``halo.convolve_grids``: fetched at once, no dependent rounds): a pairwise tree among the workers into the
        first, then copies down a tree (``_broadcast``).  Integer sums: the same grid either way."""
        grids = list(grids)
        for round_ in halo_fns.tree_pairs(workers):  # pairwise sums among the workers, never via the client
            for i, j in round_:
                grids[i] = self._submit(halo_fns.add_grids, grids[i], grids[j], worker=workers[i], priority=2)
        return self._broadcast(grids[0], workers[:k])

    def _broadcast(self, future, workers: list) -> list:
        """``future``'s value on every worker, by a tree of copies (round r: workers ``0 .. 2^r - 1`` send to
        ``2^r .. 2^{r+1} - 1``): the root sends log2(W) times, not W."""
        copies = [future] + [None] * (len(workers) - 1)
        step = 1
        while step < len(workers):
            for i in range(min(step, len(workers) - step)):
                copies[i + step] = self._submit(halo_fns.relay, copies[i], worker=workers[i + step], priority=2)
            step *= 2
        return copies
