"""Affinity stores written in a point order (``write_affinity_store(point_order=...)``, ``scalemb affinity
--point-order``): the permutation round-trips (node ids, per-point arrays, results back to the input's ids), the
recorded halos are the stores' real ones, a graph partitioner's order keeps them small, same input -> same store,
and bad input (unknown order, partitioner missing) fails with one error and writes nothing."""
import sys

import numpy as np
import pytest
import zarr

from scalemb.affinity import AffinityStore, coauthorship_affinity, write_affinity_store
from scalemb.affinity.ingest import ingest_edge_list
from scalemb.affinity.store import halo_size, layout_partitions
from scalemb.embedding import Embedder
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.io.edgelist import read_edge_list

from .cli_runner import run_cli

pytest.importorskip("pymetis")  # the 'partition' extra (installed with the 'test' extra)

ORDERS = ("given", "rcm", "partition")


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A generated co-authorship graph of ~1200 connected authors (>= 1024: the layout has 16 partitions)."""
    path = tmp_path_factory.mktemp("graph") / "edges.txt"
    write_coauthor_edge_list(path, 1500, seed=3)
    return path, coauthorship_affinity(read_edge_list(path))


def _recorded_halos_are_real(store):
    bounds, indptr = store.partitions, store.indptr
    indices = store.read_rows(0, store.n_points).indices
    found = [halo_size(indices[indptr[a]:indptr[b]], int(a), int(b), store.n_points)
             for a, b in zip(bounds[:-1], bounds[1:])]
    assert store.halo.tolist() == found


def _back_to_input(store, affinity):
    """``rank`` with ``store.node_ids[rank] == affinity.node_ids`` (every id exactly once)."""
    position = {node: k for k, node in enumerate(store.node_ids.tolist())}
    rank = np.array([position[node] for node in affinity.node_ids.tolist()])
    assert np.array_equal(np.sort(rank), np.arange(affinity.n_points))
    return rank


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n_partitions", [None, 5])
def test_store_in_a_point_order_round_trips(tmp_path, graph, order, n_partitions):
    _, affinity = graph
    n = affinity.n_points
    labels = np.arange(n, dtype=np.int64) * 7
    path = write_affinity_store(tmp_path / "P.zarr", affinity, n_partitions=n_partitions, point_order=order,
                                extra_arrays={"labels": labels})
    store = AffinityStore(path)
    loaded = store.to_affinity()  # verifies the content hash and every partition's halo
    rank = _back_to_input(store, affinity)
    # P renumbered back to the input's points is the input's P, value for value
    back = loaded.P[rank][:, rank]
    assert (back != affinity.P).nnz == 0
    # per-point arrays follow the node ids
    stored_labels = zarr.open_group(str(path), mode="r")["labels"][:]
    assert np.array_equal(stored_labels[rank], labels)
    assert store.provenance.get("point_order", {"name": "given"})["name"] == order
    if order == "given":
        assert np.array_equal(store.node_ids, affinity.node_ids) and "point_order" not in store.provenance
    else:
        assert not np.array_equal(store.node_ids, affinity.node_ids)
    if n_partitions is None:
        assert np.array_equal(store.partitions, layout_partitions(n)) and store.partitions.size == 17
    else:
        assert store.partitions.size == n_partitions + 1 and np.all(np.diff(store.partitions) > 0)
        if order == "partition":  # the parts balance the non-zeros, as balanced_partitions does
            nnz = np.diff(store.indptr[store.partitions])
            assert nnz.max() < 1.1 * nnz.min()
    _recorded_halos_are_real(store)


def test_partition_order_keeps_halos_small(tmp_path, graph):
    """On the small-world graph the partitioner's halos are a fraction of the given and RCM orders' ones."""
    _, affinity = graph
    halos = {order: AffinityStore(write_affinity_store(tmp_path / f"{order}.zarr", affinity,
                                                       point_order=order)).halo for order in ORDERS}
    assert halos["partition"].sum() < 0.5 * halos["rcm"].sum() < 0.5 * halos["given"].sum()
    assert halos["partition"].max() < 0.7 * halos["given"].max()
    info = AffinityStore(tmp_path / "partition.zarr").provenance["point_order"]
    assert info["parts"] == 16 and info["balance"] == "rows" and info["pymetis"]


def test_ingested_store_in_partition_order_matches_the_in_memory_one(tmp_path, graph):
    """The streaming ingestion path renumbers exactly as ``write_affinity_store`` does."""
    edges, affinity = graph
    streamed = AffinityStore(ingest_edge_list(edges, tmp_path / "S.zarr", point_order="partition"))
    memory = AffinityStore(write_affinity_store(tmp_path / "M.zarr", affinity, point_order="partition"))
    assert np.array_equal(streamed.node_ids, memory.node_ids)
    assert np.array_equal(streamed.partitions, memory.partitions) and np.array_equal(streamed.halo, memory.halo)
    assert abs(streamed.to_affinity().P - memory.to_affinity().P).max() < 1e-15
    assert streamed.provenance["point_order"] == memory.provenance["point_order"]
    assert streamed.provenance["source"] == str(edges) and streamed.provenance["n_edges"] > 0


def test_embedding_of_a_reordered_store_maps_back_to_the_input_ids(tmp_path, graph):
    """The same start (renumbered with the store) gives the same layout per node id, up to summation order."""
    _, affinity = graph
    given = write_affinity_store(tmp_path / "G.zarr", affinity)
    ordered = write_affinity_store(tmp_path / "O.zarr", affinity, point_order="partition")
    rank = _back_to_input(AffinityStore(ordered), affinity)
    start = np.random.default_rng(0).normal(scale=1e-4, size=(affinity.n_points, 2))
    reordered_start = np.empty_like(start)
    reordered_start[rank] = start
    runs = [Embedder(model="tsne", iterations=15, optimizer="dbd", repulsion="exact", n_threads=1,
                     init=init).fit(str(path)).result_ for path, init in ((given, start), (ordered, reordered_start))]
    assert np.array_equal(runs[1].node_ids[rank], runs[0].node_ids)
    np.testing.assert_allclose(runs[1].embedding[rank], runs[0].embedding, rtol=1e-7, atol=1e-12)


def _arrays(path):
    group = zarr.open_group(str(path), mode="r")
    return {name: group[name][:] for name in group.array_keys()}, dict(group.attrs)


def test_same_input_same_store(tmp_path, graph):
    edges, _ = graph
    for name in ("a.zarr", "b.zarr"):
        proc = run_cli("affinity", str(edges), "--out", str(tmp_path / name), "--point-order", "partition",
                       "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert "point order partition" in proc.stdout
    (a, attrs_a), (b, attrs_b) = _arrays(tmp_path / "a.zarr"), _arrays(tmp_path / "b.zarr")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert attrs_a["scalemb"]["content_hash"] == attrs_b["scalemb"]["content_hash"]
    assert attrs_a["scalemb"]["provenance"]["point_order"] == attrs_b["scalemb"]["provenance"]["point_order"]
    given = run_cli("affinity", str(edges), "--out", str(tmp_path / "g.zarr"), "--quiet")
    assert given.returncode == 0, given.stderr
    assert _arrays(tmp_path / "g.zarr")[1]["scalemb"]["content_hash"] != attrs_a["scalemb"]["content_hash"]


def test_unknown_point_order_refused(tmp_path, graph):
    edges, affinity = graph
    proc = run_cli("affinity", str(edges), "--out", str(tmp_path / "P.zarr"), "--point-order", "metis")
    assert proc.returncode == 2 and "--point-order" in proc.stderr and "metis" in proc.stderr
    assert not (tmp_path / "P.zarr").exists()
    with pytest.raises(ValueError, match="unknown point order 'metis'"):
        write_affinity_store(tmp_path / "Q.zarr", affinity, point_order="metis")
    with pytest.raises(ValueError, match="unknown point order"):
        ingest_edge_list(edges, tmp_path / "Q.zarr", point_order="bfs")
    assert not (tmp_path / "Q.zarr").exists()


@pytest.mark.parametrize("mode", ["graph", "knn"])
def test_missing_partitioner_one_error_nothing_written(tmp_path, graph, monkeypatch, mode):
    """Without pymetis, --point-order partition fails before any work: one line naming the package, exit 2."""
    edges, _ = graph
    source = edges
    extra = []
    if mode == "knn":
        source = tmp_path / "X.npy"
        np.save(source, np.random.default_rng(0).normal(size=(80, 3)))
        extra = ["--knn", "10", "--perplexity", "5"]
    monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis -> ImportError
    out = tmp_path / "P.zarr"
    proc = run_cli("affinity", str(source), "--out", str(out), "--point-order", "partition", *extra)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "pymetis" in proc.stderr and "scalemb[partition]" in \
        proc.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name != "X.npy"] == []
    # the other orders do not need it
    proc = run_cli("affinity", str(source), "--out", str(out), "--point-order", "rcm", "--quiet", *extra)
    assert proc.returncode == 0, proc.stderr


def test_string_ids_and_radii_follow_the_order(tmp_path, graph):
    _, affinity = graph
    from scalemb.affinity import Affinity

    n = affinity.n_points
    named = Affinity(affinity.P, np.array([f"author-{i}" for i in range(n)]), {}, np.linspace(0, 0.9, n))
    store = AffinityStore(write_affinity_store(tmp_path / "P.zarr", named, point_order="partition"))
    rank = _back_to_input(store, named)
    assert np.array_equal(store.radii[rank], named.radii)
    assert (store.to_affinity().P[rank][:, rank] != named.P).nnz == 0
