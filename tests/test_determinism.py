"""Same seed, same map: the row-block layout is a function of the data only, and every reduction runs in block
order, so the thread count, the executor (threads or Dask workers) and the input form (edge list or affinity
store) never change a bit of the embedding or of the KL history.

N = 1500 >= 1024: before the data-determined layout, N >= 1024 split P into one block per thread, and these
tests failed (1 vs 2 threads: max |dY| = 86 on a kNN graph).
"""
import numpy as np
import pytest

from scalemb import Embedder
from scalemb.affinity import AffinityStore, write_affinity_store
from scalemb.affinity.ingest import ingest_edge_list
from scalemb.affinity.knn import knn_affinity
from scalemb.affinity.store import layout_block_count, layout_partitions
from scalemb.engine import LocalExecutor
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.models import get_model

N = 1500


@pytest.fixture(scope="module")
def knn():
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(size=(N // 3, 8)) + 4 * k for k in range(3)])
    return knn_affinity(X, perplexity=10, n_neighbors=30, random_state=0)


@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("determinism")
    path = write_coauthor_edge_list(tmp / "edges.txt", N, seed=4)
    store = ingest_edge_list(path, tmp / "P.zarr")  # default partitions: the data-determined layout
    return path, store


def _run(data, **options):
    options = {"model": "snest", "space_dims": 2, "iterations": 40, "seed": 3, **options}
    return Embedder(**options).fit(data).result_


def _same(a, b):
    assert np.array_equal(a.embedding, b.embedding)
    assert np.array_equal(a.kl_history, b.kl_history)
    assert np.array_equal(a.node_ids, b.node_ids)


def test_layout_depends_on_the_data_only(knn):
    ex = [LocalExecutor(knn, get_model("tsne"), 2, 0, n_threads=t) for t in (1, 2, 3)]
    bounds = [[(b.r0, b.r1) for b in e.blocks] for e in ex]
    assert bounds[0] == bounds[1] == bounds[2]
    assert len(bounds[0]) == layout_block_count(N) > 1
    assert [b for b, _ in bounds[0]] + [N] == list(layout_partitions(N))
    for e in ex:
        e.close()


@pytest.mark.parametrize("model,repulsion", [("tsne", "exact"), ("snest", "exact"), ("tsne", "fft")])
def test_any_thread_count_gives_the_same_run(knn, model, repulsion):
    runs = [_run(knn, model=model, n_threads=t, repulsion=repulsion, optimizer="dbd") for t in (1, 2, 3)]
    _same(runs[0], runs[1])
    _same(runs[0], runs[2])


def test_spectral_direction_any_thread_count(knn):
    a, b = (_run(knn, model="tsne", n_threads=t, optimizer="sd", iterations=25) for t in (1, 3))
    _same(a, b)


def test_edge_list_and_default_store_give_the_same_run(edges):
    path, store = edges
    n = AffinityStore(store).n_points
    assert n >= 1024 and list(AffinityStore(store).partitions) == list(layout_partitions(n))
    _same(_run(path, n_threads=1), _run(store, n_threads=2))


@pytest.mark.slow
def test_dask_with_two_and_three_workers_gives_the_local_run(edges, dask_cluster, grow_dask):
    """A default store on the session's two workers, the edge list (a temporary store) on three (the session's
    and one more): the in-process run (one worker: test_distributed.test_scheduler_lost_raises_clear_error)."""
    path, store = edges
    local = _run(path, n_threads=2, iterations=12, optimizer="dbd")
    _same(local, _run(store, scheduler=dask_cluster.address, iterations=12, optimizer="dbd"))
    grow_dask(1)
    assert len(dask_cluster.client.scheduler_info()["workers"]) == 3
    _same(local, _run(path, scheduler=dask_cluster.address, iterations=12, optimizer="dbd"))


@pytest.mark.slow
def test_a_store_with_its_own_partitions_gives_the_same_run_local_and_on_dask(knn, tmp_path, dask_cluster):
    """Partitions asked for by number are part of the store's data: local threads and Dask workers agree."""
    store = write_affinity_store(tmp_path / "P7.zarr", knn, n_partitions=7)
    local = _run(store, model="tsne", n_threads=1, iterations=12)
    _same(local, _run(store, model="tsne", scheduler=dask_cluster.address, iterations=12))


@pytest.mark.slow
def test_edge_list_in_process_and_on_dask_agree_from_20000_points(tmp_path_factory, dask_cluster):
    """From 20 000 points the in-process executor used to evaluate P in its reverse Cuthill-McKee order, which
    the Dask executor (the edge list streamed into a store in the input's order) does not: the two differed by
    summation order.  Every executor now evaluates P's rows in the input's order."""
    path = write_coauthor_edge_list(tmp_path_factory.mktemp("big") / "edges.txt", 27000, seed=2)
    options = {"model": "tsne", "iterations": 4, "repulsion": "fft", "optimizer": "dbd"}
    local = _run(path, n_threads=2, **options)
    assert local.embedding.shape[0] >= 20000
    _same(local, _run(path, scheduler=dask_cluster.address, **options))


@pytest.mark.parametrize("name", ["tsne", "sne", "snest", "cosne"])
def test_kernels_give_the_same_bits_wherever_malloc_puts_their_arrays(name):
    """The row-block kernels' sums do not depend on where their arrays land (``models.kernels``,
    "Bit-reproducible"): before, a sum that shared its loop with a store took LLVM's scalar fallback when small
    arrays lay close together, and the same call gave a different last bit now and then (placement's free phase,
    rows of 3-7 non-zeros; here t-SNE's attraction failed).  Small rows and small maps, the same values copied to
    new arrays after stirring the heap three ways, 1000 calls each."""
    for n in (42, 9):
        for stir_seed in (11, 12, 13):
            _same_bits_wherever_the_arrays_lie(get_model(name), n, stir_seed)


def _same_bits_wherever_the_arrays_lie(model, n, stir_seed):
    ds, dt = (2, 1) if model.name == "snest" else (2, 0)
    rng = np.random.default_rng(7)
    Y = np.ascontiguousarray(rng.normal(size=(ds + dt, n)) * (0.2 if model.name == "cosne" else 2.0))
    rows = min(13, n)
    lengths = rng.integers(3, 8, size=rows)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = rng.integers(0, n, size=indptr[-1]).astype(np.int64)
    data = rng.random(indptr[-1]) / indptr[-1]
    seen = [set(), set(), set()]
    stir = np.random.default_rng(stir_seed)
    for _ in range(1000):
        junk = [np.empty(int(stir.integers(1, 600))) for _ in range(int(stir.integers(0, 40)))]
        ip, ix, dd, Yc = indptr.copy(), indices.copy(), data.copy(), Y.copy()
        A = np.zeros((rows, ds + dt))
        s = model.attraction(ip, ix, dd, n - rows, np.ascontiguousarray(Yc.T), ds, A, True)
        R = np.zeros_like(Yc)
        z = model.repulsion(Yc, ds, 0, n, R)
        Rq = np.zeros((ds + dt, 5))
        zq = model.cross_repulsion(Yc, 3, 8, Yc, ds, True, Rq)
        for k, value in enumerate(((s, A.tobytes()), (z, R.tobytes()), (zq, Rq.tobytes()))):
            seen[k].add(value)
        del junk
    assert [len(values) for values in seen] == [1, 1, 1]


def test_time_outlier_sums_give_the_same_bits_wherever_malloc_puts_their_arrays():
    """``repulsion.near.time_outlier_rows`` with a few outliers (small arrays: the reactions' loop stores
    to ``reaction`` while it sums and reads the outliers): the same bits from copies made after stirring the heap
    (``vecmath``'s module docstring)."""
    from scalemb.repulsion.near import time_outlier_rows

    rng = np.random.default_rng(3)
    for n, n_out in ((60, 3), (40, 6)):
        Y = np.ascontiguousarray(np.vstack([rng.normal(size=(2, n)) * 3, rng.normal(size=(1, n)) * 0.3]))
        Yo = np.ascontiguousarray(np.vstack([rng.normal(size=(2, n_out)) * 3,
                                             rng.normal(size=(1, n_out)) * 0.3 + 1]))
        seen = set()
        stir = np.random.default_rng(11)
        for _ in range(500):
            junk = [np.empty(int(stir.integers(1, 64))) for _ in range(int(stir.integers(0, 30)))]
            R, reaction = np.zeros((3, n)), np.zeros((3, n_out))
            z = time_outlier_rows(Y.copy(), 0, n, 2, -0.5, 0.5, Yo.copy(), R, reaction)
            seen.add((z, R.tobytes(), reaction.tobytes()))
            del junk
        assert len(seen) == 1
