"""The Dask executor's halo exchange (``scalemb.engine.halo``): each worker gets its own rows from the client and
its halo from the other workers; charge grids are summed among the workers.  Same numbers as in-process."""
import numpy as np
import pytest

from scalemb.affinity import AffinityStore
from scalemb.engine import LocalExecutor
from scalemb.engine import halo
from scalemb.engine.blocks import curvature_block, evaluate_block_fft, laplacian_block
from scalemb.engine.distributed import DaskExecutor
from scalemb.models import get_model
from scalemb.optim import make_optimizer
from scalemb.repulsion import FFTParams, make_grid
from scalemb.repulsion.convolution import (ConvolutionShare, convolution_shares, convolve, convolve_share,
                                           join_convolution)
from scalemb.repulsion.fft import fixed_charges, spread
from scalemb.repulsion.grid import SORT_ABOVE_BYTES, grid_for

from .test_distributed import coauthor_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return coauthor_store(tmp_path_factory.mktemp("halo"), 2000, seed=7, n_partitions=7)


def _layout(n, space, time_dims=0, seed=0):
    """Space coordinates over ~10 units (an uncapped grid), time coordinates near 0 (SNEST: exp(t^2) grows)."""
    rng = np.random.default_rng(seed)
    space_part = rng.normal(size=(space, n)) * 1.5
    return np.concatenate([space_part, np.abs(rng.normal(size=(time_dims, n))) * 0.3])


def test_tree_pairs_reduce_everything_into_the_first():
    for n in range(1, 10):
        held = [{i} for i in range(n)]
        for round_ in halo.tree_pairs(list(range(n))):
            lefts = [i for i, _ in round_] + [j for _, j in round_]
            assert len(set(lefts)) == len(lefts)  # one sum per worker per round
            for i, j in round_:
                held[i] |= held[j]
        assert held[0] == set(range(n))


def test_each_workers_share_of_the_plan_is_the_full_plans(store):
    """``worker_plan`` on one worker's halo alone (what runs on the worker) gives that worker's arrays of the full
    plan, and the sizes the client keeps (``HaloLayout``) give the same halo rows and sources."""
    st = AffinityStore(store)
    affinity = st.to_affinity()
    bounds = [tuple(map(int, b)) for b in zip(st.partitions[:-1], st.partitions[1:])]
    holders = ["b", "a", "b", "c", "a", "c", "b"]
    blocks = [affinity.row_block(r0, r1) for r0, r1 in bounds]
    workers = sorted(set(holders))
    parts = {w: [k for k, h in enumerate(holders) if h == w] for w in workers}
    halos = {w: halo.own_halo([bounds[k] for k in ks], *[blocks[k] for k in ks]) for w, ks in parts.items()}
    full = halo.plan_halos(bounds, holders, halos)
    pieces = {}
    for i, w in enumerate(workers):
        share = halo.worker_plan(bounds, [parts[v] for v in workers], i, halos[w])
        assert np.array_equal(share.columns, full.columns[w])
        assert np.array_equal(share.own_positions, full.own_positions[w])
        sizes = halo.plan_sizes(share)
        assert sum(sizes.values()) == full.halo_rows()[w] > 0
        for j, v in enumerate(workers):
            assert (j in share.needs) == ((v, w) in full.needs)
            if j in share.needs:
                assert np.array_equal(halo.plan_needs(share, j), full.needs[v, w])
                assert np.array_equal(share.fills[j], full.fills[v, w])
                pieces[v, w] = sizes[j]
        view = halo.plan_view(share, *[blocks[k] for k in parts[w]])
        assert [s.tolist() for s in view.sources] == [full.fills[v, w].tolist() for v in full.sources(w)]
    layout = halo.HaloLayout(workers, parts, pieces)
    assert layout.pieces == full.pieces and layout.halo_rows() == full.halo_rows()
    assert all(layout.sources(w) == full.sources(w) for w in workers)


def test_worker_functions_rebuild_the_blocks_results(store):
    """In one process: the plan, the pieces each worker cuts, the assembled compact columns, the fixed-point
    partial grids and the relabelled blocks give exactly the full-coordinate block results."""
    st = AffinityStore(store)
    affinity = st.to_affinity()
    n = st.n_points
    bounds = [tuple(map(int, b)) for b in zip(st.partitions[:-1], st.partitions[1:])]
    holders = ["a", "a", "b", "c", "c", "c", "b"]  # not contiguous: any placement works
    blocks = [affinity.row_block(r0, r1) for r0, r1 in bounds]
    parts = {w: [k for k, h in enumerate(holders) if h == w] for w in sorted(set(holders))}
    halos = {w: halo.own_halo([bounds[k] for k in ks], *[blocks[k] for k in ks]) for w, ks in parts.items()}
    plan = halo.plan_halos(bounds, holders, halos)
    for w in plan.workers:  # the halo is what the rows touch outside the worker's own rows
        touched = np.unique(np.concatenate([blocks[k].indices for k in parts[w]]))
        assert np.array_equal(np.union1d(touched, plan.own[w]), plan.columns[w])
        assert 0 < plan.halo_rows()[w] < n - plan.own[w].size
    Y = _layout(n, 2, 1)
    model = get_model("snest")
    grid = make_grid(model, 2, Y.min(1), Y.max(1), FFTParams(), n)
    assert not grid.capped
    X, total = {}, 0
    for w in plan.workers:
        view = halo.make_view(plan.columns[w], plan.own_positions[w], [plan.fills[v, w] for v in plan.sources(w)],
                              *[blocks[k] for k in parts[w]])
        pieces = [halo.take_columns(Y[:, plan.own[v]], plan.needs[v, w]) for v in plan.sources(w)]
        X[w] = halo.assemble(view, Y[:, plan.own[w]], *pieces)
        assert np.array_equal(X[w], Y[:, plan.columns[w]])
        # each partition's rows are a contiguous run of the compact columns, in the own rows' order
        assert np.array_equal(view.own, np.concatenate([np.arange(b.r0, b.r1) for b in view.blocks]))
        # a held worker's form: its partitions' rows apart, each copied to its contiguous run
        by_partition = [Y[:, bounds[k][0]:bounds[k][1]] for k in parts[w]]
        assert np.array_equal(halo.assemble(view, by_partition, *pieces), X[w])
        # the held cut: each other worker's piece gathered from w's partitions' rows apart, not joined first
        for u in plan.workers:
            if (w, u) in plan.needs:
                assert np.all(np.diff(plan.needs[w, u]) > 0)
                assert np.array_equal(halo.take_columns_parts(by_partition, plan.needs[w, u]),
                                      halo.take_columns(Y[:, plan.own[w]], plan.needs[w, u]))
        total = total + halo.spread_view(view, Y[:, plan.own[w]], grid)
    convolution = convolve(grid, fixed_charges(grid, total))
    for w in plan.workers:
        view = halo.make_view(plan.columns[w], plan.own_positions[w], [], *[blocks[k] for k in parts[w]])
        own = Y[:, plan.own[w]]
        got = halo.finish_view(view, own, grid, halo.visit_view(view, own, grid),
                               halo.attraction_view(view, X[w], model, 2, True),
                               [ConvolutionShare(0, 1, convolution.potentials, convolution.z)])
        for k, res in zip(parts[w], got):
            want = evaluate_block_fft(model, blocks[k], Y, 2, grid, convolution.potentials)
            assert (res.r0, res.r1) == bounds[k]
            assert np.array_equal(res.attraction, want.attraction) and np.array_equal(res.repulsion, want.repulsion)
            assert res.z == want.z and res.plogw == want.plogw
    # a Laplacian product from the compact columns the client sends (own rows and halo): the global rows' numbers
    V = _layout(n, 2, seed=5)
    for w in plan.workers:
        view = halo.make_view(plan.columns[w], plan.own_positions[w], [], *[blocks[k] for k in parts[w]])
        weights = [curvature_block(model, blocks[k], Y, 2, 1.0, False) for k in parts[w]]
        # the worker's weights from its compact columns (one point-major copy for all its partitions): the same
        compact = halo.curvature_view(view, np.ascontiguousarray(Y[:, plan.columns[w]]), model, 2, 1.0, False)
        assert all(np.array_equal(a, b) for a, b in zip(compact, weights))
        got = halo.laplacian_compact(view, np.ascontiguousarray(V[:, plan.columns[w]]), *weights)
        for k, rows, c in zip(parts[w], got, weights):
            assert np.array_equal(rows, laplacian_block(blocks[k], c, V))


@pytest.mark.parametrize("model,space,time_dims", [("tsne", 2, 0), ("sne", 2, 0), ("snest", 2, 1), ("tsne", 1, 0)])
def test_convolution_shares_join_to_the_whole_convolution(model, space, time_dims):
    """Split into 1, 2, 3 or 4 shares (potential columns; a time axis' components) and joined in any order, the
    convolution is ``convolve``'s, bit for bit; a share missing or repeated is refused."""
    Y = _layout(3000, space, time_dims, seed=4)
    grid = make_grid(get_model(model), space, Y.min(1), Y.max(1), FFTParams(), Y.shape[1])
    charges = spread(grid, Y, 0, Y.shape[1])
    whole = convolve(grid, charges, workers=2)
    for k in range(1, min(4, convolution_shares(grid)) + 1):
        shares = [convolve_share(grid, charges, i, k, workers=1 + i % 2) for i in range(k)]
        joined = join_convolution(grid, shares[::-1])
        assert np.array_equal(joined.potentials, whole.potentials) and joined.z == whole.z
    if convolution_shares(grid) > 1:
        with pytest.raises(ValueError, match="every share"):
            join_convolution(grid, [shares[0], shares[0]])
    with pytest.raises(ValueError, match="share must be in"):
        convolve_share(grid, charges, 2, 2)


def test_worker_schedule_pieces_give_the_blocks_results(store):
    """The pieces of a worker's evaluation (its own rows visited once in box order, spread from that visit,
    the attraction apart, the convolution's shares summed from all workers' grids, the interpolation of all its
    rows at once) give ``evaluate_block_fft``'s numbers on the full coordinates, bit for bit, for 1, 2 and 3
    workers (t-SNE, and SNEST on a time-banded grid)."""
    st = AffinityStore(store)
    affinity = st.to_affinity()
    n = st.n_points
    bounds = [tuple(map(int, b)) for b in zip(st.partitions[:-1], st.partitions[1:])]
    blocks = [affinity.row_block(r0, r1) for r0, r1 in bounds]
    rng = np.random.default_rng(4)
    for model, time_dims, banded, spread_out in (("tsne", 0, False, 1), ("tsne", 0, False, 12),
                                                  ("snest", 1, False, 1), ("snest", 1, True, 1)):
        m = get_model(model)
        Y = _layout(n, 2, time_dims, seed=6)
        Y[:2] *= spread_out  # 12: a grid large enough to be visited box by box (``Grid.visit``'s sort)
        if banded:  # a narrow time bulk and a few outliers: the grid spans the band
            Y[2] *= 0.1
            Y[2, rng.choice(n, 25, replace=False)] = rng.uniform(-1.5, 1.5, 25)
        grid = grid_for(m, 2, Y, FFTParams(time_band=banded, max_nodes=2 ** 20))
        assert not grid.capped and (grid.time_band is not None) == banded
        assert spread_out == 1 or grid.n_nodes * 8 > SORT_ABOVE_BYTES
        want = [evaluate_block_fft(m, b, Y, 2, grid, convolve(grid, spread(grid, Y, 0, n)).potentials)
                for b in blocks]
        for holders in (["a"] * 7, ["a", "a", "a", "b", "b", "b", "b"], ["a", "b", "c", "c", "c", "a", "b"]):
            parts = {w: [k for k, h in enumerate(holders) if h == w] for w in sorted(set(holders))}
            halos = {w: halo.own_halo([bounds[k] for k in ks], *[blocks[k] for k in ks]) for w, ks in parts.items()}
            plan = halo.plan_halos(bounds, holders, halos)
            views = {w: halo.make_view(plan.columns[w], plan.own_positions[w], [], *[blocks[k] for k in parts[w]])
                     for w in plan.workers}
            X = {w: np.ascontiguousarray(Y[:, plan.columns[w]]) for w in plan.workers}
            own = {w: np.ascontiguousarray(Y[:, plan.own[w]]) for w in plan.workers}
            visits = {w: halo.visit_view(views[w], own[w], grid) for w in plan.workers}
            grids = [halo.spread_view(views[w], own[w], grid, visits[w]) for w in plan.workers]
            k = min(len(plan.workers), convolution_shares(grid))
            shares = [halo.convolve_part(grid, halo.add_grids(*grids[i:], *grids[:i]), i, k, 1) for i in range(k)]
            for w in plan.workers:
                attraction = halo.attraction_view(views[w], X[w], m, 2, True)
                for j, res in zip(parts[w], halo.finish_view(views[w], own[w], grid, visits[w], attraction, shares)):
                    assert (res.r0, res.r1) == bounds[j]
                    for name in ("attraction", "repulsion", "outlier_reaction"):
                        a, b = getattr(res, name), getattr(want[j], name)
                        assert (a is None and b is None) or np.array_equal(a, b)
                    assert res.z == want[j].z and res.plogw == want[j].plogw


@pytest.mark.parametrize("model,space,time_dims", [("tsne", 2, 0), ("snest", 2, 1)])
@pytest.mark.slow
def test_halo_evaluation_sends_each_row_once_and_matches_local(store, dask_cluster, model, space, time_dims):
    st = AffinityStore(store)
    n = st.n_points
    Y = _layout(n, space, time_dims, seed=1)
    with LocalExecutor(st.to_affinity(), get_model(model), space, time_dims, partitions=st.partitions,
                       repulsion="fft") as local, \
            DaskExecutor(store, get_model(model), space, time_dims, dask_cluster.client, repulsion="fft") as dask, \
            DaskExecutor(store, get_model(model), space, time_dims, dask_cluster.client, repulsion="fft",
                         halo=False) as broadcast:
        a = local.evaluate(Y)
        sent = dask.stats["bytes_sent"]
        b = dask.evaluate(Y)
        c = broadcast.evaluate(Y)
        for other in (b, c):
            assert a.kl == other.kl and a.objective == other.objective and np.array_equal(a.gradient, other.gradient)
        assert dask.stats["halo_evaluations"] == 1 and broadcast.stats["halo_evaluations"] == 0
        # own rows only (N d numbers, not W N d) and the grid object: t-SNE's (~1 KB) in the 3 W + 1 tasks that
        # read it, SNEST's (~19 KB: its time band) once per worker
        assert Y.nbytes < dask.stats["bytes_sent"] - sent < Y.nbytes + 2 * 20_000
        assert broadcast.stats["bytes_sent"] >= 2 * Y.nbytes
        plan = dask._halo[0]
        assert len(plan.workers) == 2
        halo_rows = sum(plan.halo_rows().values())
        assert 0 < halo_rows < n
        # the Laplacian products go the same way
        for ex in (local, dask):
            ex.set_curvature(Y)
        V = _layout(n, space, seed=2)
        submitted, submit = [], dask._submit
        dask._submit = lambda fn, *args, **kwargs: submitted.append(fn.__name__) or submit(fn, *args, **kwargs)
        sent = dask.stats["bytes_sent"]
        assert np.array_equal(local.laplacian_matvec(V), dask.laplacian_matvec(V))
        # one task round: a task per worker, each sent its own rows and its halo (no cutting on other workers)
        assert submitted == ["laplacian_compact"] * 2
        assert dask.stats["bytes_sent"] - sent == (n + halo_rows) * space * 8
        del dask._submit
        assert np.array_equal(local.curvature_diagonal(), dask.curvature_diagonal())


@pytest.mark.parametrize("max_nodes", [None, 4_000])
@pytest.mark.slow
def test_time_banded_grid_on_workers_matches_local(store, dask_cluster, max_nodes):
    """A SNEST layout with a narrow time bulk and a few outliers: the grid spans the band (``grid_for``); the
    outliers' pairs are summed directly per block and their reactions reduced with the blocks: the halo exchange
    (uncapped) and the broadcast path (capped: near field) give the in-process numbers bit for bit."""
    from scalemb.repulsion import grid_for

    st = AffinityStore(store)
    n = st.n_points
    rng = np.random.default_rng(4)
    Y = _layout(n, 2, 1, seed=3) * np.array([[1.0], [1.0], [0.1]])
    Y[2, rng.choice(n, 25, replace=False)] = rng.uniform(-1.5, 1.5, 25)
    params = FFTParams(max_nodes=max_nodes)
    grid = grid_for("snest", 2, Y, params)
    assert grid.n_outliers > 0 and grid.capped == (max_nodes is not None)
    model = get_model("snest")
    with LocalExecutor(st.to_affinity(), model, 2, 1, partitions=st.partitions, repulsion="fft",
                       fft_params=params) as local, \
            DaskExecutor(store, model, 2, 1, dask_cluster.client, repulsion="fft", fft_params=params) as dask:
        a, b = local.evaluate(Y), dask.evaluate(Y)
        assert a.kl == b.kl and a.z == b.z and np.array_equal(a.gradient, b.gradient)
        assert dask.stats["halo_evaluations"] == (0 if grid.capped else 1)


def _in_process_run(store, model, space, time_dims, seed, iterations):
    """A start of scale 1e-4 and the in-process delta-bar-delta run from it (FFT repulsion, the store's
    partitions): what a Dask run from the same start must reproduce bit for bit."""
    st = AffinityStore(store)
    start = np.random.default_rng(seed).normal(size=(space + time_dims, st.n_points)) * 1e-4
    with LocalExecutor(st.to_affinity(), get_model(model), space, time_dims, partitions=st.partitions,
                       repulsion="fft") as local:
        return start, make_optimizer("dbd", model).optimize(local, start, iterations)


@pytest.mark.slow
def test_three_workers_run_identical_to_local(store, dask_cluster, grow_dask):
    """A whole delta-bar-delta run with FFT repulsion on three workers (a two-round grid reduction and
    broadcast) ends where the in-process run ends, bit for bit."""
    start, expected = _in_process_run(store, "snest", 2, 1, seed=3, iterations=25)
    grow_dask(1)
    with DaskExecutor(store, get_model("snest"), 2, 1, dask_cluster.client, repulsion="fft") as dask:
        got = make_optimizer("dbd", "snest").optimize(dask, start, 25)
        assert len(dask._halo[0].workers) == 3
        assert dask.stats["halo_evaluations"] >= 25
    assert np.array_equal(expected.coords, got.coords)
    assert np.array_equal(expected.kl_history, got.kl_history, equal_nan=True)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["take_columns", "convolve_grids", "prepare_view"])
def test_worker_killed_inside_the_exchange_recovers_identical(store, dask_cluster, grow_dask, monkeypatch, stage):
    """SIGKILL a worker in the middle of an evaluation's halo exchange (``take_columns``: workers cutting each
    other's halo pieces), its grids' sum and convolution (``convolve_grids``) or the attraction on the assembled halo
    (``prepare_view``): the evaluation is repeated on the two workers left and the run ends where the in-process run
    ends, bit for bit."""
    import signal

    start, expected = _in_process_run(store, "tsne", 2, 0, seed=5, iterations=20)
    [victim] = grow_dask(1)  # three workers: the session's two and this one
    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client, repulsion="fft") as dask:
        submit = dask._submit
        target = getattr(halo, stage)

        def submit_and_kill(fn, *args, **kwargs):
            # the 8th evaluation is in flight (own rows scattered, earlier stages submitted) when the worker dies
            if fn is target and dask.stats["halo_evaluations"] >= 8 and victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
                victim.wait()
            return submit(fn, *args, **kwargs)

        monkeypatch.setattr(dask, "_submit", submit_and_kill)
        got = make_optimizer("dbd", "tsne").optimize(dask, start, 20)
        assert victim.poll() is not None
        assert dask.stats["recoveries"] >= 1
        assert len(dask._halo[0].workers) == 2
    assert np.array_equal(expected.coords, got.coords)
    assert np.array_equal(expected.kl_history, got.kl_history, equal_nan=True)


@pytest.mark.slow
def test_laplacian_product_of_a_one_worker_layout_matches_local(tmp_path, dask_cluster):
    """A store of one partition lives on one worker (W = 1: no halo, no piece from anyone): its one-round product,
    curvature diagonal and evaluation are the in-process numbers bit for bit (W = 2: above; W = 3: the kill test
    below runs on three workers until the kill)."""
    one = coauthor_store(tmp_path, 800, seed=3, n_partitions=1)
    st = AffinityStore(one)
    Y, V = _layout(st.n_points, 2, seed=6), _layout(st.n_points, 2, seed=7)
    with LocalExecutor(st.to_affinity(), get_model("tsne"), 2, 0, partitions=st.partitions,
                       repulsion="fft") as local, \
            DaskExecutor(one, get_model("tsne"), 2, 0, dask_cluster.client, repulsion="fft") as dask:
        a, b = local.evaluate(Y), dask.evaluate(Y)
        assert a.kl == b.kl and np.array_equal(a.gradient, b.gradient)
        for ex in (local, dask):
            ex.set_curvature(Y)
        sent = dask.stats["bytes_sent"]
        assert np.array_equal(local.laplacian_matvec(V), dask.laplacian_matvec(V))
        assert len(dask._halo[0].workers) == 1 and dask.stats["bytes_sent"] - sent == V.nbytes
        assert np.array_equal(local.curvature_diagonal(), dask.curvature_diagonal())


@pytest.mark.slow
@pytest.mark.parametrize("held", [True, False])
def test_worker_killed_inside_a_cg_product_recovers_identical(store, dask_cluster, grow_dask, monkeypatch, held):
    """SIGKILL a worker while a spectral-direction CG solve's Laplacian product is in flight.  State held on the
    workers (``optim.descent_held``: the product of a held vector, its halo cut on the owners): the run rewinds to
    its start on the two workers left and replays.  State held on the client (``engine.held.LocalHeld``: its
    compact columns scattered, its one-round task submitted): the product is repeated on the two workers left
    (curvature recomputed where it was set).  Either way the run ends where the in-process run ends, bit for bit."""
    import signal

    from scalemb.engine.held import LocalHeld
    from scalemb.engine.held_tasks import held_laplacian

    st = AffinityStore(store)
    start = np.random.default_rng(6).normal(size=(2, st.n_points)) * 1e-4
    options = dict(solver="cg", preconditioner="jacobi")
    with LocalExecutor(st.to_affinity(), get_model("tsne"), 2, 0, partitions=st.partitions,
                       repulsion="fft") as local:
        expected = make_optimizer("sd", "tsne", **options).optimize(local, start, 12)
    [victim] = grow_dask(1)
    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client, repulsion="fft") as dask:
        submit, products = dask._submit, []
        if not held:
            dask.hold = lambda arrays: LocalHeld(dask, arrays)
        product = held_laplacian if held else halo.laplacian_compact

        def submit_and_kill(fn, *args, **kwargs):
            if fn is product:
                products.append(fn)
                if len(products) == 12 and victim.poll() is None:  # a few iterations in, mid-solve
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
            return submit(fn, *args, **kwargs)

        monkeypatch.setattr(dask, "_submit", submit_and_kill)
        got = make_optimizer("sd", "tsne", **options).optimize(dask, start, 12)
        assert victim.poll() is not None and len(products) > 12
        assert dask.stats["recoveries"] >= 1
        assert len(dask._halo[0].workers) == 2
    assert np.array_equal(expected.coords, got.coords)
    assert np.array_equal(expected.kl_history, got.kl_history, equal_nan=True)


@pytest.mark.slow
def test_task_keys_name_the_operation_and_a_users_client_stays_open(store, dask_cluster):
    """The dashboard reads as the algorithm: keys are grouped by operation (``gradient``, ``repulsion-spread``,
    ``laplacian`` ...), never by the generic per-worker wrapper.  A client handed in is used, not closed."""
    from scalemb.engine.cluster import dask_client

    st = AffinityStore(store)
    Y = _layout(st.n_points, 2, seed=3)
    with dask_client(dask_cluster.client) as client:
        assert client is dask_cluster.client
        with DaskExecutor(store, get_model("tsne"), 2, 0, client, repulsion="fft") as dask, \
                DaskExecutor(store, get_model("tsne"), 2, 0, client, repulsion="exact", halo=False) as plain:
            dask.evaluate(Y)
            dask.set_curvature(Y)
            dask.laplacian_matvec(_layout(st.n_points, 2, seed=4))
            plain.evaluate(Y)
    assert dask_cluster.client.status == "running"
    prefixes = set(dask_cluster.client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))
    assert {"gradient", "repulsion-spread", "repulsion-convolution", "curvature", "laplacian"} <= prefixes, prefixes
    assert "run_partitions" not in prefixes and "run-partitions" not in prefixes


def test_operation_names_survive_dasks_key_split_and_dask_logs_are_quiet(monkeypatch):
    import logging

    from dask.utils import key_split

    from scalemb.engine.cluster import quiet_dask_logs
    from scalemb.engine.dask_keys import _OPERATIONS, task_key

    for name in _OPERATIONS.values():  # an 8-letter word starting with a-f would vanish from the dashboard
        assert key_split(f"{name}-{'0' * 32}") == name
    assert key_split(task_key(halo.spread_view)) == "repulsion-spread"
    assert key_split(task_key(np.negative)) == "negative"
    quiet_dask_logs()
    assert logging.getLogger("distributed").getEffectiveLevel() == logging.WARNING
    monkeypatch.setenv("SCALEMB_DASK_LOG_LEVEL", "info")
    quiet_dask_logs()
    assert logging.getLogger("distributed").getEffectiveLevel() == logging.INFO
    monkeypatch.setenv("SCALEMB_DASK_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match="SCALEMB_DASK_LOG_LEVEL must be a logging level name"):
        quiet_dask_logs()
    monkeypatch.delenv("SCALEMB_DASK_LOG_LEVEL")
    quiet_dask_logs()
