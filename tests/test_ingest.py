"""Out-of-core edge-list ingestion into an affinity store: equality with the in-memory pipeline, bad input."""
import gzip

import numpy as np
import pytest
import zarr

from scalemb.affinity import AffinityStore, coauthorship_affinity, normalized_affinity, write_affinity_store
from scalemb.affinity.ingest import ingest_edge_list
from scalemb.datasets import grqc_path
from scalemb.errors import InputError, ScalembError
from scalemb.io.edgelist import read_edge_list

PIPELINES = {"coauthorship": coauthorship_affinity, "normalized": normalized_affinity}


def _write(tmp_path, text, name="g.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _store_arrays(path):
    group = zarr.open_group(str(path), mode="r")
    return {name: group[name][:] for name in ("indptr", "indices", "data", "node_ids", "partitions")}


def _assert_same_store(a, b):
    arrays_a, arrays_b = _store_arrays(a), _store_arrays(b)
    for name in arrays_a:
        assert np.array_equal(arrays_a[name], arrays_b[name]), name
    assert AffinityStore(a).content_hash == AffinityStore(b).content_hash


@pytest.fixture
def weighted_edges():
    rng = np.random.default_rng(3)
    ids = rng.choice(10**12, size=60, replace=False)
    edges = [(int(ids[a]), int(ids[b]), int(rng.integers(1, 5)))
             for a in range(60) for b in range(a + 1, 60) if rng.random() < 0.15]
    return edges, int(ids[0])


def test_shuffled_duplicated_reversed_equals_clean(tmp_path, weighted_edges):
    edges, some_id = weighted_edges
    clean = _write(tmp_path, "".join(f"{a} {b} {w}\n" for a, b, w in edges), "clean.txt")
    rng = np.random.default_rng(0)
    messy_lines = ([f"{b}\t{a}\t{w}\n" for a, b, w in edges] + [f"{a} {b} {w}\n" for a, b, w in edges]
                   + [f"{a} {b} 0.5\n" for a, b, _ in edges[::3]] + [f"{some_id} {some_id} 9\n", "7 7\n"])
    rng.shuffle(messy_lines)
    messy = _write(tmp_path, "# messy\n\n" + "".join(messy_lines), "messy.txt")
    ingest_edge_list(clean, tmp_path / "clean.zarr", chunk_lines=10**6)
    ingest_edge_list(messy, tmp_path / "messy.zarr", chunk_lines=37)  # many runs: out-of-core merge
    _assert_same_store(tmp_path / "clean.zarr", tmp_path / "messy.zarr")
    assert 7 not in AffinityStore(tmp_path / "messy.zarr").node_ids  # only had a self-loop


@pytest.mark.parametrize("affinity", sorted(PIPELINES))
def test_grqc_equals_in_memory_pipeline(tmp_path, affinity):
    expected = PIPELINES[affinity](read_edge_list(grqc_path()))
    out = ingest_edge_list(grqc_path(), tmp_path / "small-chunks.zarr", affinity=affinity, chunk_lines=5000,
                           n_partitions=4)
    loaded = AffinityStore(out).to_affinity()  # also verifies the streamed content hash
    assert np.array_equal(loaded.node_ids, expected.node_ids)
    assert np.array_equal(loaded.P.indptr, expected.P.indptr)
    assert np.array_equal(loaded.P.indices, expected.P.indices)
    np.testing.assert_allclose(loaded.P.data, expected.P.data, rtol=1e-13, atol=0)
    assert {k: loaded.provenance[k] for k in expected.provenance} == expected.provenance
    # in one chunk the sums run in the same order: the very store write_affinity_store writes
    write_affinity_store(tmp_path / "in-memory.zarr", expected, n_partitions=4)
    ingest_edge_list(grqc_path(), tmp_path / "one-chunk.zarr", affinity=affinity, n_partitions=4)
    _assert_same_store(tmp_path / "in-memory.zarr", tmp_path / "one-chunk.zarr")
    in_memory = zarr.open_group(str(tmp_path / "in-memory.zarr"), mode="r")
    ingested = zarr.open_group(str(tmp_path / "one-chunk.zarr"), mode="r")
    assert in_memory["data"].chunks == ingested["data"].chunks
    assert dict(in_memory.attrs) == dict(ingested.attrs)


@pytest.mark.parametrize("text,line,fragment", [
    ("1 2\n3\n", 2, "fields"),
    ("# a\n# b\n1 2\n3 4\n5 6\n7 8\n9 10 11 12\n", 7, "fields"),
    ("1 2\n3 4\n5 6\n7 b\n", 4, "'b' is a string but node id '1' on line 1 is an integer"),
    ("a b\nc d\ne f\n7 b\n", 4, "'7' is an integer but node id 'a' on line 1 is a string"),
    ("a b\nc d\nA f\n", None, r"'A' and 'a' differ only in case \(lines 3 and 1\)"),
    ("1 2\n3 4\n5 6\n-3 4\n", 4, "outside"),
    ("1 2\n3 4\n5 6\n3 9223372036854775808\n", 4, "outside"),
    ("1 2 1\n3 4 1\n# c\n1 2 nan\n", 4, "finite positive"),
    ("1 2 -1\n", 1, "finite positive"),
    ("1 2\n3 4\n1 2 abc\n", 3, "not a number"),
    ("1,2\n3,4\n5;6\n", 3, "fields"),
    ("1.5,2\n3,4\n", 1, r"'2' is an integer but node id '1.5' on line 1 is a string \(a number, not an integer"),
    # a numeric first field is data, not a CSV header
])
def test_malformed_line_names_line_and_leaves_nothing(tmp_path, text, line, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(InputError, match=fragment) as err:
        ingest_edge_list(path, tmp_path / "out.zarr", chunk_lines=2)
    assert err.value.line == line and err.value.path == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.txt"]


def test_failed_overwrite_keeps_previous_store(tmp_path):
    out = ingest_edge_list(_write(tmp_path, "1 2\n2 3\n"), tmp_path / "out.zarr")
    before = _store_arrays(out)
    with pytest.raises(ScalembError, match="exists"):
        ingest_edge_list(tmp_path / "g.txt", out)
    with pytest.raises(InputError):
        ingest_edge_list(_write(tmp_path, "1 2\nx y\n", "bad.txt"), out, overwrite=True)
    assert all(np.array_equal(before[k], v) for k, v in _store_arrays(out).items())
    ingest_edge_list(_write(tmp_path, "1 2\n2 3\n3 4\n", "more.txt"), out, overwrite=True)
    assert AffinityStore(out).n_points == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "g.txt", "more.txt", "out.zarr"]


@pytest.mark.parametrize("text,fragment", [
    ("", "no edges"), ("# only\n# comments\n\n", "no edges"), ("5 5\n6 6 2\n", "self-loops"),
])
def test_empty_input(tmp_path, text, fragment):
    with pytest.raises(InputError, match=fragment):
        ingest_edge_list(_write(tmp_path, text), tmp_path / "out.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.txt"]


def test_extreme_ids_and_overflow(tmp_path):
    big = 2**63 - 1
    out = ingest_edge_list(_write(tmp_path, f"{big} 0\n0 1\n"), tmp_path / "big.zarr")
    assert list(AffinityStore(out).node_ids) == [0, 1, big]
    with pytest.raises(InputError, match="outside") as err:
        ingest_edge_list(_write(tmp_path, f"0 1\n{big + 1} 0\n", "over.txt"), tmp_path / "over.zarr")
    assert err.value.line == 2


def test_csv_gz_and_mixed_columns_equal_text(tmp_path, weighted_edges):
    edges, _ = weighted_edges
    text = _write(tmp_path, "".join(f"{a}\t{b}\t{w}\n" for a, b, w in edges))
    csv = _write(tmp_path, "src,dst,weight\n" + "".join(f"{a}, {b},{w}\n" for a, b, w in edges), "g.csv")
    gz = tmp_path / "g.txt.gz"
    gz.write_bytes(gzip.compress(text.read_bytes()))
    ingest_edge_list(text, tmp_path / "text.zarr")
    for source in (csv, gz):
        ingest_edge_list(source, tmp_path / f"{source.name}.zarr", chunk_lines=50)
        _assert_same_store(tmp_path / "text.zarr", tmp_path / f"{source.name}.zarr")
    mixed = _write(tmp_path, "1 2\n2 3 2.5\n3 1\n", "mixed.txt")  # 2 and 3 fields: the line-by-line parser
    loaded = AffinityStore(ingest_edge_list(mixed, tmp_path / "mixed.zarr")).to_affinity()
    expected = coauthorship_affinity(read_edge_list(mixed))
    assert abs(loaded.P - expected.P).max() < 1e-15


def test_rejects_bad_arguments(tmp_path):
    path = _write(tmp_path, "1 2\n")
    with pytest.raises(ValueError, match="affinity"):
        ingest_edge_list(path, tmp_path / "o.zarr", affinity="cosine")
    with pytest.raises(InputError, match="no such file"):
        ingest_edge_list(tmp_path / "missing.txt", tmp_path / "o.zarr")
    with pytest.raises(ScalembError, match="does not exist"):
        ingest_edge_list(path, tmp_path / "nowhere" / "o.zarr")


def test_string_ids_and_arrow_tables_equal_in_memory(tmp_path, weighted_edges):
    """String ids (streamed as integer codes, sorted at the end) and Parquet / Feather / Arrow-stream tables give
    the store of the in-memory pipeline, with the same content hash, whatever the chunking."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    edges, _ = weighted_edges
    names = [(f"n{a}", f"n{b}", w) for a, b, w in edges]
    text = _write(tmp_path, "".join(f"{a}\t{b}\t{w}\n" for a, b, w in names), "names.tsv")
    write_affinity_store(tmp_path / "memory.zarr", coauthorship_affinity(read_edge_list(text)))
    ingest_edge_list(text, tmp_path / "text.zarr", chunk_lines=23)
    _assert_same_store(tmp_path / "memory.zarr", tmp_path / "text.zarr")
    assert AffinityStore(tmp_path / "text.zarr").node_ids.dtype.kind == "U"
    for kind, rows in (("str", names), ("int", edges)):
        table = pa.table({"src": [r[0] for r in rows], "dst": [r[1] for r in rows],
                          "weight": [float(r[2]) for r in rows]})
        expected = tmp_path / f"{kind}-memory.zarr"
        if kind == "int":
            write_affinity_store(expected, coauthorship_affinity(read_edge_list(_write(
                tmp_path, "".join(f"{a} {b} {w}\n" for a, b, w in rows), "ints.txt"))))
        else:
            expected = tmp_path / "memory.zarr"
        pq.write_table(table, tmp_path / f"{kind}.parquet", row_group_size=40)
        feather.write_feather(table, tmp_path / f"{kind}.feather")
        with pa.OSFile(str(tmp_path / f"{kind}.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=30)
        for suffix in ("parquet", "feather", "arrow"):
            source = tmp_path / f"{kind}.{suffix}"
            ingest_edge_list(source, tmp_path / f"{kind}-{suffix}.zarr", chunk_lines=17)
            _assert_same_store(expected, tmp_path / f"{kind}-{suffix}.zarr")
            graph = read_edge_list(source)
            assert graph.n_nodes == AffinityStore(expected).n_points


def test_cli_affinity_refuses_a_bad_table_and_writes_nothing(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from scalemb.cli.main import main

    pq.write_table(pa.table({"src": ["a", "b", None], "dst": ["b", "c", "a"]}), tmp_path / "e.parquet")
    assert main(["affinity", str(tmp_path / "e.parquet"), "--out", str(tmp_path / "e.zarr")]) == 2
    assert "e.parquet: column 'src' has a null node id at row 3" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.parquet"]
