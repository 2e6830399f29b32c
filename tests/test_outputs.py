"""Outputs other tools read: xarray opens a result group, AnnData conversion, `scalemb export`."""
import anndata
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import scalemb
from scalemb.cli.main import main
from scalemb.store import to_anndata


def _named_school(path):
    """The SCHOOL graph as an edge list with string ids (``pupil-K``) and a header row."""
    from scalemb.datasets import school_edges

    src, dst = school_edges()
    path.write_text("source,target\n" + "".join(f"pupil-{a},pupil-{b}\n" for a, b in zip(src, dst)))
    return path


@pytest.fixture(scope="module", params=["integer ids", "string ids"])
def run(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("outputs")
    data = "school" if request.param == "integer ids" else str(_named_school(tmp / "school.csv"))
    result = scalemb.embed(data, out=tmp / "run.zarr", model="snest", iterations=20)
    assert (result.node_ids.dtype.kind == "U") == (request.param == "string ids")
    return tmp / "run.zarr", result


def test_xarray_opens_the_result_group(run):
    out, result = run
    ds = xr.open_zarr(out, consolidated=False)
    assert ds["embedding"].dims == ("node_ids", "component")
    assert ds["node_ids"].dims == ("node_ids",) and ds["kl_history"].dims == ("iteration",)
    assert np.array_equal(ds["embedding"].values, result.embedding)
    assert ds["node_ids"].values.tolist() == result.node_ids.tolist()
    assert "node_ids" in ds.indexes  # the ids are the node axis' coordinate: select a node by its id
    k = len(result.node_ids) // 2
    np.testing.assert_array_equal(ds["embedding"].sel(node_ids=result.node_ids[k]).values, result.embedding[k])
    assert ds.attrs["model"] == "snest"


def test_to_anndata_from_path_and_result(run):
    out, result = run
    for source in (out, result):
        adata = to_anndata(source)
        assert list(adata.obs_names) == [str(v) for v in result.node_ids]
        assert np.array_equal(adata.obsm["X_scalemb"], result.embedding)
        assert adata.uns["scalemb"]["model"] == "snest"


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npy", "h5ad"])
def test_export_formats(run, tmp_path, fmt):
    out, result = run
    target = tmp_path / f"e.{fmt}"
    assert main(["export", str(out), "--format", fmt, "--out", str(target)]) == 0
    if fmt == "npy":
        assert np.array_equal(np.load(target), result.embedding)
    elif fmt == "h5ad":
        assert np.array_equal(anndata.read_h5ad(target).obsm["X_scalemb"], result.embedding)
    else:
        frame = pd.read_csv(target, float_precision="round_trip") if fmt == "csv" else pd.read_parquet(target)
        assert list(frame.columns) == ["node_id", "s1", "s2", "t1"]
        assert frame["node_id"].tolist() == result.node_ids.tolist()
        assert np.array_equal(frame[["s1", "s2", "t1"]].to_numpy(), result.embedding)  # %.17g round-trips
    # an existing file is kept unless --overwrite
    before = target.read_bytes()
    assert main(["export", str(out), "--format", fmt, "--out", str(target)]) == 2
    assert target.read_bytes() == before


def test_export_of_something_else_fails_cleanly(tmp_path, capsys):
    (tmp_path / "notarun").mkdir()
    assert main(["export", str(tmp_path / "notarun"), "--format", "csv", "--out", str(tmp_path / "x.csv")]) == 2
    assert "not a finished scalemb result" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notarun"]


@pytest.mark.parametrize("optimizer", ["dbd", "sd"])
def test_cli_continue_equals_one_longer_run(tmp_path, optimizer):
    out = tmp_path / "run.zarr"
    args = ["--model", "snest", "--optimizer", optimizer, "--quiet", "--tol", "0"]
    assert main(["embed", "school", "--iterations", "30", "--out", str(out), *args]) == 0
    assert main(["continue", str(out), "--iterations", "20", "--quiet"]) == 0
    longer = tmp_path / "longer.zarr"
    assert main(["embed", "school", "--iterations", "50", "--out", str(longer), *args]) == 0
    a, b = scalemb.EmbeddingResult.load(out), scalemb.EmbeddingResult.load(longer)
    assert np.array_equal(a.embedding, b.embedding) and np.array_equal(a.kl_history, b.kl_history)
    assert a.iterations == 50
    assert main(["continue", str(out), "--iterations", "5", "--quiet"]) == 0  # continuable again
    assert scalemb.EmbeddingResult.load(out).iterations == 55


def test_cli_continue_refuses_what_is_not_a_finished_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["continue", str(tmp_path / "empty"), "--iterations", "5"]) == 2
    assert "not a" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_string_ids_through_transform_metrics_and_map(tmp_path):
    """A run on named nodes: new nodes placed by name, metrics find its affinity, the map page carries the names;
    new edges with integer ids are refused."""
    from scalemb.metrics.evaluate import evaluate_run
    from scalemb.report.mappage import build_map_page

    out = tmp_path / "run.zarr"
    result = scalemb.embed(str(_named_school(tmp_path / "school.csv")), out=out, model="snest", iterations=20)
    new = tmp_path / "new.tsv"
    new.write_text("newcomer\tpupil-3\nnewcomer\tpupil-4\n")
    placed = tmp_path / "placed.zarr"
    assert main(["transform", str(out), str(new), "--out", str(placed), "--quiet"]) == 0
    grown = scalemb.EmbeddingResult.load(placed)
    assert grown.node_ids.tolist() == result.node_ids.tolist() + ["newcomer"]
    assert "kl" in evaluate_run(out)
    page = build_map_page(out)
    assert '"id_names":["pupil-0","pupil-1"' in page
    bad = tmp_path / "bad.txt"
    bad.write_text("500 3\n")
    assert main(["transform", str(out), str(bad), "--out", str(tmp_path / "x.zarr"), "--quiet"]) == 2
    assert not (tmp_path / "x.zarr").exists()


def test_estimator_fits_a_parquet_edge_table_as_its_csv(tmp_path):
    """The estimator's fit with a path reads Parquet through the one reader: the same named graph as a CSV file
    and a Parquet table give the bit-identical embedding, rows named by the string ids."""
    import pyarrow.csv
    import pyarrow.parquet as pq

    csv = _named_school(tmp_path / "school.csv")
    pq.write_table(pyarrow.csv.read_csv(csv), tmp_path / "school.parquet")
    a = scalemb.TSNE(iterations=15).fit(str(csv))
    b = scalemb.TSNE(iterations=15).fit(tmp_path / "school.parquet")
    assert np.array_equal(a.embedding_, b.embedding_)
    assert b.node_ids_.tolist() == sorted(f"pupil-{k}" for k in range(b.embedding_.shape[0]))
