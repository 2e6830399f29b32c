"""Affinity stores are validated wherever they are read: the structure of every partition where it is read
(in-process and on Dask workers), the content hash where one is recorded (also on the Dask path)."""
import numpy as np
import pytest
import zarr

import scalemb
from scalemb.affinity.store import write_affinity_store

from .cli_runner import run_cli


def _store(tmp_path, name, school_affinity, hashless=True):
    path = tmp_path / name
    write_affinity_store(path, school_affinity, n_partitions=4)
    group = zarr.open_group(str(path), mode="r+")
    if hashless:
        meta = dict(group.attrs["scalemb"])
        meta["content_hash"] = None
        group.attrs["scalemb"] = meta
    return path, group


# the Dask case starts the session cluster (real scheduler and worker processes): a slow test
EXECUTORS = ["local", pytest.param("dask", marks=pytest.mark.slow)]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_corrupt_stores_are_one_line_errors_in_process_and_on_dask(tmp_path, school_affinity, executor, request):
    # the Dask path on the session's cluster (a LocalCluster started by --workers: test_distributed)
    where = ("--scheduler", request.getfixturevalue("dask_cluster").address) if executor == "dask" else ()
    bad_index, group = _store(tmp_path, "idx.zarr", school_affinity)
    indices = group["indices"][:]
    indices[-3] = 10 ** 9
    group["indices"][:] = indices
    bad_indptr, group = _store(tmp_path, "ptr.zarr", school_affinity)
    indptr = group["indptr"][:]
    indptr[5], indptr[6] = indptr[6], indptr[5] - 1
    group["indptr"][:] = indptr
    scaled, group = _store(tmp_path, "scaled.zarr", school_affinity, hashless=False)
    group["data"][:] = group["data"][:] * 2
    for path, fragment in ((bad_index, "column index out of range"), (bad_indptr, "indptr is not non-decreasing"),
                           (scaled, "content hash mismatch")):
        proc = run_cli("embed", str(path), "--model", "tsne", "--iterations", "5", "--out",
                       str(tmp_path / f"out-{path.name}"), "--quiet", *where)
        assert proc.returncode == 2, (path, proc.returncode, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert fragment in lines[-1] and str(path) in lines[-1], proc.stderr[-2000:]
        assert not (tmp_path / f"out-{path.name}").exists()


def test_anndata_style_store_without_scalemb_metadata_is_accepted(tmp_path, school_affinity):
    path = tmp_path / "ad.zarr"
    P = school_affinity.P.tocsr()
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    group.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": list(P.shape)})
    group.create_array("data", data=P.data.astype(np.float32))
    group.create_array("indices", data=P.indices.astype(np.int32))
    group.create_array("indptr", data=P.indptr.astype(np.int32))
    result = scalemb.embed(str(path), model="tsne", iterations=10)
    assert result.embedding.shape == (42, 2) and np.array_equal(result.node_ids, np.arange(42))


def test_subnormal_and_huge_weights_are_refused_with_the_line(tmp_path):
    for weight in ("1e-320", "1e308"):
        edges = tmp_path / "w.txt"
        edges.write_text(f"1 2\n2 3 {weight}\n3 1\n")
        proc = run_cli("affinity", str(edges), "--out", str(tmp_path / "P.zarr"), "--quiet")
        assert proc.returncode == 2 and f"{edges}:2: weight {weight}" in proc.stderr, proc.stderr
        assert not (tmp_path / "P.zarr").exists()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_halo_metadata_is_written_and_a_mismatch_refused(tmp_path, school_affinity, executor, request):
    """Every store records each partition's halo (distinct columns outside its rows); a store whose partitions
    do not match it is refused in-process and where a Dask worker reads the partition."""
    from scalemb.affinity.store import AffinityStore

    path, group = _store(tmp_path, "halo.zarr", school_affinity, hashless=False)
    store = AffinityStore(path)
    P, bounds = school_affinity.P, store.partitions
    expected = [len(set(P.indices[P.indptr[a]:P.indptr[b]]) - set(range(a, b))) for a, b in zip(bounds[:-1],
                                                                                              bounds[1:])]
    assert store.halo.tolist() == expected and sum(expected) > 0
    where = ("--scheduler", request.getfixturevalue("dask_cluster").address) if executor == "dask" else ()
    halo = group["halo"][:]
    halo[1] += 1
    group["halo"][:] = halo
    moved, group2 = _store(tmp_path, "moved.zarr", school_affinity, hashless=False)
    partitions = group2["partitions"][:]
    partitions[2] += 1  # partitions moved, halo kept
    group2["partitions"][:] = partitions
    short, group3 = _store(tmp_path, "short.zarr", school_affinity, hashless=False)
    del group3["halo"]
    group3.create_array("halo", data=np.zeros(2, dtype=np.int64))
    for bad, fragment in ((path, "do not match the halo metadata"), (moved, "do not match the halo metadata"),
                          (short, "partitions do not match it")):
        proc = run_cli("embed", str(bad), "--model", "tsne", "--iterations", "5", "--out",
                       str(tmp_path / f"out-{bad.name}"), "--quiet", *where)
        assert proc.returncode == 2, (bad, proc.returncode, proc.stderr[-2000:])
        assert fragment in proc.stderr.strip().splitlines()[-1] and str(bad) in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / f"out-{bad.name}").exists()


def test_opening_a_store_checks_indptr_streaming_and_keeps_no_row_array(tmp_path, school_affinity):
    """What a Dask client does with a store (open it, ask N, nnz, the partitions, read one partition's rows)
    reads no O(N) array into memory; the streaming check finds a decrease at a step boundary."""
    from scalemb.affinity.store import AffinityStore, InputError, _checked_end

    path, group = _store(tmp_path, "p.zarr", school_affinity)
    st = AffinityStore(path)
    bounds = st.partitions
    block = st.read_rows(int(bounds[1]), int(bounds[2]))
    assert "indptr" not in st.__dict__ and st.nnz == school_affinity.P.nnz
    full = AffinityStore(path).indptr
    assert np.array_equal(block.indptr, full[bounds[1]:bounds[2] + 1] - full[bounds[1]])
    indptr = group["indptr"][:]
    for at in (3, 4, 5):  # a decrease at, just before and just after a step boundary (step 4)
        bad = indptr.copy()
        bad[at] = bad[at - 1] - 1
        with pytest.raises(InputError, match="indptr is not non-decreasing"):
            _checked_end(bad, path, step=4)
    assert _checked_end(indptr, path, step=4) == indptr[-1]
