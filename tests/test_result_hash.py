"""The result's content hash in the blocked form (``scalemb.store.results``): recomputed by any reader, results
written in the older whole-array form still read, tampering with one block or the block list is detected."""
import numpy as np
import pytest
import zarr

from scalemb.errors import ScalembError
from scalemb.store.results import (EmbeddingResult, arrays_hash, blocked_hash, check_row_blocks, read_result,
                                   write_result)
from scalemb.engine.held import rows_digest


def _arrays(n=50, d=2):
    rng = np.random.default_rng(3)
    return {"embedding": rng.normal(size=(n, d)), "node_ids": np.arange(n, dtype=np.int64) * 7,
            "kl_history": np.array([3.0, 2.5, 2.25])}


ATTRS = {"model": "tsne", "space_dims": 2, "time_dims": 0, "iterations": 2, "kl": 2.25, "seed": 0}


def test_blocked_hash_is_recomputed_and_composes_from_block_digests(tmp_path):
    arrays = _arrays()
    blocks = [[0, 13], [13, 31], [31, 50]]
    write_result(tmp_path / "r.zarr", arrays, ATTRS, row_blocks=blocks)
    back, attrs = read_result(tmp_path / "r.zarr")
    assert attrs["row_blocks"] == blocks and attrs["blocked"] == {"embedding": ["<f8", [50, 2]]}
    # what the writers of the blocks report composes the same hash, without the whole embedding
    digests = {"embedding": [rows_digest(arrays["embedding"][a:b]) for a, b in blocks]}
    small = {k: v for k, v in arrays.items() if k != "embedding"}
    assert blocked_hash(small, attrs["blocked"], blocks, digests) == attrs["content_hash"]
    # the blocks are part of the hash: other blocks, another hash; one block is the default
    write_result(tmp_path / "one.zarr", arrays, ATTRS)
    one = read_result(tmp_path / "one.zarr")[1]
    assert one["row_blocks"] == [[0, 50]] and one["content_hash"] != attrs["content_hash"]
    # EmbeddingResult keeps its blocks through a load and a save: the same hash
    loaded = EmbeddingResult.load(tmp_path / "r.zarr")
    assert loaded.row_blocks == blocks
    loaded.save(tmp_path / "again.zarr")
    assert read_result(tmp_path / "again.zarr")[1]["content_hash"] == attrs["content_hash"]


def test_a_result_in_the_older_form_still_reads_and_verifies(tmp_path):
    arrays = _arrays()
    path = tmp_path / "old.zarr"
    group = zarr.open_group(store=str(path), mode="w", zarr_format=3)
    for name, value in arrays.items():
        group.create_array(name, data=value)
    group.attrs.update({**ATTRS, "content_hash": arrays_hash(arrays)})  # as results were written before
    back, attrs = read_result(path)
    assert "blocked" not in attrs and np.array_equal(back["embedding"], arrays["embedding"])
    assert EmbeddingResult.load(path).row_blocks is None
    zarr.open_array(store=str(path / "embedding"), mode="r+")[4, 1] += 1.0
    with pytest.raises(ScalembError, match="content hash mismatch"):
        read_result(path)


def test_a_tampered_block_or_block_list_is_detected(tmp_path):
    arrays = _arrays()
    path = tmp_path / "r.zarr"
    write_result(path, arrays, ATTRS, row_blocks=[[0, 20], [20, 50]])
    zarr.open_array(store=str(path / "embedding"), mode="r+")[33, 0] = -arrays["embedding"][33, 0]
    with pytest.raises(ScalembError, match="content hash mismatch"):
        read_result(path)
    path = tmp_path / "r2.zarr"
    write_result(path, arrays, ATTRS, row_blocks=[[0, 20], [20, 50]])
    group = zarr.open_group(store=str(path), mode="r+")
    group.attrs["row_blocks"] = [[0, 25], [25, 50]]  # other blocks over the same rows: another hash
    with pytest.raises(ScalembError, match="content hash mismatch"):
        read_result(path)
    for bad in ([[0, 20], [21, 50]], [[0, 49]], "x", [[0, 0], [0, 50]]):
        group.attrs["row_blocks"] = bad
        with pytest.raises(ScalembError, match="hash attributes are invalid"):
            read_result(path)
    group.attrs["row_blocks"] = [[0, 20], [20, 50]]
    group.attrs["blocked"] = {"embedding": ["<f8", [50, 3]]}
    with pytest.raises(ScalembError, match="hash attributes are invalid"):
        read_result(path)


def test_row_blocks_are_checked():
    assert check_row_blocks([(0, 3), (3, 5)], 5) == [[0, 3], [3, 5]]
    assert check_row_blocks([[0, 0]], 0) == [[0, 0]]
    for bad in ([], [[0, 3]], [[1, 5]], [[0, 3], [2, 5]], [[0, 5], [5, 5]], None):
        with pytest.raises(ValueError):
            check_row_blocks(bad, 5)


def test_in_process_run_hashes_over_the_layout_blocks(tmp_path):
    """An in-process run's result is hashed over its executor's row blocks (the layout partitions)."""
    import scalemb

    result = scalemb.Embedder(model="tsne", max_iter=5).fit("school").result_
    assert result.row_blocks is not None and result.row_blocks[0][0] == 0 and \
        result.row_blocks[-1][1] == result.embedding.shape[0]
    result.save(tmp_path / "r.zarr")
    assert read_result(tmp_path / "r.zarr")[1]["row_blocks"] == result.row_blocks
