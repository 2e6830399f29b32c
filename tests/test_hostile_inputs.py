"""Hostile inputs (issue 34: M2, L1-L4, L7): each is refused with one line naming the file and line (row,
column or parameter), within the input limits, leaving nothing on disk -- or, for text that is only odd (L2,
L3), drawn and embedded as it is."""
import gzip
import json
import re
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import scalemb
from scalemb.affinity.ingest import ingest_edge_list
from scalemb.errors import InputError
from scalemb.io.edges import Edges, PairSet, graph_from_edges
from scalemb.io.edgelist import parse_edge_chunks, read_edge_list
from scalemb.io.nodeids import check_node_ids

from .cli_runner import run_cli

NFD_CAFE = unicodedata.normalize("NFD", "café")

# (name, file name, file content (str: text, bytes: written as is, dict: Parquet columns), fragment of the
# message, line or None): every reader of edge lists refuses the file with one line naming it.
CASES = [
    ("gzip bomb (integer ids)", "bomb.txt.gz", gzip.compress(b"1 2\n" * 2_000_000, 9),
     r"gzip data decompresses to more than 1,048,576 bytes \(the limit: 100 times the file's [\d,]+ bytes, at "
     r"least 1 MiB; set SCALEMB_MAX_GZIP_RATIO higher to read it\)$", None),
    ("gzip bomb (string ids)", "bomb.csv.gz", gzip.compress(b"alice,bob\n" * 1_000_000, 9),
     r"gzip data decompresses to more than 1,945,700 bytes \(the limit: 100 times the file's 19,457 bytes", None),
    ("gzip bomb of one line", "line.txt.gz", gzip.compress(b"a" * 4_000_000, 9), r"line is longer than 1536", 1),
    ("100 KB id", "long.txt", "a b\nc d\n" + "x" * 100_000 + " b\n",
     r"line is longer than 1536 characters: node ids are at most 256 characters \(SCALEMB_MAX_ID_CHARS\)", 3),
    ("300-character id", "long.csv", "a,b\n" + "y" * 300 + ",b\n",
     r"node id 'y{40}\.\.\.' has 300 characters, more than the limit of 256", 2),
    ("dotted capital I twin", "t1.txt", "Alice bob\nbob Alİce\n", r"'Alice' and 'Alİce' differ only in case "
     r"\(lines 1 and 2\)", None),
    ("sharp s twin", "t2.txt", "straße x\nx STRASSE\n", r"'STRASSE' and 'straße' differ only in case", None),
    ("dotless i twin", "t3.txt", "ALICE x\nx Alıce\n", r"'ALICE' and 'Alıce' differ only in case", None),
    ("NFC / NFD twin", "t4.txt", f"café x\nx {NFD_CAFE}\n", r"one text in two Unicode normalisation forms", None),
    ("NUL in an id", "nul.txt", "a b\nc\x00d e\n", r"node id 'c\\x00d' holds U\+0000", 2),
    ("control character", "ctl.csv", "a,b\nc\x01d,e\n", r"holds U\+0001", 2),
    ("tab inside a CSV id", "tab.csv", "a,b\nc\td,e\n", r"holds U\+0009", 2),
    ("right-to-left override", "rtl.txt", "a b\nc\u202ed e\n", r"holds U\+202E \(RIGHT-TO-LEFT OVERRIDE\)", 2),
    ("Parquet: newline in an id", "nl.parquet", {"src": ["a", "b\nc"], "dst": ["b", "a"]},
     r"column 'src', row 2: node id 'b\\nc' holds U\+000A", None),
    ("Parquet: RTL override", "rtl.parquet", {"src": ["a", "b"], "dst": ["b", "x\u202ey"]},
     r"column 'dst', row 2: node id 'x\\u202ey' holds U\+202E", None),
    ("Parquet: 300-character id", "long.parquet", {"src": ["a", "z" * 300], "dst": ["b", "a"]},
     r"column 'src', row 2: node id 'z{40}\.\.\.' has 300 characters", None),
    ("Parquet: case twin beyond ASCII", "twin.parquet", {"src": ["straße", "b"], "dst": ["b", "STRASSE"]},
     r"'STRASSE' and 'straße' differ only in case \(rows 2 and 1\)", None),
    ("Parquet: duplicate column names", "dup.parquet", pa.Table.from_arrays(
        [pa.array([1, 2]), pa.array([2, 3]), pa.array([3, 1])], names=["src", "dst", "src"]),
     r"column name 'src' occurs 2 times \(columns \['src', 'dst', 'src'\]\)", None),
    ("Parquet: two unnamed columns named alike", "dup2.parquet", pa.Table.from_arrays(
        [pa.array([1, 2]), pa.array([2, 3])], names=["a", "a"]), r"column name 'a' occurs 2 times", None),
    ("Feather: RTL override", "rtl.feather", {"src": ["a", "b"], "dst": ["b", "x\u202ey"]},
     r"column 'dst', row 2: node id 'x\\u202ey' holds U\+202E", None),
    ("Feather: duplicate column names", "dup.feather", pa.Table.from_arrays(
        [pa.array([1, 2]), pa.array([2, 3]), pa.array([3, 1])], names=["src", "dst", "dst"]),
     r"column name 'dst' occurs 2 times", None),
    ("Feather: compressed rows bomb", "rows.feather", {"src": np.ones(1 << 21, np.int64), "dst": np.full(1 << 21, 2)},
     r"its first [\d,]+ rows decode to more than [\d,]+ bytes \(the limit: 100 times", None),
    ("Parquet: run-length bomb", "rle.parquet", {"src": np.ones(1 << 21, np.int64), "dst": np.full(1 << 21, 2)},
     r"2,097,152 rows \([\d,]+ bytes of pages\) decode to more than [\d,]+ bytes \(the limit: 100 times", None),
]


def _write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        table = content if isinstance(content, pa.Table) else pa.table(content)
        if name.endswith(".feather"):
            import pyarrow.feather as feather

            feather.write_feather(table, path, compression="zstd", compression_level=19)
        else:
            pq.write_table(table, path, compression="zstd")
    return path


def _entries(directory):
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("name, file, content, fragment, line", CASES, ids=[c[0] for c in CASES])
def test_hostile_edge_lists_are_refused_by_every_reader(tmp_path, name, file, content, fragment, line):
    path = _write(tmp_path, file, content)
    readers = {"read_edge_list": lambda: read_edge_list(path),
               "streaming ingest": lambda: ingest_edge_list(path, tmp_path / "store.zarr")}
    if not file.endswith((".parquet", ".feather")):
        readers["exact reader"] = lambda: read_edge_list_exact(path)
    before = _entries(tmp_path)
    for reader, call in readers.items():
        with pytest.raises(InputError, match=fragment) as caught:
            call()
        error = caught.value
        assert error.path == str(path) and "\n" not in str(error), (reader, str(error))
        assert error.line == line, (reader, str(error))
        assert _entries(tmp_path) == before, reader  # no store, no spill directory left behind


def read_edge_list_exact(path):
    """``read_edge_list`` with the exact reader throughout (no pyarrow)."""
    pairs = PairSet()
    for edges in parse_edge_chunks(path, reader="exact"):
        pairs.add(edges)
    graph = pairs.graph(str(path))
    from scalemb.io.edgelist import check_ids

    check_ids(graph.node_ids, path)
    return graph


@pytest.mark.parametrize("file, fragment", [("bomb.txt.gz", "decompresses"), ("long.txt", "line is longer")])
def test_cli_refuses_with_one_line_and_writes_nothing(tmp_path, file, fragment):
    content = next(c[2] for c in CASES if c[1] == file)
    path = _write(tmp_path, file, content)
    before = _entries(tmp_path)
    for command in (["affinity", path, "--out", tmp_path / "a.zarr"],
                    ["embed", path, "--out", tmp_path / "e.zarr", "--iterations", "2"]):
        proc = run_cli(*command, "--quiet")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and fragment in proc.stderr, proc.stderr
        assert _entries(tmp_path) == before


def test_limits_are_configurable(tmp_path, monkeypatch):
    long = _write(tmp_path, "long.csv", "a,b\n" + "y" * 300 + ",b\n")
    bomb = _write(tmp_path, "bomb.txt.gz", gzip.compress(b"1 2\n" * 2_000_000, 9))
    monkeypatch.setenv("SCALEMB_MAX_ID_CHARS", "300")
    assert read_edge_list(long).n_nodes == 3
    monkeypatch.setenv("SCALEMB_MAX_GZIP_RATIO", "1e4")
    assert read_edge_list(bomb).n_edges == 1
    monkeypatch.setenv("SCALEMB_MAX_ID_CHARS", "many")
    with pytest.raises(ValueError, match="SCALEMB_MAX_ID_CHARS must be a positive integer, got 'many'"):
        read_edge_list(long)


def test_long_comment_lines_are_skipped_not_refused(tmp_path):
    path = _write(tmp_path, "c.txt", "# " + "comment " * 1000 + "\na b\n")
    assert read_edge_list(path).n_edges == 1
    assert read_edge_list_exact(path).n_edges == 1


def test_non_ascii_ids_that_are_not_twins_are_kept(tmp_path):
    path = _write(tmp_path, "u.txt", "Zoë Zoe\nİstanbul istanbul-2\n中文 Ωmega\ncafé x\n")
    assert list(read_edge_list(path).node_ids) == sorted(["Zoë", "Zoe", "İstanbul", "istanbul-2", "中文", "Ωmega",
                                                          "café", "x"])


def test_estimator_inputs_pass_the_same_validator():
    nx = pytest.importorskip("networkx")
    graph = nx.Graph([("a\x00", "b"), ("b", "c")])  # a <U array would have dropped the trailing NUL
    with pytest.raises(InputError, match=r"networkx graph: node id 'a\\x00' holds U\+0000 \(a control character\)"):
        scalemb.Embedder(iterations=2).fit(graph)
    with pytest.raises(InputError, match="'Alİce' and 'alice' differ only in case"):
        check_node_ids(np.array(["Alİce", "alice"]), "x")


# --- M2: memory follows the distinct pairs, not the rows ----------------------------------------------------------

def test_pair_set_holds_distinct_pairs_only():
    pairs = PairSet()
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 50, 4000), rng.integers(0, 50, 4000)
    weight = rng.uniform(0.5, 2.0, 4000)
    for _ in range(300):  # 1.2 M rows of at most 50 * 49 / 2 distinct pairs
        pairs.add(Edges(src, dst, weight))
        held = pairs.merged[0].size + sum(part[0].size for part in pairs.pending)
        assert held <= (1 << 16) + 1225  # merged when the pending pairs reach 2^16 (or the merged ones)
    graph = pairs.graph("x")
    reference = graph_from_edges(src, dst, weight, "x")
    for name in ("node_ids", "src", "dst", "weight"):
        assert np.array_equal(getattr(graph, name), getattr(reference, name))


@pytest.mark.parametrize("string", [False, True])
def test_streamed_graph_equals_the_in_memory_one(tmp_path, string):
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 300, 5000), rng.integers(0, 300, 5000)
    w = rng.integers(1, 5, 5000).astype(float)
    names = np.array([f"n{k:03d}é" if k % 7 else f"N{k}" for k in range(300)]) if string else np.arange(300) * 3
    path = _write(tmp_path, "g.txt", "".join(f"{names[i]} {names[j]} {x:g}\n" for i, j, x in zip(a, b, w)))
    reference = graph_from_edges(names[a], names[b], w, str(path))
    for graph in (read_edge_list(path), read_edge_list_exact(path)):
        for name in ("node_ids", "src", "dst", "weight"):
            assert np.array_equal(getattr(graph, name), getattr(reference, name)), name
    table = _write(tmp_path, "g.parquet", {"src": names[a], "dst": names[b], "weight": w})
    for source in (path, table):
        small = PairSet()
        for edges in parse_edge_chunks(source, chunk_lines=97):  # many chunks, each with its own names
            small.add(edges)
        graph = small.graph(str(source))
        for name in ("node_ids", "src", "dst", "weight"):
            assert np.array_equal(getattr(graph, name), getattr(reference, name)), (source, name)


def test_parquet_string_ids_stay_dictionary_codes(tmp_path, monkeypatch):
    """A batch of rows sharing one long id costs its codes, not a copy of the id per row."""
    monkeypatch.setenv("SCALEMB_MAX_GZIP_RATIO", "1e4")  # 100,000 rows of two ids in 2 KB: a bomb by default
    ids = ["q" * 200] * 50_000 + ["b"] * 50_000
    path = _write(tmp_path, "d.parquet", {"src": ids, "dst": ["c"] * 100_000})
    chunks = list(parse_edge_chunks(path))
    assert all(c.names is not None and c.src.dtype == np.int64 for c in chunks)
    assert read_edge_list(path).n_edges == 2


# --- L2, L3: odd ids are drawn and embedded as they are --------------------------------------------------------

ODD = [r"$\foo$", "<!--<script>", "a</script>b&c", "$x$y$"]


@pytest.fixture(scope="module")
def odd_run():
    """A finished SNEST-like run whose largest |time| nodes (the ones labelled) have the odd ids."""
    from scalemb.embedding import EmbeddingResult

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(20, 3))
    emb[:len(ODD), 2] = 10.0 + np.arange(len(ODD))
    return EmbeddingResult(emb, np.array(ODD + [f"n{k}" for k in range(16)]), 1.0, np.ones(3), "snest", 2, 1, 2, 0)


def test_plot_draws_ids_with_dollars_and_backslashes_as_text(odd_run):
    from scalemb.plot.figure import plot_png, plot_embedding

    fig = plot_embedding(odd_run, labels=len(ODD), affinity=None)
    drawn = {t.get_text() for t in fig.axes[0].texts}
    assert set(ODD) <= drawn
    assert plot_png(odd_run, labels=len(ODD), affinity=None).startswith(b"\x89PNG")


def test_map_page_escapes_script_embedded_json(odd_run):
    from scalemb.report.mappage import build_map_page

    page = build_map_page(odd_run, affinity=None)
    data = re.search(r'<script id=map-data type="application/json">(.*?)</script>', page, re.S).group(1)
    assert not set("<>&") & set(data) and "\u2028" not in data
    payload = json.loads(data)
    assert set(ODD) <= _strings(payload)
    # the page's three script elements (vendored library, map.js, data) and no more: no id ends one early
    assert page.count("</script>") == 3 and page.count("<!--") == 0


def _strings(value):
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*map(_strings, value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*map(_strings, value)) if value else set()
    return set()


# --- L4: settings out of float64's reach are refused where settings are checked ------------------------------

@pytest.mark.parametrize("argv, fragment", [
    (["--model", "cosne", "--model-param", "gamma=1e-200"], "cosne: gamma must be in [1e-06, 1e+06], got 1e-200"),
    (["--model", "cosne", "--model-param", "gamma=1e300"], "cosne: gamma must be in [1e-06, 1e+06], got 1e+300"),
    (["--repulsion", "fft", "--fft-box-width", "1e-300"],
     "--fft-box-width: must be a number >= 0.001 and <= 1000, got 1e-300"),
    (["--repulsion", "fft", "--fft-box-width", "nan"],
     "--fft-box-width: must be a number >= 0.001 and <= 1000, got nan"),
])
def test_out_of_range_settings_are_one_line_errors(tmp_path, argv, fragment):
    proc = run_cli("embed", "school", "--out", tmp_path / "r.zarr", "--iterations", "2", "--quiet", *argv)
    assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "r.zarr").exists()


def test_out_of_range_settings_are_refused_by_the_api_and_the_service_schema():
    from pydantic import ValidationError

    from scalemb.models import get_model
    from scalemb.repulsion.spec import FFTParams
    from scalemb.service.requests import JobRequest

    for gamma in (1e-200, 1e300, 1e-7, 2e6):
        with pytest.raises(ValueError, match="gamma must be in"):
            get_model("cosne", gamma=gamma)
        with pytest.raises(ValidationError, match="gamma must be in"):
            JobRequest(input="school", model="cosne", model_params={"gamma": gamma})
    for width in (1e-300, 1e300, 0.0, float("nan")):
        with pytest.raises(ValueError, match=r"box_width must be in \[0.001, 1000\]"):
            FFTParams(box_width=width)
    assert get_model("cosne", gamma=1e-6).params["gamma"] == 1e-6 and FFTParams(box_width=0.001).box_width == 0.001
