"""Worker-resident optimiser state (issue 30, part 1): delta-bar-delta's per-point arrays stay on the Dask
workers beside their partitions of P; the client sends and receives scalars and d-vectors per iteration; the run
is the in-process run bit for bit at W = 1, 2, 3, for t-SNE and SNEST (a time-banded grid with outliers)."""
import numpy as np
import pytest

from scalemb.affinity import AffinityStore
from scalemb.engine import LocalExecutor
from scalemb.engine.distributed import DaskExecutor
from scalemb.engine.held import LocalHeld, hold
from scalemb.engine.held_dask import DaskHeld
from scalemb.models import get_model
from scalemb.optim import make_optimizer
from scalemb.repulsion import FFTParams

from .test_distributed import coauthor_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return coauthor_store(tmp_path_factory.mktemp("held"), 2000, seed=7, n_partitions=6)


def _start(n, dims, seed):
    return np.random.default_rng(seed).normal(size=(dims, n)) * 1e-4


def _local_run(store, model, space, time_dims, start, iterations, **options):
    st = AffinityStore(store)
    with LocalExecutor(st.to_affinity(), get_model(model), space, time_dims, partitions=st.partitions,
                       repulsion=options.pop("repulsion", "fft"), **options) as local:
        return make_optimizer("dbd", model).optimize(local, start, iterations)


def _same(a, b):
    assert np.array_equal(a.coords, b.coords)
    assert np.array_equal(a.kl_history, b.kl_history, equal_nan=True)
    for name in ("update", "gains", "best_coords"):
        assert np.array_equal(getattr(a.state, name), getattr(b.state, name)), name
    assert a.state.time_gain == b.state.time_gain and a.state.lr == b.state.lr


@pytest.mark.parametrize("model,space,time_dims", [("tsne", 2, 0),
                                                   pytest.param("snest", 2, 1, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_held_run_on_two_workers_is_the_in_process_run_and_moves_no_rows_through_the_client(
        store, dask_cluster, model, space, time_dims):
    n = AffinityStore(store).n_points
    start = _start(n, space + time_dims, 3)
    expected = _local_run(store, model, space, time_dims, start, 30)
    with DaskExecutor(store, get_model(model), space, time_dims, dask_cluster.client, repulsion="fft") as dask:
        assert isinstance(hold(dask, {"coords": start}), DaskHeld)
        optimizer = make_optimizer("dbd", model)
        before = dict(dask.stats)
        got = optimizer.optimize(dask, start, 30)
        sent = dask.stats["bytes_sent"] - before["bytes_sent"]
        received = dask.stats["bytes_received"] - before["bytes_received"]
    _same(expected, got)
    rows = n * (space + time_dims) * 8
    # the start (4 arrays) goes out once and the final state (4 arrays) comes back once; per iteration: small
    assert sent < 4 * rows + 30 * 20_000, sent
    assert received < 4 * rows + 30 * 20_000, received


@pytest.mark.slow
def test_snest_time_band_outliers_and_auto_repulsion_on_workers(store, dask_cluster):
    """A layout with a narrow time bulk and outliers: the time-banded grid is built from the workers' bin counts
    and outliers, the outliers' reactions are summed in partition order; ``auto`` (forced on below its size
    floor) decides from the grid the workers' summaries built."""
    from scalemb.repulsion import grid_for
    from scalemb.repulsion.method import AutoRepulsion

    st = AffinityStore(store)
    n = st.n_points
    rng = np.random.default_rng(4)
    start = rng.normal(size=(3, n)) * np.array([[1.0], [1.0], [0.1]])
    start[2, rng.choice(n, 25, replace=False)] = rng.uniform(-1.5, 1.5, 25)
    assert grid_for("snest", 2, start, FFTParams().resolved(get_model("snest").fft, 2)).n_outliers > 0
    model = get_model("snest")
    for auto in (False, True):
        with LocalExecutor(st.to_affinity(), model, 2, 1, partitions=st.partitions, repulsion="fft") as local, \
                DaskExecutor(store, model, 2, 1, dask_cluster.client, repulsion="fft") as dask:
            if auto:
                for ex in (local, dask):
                    ex.repulsion, ex.auto_repulsion = "auto", AutoRepulsion(model, 2, 1, ex.fft_params)
            expected = make_optimizer("dbd", "snest").optimize(local, start, 15)
            got = make_optimizer("dbd", "snest").optimize(dask, start, 15)
            if auto:
                assert dask.auto_repulsion.history == local.auto_repulsion.history
                assert dask.stats["halo_evaluations"] == dask.auto_repulsion.history.count("fft")
            else:
                assert dask.stats["halo_evaluations"] >= 15
        _same(expected, got)


@pytest.mark.slow
def test_capped_grid_falls_back_to_the_client_and_stays_identical(store, dask_cluster):
    n = AffinityStore(store).n_points
    start = np.random.default_rng(1).normal(size=(2, n)) * 30.0  # spread: the grid hits its cap
    params = FFTParams(max_nodes=4_000)
    expected = _local_run(store, "tsne", 2, 0, start, 6, fft_params=params)
    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client, repulsion="fft",
                      fft_params=params) as dask:
        got = make_optimizer("dbd", "tsne").optimize(dask, start, 6)
        assert dask.stats["halo_evaluations"] == 0
    _same(expected, got)


@pytest.mark.slow
def test_models_with_a_point_term_hold_their_state_on_the_client(store, dask_cluster):
    with DaskExecutor(store, get_model("cosne"), 2, 0, dask_cluster.client, repulsion="exact") as dask:
        assert isinstance(hold(dask, {"coords": np.zeros((2, dask.n_points))}), LocalHeld)


@pytest.mark.slow
@pytest.mark.parametrize("n_workers", [1, 3])
def test_held_run_on_one_and_three_workers_is_the_in_process_run(store, request, n_workers):
    n = AffinityStore(store).n_points
    start = _start(n, 3, 8)
    expected = _local_run(store, "snest", 2, 1, start, 20)
    if n_workers == 3:  # the session's two workers and one more
        request.getfixturevalue("grow_dask")(1)
        client = request.getfixturevalue("dask_cluster").client
    else:
        client = request.getfixturevalue("start_dask")(n_workers).client
    with DaskExecutor(store, get_model("snest"), 2, 1, client, repulsion="fft") as dask:
        got = make_optimizer("dbd", "snest").optimize(dask, start, 20)
        assert len(dask._halo[0].workers) == n_workers
    _same(expected, got)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [{"CONVOLVING_WORKERS": None}, {"CONVOLVING_WORKERS": 1},
                                      {"CONVOLVING_WORKERS": None, "DIRECT_SUM_WORKERS": 2},
                                      {"CONVOLVING_WORKERS": 1, "VISIT_IN_TASKS_ROWS": 0},
                                      {"CONVOLVING_WORKERS": 1, "PACK_POTENTIALS": False}])
def test_every_convolution_schedule_on_three_workers_is_the_in_process_run(store, dask_cluster, grow_dask,
                                                                          monkeypatch, schedule):
    """t-SNE on three workers from a start wide enough for a grid visited box by box: the convolution's two shares
    on two of them, each summing the three charge grids (``CONVOLVING_WORKERS = None``), on one of them (1, the
    default), or the grids summed by a tree and the sum copied to the two (``DIRECT_SUM_WORKERS = 2``), the
    other workers' charges packed where they are summed directly: the in-process run, bit for bit, every
    evaluation on the workers' halos."""
    from scalemb.engine import dask_halo
    from scalemb.repulsion.grid import SORT_ABOVE_BYTES, grid_for

    for name, value in schedule.items():
        monkeypatch.setattr(dask_halo, name, value)
    n = AffinityStore(store).n_points
    start = np.random.default_rng(9).normal(size=(2, n)) * 8.0
    params = FFTParams(max_nodes=2 ** 19)  # uncapped while the layout grows
    assert grid_for(get_model("tsne"), 2, start, params).n_nodes * 8 > SORT_ABOVE_BYTES
    expected = _local_run(store, "tsne", 2, 0, start, 12, fft_params=params)
    grow_dask(1)
    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client, repulsion="fft", fft_params=params) as dask:
        submitted, waits, submit = [], [], dask._submit

        def count(fn, *args, **kwargs):
            submitted.append(fn.__name__)
            if fn.__name__ == "prepare_view":  # the attraction, and the tasks it waits for
                after = args[-1] if isinstance(args[-1], list) else [args[-1]]
                waits.append(",".join(str(getattr(task, "key", None)) for task in after))
            return submit(fn, *args, **kwargs)

        dask._submit = count
        got = make_optimizer("dbd", "tsne").optimize(dask, start, 12)
        assert len(dask._halo[0].workers) == 3
        evaluations = dask.stats["halo_evaluations"]
    _same(expected, got)
    # the box order in a task of its own for many rows a worker, else made in the tasks that read it
    assert submitted.count("visit_view") == (3 if "VISIT_IN_TASKS_ROWS" in schedule else 0) * evaluations
    shares = schedule["CONVOLVING_WORKERS"] or 2
    tree = "DIRECT_SUM_WORKERS" in schedule  # a tree of pairwise sums, then the convolution; else both in one task
    # each worker's charges: a convolving worker's whole, the others' packed (the boxes of their rows) unless
    # summed by the tree
    packed = 0 if tree else 3 - shares
    assert evaluations >= 12 and submitted.count("spread_packed") == packed * evaluations
    assert submitted.count("spread_view") == (3 - packed) * evaluations
    # with ``PACK_POTENTIALS`` each packed worker gets every share packed alike (its rows' boxes), cut on the
    # convolving worker
    restricted = packed * shares if schedule.get("PACK_POTENTIALS", True) else 0
    assert submitted.count("restrict_share") == restricted * evaluations
    assert submitted.count("convolve_part" if tree else "convolve_grids") == shares * evaluations
    assert submitted.count("add_grids") == (2 if tree else 0) * evaluations
    # every worker's attraction; a convolving worker's after the other workers' charges (it runs beside the
    # convolution, which waits for the same), or after its share of the convolution (the tree)
    assert len(waits) == 3 * evaluations
    if tree:
        assert sum(keys.startswith("repulsion-convolution-") for keys in waits) == shares * evaluations
    else:
        assert sum(keys.count("repulsion-spread-") == 2 for keys in waits) == shares * evaluations
    assert waits.count("None") == (3 - shares) * evaluations


def _held_keys(client) -> int:
    return sum(sum(1 for key in keys if str(key).startswith("held-put"))
               for keys in client.run(lambda dask_worker: list(dask_worker.data.keys())).values())


@pytest.mark.slow
def test_a_client_that_disconnects_leaves_no_held_rows_on_the_workers(store, dask_cluster):
    import time

    from distributed import Client

    other = Client(dask_cluster.address, set_as_default=False)
    dask = DaskExecutor(store, get_model("tsne"), 2, 0, other, repulsion="fft")
    held = dask.hold({"coords": _start(dask.n_points, 2, 0)})
    assert isinstance(held, DaskHeld) and _held_keys(dask_cluster.client) == 2  # one box per worker
    other.close()  # no close() of the executor or the held state: the scheduler releases the client's futures
    deadline = time.monotonic() + 30
    while _held_keys(dask_cluster.client) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _held_keys(dask_cluster.client) == 0


@pytest.mark.slow
def test_a_run_continued_on_the_cluster_equals_one_longer_in_process_run(tmp_path, dask_cluster):
    """Checkpointed state is the same value whichever executor exported it: a run finished in-process and
    continued on the Dask workers (its state held there) ends where one longer in-process run ends."""
    import scalemb
    from scalemb.cli.main import main

    args = ["--model", "snest", "--optimizer", "dbd", "--repulsion", "fft", "--quiet", "--tol", "0"]
    out, longer = tmp_path / "run.zarr", tmp_path / "longer.zarr"
    assert main(["embed", "school", "--iterations", "20", "--out", str(out), *args]) == 0
    assert main(["continue", str(out), "--iterations", "15", "--quiet", "--scheduler", dask_cluster.address]) == 0
    assert main(["embed", "school", "--iterations", "35", "--out", str(longer), *args]) == 0
    a, b = scalemb.EmbeddingResult.load(out), scalemb.EmbeddingResult.load(longer)
    assert np.array_equal(a.embedding, b.embedding) and np.array_equal(a.kl_history, b.kl_history)


@pytest.mark.slow
def test_backoffs_on_the_workers_are_the_in_process_backoffs(store, dask_cluster):
    """A learning rate that blows the layout up, with the KL every third iteration: the backoffs (to the best
    iterate held on the workers, halving the learning rate) happen where they happen in-process, bit for bit."""
    n = AffinityStore(store).n_points
    start = _start(n, 2, 9)
    options = {"learning_rate": 1e5, "kl_every": 3, "exaggeration_iterations": 0, "divergence_factor": 1.0001}
    st = AffinityStore(store)
    with LocalExecutor(st.to_affinity(), get_model("tsne"), 2, 0, partitions=st.partitions,
                       repulsion="fft") as local:
        expected = make_optimizer("dbd", "tsne", **options).optimize(local, start, 25)
    with DaskExecutor(store, get_model("tsne"), 2, 0, dask_cluster.client, repulsion="fft") as dask:
        got = make_optimizer("dbd", "tsne", **options).optimize(dask, start, 25)
    assert expected.backoffs > 0
    assert got.backoffs == expected.backoffs
    _same(expected, got)


def test_a_workers_partials_travel_packed_and_unpack_to_the_same_values():
    """The per-partition tuples of float64 arrays a held task returns (CG's reductions, a slope's partials) go to
    the client as one array (``held_tasks.Partials``): the same values, fewer bytes; anything else as it was."""
    import pickle

    from scalemb.engine.held_tasks import Partials, packed, unpacked

    rng = np.random.default_rng(0)
    results = [(rng.normal(size=2), rng.normal(size=2), rng.normal(size=(1, 3)), np.array(rng.normal()))
               for _ in range(23)]
    wire = packed(results)
    assert isinstance(wire, Partials)
    back = unpacked(pickle.loads(pickle.dumps(wire, protocol=5)))
    assert len(back) == len(results)
    for got, sent in zip(back, results):
        assert len(got) == len(sent)
        for a, b in zip(got, sent):
            assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    assert len(pickle.dumps(wire, protocol=5)) < 0.6 * len(pickle.dumps(results, protocol=5))
    # not one layout of float64 arrays: left as they are
    for mixed in ([None, None], [(1.0, 2.0)], [(rng.normal(size=2),), (rng.normal(size=3),)],
                  [(rng.normal(size=2),), (rng.normal(size=2).astype(np.float32),)], [{"a": 1}], [], [()],
                  [(rng.normal(size=2),), (rng.normal(size=2), rng.normal(size=2))]):
        assert unpacked(packed(mixed)) is mixed
