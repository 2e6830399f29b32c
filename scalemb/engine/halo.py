"""Halo exchange: what each Dask worker needs of the coordinates, and the functions it runs on them.

A worker w holds some of P's row partitions (its *own* rows: the union of their row ranges).  Its rows' columns
touch its own rows and a set of other rows, its *halo* ``H_w``.  The attractive term, the curvature weights and
the Laplacian products of its rows need exactly the coordinates of ``U_w = own_w + H_w``; so, per evaluation:

1. the client sends each worker the coordinates of its own rows (N·d numbers in all, not W·N·d);
2. each worker cuts, for every other worker, the columns of its own rows that the other's halo holds
   (``take_columns``), and the other worker assembles its compact ``(d, |U_w|)`` array (``assemble``): the halo
   travels worker to worker, never through the client;
3. with FFT repulsion, each worker visits its own rows in box order (``visit_view``) and spreads their charges
   (``spread_view``: fixed point, so partial grids sum exactly in any order); it computes their attraction
   (``attraction_view``, with the box order again for the interpolation: ``prepare_view``) while the grids are
   summed on each of the K workers that convolve and convolved there (one by default; each of K computes every
   K-th potential column or time component: ``convolve_grids``, or beyond a few workers a tree of ``add_grids``
   and ``convolve_part``); each worker interpolates its own rows from the convolution's shares (``finish_view``);
4. the client gathers the rows of the gradient (and the blocks' small sums) and reduces them in partition order.

A Laplacian product (the spectral direction's CG steps) is one task round instead: the client sends each worker
its compact columns of V, own rows and halo together (``laplacian_compact``).

The worker's partitions are relabelled once (``make_view``): column indices into ``U_w`` (sorted, so a
partition's own rows are a contiguous run of it) and ``r0`` its position there; the block kernels run unchanged
on the compact array (``scalemb.engine.blocks``), in the same order on the same numbers, so the result is bit
for bit the in-process executor's.  What this leaves out: the exact all-pairs repulsion and a capped FFT grid's
near field read every point's coordinates, so those evaluations still broadcast Y (``DaskExecutor``).

Communication per evaluation, for W workers, N points, d coordinates, G grid nodes: ``docs/scaling.md``.
"""
from dataclasses import dataclass

import numpy as np

from ..affinity.affinity import RowBlock
from ..repulsion.convolution import ConvolutionShare, convolve_share, join_convolution
from ..repulsion.fft import fixed_charges, interpolate_grid, spread_fixed
from ..repulsion.interpolation import gather_columns, gather_columns_into, put_columns
from ..repulsion.packed import PackedCharges, PackedShare, pack_charges, pack_share, sum_charges, unpack_share
from .blocks import attraction_block, curvature_block, laplacian_block, point_major, repulsion_block_fft
from .base import block_model


@dataclass
class WorkerView:
    """One worker's partitions relabelled to its compact columns ``columns`` (``U_w``, sorted global rows).

    ``own``: positions in ``columns`` of the worker's own rows, in the order the client sends them (ascending);
    ``sources``: per source worker (in the client's order) the positions its piece fills; ``blocks``: the
    partitions with ``indices`` into ``columns`` and ``r0, r1`` their positions; ``bounds``: their global rows.
    """

    columns: np.ndarray
    own: np.ndarray
    sources: list
    blocks: list
    bounds: list


# --------------------------------------------------------------------------- functions run on the workers

def own_halo(bounds: list, *blocks: RowBlock) -> np.ndarray:
    """Sorted distinct columns of ``blocks`` outside the row ranges ``bounds`` (a worker's halo)."""
    columns = np.unique(np.concatenate([b.indices for b in blocks])) if blocks else np.empty(0, np.int64)
    inside = np.zeros(columns.shape, dtype=bool)
    for r0, r1 in bounds:
        inside |= (columns >= r0) & (columns < r1)
    return columns[~inside].astype(np.int64)


def make_view(columns: np.ndarray, own: np.ndarray, sources: list, *blocks: RowBlock) -> WorkerView:
    """The worker's partitions relabelled to ``columns`` (see ``WorkerView``)."""
    local = []
    for b in blocks:
        r0 = int(np.searchsorted(columns, b.r0))
        local.append(RowBlock(r0, r0 + (b.r1 - b.r0), b.indptr, np.searchsorted(columns, b.indices), b.data))
    return WorkerView(columns, own, sources, local, [(b.r0, b.r1) for b in blocks])


def take_columns(X: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Columns ``positions`` of a worker's own rows ``X`` (``(d, rows)``): the piece another worker needs (a
    compiled loop: numpy's fancy indexing is slower on a few long rows)."""
    return gather_columns(np.ascontiguousarray(X, dtype=np.float64), positions)


def take_columns_parts(parts: list, positions: np.ndarray) -> np.ndarray:
    """``take_columns`` of the worker's own rows given as its partitions' rows (``parts``, in order), without
    joining them first: ``positions`` ascending (``worker_plan``'s ``needs``), so each partition's positions are
    one run of them.  Why: joining copies all of a worker's own rows per cut, to send the ~15 % of them that another
    worker's halo needs (t-SNE at 7.7e5 points on 2 workers: 6 MB per Laplacian product)."""
    widths = np.array([p.shape[1] for p in parts], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(widths)))
    at = np.searchsorted(positions, offsets)
    out = np.empty((parts[0].shape[0], positions.shape[0]))
    for k, part in enumerate(parts):
        if at[k + 1] > at[k]:
            gather_columns_into(np.ascontiguousarray(part, dtype=np.float64), positions[at[k]:at[k + 1]], at[k],
                                offsets[k], out)
    return out


def assemble(view: WorkerView, own: np.ndarray | list, *pieces: np.ndarray) -> np.ndarray:
    """The worker's compact coordinates ``(d, |U_w|)``: its own rows and the pieces of its halo.  ``own``: its
    partitions' rows, one array per partition (``view.blocks``' order) or all in one; each partition's rows are a
    contiguous run of the compact columns (``make_view``), copied there whole."""
    if not isinstance(own, list):
        own = np.split(own, np.cumsum([b.r1 - b.r0 for b in view.blocks])[:-1], axis=1)
    X = np.empty((own[0].shape[0], view.columns.shape[0]))
    for block, rows in zip(view.blocks, own):
        X[:, block.r0:block.r1] = rows
    for positions, piece in zip(view.sources, pieces):
        put_columns(X, positions, np.ascontiguousarray(piece, dtype=np.float64))
    return X


def visit_view(view: WorkerView, own: np.ndarray, grid) -> tuple:
    """The worker's own rows ``own`` (``(d, rows)``: its partitions' rows in order) in the grid's box order
    (``Grid.visit``), once per evaluation for both the spreading (``spread_view``) and the interpolation
    (``finish_view``), as the in-process pass visits all rows once (``engine.fft_pass``).  It needs only the
    worker's own rows, not its halo: the charges are spread while the halo travels.

    Why: visited per partition, each partition's rows (spread over the whole layout) are sorted and walked
    apart, and a box's nodes leave the cache between them (t-SNE R^2 at N = 7.7e5 on 2 workers: the spreading
    took 40-60 % less in one pass in box order: docs/scaling.md)."""
    return grid.visit(own, 0, own.shape[1])


def spread_view(view: WorkerView, own: np.ndarray, grid, visit: tuple | None = None) -> np.ndarray:
    """The fixed-point charges of the worker's own rows ``own`` (``scalemb.repulsion.fft.spread_fixed``) in the
    order ``visit`` (``visit_view``; made here if None): integers, so the same grid as any split of the rows."""
    return spread_fixed(grid, own, 0, own.shape[1], visit=visit_view(view, own, grid) if visit is None else visit)


def spread_packed(view: WorkerView, own: np.ndarray, grid, visit: tuple | None = None) -> PackedCharges:
    """``spread_view``'s charges at the boxes the rows occupy (``repulsion.packed``): what a worker that does
    not convolve sends to those that do, a fraction of the grid's bytes (23 % for each of two workers' rows at
    1.5e5 points), summed exactly (``convolve_grids``)."""
    visit = visit_view(view, own, grid) if visit is None else visit
    return pack_charges(grid, spread_fixed(grid, own, 0, own.shape[1], visit=visit), visit[2])


def add_grids(*grids: np.ndarray) -> np.ndarray:
    """The sum of whole fixed-point charge grids (``repulsion.packed.sum_charges``: exact, integer addition, any
    order gives the same): one step of the tree that sums them beyond ``DIRECT_SUM_WORKERS`` workers."""
    return sum_charges(None, *grids)


def convolve_part(grid, total: np.ndarray, share: int, shares: int, workers: int = -1) -> ConvolutionShare:
    """Share ``share`` of ``shares`` of the convolution of the summed fixed-point charges
    (``repulsion.convolution.convolve_share``)."""
    return convolve_share(grid, fixed_charges(grid, total), share, shares, workers)


def convolve_grids(grid, share: int, shares: int, workers: int, *grids) -> ConvolutionShare:
    """``convolve_part`` of the sum of the workers' charge ``grids`` (whole or packed: ``spread_packed``;
    ``repulsion.packed.sum_charges``), in one task: a Dask hop fewer on every evaluation's critical path.

    On a Dask worker it first leaves the worker's thread pool (``distributed.secede``): its transforms run on
    their own threads, and the slot it frees runs the worker's attraction (``prepare_view``) beside them instead
    of after them, where every other worker waited for it (2 workers at 1.5e5 points: ~30 ms an evaluation on
    the critical path, measured by ``benchmarks/dask_timeline.py``)."""
    _free_worker_slot()
    return convolve_part(grid, sum_charges(grid, *grids), share, shares, workers)


def restrict_share(share: ConvolutionShare, charges: PackedCharges, grid) -> PackedShare:
    """The convolution's ``share`` at the boxes of a worker's packed ``charges`` (``spread_packed``): all that
    worker's rows read of it (``repulsion.packed``), a fraction of the bytes sent back to it."""
    return pack_share(grid, share, charges.boxes)


def _free_worker_slot() -> None:
    """``distributed.secede()`` on a Dask worker (its next ready task may start beside this one); nothing
    elsewhere."""
    try:
        from distributed import secede

        secede()
    except (ImportError, ValueError):  # not in a Dask worker's task
        pass


def relay(value):
    """A copy of ``value`` on this worker (one step of the tree broadcast of the potentials)."""
    return value


def convolution_z(convolution) -> float:
    """Z's grid part of a ``Convolution`` or of the ``ConvolutionShare`` that holds it (the last)."""
    return float(convolution.z)


def attraction_view(view: WorkerView, X: np.ndarray, model, space_dims: int, with_kl: bool) -> list:
    """``blocks.attraction_block`` of each of the worker's partitions on its compact coordinates: ``[(A,
    plogw), ...]``.  It needs no potentials, so it runs while the charges are summed and convolved."""

    model = block_model(model)
    Yt = point_major(X)
    return [attraction_block(model, b, X, space_dims, with_kl, Yt) for b in view.blocks]


def prepare_view(view: WorkerView, own: np.ndarray, pieces: list, grid, model, space_dims: int, with_kl: bool,
                 visit: tuple | None = None, after=None) -> tuple:
    """What a worker's rows need before their potentials, in one task: ``(attraction_view`` on its compact
    columns (``assemble``: its own rows and the halo ``pieces``), the box order ``visit`` (``visit_view``; made
    here if None)``)``.  ``after``: tasks it waits for and does not read (on a convolving worker the other
    workers' charges, which its convolution waits for: both become ready together, the convolution starts first
    and leaves the worker's slot to this task, ``convolve_grids``).

    Why one task: each task costs the scheduler CPU (2 workers at 1.5e5 points: the process running the client
    and a ``LocalCluster``'s scheduler spent ~130 ms of CPU per iteration of 21 tasks, beside the workers on 2
    cores) and each dependent step a Dask hop (~6-8 ms, ``benchmarks/dask_latency.py``)."""
    return attraction_view(view, assemble(view, own, *pieces), model, space_dims, with_kl), \
        visit_view(view, own, grid) if visit is None else visit


def finish_prepared(view: WorkerView, own: np.ndarray, grid, prepared: tuple, shares: list) -> list:
    """``finish_view`` from ``prepare_view``'s ``(attraction, visit)``."""
    attraction, visit = prepared
    return finish_view(view, own, grid, visit, attraction, shares)


def finish_view(view: WorkerView, own: np.ndarray, grid, visit: tuple, attraction: list, shares: list) -> list:
    """Each partition's ``BlockResult`` from its attraction (``attraction_view``) and the repulsion interpolated
    from the convolution's ``shares`` (``repulsion.convolution.join_convolution``) at the worker's own rows ``own``: the
    grid part of all of them in one pass in the visit order (``interpolate_grid``), each partition taking its
    rows, as in-process (``engine.fft_pass``); the results carry the partitions' global rows.  The numbers of
    ``evaluate_block_fft`` on the full coordinates, bit for bit (the same rows' values, summed in the same
    order)."""
    if grid.capped:  # its near field reads every point: the broadcast path (DaskExecutor) handles it
        raise ValueError("a capped FFT grid cannot be evaluated on a worker's halo")
    shares = [unpack_share(grid, s) if isinstance(s, PackedShare) else s for s in shares]
    potentials = join_convolution(grid, shares).potentials
    rows = interpolate_grid(grid, own, potentials, 1, visit) if own.shape[1] else None
    results = []
    start = 0
    for b, (r0, r1), (A, plogw) in zip(view.blocks, view.bounds, attraction):
        at = RowBlock(start, start + r1 - r0, b.indptr, b.indices, b.data)  # its rows' place in ``own``
        res = repulsion_block_fft(at, A, plogw, own, grid, potentials, None, rows)
        res.r0, res.r1 = r0, r1
        results.append(res)
        start += r1 - r0
    return results


def curvature_view(view: WorkerView, X: np.ndarray, model, space_dims: int, exaggeration: float,
                   fixed: bool) -> list:
    """``curvature_block`` of each of the worker's partitions (per non-zero: the same arrays as on the rows'
    global labels)."""

    model = block_model(model)
    Yt = None if fixed else point_major(X)  # once for all the worker's partitions
    return [curvature_block(model, b, X, space_dims, exaggeration, fixed, Yt) for b in view.blocks]


def laplacian_compact(view: WorkerView, V: np.ndarray, *weights: np.ndarray) -> list:
    """Rows of ``L(C) V`` of each of the worker's partitions from ``V``'s compact columns ``V[:, view.columns]``
    (its own rows and its halo, sent with the task) and the partitions' curvature weights ``weights``.

    Why the client sends the halo too: a product is a few tens of milliseconds of work, and cutting the halo on
    the workers that own it costs two more dependent task rounds (own rows to each worker, the pieces cut there,
    then the product), each a scheduler round trip; the halo's bytes (``sum_w h_w d 8``) cost less than those."""
    return [laplacian_block(b, w, V) for b, w in zip(view.blocks, weights)]


@dataclass
class WorkerPlan:
    """Worker i's share of the halo plan (``worker_plan``): ``columns`` (``U_w``), ``own_positions`` (of its own
    rows in ``columns``), and per source worker j (an index into the sorted workers) ``needs[j]``, the positions in
    j's own rows of the rows it needs from j (ascending: the halo is sorted and j's partitions ascend), and
    ``fills[j]``, where they go in ``columns``."""

    columns: np.ndarray
    own_positions: np.ndarray
    needs: dict
    fills: dict


def own_rows(bounds: list, parts: list) -> np.ndarray:
    """The global rows of partitions ``parts`` (ascending) of ``bounds``, in that order."""
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(*bounds[k], dtype=np.int64) for k in parts])


def worker_plan(bounds: list, parts: list, i: int, halo: np.ndarray) -> WorkerPlan:
    """Worker ``i``'s share of the plan, from the partitions' ``bounds``, ``parts[j]`` (the partitions of the j-th
    worker, ascending) and its halo (``own_halo``).  Who owns a halo row and where it sits among the owner's own
    rows follow from the bounds alone (a row of partition k is at ``offset[k] + row - r0_k`` in its holder's own
    rows), so this runs where the halo is: the client never holds an O(N) array of the plan."""
    starts = np.array([b[0] for b in bounds], dtype=np.int64)
    holder = np.zeros(len(bounds), dtype=np.int64)
    offset = np.zeros(len(bounds), dtype=np.int64)
    for j, ks in enumerate(parts):
        at = 0
        for k in ks:
            holder[k], offset[k] = j, at
            at += int(bounds[k][1] - bounds[k][0])
    own = own_rows(bounds, parts[i])
    halo = np.asarray(halo, dtype=np.int64)
    columns = np.union1d(own, halo)
    k = np.searchsorted(starts, halo, side="right") - 1
    source, rank = holder[k], offset[k] + halo - starts[k]
    needs, fills = {}, {}
    for j in range(len(parts)):
        chosen = source == j
        if chosen.any():
            needs[j] = rank[chosen]
            fills[j] = np.searchsorted(columns, halo[chosen])
    return WorkerPlan(columns, np.searchsorted(columns, own), needs, fills)


def plan_sizes(plan: WorkerPlan) -> dict:
    """``{j: rows needed from worker j}`` of a worker's plan: what the client keeps of it (its halo rows are their
    sum, ``HaloLayout.halo_rows``)."""
    return {j: int(v.size) for j, v in plan.needs.items()}


def plan_view(plan: WorkerPlan, *blocks: RowBlock) -> WorkerView:
    """``make_view`` from a worker's plan (in the order ``plan.fills`` lists its sources)."""
    return make_view(plan.columns, plan.own_positions, [plan.fills[j] for j in sorted(plan.fills)], *blocks)


def plan_needs(plan: WorkerPlan, j: int) -> np.ndarray:
    """The positions worker j cuts for the worker whose plan this is (run on j: the array moves there once)."""
    return plan.needs[j]


# ------------------------------------------------------------------------------------------------ client

@dataclass
class HaloLayout:
    """What the client keeps of the plan (``DaskExecutor._halo_state``): ``workers`` (sorted), ``parts[w]`` (their
    partitions, ascending) and ``pieces[(v, w)]``, the number of rows w needs from v (its halo from v): O(W^2 +
    K) numbers, whatever N.  The arrays (``HaloPlan``'s) stay on the workers."""

    workers: list
    parts: dict
    pieces: dict

    def sources(self, w) -> list:
        """The workers w receives a piece from, in a fixed order."""
        return [v for v in self.workers if (v, w) in self.pieces]

    def halo_rows(self) -> dict:
        return {w: sum(n for (v, u), n in self.pieces.items() if u == w) for w in self.workers}


@dataclass
class HaloPlan(HaloLayout):
    """Who needs what, with every array (``plan_halos``: tests, and the paths whose vectors are on the client).

    Beside ``HaloLayout``'s sizes: ``own[w]``: the worker's own rows (ascending global rows); ``columns[w]``:
    ``U_w``; ``own_positions[w]``: positions of ``own[w]`` in ``columns[w]``; ``needs[(v, w)]``: positions in
    ``own[v]`` of the rows w needs from v, and ``fills[(v, w)]`` where they go in ``columns[w]``.
    """

    own: dict
    columns: dict
    own_positions: dict
    needs: dict
    fills: dict


def plan_halos(bounds: list, holders: list, halos: dict) -> HaloPlan:
    """The ``HaloPlan`` for partitions ``bounds`` held by ``holders`` (a worker address per partition) and each
    worker's halo ``halos[w]`` (``own_halo``): ``worker_plan`` for each worker."""
    workers = sorted(set(holders))
    parts = {w: [k for k, h in enumerate(holders) if h == w] for w in workers}
    listed = [parts[w] for w in workers]
    return full_plan(bounds, workers, parts, {w: worker_plan(bounds, listed, i, halos[w])
                                             for i, w in enumerate(workers)})


def full_plan(bounds: list, workers: list, parts: dict, shares: dict) -> HaloPlan:
    """The ``HaloPlan`` from each worker's share (``worker_plan``; source indices mapped to the workers)."""
    own, columns, own_positions, needs, fills = {}, {}, {}, {}, {}
    for w in workers:
        share = shares[w]
        own[w] = own_rows(bounds, parts[w])
        columns[w], own_positions[w] = share.columns, share.own_positions
        for j, v in enumerate(workers):
            if j in share.needs:
                needs[v, w], fills[v, w] = share.needs[j], share.fills[j]
    pieces = {key: int(v.size) for key, v in needs.items()}
    return HaloPlan(workers, parts, pieces, own, columns, own_positions, needs, fills)


def tree_pairs(items: list) -> list:
    """The rounds of a pairwise tree reduction over ``items`` (indices): ``[[(left, right), ...], ...]``, each
    left index keeping the sum, until index 0 holds everything."""
    rounds = []
    step = 1
    while step < len(items):
        rounds.append([(i, i + step) for i in range(0, len(items) - step, 2 * step)])
        step *= 2
    return rounds
