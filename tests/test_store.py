"""Zarr affinity store: layout, round trip, row-range reads, atomic writes."""
import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import scalemb
from scalemb.affinity import Affinity, AffinityStore, write_affinity_store
from scalemb.affinity.store import balanced_partitions
from scalemb.datasets import grqc
from scalemb.errors import InputError, ScalembError


@pytest.fixture(scope="module")
def grqc_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "grqc.zarr"
    affinity = grqc()
    write_affinity_store(path, affinity, n_partitions=4, chunk_nnz=2048)
    return path, affinity


def test_round_trip_equals_in_memory(grqc_store):
    path, affinity = grqc_store
    loaded = AffinityStore(path).to_affinity()
    assert (loaded.P != affinity.P).nnz == 0
    assert np.array_equal(loaded.node_ids, affinity.node_ids)
    assert loaded.provenance["dataset"] == "grqc"


def test_layout_follows_anndata_csr_convention(grqc_store):
    path, affinity = grqc_store
    group = zarr.open_group(str(path), mode="r")
    assert group.metadata.zarr_format == 3
    assert group.attrs["encoding-type"] == "csr_matrix" and group.attrs["encoding-version"] == "0.1.0"
    assert list(group.attrs["shape"]) == [5241, 5241]
    assert group["data"].chunks == (2048,) and group["indices"].chunks == (2048,)
    assert len(group.attrs["scalemb"]["content_hash"]) == 64
    anndata = pytest.importorskip("anndata")
    read_elem = getattr(getattr(anndata, "io", anndata), "read_elem", None) or anndata.experimental.read_elem
    matrix = read_elem(group)
    assert sp.issparse(matrix) and (sp.csr_matrix(matrix) != affinity.P).nnz == 0


@pytest.mark.parametrize("r0,r1", [(0, 1), (100, 2000), (5000, 5241), (17, 17)])
def test_row_range_reads_equal_slices(grqc_store, r0, r1):
    path, affinity = grqc_store
    block = AffinityStore(path).read_rows(r0, r1)
    expected = affinity.row_block(r0, r1)
    assert np.array_equal(block.indptr, expected.indptr)
    assert np.array_equal(block.indices, expected.indices)
    assert np.array_equal(block.data, expected.data)


def test_partitions_balanced_and_chunk_aligned(grqc_store):
    path, _ = grqc_store
    store = AffinityStore(path)
    bounds = store.partitions
    assert bounds[0] == 0 and bounds[-1] == store.n_points and np.all(np.diff(bounds) > 0)
    nnz = np.diff(store.indptr[bounds])
    assert nnz.max() <= 1.2 * store.nnz / 4
    for b in bounds[1:-1]:  # each inner boundary is the first row starting at/after a chunk boundary
        assert (store.indptr[b] // 2048) * 2048 > store.indptr[b - 1]


def test_balanced_partitions_small_cases():
    indptr = np.array([0, 5, 5, 6, 10])
    for k in (1, 2, 3, 4, 9):
        b = balanced_partitions(indptr, k, 2)
        assert b[0] == 0 and b[-1] == 4 and np.all(np.diff(b) > 0)


def test_embed_accepts_store(grqc_store, tmp_path):
    school_store = tmp_path / "school.zarr"
    # one partition = the single block the in-memory run uses below 1024 points: same sums, same result
    write_affinity_store(school_store, scalemb.load_affinity("school"), n_partitions=1)
    a = scalemb.embed(str(school_store), model="tsne", iterations=50)
    b = scalemb.embed("school", model="tsne", iterations=50)
    assert np.array_equal(a.embedding, b.embedding)
    assert a.provenance["content_hash"]


def test_refuses_overwrite_and_corruption(tmp_path):
    affinity = Affinity(sp.csr_matrix(np.array([[0, 1.0], [1.0, 0]])), [7, 9])
    path = tmp_path / "p.zarr"
    write_affinity_store(path, affinity)
    with pytest.raises(ScalembError, match="exists"):
        write_affinity_store(path, affinity)
    group = zarr.open_group(str(path), mode="r+")
    group["data"][0] = 0.25
    with pytest.raises(InputError, match="hash"):
        AffinityStore(path).to_affinity()
    with pytest.raises(InputError, match="not a scalemb affinity store"):
        AffinityStore(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.zarr"]  # no temporary leftovers


def test_node_id_kinds_and_hashes():
    """Integer ids hash as before string ids existed (stores written earlier keep their content hash); string ids
    hash by their text, whatever the array's width or dtype; anything else is refused."""
    import hashlib

    from scalemb.affinity.store import content_hash
    from scalemb.io.nodeids import as_node_ids, ids_bytes

    indptr, indices, data = np.array([0, 1, 2]), np.array([1, 0]), np.array([0.5, 0.5])
    old = hashlib.sha256()
    for array, dtype in ((indptr, "<i8"), (indices, "<i8"), (data, "<f8"), (np.array([4, 7]), "<i8")):
        old.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
    assert content_hash(indptr, indices, data, np.array([4, 7], dtype=np.int32)) == old.hexdigest()
    assert ids_bytes(np.array(["ab", "c"], dtype="<U9")) == ids_bytes(np.array(["ab", "c"], dtype=object))
    assert ids_bytes(np.array(["ab", "c"])) != ids_bytes(np.array(["a", "bc"]))
    for bad in (np.array([1.5, 2.0]), np.array([1, "a"], dtype=object)):
        with pytest.raises(ValueError, match="node ids must be"):
            as_node_ids(bad)


def test_a_name_moved_out_of_io_says_where_it_went():
    """``scalemb.io.to_anndata`` moved with the records to ``scalemb.store``: the old name raises an AttributeError
    naming the new one; other missing names raise the usual one."""
    import scalemb.io
    import scalemb.store

    with pytest.raises(AttributeError, match=r"scalemb\.io\.to_anndata moved to scalemb\.store\.to_anndata"):
        scalemb.io.to_anndata
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        scalemb.io.nothing
    assert callable(scalemb.store.to_anndata)
