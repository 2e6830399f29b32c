"""Methods and affinity metrics as registered units (``scalemb.methods``): the fronts find them by name, and a unit
registered from outside the package is served by the CLI's ``embed``, ``transform`` and ``affinity`` without a
change to them."""
import numpy as np
import pytest
import zarr

from scalemb import methods
from scalemb.affinity import AffinityStore
from scalemb.affinity.knn import knn_affinity, read_features
from scalemb.embedding import EmbeddingResult
from scalemb.io.atomic import check_output_path
from scalemb.methods import AffinityMetric, Method, affinity_metric, label_metric_names, method_names, method_of
from scalemb.params import Param
from tests.cli_runner import run_cli


def test_builtin_units_are_found_by_name():
    assert method_of("tsne") is method_of("snest") and method_of("tsne").output == "objective"
    assert method_of("tsne").place is None  # scalemb.placement's optimisation
    for name, needs in (("eigenmap", "affinity"), ("kernel-eigenmap", "features")):
        method = method_of(name)
        assert method.name == name and method.output == "spectral" and method.needs == needs
        assert method.place is not None and method.params
    assert set(method_names()) >= {"eigenmap", "kernel-eigenmap"}
    # a name no method has is the runner's: its model lookup refuses an unknown model, naming the models (and a
    # stored run of a model registered in another process stays readable)
    assert method_of("umap") is method_of("tsne")
    with pytest.raises(ValueError, match="model"):
        method_of("umap").fit(None, {"model": "umap"})
    assert affinity_metric("liram").learns_from_labels and affinity_metric("liram").neighbours is not None
    assert not affinity_metric("poincare").learns_from_labels and affinity_metric("poincare").neighbours is None
    assert affinity_metric("euclidean") is None and affinity_metric(len) is None
    assert label_metric_names() == ("liram",)


def test_a_method_declares_valid_kinds_and_a_unique_name(monkeypatch):
    monkeypatch.setattr(methods, "_METHODS", dict(methods._METHODS))
    with pytest.raises(ValueError, match="output must be one of"):
        Method("x", "", output="picture", needs="affinity", fit=print, describe=str)
    with pytest.raises(ValueError, match="already called 'tsne'"):
        methods.register_method(Method("tsne", "", output="spectral", needs="features", fit=print, describe=str))
    with pytest.raises(ValueError, match="already called 'eigenmap'"):
        methods.register_method(Method("eigenmap", "", output="spectral", needs="features", fit=print,
                                       describe=str))


# A real method defined outside the package: principal components of feature rows, a linear map that places new
# rows by the same projection.
def _fit_pca(source, values, *, out=None, overwrite=False, checkpoint_every=None, front="python", quiet=True):
    values = PCA_MAP.values(values)
    if out is not None:
        check_output_path(out, overwrite, (source,))
    X = read_features(source)
    mean = X.mean(axis=0)
    _, s, vt = np.linalg.svd(X - mean, full_matrices=False)
    k = int(values["space_dims"])
    scale = s[:k] / np.sqrt(X.shape[0]) if values["whiten"] else np.ones(k)
    components = vt[:k] / scale[:, None]
    result = EmbeddingResult(np.ascontiguousarray((X - mean) @ components.T), np.arange(X.shape[0]), float("nan"),
                             np.zeros(0), "pca-map", k, 0, 0, 0, optimizer={
                                 "name": "pca-map", "mean": mean.tolist(), "components": components.tolist(),
                                 "variance": (s[:k] ** 2 / X.shape[0]).tolist()},
                             provenance={"source": str(source), "method": "features"}, repulsion={})
    if out is not None:
        result.save(out, overwrite=overwrite)
    return result


def _place_pca(result, new, *, reference=None, run_name="the stored map", n_threads=None, **_):
    from scalemb.placement import PlacementRun, new_point_ids, placed_result

    X = read_features(new)
    coords = (X - np.asarray(result.optimizer["mean"])) @ np.asarray(result.optimizer["components"]).T
    run = PlacementRun(np.ascontiguousarray(coords.T), float("nan"), np.zeros(0), 0, True, 0.0, 0,
                       {"method": "projection"})
    return placed_result(result, run, new_point_ids(result.node_ids, X.shape[0]),
                         {"transform_of": str(run_name), "method": "projection", "n_old": int(result.node_ids.size),
                          "n_new": int(X.shape[0]), "n_unattached": 0, "start_kl": float("nan")}, repulsion={})


PCA_MAP = Method("pca-map", "principal components of feature rows", output="spectral", needs="features",
                 fit=_fit_pca, place=_place_pca, params=(Param("whiten", 0, "pca-map: 1: unit variance per "
                                                               "component", (0, 1), "--whiten", type=int,
                                                               run=False),),
                 describe=lambda r: "variance " + ", ".join(f"{v:.3f}" for v in r.optimizer["variance"]))


def test_a_registered_method_is_served_by_embed_and_transform(tmp_path, monkeypatch):
    monkeypatch.setattr(methods, "_METHODS", dict(methods._METHODS))
    methods.register_method(PCA_MAP)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5)) * np.array([5.0, 2.0, 1.0, 0.5, 0.1])
    np.save(tmp_path / "X.npy", X[:50])
    np.save(tmp_path / "new.npy", X[50:])
    proc = run_cli("embed", tmp_path / "X.npy", "--model", "pca-map", "--space", "2", "--whiten", "1",
                   "--out", tmp_path / "run.zarr", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {tmp_path / 'run.zarr'}: pca-map R^2, N=50, variance ")
    stored = EmbeddingResult.load(tmp_path / "run.zarr")
    np.testing.assert_allclose(stored.embedding.std(axis=0), 1.0, rtol=1e-12)  # --whiten reached the method
    proc = run_cli("transform", tmp_path / "run.zarr", tmp_path / "new.npy", "--out", tmp_path / "placed.zarr",
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    placed = zarr.open_group(str(tmp_path / "placed.zarr"), mode="r")
    expected = (X[50:] - X[:50].mean(axis=0)) @ np.asarray(stored.optimizer["components"]).T
    np.testing.assert_allclose(placed["embedding"][50:], expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(placed["embedding"][:50], stored.embedding)
    proc = run_cli("embed", tmp_path / "X.npy", "--model", "pca-map", "--out", tmp_path / "run.zarr", "--quiet")
    assert proc.returncode == 2 and "already exists" in proc.stderr  # the method refuses, nothing replaced
    np.testing.assert_array_equal(EmbeddingResult.load(tmp_path / "run.zarr").embedding, stored.embedding)


def _scaled_affinity(X, labels=None, *, perplexity, n_neighbors, random_state=0, n_jobs=None, source=None,
                     **options):
    affinity = knn_affinity(X / X.std(axis=0), perplexity=perplexity, n_neighbors=n_neighbors,
                            random_state=random_state, n_jobs=n_jobs, source=source)
    affinity.provenance.update(metric="standardised", scales=X.std(axis=0).tolist())
    return affinity


def test_a_registered_metric_is_served_by_scalemb_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(methods, "_METRICS", dict(methods._METRICS))
    methods.register_metric(AffinityMetric("standardised", "Euclidean on unit-variance columns",
                                           learns_from_labels=False, affinity=_scaled_affinity))
    X = np.random.default_rng(1).normal(size=(80, 3)) * np.array([100.0, 1.0, 0.01])
    np.save(tmp_path / "X.npy", X)
    proc = run_cli("affinity", tmp_path / "X.npy", "--knn", "12", "--perplexity", "4", "--metric", "standardised",
                   "--out", tmp_path / "P.zarr", "--quiet")
    assert proc.returncode == 0, proc.stderr
    stored = AffinityStore(tmp_path / "P.zarr").to_affinity()
    expected = knn_affinity(X / X.std(axis=0), perplexity=4.0, n_neighbors=12, random_state=0)
    assert stored.provenance["metric"] == "standardised"
    assert abs(stored.P - expected.P).max() < 1e-15 and stored.P.nnz == expected.P.nnz
    # --labels belongs to the metrics learned from labels, named from the registry
    proc = run_cli("affinity", tmp_path / "X.npy", "--knn", "12", "--metric", "standardised", "--labels",
                   tmp_path / "X.npy", "--out", tmp_path / "Q.zarr", "--quiet")
    assert proc.returncode == 2 and "--labels is used with --metric liram (got --metric standardised)" in proc.stderr
    assert not (tmp_path / "Q.zarr").exists()
