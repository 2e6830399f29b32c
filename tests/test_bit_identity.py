"""Results stay bit-identical across the front-half refactor (issue 31): fixed-seed runs through the CLI, the
estimator, resume / continue and the service, each hashed (embedding, node ids, KL history and the recorded
settings) and compared with hashes recorded before the change.  ``SCALEMB_PRINT_HASHES=1`` prints the hashes a
run gives (to record them after an intended change of results, never to paper over an unintended one)."""
import hashlib
import json
import os

import numpy as np
import pytest

import scalemb
from scalemb.embedding import Embedder as Runner, EmbeddingResult
from scalemb.io.checkpoint import Checkpointer, RunInterrupted

from .cli_runner import run_cli

RECORDED = {
    "cli-school-snest": "9643a1f889419bfca72a41426450f67cbb165690105a0151fb005f94c8931198",
    "cli-school-sne-dbd": "336f80f12b2288f0f3038945958eb38a722768b1cee3777d9da9a2df83a6858d",
    "cli-school-tsne-fft-gd": "db86b5be490f7bd3943eea640de9f8d16c292fc784872efdc308a7a5d5c50c1c",
    "cli-school-tsne-sd-cg": "2c24040cdd4603b5edf922bfebf5e2ab468a2631cb196d52a51fea6a9f9a5d5a",
    "cli-school-tsne-restarts": "79465313ad8e1c838250af9ff5e8203474ec2d1294427e1838fe3b6ada402a2e",
    "cli-school-ee-param": "1324643afe4b777eef738fd38db4cadb58a2c877f04378bddb71e2d2704dba22",
    "cli-features-knn": "a9e4f7fe5c8a69e27a7e6cfc9e4592c83fcfd093a58c73381d5bd5a8d5aa561f",
    "cli-grqc-tsne": "8268d4fd8e076d2dbc07b05cca423e2522bfb9e59e40d0ebee7f799bf4b5a91d",
    "cli-continue": "f8aa3b012c7ac6582301c9bc8bd77d1d3d61b64a0f69cf5d5effddeb310359f4",
    "resume": "9643a1f889419bfca72a41426450f67cbb165690105a0151fb005f94c8931198",
    "estimator-features": "3fef4eaa522c7ce2d9fb18d9577fb7abd8395dfb7ce7ba41ff4ebcaa234c96cc",
    "estimator-optimize": "5081f326d611a7a2e4d1b537b8049e333804e472a34d1736c86a1765c2892533",
    "estimator-school": "9643a1f889419bfca72a41426450f67cbb165690105a0151fb005f94c8931198",
}

CLI_RUNS = {
    "cli-school-snest": ["school", "--model", "snest", "--iterations", "60", "--seed", "3"],
    "cli-school-sne-dbd": ["school", "--model", "sne", "--optimizer", "dbd", "--iterations", "80", "--seed", "2",
                           "--max-step-norm", "5", "--exaggeration", "2", "--exaggeration-iterations", "20",
                           "--learning-rate", "10", "--kl-every", "3"],
    "cli-school-tsne-fft-gd": ["school", "--model", "tsne", "--repulsion", "fft", "--fft-points", "3",
                               "--optimizer", "gd", "--iterations", "40", "--seed", "4"],
    "cli-school-tsne-sd-cg": ["school", "--model", "tsne", "--optimizer", "sd", "--solver", "cg",
                              "--preconditioner", "jacobi", "--curvature", "fixed", "--tol", "0", "--iterations",
                              "25", "--seed", "6"],
    "cli-school-tsne-restarts": ["school", "--model", "tsne", "--space", "3", "--restarts", "2", "--iterations", "30",
                                 "--seed", "5", "--threads", "2"],
    "cli-school-ee-param": ["school", "--model", "ee", "--model-param", "lam=0.5", "--iterations", "30"],
    "cli-features-knn": ["FEATURES", "--model", "tsne", "--perplexity", "5", "--iterations", "40", "--seed", "7"],
}


def result_hash(result: EmbeddingResult) -> str:
    """SHA-256 over the embedding, node ids, KL history and the settings the result records."""
    digest = hashlib.sha256()
    for array in (result.embedding, np.asarray(result.node_ids), result.kl_history):
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    record = {"model": result.model, "space_dims": result.space_dims, "time_dims": result.time_dims,
              "iterations": result.iterations, "seed": result.seed, "restart_kls": result.restart_kls,
              "optimizer": result.optimizer, "repulsion": result.repulsion, "model_params": result.model_params}
    digest.update(json.dumps(record, sort_keys=True, default=repr).encode())
    return digest.hexdigest()


def check(name: str, result: EmbeddingResult) -> None:
    value = result_hash(result)
    if os.environ.get("SCALEMB_PRINT_HASHES"):
        print(f'HASH "{name}": "{value}",')
        return
    assert value == RECORDED[name], f"{name}: results changed"


def features(tmp_path):
    path = tmp_path / "features.npy"
    np.save(path, np.random.default_rng(0).normal(size=(60, 5)))
    return path


@pytest.mark.parametrize("name", sorted(CLI_RUNS))
def test_cli_runs_are_unchanged(name, tmp_path):
    argv = [str(features(tmp_path)) if a == "FEATURES" else a for a in CLI_RUNS[name]]
    out = tmp_path / "run.zarr"
    done = run_cli("embed", *argv, "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    check(name, EmbeddingResult.load(out))


@pytest.mark.slow
def test_cli_grqc_and_continue_are_unchanged(tmp_path):
    out = tmp_path / "grqc.zarr"
    done = run_cli("embed", "grqc", "--model", "tsne", "--iterations", "20", "--seed", "1", "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    check("cli-grqc-tsne", EmbeddingResult.load(out))
    done = run_cli("continue", out, "--iterations", "10", "--quiet")
    assert done.returncode == 0, done.stderr
    check("cli-continue", EmbeddingResult.load(out))


def test_resume_is_unchanged(tmp_path):
    """An interrupted checkpointed run resumed to its end: the uninterrupted run's result (cli-school-snest)."""
    out = tmp_path / "run.zarr"

    def stop(checkpointer, restart, iteration):
        if iteration == 20:
            checkpointer.request_stop()

    with pytest.raises(RunInterrupted):
        with Checkpointer(out, every=10, on_checkpoint=stop, handle_signals=False) as checkpointer:
            Runner(model="snest", iterations=60, seed=3).fit("school", checkpoint=checkpointer)
    done = run_cli("resume", out, "--quiet")
    assert done.returncode == 0, done.stderr
    check("resume", EmbeddingResult.load(out))
    assert os.environ.get("SCALEMB_PRINT_HASHES") or result_hash(EmbeddingResult.load(out)) == \
        RECORDED["cli-school-snest"]


def test_estimator_runs_are_unchanged(tmp_path):
    X = np.load(features(tmp_path))
    estimator = scalemb.TSNE(iterations=40, random_state=0, perplexity=10).fit(X)
    check("estimator-features", estimator.result_)
    check("estimator-optimize", estimator.optimize(20, exaggeration=1.0).result_)
    check("estimator-school", scalemb.Embedder(model="snest", iterations=60, random_state=3).fit("school").result_)


@pytest.mark.slow
def test_service_jobs_are_unchanged(service, tmp_path):
    """The service's job path gives the CLI's results: a dataset job and a feature-file job."""
    status, created = service.json("POST", "/jobs", {"input": "school", "model": "snest", "iterations": 60,
                                                     "seed": 3})
    assert status == 201, created
    assert service.wait(created["id"])["state"] == "done"
    result = EmbeddingResult.load(tmp_path / "jobs" / created["id"] / "run.zarr")
    assert result_hash(result) == RECORDED["cli-school-snest"]
    status, up = service.json("PUT", "/uploads/features.npy", raw=_features_bytes())
    assert status == 201, up
    status, created = service.json("POST", "/jobs", {"input": up["input"], "model": "tsne", "perplexity": 5,
                                                     "iterations": 40, "seed": 7})
    assert status == 201, created
    assert service.wait(created["id"])["state"] == "done"
    result = EmbeddingResult.load(tmp_path / "jobs" / created["id"] / "run.zarr")
    assert np.array_equal(result.embedding, _cli_features_embedding(tmp_path))


def _features_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(0).normal(size=(60, 5)))
    return buffer.getvalue()


def _cli_features_embedding(tmp_path):
    folder = tmp_path / "cli"
    folder.mkdir()
    argv = [str(features(folder)) if a == "FEATURES" else a for a in CLI_RUNS["cli-features-knn"]]
    done = run_cli("embed", *argv, "--out", folder / "run.zarr", "--quiet")
    assert done.returncode == 0, done.stderr
    return EmbeddingResult.load(folder / "run.zarr").embedding


def test_a_checkpoint_written_before_the_spec_resumes_identically(tmp_path):
    """A checkpoint in the layout before ``RunSpec`` (the settings as keys of the configuration, the runner's
    arguments under ``embedder``) still resumes, to the uninterrupted run's result."""
    import zarr

    from scalemb.io.checkpoint import _config_hash

    out = tmp_path / "run.zarr"

    def stop(checkpointer, restart, iteration):
        if iteration == 20:
            checkpointer.request_stop()

    with pytest.raises(RunInterrupted):
        with Checkpointer(out, every=10, on_checkpoint=stop, handle_signals=False) as checkpointer:
            Runner(model="snest", iterations=60, seed=3).fit("school", checkpoint=checkpointer)
    group = zarr.open_group(str(out), mode="r+")
    meta = dict(group.attrs["scalemb_checkpoint"])
    config = dict(meta["config"])
    spec = config.pop("spec")
    fft = {k[4:]: spec[k] for k in spec if k.startswith("fft_")}
    config.update(graph_affinity=spec["graph_affinity"], model=spec["model"], model_params=spec["model_params"],
                  space_dims=spec["space_dims"], iterations=spec["iterations"], seed=spec["random_state"],
                  restarts=spec["restarts"], n_threads=spec["n_jobs"], scheduler=None, workers=None,
                  embedder={"model": spec["model"], "space_dims": spec["space_dims"], "time_dims": spec["time_dims"],
                            "iterations": spec["iterations"], "seed": spec["random_state"],
                            "restarts": spec["restarts"], "n_threads": spec["n_jobs"], "repulsion": spec["repulsion"],
                            "fft_params": fft, "scheduler": None, "workers": None, "init": "random",
                            "model_params": spec["model_params"]})
    meta["config"] = config
    meta["config_hash"] = _config_hash(config)
    group.attrs["scalemb_checkpoint"] = meta
    done = run_cli("resume", out, "--quiet")
    assert done.returncode == 0, done.stderr
    assert os.environ.get("SCALEMB_PRINT_HASHES") or result_hash(EmbeddingResult.load(out)) == \
        RECORDED["cli-school-snest"]
