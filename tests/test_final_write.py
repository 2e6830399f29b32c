"""The final embedding written by the workers (issue 30, "no full copy on the client"): a checkpointed
delta-bar-delta run whose rows are held on Dask workers ends with each worker writing its partitions' rows of the
embedding and of the final optimiser state into the staged result (even partitions, then odd ones), the client
adding the small arrays and the attributes with the content hash composed from the workers' block digests, then
the atomic rename.  The result is the in-process run's, hash included; each continues on the other executor bit
for bit; a worker killed during the final write leaves nothing half-written and the run ends as if it had not
been."""
import shutil

import numpy as np
import pytest
import zarr

import scalemb
from scalemb.affinity import AffinityStore
from scalemb.engine.held_dask import DaskHeld
from scalemb.cli.main import main
from scalemb.store.checkpoint import read_final_state
from scalemb.store.results import read_result
from scalemb.engine.held import store_chunk
from scalemb.run.resume import continue_finished

from .test_checkpoint import assert_same_result
from .test_distributed import coauthor_store

SETTINGS = dict(model="tsne", iterations=30, seed=3, optimizer="dbd", repulsion="fft")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return coauthor_store(tmp_path_factory.mktemp("final-store"), 1200, seed=11, n_partitions=5)


def _embed(out, store, **params):
    return scalemb.embed(str(store), out=out, checkpoint_every=10, **SETTINGS, **params)


def _no_gather(self, *names):
    raise AssertionError(f"the client gathered {names}")


def _same_final_state(a, b):
    (_, sa), (_, sb) = read_final_state(a), read_final_state(b)
    left, right = sa.split(), sb.split()
    assert sorted(left[0]) == sorted(right[0])
    assert {k: v for k, v in left[1].items() if k != "elapsed"} == {k: v for k, v in right[1].items() if k != "elapsed"}
    for name in set(left[0]) - {"seconds"}:  # (wall times differ)
        assert np.array_equal(left[0][name], right[0][name], equal_nan=True), name


@pytest.fixture(scope="module")
def in_process(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "run.zarr"
    _embed(out, store)
    return out


@pytest.fixture(scope="module")
def on_cluster(store, dask_cluster, tmp_path_factory):
    """The same run on the session's two Dask workers, the client forbidden to gather the held rows:
    ``(store path, result)``."""
    out = tmp_path_factory.mktemp("cluster") / "run.zarr"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DaskHeld, "gather", _no_gather)  # the client never holds the (d, N) state
        result = _embed(out, store, scheduler=dask_cluster.address)
        assert result.__dict__["_embedding"] is None  # nor read it: the workers wrote it
    return out, result


@pytest.mark.slow
def test_the_workers_write_the_result_with_the_in_process_hash(store, in_process, on_cluster):
    out, result = on_cluster
    arrays, attrs = read_result(out)
    local_arrays, local_attrs = read_result(in_process)
    edges = AffinityStore(store).partitions
    bounds = [[int(a), int(b)] for a, b in zip(edges[:-1], edges[1:])]
    assert attrs["row_blocks"] == local_attrs["row_blocks"] == bounds
    assert attrs["content_hash"] == local_attrs["content_hash"]
    assert zarr.open_array(store=str(out / "embedding"), mode="r").chunks == (store_chunk(bounds), 2)
    for name in arrays:
        assert np.array_equal(arrays[name], local_arrays[name], equal_nan=True), name
    assert np.array_equal(result.embedding, local_arrays["embedding"])  # read from the store when asked
    _same_final_state(out, in_process)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary left beside it


@pytest.mark.slow
def test_each_continues_on_the_other_executor_bit_for_bit(in_process, on_cluster, dask_cluster, tmp_path):
    """``scalemb continue`` of the cluster's result in-process, and of the in-process result on the cluster,
    equal the in-process result continued in-process (results and final states, hashes included)."""
    for name, source in (("local", in_process), ("cluster", on_cluster[0]), ("both", in_process)):
        shutil.copytree(source, tmp_path / name)
    local = continue_finished(tmp_path / "local", 10, in_process=True)
    cluster_here = continue_finished(tmp_path / "cluster", 10, in_process=True)
    here_on_cluster = continue_finished(tmp_path / "both", 10, scheduler=dask_cluster.address)
    for got in (cluster_here, here_on_cluster):
        assert_same_result(got, local)
    hashes = {name: read_result(tmp_path / name)[1]["content_hash"] for name in ("local", "cluster", "both")}
    assert len(set(hashes.values())) == 1
    _same_final_state(tmp_path / "cluster", tmp_path / "local")
    _same_final_state(tmp_path / "both", tmp_path / "local")
    assert main(["continue", str(tmp_path / "cluster"), "--iterations", "2", "--in-process", "--quiet"]) == 0


@pytest.mark.slow
def test_an_embedder_whose_result_the_workers_wrote_optimizes_on(store, in_process, dask_cluster, tmp_path):
    """``Embedder.optimize`` after a checkpointed cluster fit continues from the final state the workers wrote
    (read back from the output store): as the in-process result continued."""
    from scalemb.store.checkpointer import Checkpointer

    with Checkpointer(tmp_path / "run.zarr", every=10) as checkpointer:
        embedder = scalemb.Embedder(model="tsne", max_iter=30, random_state=3, optimizer="dbd", repulsion="fft",
                                    scheduler=dask_cluster.address).fit(str(store), checkpoint=checkpointer)
    assert np.array_equal(embedder.embedding_, read_result(in_process)[0]["embedding"])
    shutil.copytree(in_process, tmp_path / "local")
    expected = continue_finished(tmp_path / "local", 10, in_process=True)
    assert_same_result(embedder.optimize(10).result_, expected)


@pytest.mark.slow
def test_workers_that_cannot_see_the_output_leave_the_result_to_the_client(store, in_process, dask_cluster, tmp_path,
                                                                            monkeypatch, caplog):
    """A worker on a host without the client's file system finds no staged result: the client gathers and writes
    it (a warning), the same result; nothing is left beside the output."""
    from scalemb.engine.held import RowsExport

    original = RowsExport.write_result
    monkeypatch.setattr(RowsExport, "write_result",
                        lambda self, directory, group: original(self, directory + ".elsewhere", group))
    out = tmp_path / "run.zarr"
    result = _embed(out, store, scheduler=dask_cluster.address)
    assert "not visible here" in caplog.text and "the client writes the result" in caplog.text
    assert result.__dict__["_embedding"] is not None  # gathered
    arrays, attrs = read_result(out)
    local_arrays, local_attrs = read_result(in_process)
    assert attrs["content_hash"] == local_attrs["content_hash"]
    assert np.array_equal(arrays["embedding"], local_arrays["embedding"])
    _same_final_state(out, in_process)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
