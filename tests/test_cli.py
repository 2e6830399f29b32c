"""The CLI as a user runs it: the console entry point on real arguments, real Zarr stores on disk (in this
process, see tests/cli_runner.py; the process boundary itself -- ``python -m scalemb``, exit status and stderr of
a real process -- is checked in test_missing_input_and_existing_output and by the signal tests)."""
import numpy as np
import pytest
import zarr

import scalemb
from scalemb.embedding import EmbeddingResult

from .cli_runner import message_lines, run_cli, run_cli_process


def test_embed_writes_zarr_v3_group(tmp_path):
    out = tmp_path / "run.zarr"
    proc = run_cli("embed", "school", "--model", "snest", "--space", "2", "--time", "1", "--iterations", "300",
                   "--seed", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "KL" in proc.stdout
    group = zarr.open_group(str(out), mode="r")
    assert group.metadata.zarr_format == 3
    emb, ids, hist = group["embedding"][:], group["node_ids"][:], group["kl_history"][:]
    assert emb.shape == (42, 3) and emb.dtype == np.float64
    assert ids.dtype == np.int64 and ids.shape == (42,)
    attrs = dict(group.attrs)
    for key in ("model", "space_dims", "time_dims", "iterations", "kl", "seed", "scalemb_version", "provenance"):
        assert key in attrs
    assert attrs["model"] == "snest" and attrs["space_dims"] == 2 and attrs["time_dims"] == 1
    assert attrs["seed"] == 3 and attrs["iterations"] == len(hist) - 1 == 300
    assert attrs["kl"] == pytest.approx(hist[-1])
    assert attrs["scalemb_version"] == scalemb.__version__
    assert attrs["provenance"]["dataset"] == "school"
    # the API reproduces the CLI run
    api = scalemb.embed("school", model="snest", iterations=300, seed=3)
    assert np.array_equal(api.embedding, emb)
    assert EmbeddingResult.load(out).kl == attrs["kl"]
    # logs go to stderr when not on a terminal; --quiet silences them
    assert "iteration" in proc.stderr
    quiet = run_cli("embed", "school", "--iterations", "10", "--out", str(out), "--overwrite", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_edge_list_input_keeps_node_ids(tmp_path):
    edges = tmp_path / "e.txt"
    edges.write_text("# test\n100 200\n200 300\n300 100\n300 400 2\n")
    out = tmp_path / "e.zarr"
    proc = run_cli("embed", str(edges), "--model", "tsne", "--iterations", "50", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    group = zarr.open_group(str(out), mode="r")
    assert list(group["node_ids"][:]) == [100, 200, 300, 400]
    assert group.attrs["provenance"]["source"] == str(edges)


@pytest.mark.parametrize("content,fragment", [
    ("1 2\n2 x\n", ":2: node id 'x' is a string but node id '1' on line 1 is an integer"),
    ("", "no edges"),
    ("5 5\n", "no edges once self-loops are removed"),
])
def test_bad_input_one_line_error_nothing_written(tmp_path, content, fragment):
    edges = tmp_path / "bad.txt"
    edges.write_text(content)
    out = tmp_path / "bad.zarr"
    proc = run_cli("embed", str(edges), "--out", str(out))
    assert proc.returncode == 2
    lines = message_lines(proc.stderr)  # beside the progress ("reading ..."), one line
    assert len(lines) == 1 and lines[0].startswith("scalemb: error: ") and str(edges) in lines[0]
    assert fragment in lines[0]
    assert list(tmp_path.iterdir()) == [edges]


@pytest.mark.slow
def test_missing_input_and_existing_output(tmp_path):
    proc = run_cli_process("embed", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o.zarr"))
    assert proc.returncode == 2 and "no such file" in proc.stderr
    out = tmp_path / "keep.zarr"
    out.mkdir()
    (out / "precious").write_text("x")
    proc = run_cli("embed", "school", "--iterations", "5", "--out", str(out))
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert (out / "precious").read_text() == "x"


def test_invalid_options(tmp_path):
    assert run_cli("embed", "school", "--model", "umap").returncode == 2
    assert run_cli("embed", "school", "--iterations", "0").returncode == 2
    proc = run_cli("embed", "school", "--model", "tsne", "--time", "1", "--out", str(tmp_path / "x.zarr"))
    assert proc.returncode == 2 and "no time dimensions" in proc.stderr


@pytest.mark.parametrize("flags,expected", [(["--optimizer", "sd", "--solver", "cg"], "sd"),
                                            (["--optimizer", "gd"], "gd"), ([], "sd"),
                                            (["--model", "sne"], "dbd")])
def test_optimizer_flags(tmp_path, flags, expected):
    out = tmp_path / "o.zarr"
    proc = run_cli("embed", "school", "--iterations", "30", "--quiet", "--out", str(out), *flags)
    assert proc.returncode == 0, proc.stderr
    assert zarr.open_group(str(out), mode="r").attrs["optimizer"]["optimizer"] == expected


def test_max_step_norm_and_kl_every_flags(tmp_path):
    out = tmp_path / "o.zarr"
    proc = run_cli("embed", "school", "--optimizer", "dbd", "--max-step-norm", "5", "--kl-every", "10",
                   "--iterations", "30", "--quiet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    group = zarr.open_group(str(out), mode="r")
    assert group.attrs["optimizer"]["max_step_norm"] == 5.0 and group.attrs["optimizer"]["kl_every"] == 10
    assert np.isnan(group["kl_history"][:]).sum() == 27 and "KL" in proc.stdout + proc.stderr
    proc = run_cli("embed", "school", "--optimizer", "dbd", "--max-step-norm", "0", "--out", str(tmp_path / "b"))
    assert proc.returncode == 2 and "max-step-norm" in proc.stderr and not (tmp_path / "b").exists()


def test_generate_affinity_embed_pipeline(tmp_path):
    """generate -> affinity (graph) -> embed from the store: the chain a user runs for a synthetic graph."""
    edges, store, out = tmp_path / "edges.txt.gz", tmp_path / "P.zarr", tmp_path / "run.zarr"
    proc = run_cli("generate", "coauthor", "--authors", "300", "--seed", "1", "--out", str(edges), "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("affinity", str(edges), "--out", str(store), "--graph", "--partitions", "3", "--quiet")
    assert proc.returncode == 0, proc.stderr
    from scalemb.affinity import AffinityStore
    from scalemb.affinity.graph import coauthorship_affinity
    from scalemb.io.edgelist import read_edge_list

    P = AffinityStore(store).to_affinity().P
    expected = coauthorship_affinity(read_edge_list(edges)).P
    assert abs(P - expected).max() < 1e-15 and P.nnz == expected.nnz
    proc = run_cli("embed", str(store), "--model", "tsne", "--iterations", "50", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert zarr.open_group(str(out), mode="r")["embedding"].shape == (P.shape[0], 2)
    # refusing to overwrite, for both new commands
    assert run_cli("generate", "coauthor", "--authors", "300", "--out", str(edges)).returncode != 0
    proc = run_cli("affinity", str(edges), "--out", str(store))
    assert proc.returncode != 0 and "already exists" in proc.stderr


def test_affinity_knn_from_features(tmp_path):
    rng = np.random.default_rng(0)
    features, store = tmp_path / "X.npy", tmp_path / "P.zarr"
    np.save(features, rng.normal(size=(200, 5)))
    proc = run_cli("affinity", str(features), "--out", str(store), "--knn", "30", "--perplexity", "10", "--quiet")
    assert proc.returncode == 0, proc.stderr
    from scalemb.affinity import AffinityStore

    P = AffinityStore(store).to_affinity().P
    assert P.shape == (200, 200) and abs(P.sum() - 1) < 1e-12 and abs(P - P.T).max() < 1e-15
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2\n3,nan\n")
    proc = run_cli("affinity", str(bad), "--out", str(tmp_path / "Q.zarr"), "--knn", "5")
    assert proc.returncode != 0 and "bad.csv" in proc.stderr and not (tmp_path / "Q.zarr").exists()
    assert len(proc.stderr.strip().splitlines()) == 1
    # embed reads a feature file itself (--affinity auto: a .npy is features) as scalemb.Embedder does
    X = np.load(features)[:60]
    np.save(features, X)
    out = tmp_path / "knn.zarr"
    proc = run_cli("embed", str(features), "--model", "tsne", "--iterations", "30", "--seed", "3", "--perplexity",
                   "8", "--metric", "cosine", "--threads", "2", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    here = scalemb.Embedder(model="tsne", iterations=30, random_state=3, perplexity=8.0, metric="cosine",
                            n_jobs=2).fit(X)
    assert np.array_equal(EmbeddingResult.load(out).embedding, here.embedding_)
    for args, fragment in ((("school", "--perplexity", "5"), "--perplexity: kNN settings apply"),
                           ((str(features), "--perplexity", "0"), "--perplexity: must be a number >= 1 and <= 1e6"),
                           ((str(features), "--metric", "hamming"), "--metric: must be one of"),
                           (("school", "--affinity", "knn"), "--affinity: 'knn' needs a feature matrix"),
                           ((str(bad), "--affinity", "knn"), "bad.csv")):
        proc = run_cli("embed", *args, "--iterations", "5", "--out", str(tmp_path / "no.zarr"), "--quiet")
        assert proc.returncode == 2 and fragment in proc.stderr, (args, proc.stderr)
        assert not (tmp_path / "no.zarr").exists()
