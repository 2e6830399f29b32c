"""Outputs other tools read: xarray opens a result group, AnnData conversion, `scalemb export`."""
import anndata
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import scalemb
from scalemb.cli.main import main
from scalemb.io import to_anndata


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs") / "run.zarr"
    result = scalemb.embed("school", out=out, model="snest", iterations=20)
    return out, result


def test_xarray_opens_the_result_group(run):
    out, result = run
    ds = xr.open_zarr(out, consolidated=False)
    assert ds["embedding"].dims == ("node", "component")
    assert ds["node_ids"].dims == ("node",) and ds["kl_history"].dims == ("iteration",)
    assert np.array_equal(ds["embedding"].values, result.embedding)
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
        assert np.array_equal(frame["node_id"].to_numpy(), result.node_ids)
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
