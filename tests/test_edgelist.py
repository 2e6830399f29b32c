import gzip
import re
import sys

import numpy as np
import pyarrow as pa
import pytest

from scalemb.affinity import coauthorship_affinity, normalized_affinity
from scalemb.datasets import grqc, school
from scalemb.errors import InputError
from scalemb.io.edges import graph_from_edges
from scalemb.io.edgelist import read_edge_list


def _write(tmp_path, text, name="g.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_parses_comments_separators_weights_and_loops(tmp_path):
    path = _write(tmp_path, "# header\n10\t20\n20 10\n20   30 2.5\n30 30\n\n40 40\n10 20\n")
    g = read_edge_list(path)
    assert list(g.node_ids) == [10, 20, 30]  # 40 only had a self-loop: removed
    assert g.n_edges == 2
    pairs = {(int(g.node_ids[a]), int(g.node_ids[b])): w for a, b, w in zip(g.src, g.dst, g.weight)}
    assert pairs == {(10, 20): 1.0, (20, 30): 2.5}


def test_shuffled_duplicated_reversed_equals_clean(tmp_path):
    rng = np.random.default_rng(0)
    edges = [(a, b) for a in range(30) for b in range(a + 1, 30) if rng.random() < 0.2]
    clean = _write(tmp_path, "".join(f"{a} {b}\n" for a, b in edges), "clean.txt")
    messy_edges = edges + [(b, a) for a, b in edges] + edges[:10]
    rng.shuffle(messy_edges)
    messy = _write(tmp_path, "".join(f"{a}\t{b}\n" for a, b in messy_edges), "messy.txt")
    p1 = coauthorship_affinity(read_edge_list(clean))
    p2 = coauthorship_affinity(read_edge_list(messy))
    assert np.array_equal(p1.node_ids, p2.node_ids)
    assert abs(p1.P - p2.P).max() == 0


def test_gzip_and_huge_ids(tmp_path):
    path = tmp_path / "g.txt.gz"
    big = 2**63 - 1
    with gzip.open(path, "wt") as f:
        f.write(f"{big} 1\n1 2\n")
    g = read_edge_list(path)
    assert g.node_ids.dtype == np.int64 and g.node_ids[-1] == big


@pytest.mark.parametrize("text,line,fragment", [
    ("1 2\n3\n", 2, "fields"),
    ("1 2\n3 4 5 6\n", 2, "fields"),
    ("1 2\n3 b\n", 2, "node id 'b' is a string but node id '1' on line 1 is an integer"),
    ("# names\nalice bob\n\nbob 7\n", 4, "node id '7' is an integer but node id 'alice' on line 2 is a string"),
    ("a,b\nb,c\n,c\n", 3, "empty node id"),
    ("a,b\nb, \n", 2, "empty node id"),
    ("a b\nb -3\n", 2, "outside"),
    ("1 2\n-3 4\n", 2, "outside"),
    ("1 2\n3 99999999999999999999999\n", 2, "outside"),
    ("# c\n1 2 nan\n", 2, "finite positive"),
    ("1 2 -1\n", 1, "finite positive"),
    ("1 2 abc\n", 1, "not a number"),
])
def test_malformed_lines_name_file_and_line(tmp_path, text, line, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as err:
        read_edge_list(path)
    assert err.value.line == line
    assert str(err.value).startswith(f"{path}:{line}:")
    assert fragment in str(err.value)


def test_empty_no_edges_missing_and_binary(tmp_path):
    with pytest.raises(InputError, match="no edges"):
        read_edge_list(_write(tmp_path, "# only a comment\n"))
    with pytest.raises(InputError, match="no edges"):
        read_edge_list(_write(tmp_path, "1 1\n2 2\n", "loops.txt"))
    with pytest.raises(InputError, match="no such file"):
        read_edge_list(tmp_path / "missing.txt")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00\x01garbage")
    with pytest.raises(InputError, match="cannot read"):
        read_edge_list(binary)


def test_grqc_counts():
    a = grqc()
    assert a.n_points == 5241
    assert a.P.nnz == 2 * 14484
    assert a.P.sum() == pytest.approx(1.0)
    assert abs(a.P - a.P.T).max() == 0


def test_coauthorship_formula(tmp_path):
    # path 1-2-3 plus 2-4: degrees 1, 3, 1, 1
    g = read_edge_list(_write(tmp_path, "1 2\n2 3\n2 4\n"))
    P = coauthorship_affinity(g).P.toarray()
    expected = np.zeros((4, 4))
    for a, b in [(0, 1), (1, 2), (1, 3)]:
        deg = [1, 3, 1, 1]
        expected[a, b] = expected[b, a] = 1 / deg[a] + 1 / deg[b]
    assert np.allclose(P, expected / expected.sum())
    Pn = normalized_affinity(g).P.toarray()
    assert np.allclose(Pn, (expected > 0) / 6)


def test_school_graph():
    a = school()
    assert a.n_points == 42 and a.P.nnz == 2 * 121
    degrees = np.asarray((a.P > 0).sum(axis=1)).ravel()
    assert sorted(set(degrees)) == [5, 21]  # students: 4 ring neighbours + teacher; teachers: 20 + other teacher


def test_embed_and_affinity_read_one_format_csv_header_gz(tmp_path):
    """One parser for every command: a CSV with a header row, gzipped, reads the same as the SNAP text."""
    import scalemb
    from scalemb.affinity.ingest import ingest_edge_list
    from scalemb.affinity import AffinityStore

    text = tmp_path / "e.txt"
    text.write_text("# comment\n1 2\n2 3\n3 1\n3 4\n")
    csv = tmp_path / "e.csv.gz"
    with gzip.open(csv, "wt") as f:
        f.write("source,target\n1,2\n2,3\n# c\n3,1\n3,4\n")
    a, b = read_edge_list(text), read_edge_list(csv)
    assert np.array_equal(a.node_ids, b.node_ids) and np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)
    store = ingest_edge_list(csv, tmp_path / "P.zarr")
    assert np.array_equal(AffinityStore(store).node_ids, a.node_ids)
    assert scalemb.Embedder(model="tsne", iterations=5).fit(str(csv)).embedding_.shape == (4, 2)


TRICKY = [
    "# c\n1\t2\n2\t3\n\n3\t4\t2.5\n",                      # field count changes: pyarrow fails, exact reads on
    "1 2\n2 3\n# a comment after the data\n3 4\n",
    "src,dst,weight\nalice,bob,2\nbob,carol,0.5\n",
    "alice bob\nbob carol\n#x y\ncarol dave\n",
    "alice\tbob\nbob\tca rol\n",                            # 3 whitespace fields: 'rol' is not a weight
    "a,b\nb , c\nc,d\n",                                     # blanks around CSV fields are stripped
    "a b\nb c\nc 007\n",                                     # an integer-looking id among names
    "1 2\n2 +3\n3 4\n",
    "1 2\n2 3\n4 5 nan\n",
    "true false\nfalse maybe\n",                             # pyarrow would read booleans
    "NA x\nx null\n",                                        # pyarrow would read nulls
    "1 2\n3 9223372036854775808\n",
    "1\t2\r\n2\t3\r\n",
    "a b\nb\tc\n",
    "x,y\n1,2\n2,3\n",                                       # a header over integer ids
    "Alice bob\nbob alice\n",
    "\ufeff1 2\n2 3\n",                                    # a byte-order mark
    "1\t2\t1\n2\t3\t2\n3\t4\t2.5\n4\t5\t1e-400\n",             # integer weights, then decimals
    "\ufeffsrc,dst\nx,y\n",
]


@pytest.mark.parametrize("text", TRICKY)
@pytest.mark.parametrize("chunk_lines", [2, 1000])
def test_pyarrow_reader_gives_the_exact_readers_graph_and_errors(tmp_path, text, chunk_lines):
    """The pyarrow CSV path (default when pyarrow is installed) and the exact reader agree on every file:
    the same Graph or the same error at the same line, whatever the chunking."""
    from scalemb.io.edges import Edges
    from scalemb.io.edgelist import check_ids, parse_edge_chunks

    path = _write(tmp_path, text)

    def outcome(reader):
        try:
            edges = Edges.concat(parse_edge_chunks(path, chunk_lines, reader=reader))
            g = graph_from_edges(edges.src, edges.dst, edges.weight, str(path))
            check_ids(g.node_ids, path)
            return g.node_ids.tolist(), g.src.tolist(), g.dst.tolist(), g.weight.tolist()
        except InputError as exc:
            return str(exc)

    assert outcome("arrow") == outcome("exact")


@pytest.mark.parametrize("late", ["# a late comment\n", "5 x\n", "5\n", "\n\n", "9 10 0\n"])
def test_pyarrow_hands_over_mid_file_at_the_right_line(tmp_path, late):
    """Blocks pyarrow read are kept; from the first block it cannot vouch for the exact reader continues at that
    block's first row: the same Graph or the same error line as the exact reader alone."""
    from scalemb.io.edges import Edges
    from scalemb.io.edgelist import parse_edge_chunks

    lines = [f"{k}\t{k + 1}\t{1 + k % 3}\n" for k in range(3000)]
    lines.insert(2200, late)
    path = _write(tmp_path, "# header comment\n\n" + "".join(lines))

    def outcome(reader):
        try:
            edges = Edges.concat(parse_edge_chunks(path, 100, reader=reader))
            return edges.src.tolist(), edges.dst.tolist(), edges.weight.tolist()
        except InputError as exc:
            return str(exc)

    arrow = outcome("arrow")
    assert arrow == outcome("exact")
    assert isinstance(arrow, str) == (late.strip() not in ("", "# a late comment"))


def test_string_ids_header_and_case(tmp_path):
    g = read_edge_list(_write(tmp_path, "source\ttarget\nbob\talice\nalice\tcarol\t3\n", "s.tsv"))
    assert g.node_ids.tolist() == ["alice", "bob", "carol"] and g.node_ids.dtype.kind == "U"
    assert sorted(zip(g.src.tolist(), g.dst.tolist(), g.weight.tolist())) == [(0, 1, 1.0), (0, 2, 3.0)]
    with pytest.raises(InputError, match=r"'Bob' and 'bob' differ only in case \(lines 3 and 1\)"):
        read_edge_list(_write(tmp_path, "bob alice\nalice carol\nBob carol\n", "c.txt"))


def _table(tmp_path, columns, name="t.parquet"):
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    path = tmp_path / name
    table = pa.table(columns)
    (pq.write_table if name.endswith(".parquet") else feather.write_feather)(table, path)
    return path


def test_arrow_tables_by_name_or_position(tmp_path):
    named = read_edge_list(_table(tmp_path, {"weight": [2.0, 1.0], "dst": ["b", "c"], "src": ["a", "b"]}))
    assert named.node_ids.tolist() == ["a", "b", "c"] and sorted(named.weight.tolist()) == [1.0, 2.0]
    positional = read_edge_list(_table(tmp_path, {"u": [5, 6], "v": [6, 7]}, "p.feather"))
    assert positional.node_ids.tolist() == [5, 6, 7] and positional.node_ids.dtype == np.int64


@pytest.mark.parametrize("columns,fragment", [
    ({"src": [1, 2, None], "dst": [2, 3, 4]}, "column 'src' has a null node id at row 3"),
    ({"src": [1, 2], "dst": [2, 3], "weight": [1.0, None]}, "column 'weight' has a null weight at row 2"),
    ({"src": [1.0, 2.0], "dst": [2.0, 3.0]}, "column 'src' has type double: node ids must be integers or strings"),
    ({"src": [1, 2], "dst": ["b", "c"]}, "'src' holds integer ids and 'dst' string ids"),
    ({"a": [1], "b": [2], "c": [1.0], "d": [1.0]}, "columns ['a', 'b', 'c', 'd']: expected"),
    ({"src": [1, 2], "dst": [2, 3], "weight": ["x", "y"]}, "the weight must be a number"),
    ({"src": [1, 2], "dst": [2, 3], "weight": [1.0, -1.0]}, "weight -1.0 at row 2 must be a finite positive"),
    ({"src": [1, -2], "dst": [2, 3]}, "node id -2 at row 2 is outside"),
    ({"src": pa.array([1, 2**64 - 1], pa.uint64()), "dst": [2, 3]}, f"node id {2**64 - 1} at row 2 is outside"),
    ({"src": ["a", ""], "dst": ["b", "c"]}, "column 'src' has an empty node id at row 2"),
    ({"src": ["a", "b"], "dst": ["b", "A"]}, r"'A' and 'a' differ only in case \(rows 2 and 1\)"),
])
def test_bad_arrow_tables_name_column_and_row(tmp_path, columns, fragment):
    with pytest.raises(InputError, match=re.escape(fragment) if "\\(" not in fragment else fragment):
        read_edge_list(_table(tmp_path, columns))


def test_arrow_input_without_pyarrow_and_corrupt_tables(tmp_path, monkeypatch):
    path = _table(tmp_path, {"src": [1], "dst": [2]})
    text = _write(tmp_path, "a b\nb c\n")
    corrupt = tmp_path / "bad.parquet"
    corrupt.write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="cannot read as a parquet table"):
        read_edge_list(corrupt)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if the 'arrow' extra were not installed
    with pytest.raises(InputError, match=re.escape("needs pyarrow: pip install 'scalemb[arrow]'")):
        read_edge_list(path)
    assert read_edge_list(text).node_ids.tolist() == ["a", "b", "c"]  # text falls back to the exact reader


def _pyarrow_reads_whole_file(path) -> bool:
    """Whether the pyarrow path reads ``path`` to the end without handing over to the exact reader."""
    from scalemb.io.edgelist import _csv_chunks, _IdKind, _sniff

    sep, header, data_line = _sniff(path)
    chunks = _csv_chunks(path, 1000, sep, data_line, header, _IdKind(path), [0])
    try:
        while True:
            next(chunks)
    except StopIteration as stop:
        return stop.value


def test_pyarrow_path_reads_clean_files_itself(tmp_path):
    gz = tmp_path / "g.txt.gz"
    gz.write_bytes(gzip.compress(b"# SNAP\n# FromNodeId\tToNodeId\n1\t2\n2\t3\n"))
    assert _pyarrow_reads_whole_file(gz)
    assert _pyarrow_reads_whole_file(_write(tmp_path, "source,target,weight\nann,bob,1\nbob,cy,2.5\n", "s.csv"))
    assert _pyarrow_reads_whole_file(_write(tmp_path, "1 2 1\n2 3 2.5\n", "w.txt"))
    assert not _pyarrow_reads_whole_file(_write(tmp_path, "1 2\n# late comment\n2 3\n", "c.txt"))
    assert not _pyarrow_reads_whole_file(_write(tmp_path, "a b\nb 7\n", "m.txt"))
