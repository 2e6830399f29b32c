"""Object storage for inputs, stores and outputs (issue 33, item 3; ``scalemb.io.storage``), against a real
S3-compatible server: moto's server mode in a process of its own (the ``s3`` fixture, ``tests/s3_server.py``),
reached over HTTP through s3fs/botocore with the standard AWS variables -- never the in-process ``mock_aws``.

Covered: ``embed`` from an S3 edge list to an S3 result (identical to the local run) and through an S3 affinity
store written by ``scalemb affinity``; the service with ``--storage`` (inputs read from it, results published to
it, downloads read from it, deleted with the job); one clear error naming the URL for a malformed URL, a missing
bucket or object, missing credentials, an existing or foreign output; an interrupted publish (a real SIGKILL at
random instants) leaves the old result, no result, or the complete new one -- never a readable mix -- and the
recovery rule finishes or removes it, deleting nothing scalemb did not write."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import scalemb
from scalemb.io import storage
from scalemb.io.coauthor_generator import write_coauthor_edge_list
from scalemb.store.results import read_result

from .cli_runner import run_cli

EMBED = ("--model", "tsne", "--iterations", "25", "--seed", "3", "--quiet")


@pytest.fixture
def edges(tmp_path):
    path = tmp_path / "authors.txt"
    write_coauthor_edge_list(path, 120, seed=4)
    return path


def _same(a, b):
    (x, xa), (y, ya) = read_result(a), read_result(b)
    return all(np.array_equal(x[k], y[k]) for k in x) and xa["content_hash"] == ya["content_hash"]


@pytest.mark.slow
def test_embed_from_s3_edge_list_to_s3_result_is_the_local_run(s3, edges, tmp_path):
    fs = s3.filesystem()
    fs.put_file(str(edges), f"{s3.bucket[5:]}/data/authors.txt")
    local = tmp_path / "local.zarr"
    assert run_cli("embed", edges, "--out", local, *EMBED).returncode == 0
    url = f"{s3.bucket}/runs/authors.zarr"
    done = run_cli("embed", f"{s3.bucket}/data/authors.txt", "--out", url, *EMBED)
    assert done.returncode == 0, done.stderr
    assert f"wrote {url}" in done.stdout
    assert fs.exists(f"{url[5:]}/zarr.json") and not fs.exists(f"{url[5:]}/.scalemb.lock")
    assert _same(url, local)
    exported = run_cli("export", url, "--format", "npy", "--out", tmp_path / "map.npy")
    assert exported.returncode == 0, exported.stderr
    assert np.array_equal(np.load(tmp_path / "map.npy"), read_result(local)[0]["embedding"])
    # no temporary prefix left beside it, nothing but the group under it
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3.bucket[5:]}/runs")) == ["authors.zarr"]
    # an affinity store written to S3, embedded from S3: the same map
    store = f"{s3.bucket}/stores/authors.zarr"
    assert run_cli("affinity", f"{s3.bucket}/data/authors.txt", "--out", store, "--quiet").returncode == 0
    again = run_cli("embed", store, "--out", f"{s3.bucket}/runs/from-store.zarr", *EMBED)
    assert again.returncode == 0, again.stderr
    assert np.array_equal(read_result(f"{s3.bucket}/runs/from-store.zarr")[0]["embedding"],
                          read_result(local)[0]["embedding"])
    # Python API: the same URLs
    result = scalemb.embed(f"{s3.bucket}/data/authors.txt", model="tsne", iterations=25, seed=3, n_threads=2)
    assert np.array_equal(result.embedding, read_result(local)[0]["embedding"])


@pytest.mark.slow
def test_existing_and_foreign_outputs_are_refused_and_kept(s3, edges):
    fs = s3.filesystem()
    bucket = s3.bucket[5:]
    fs.put_file(str(edges), f"{bucket}/authors.txt")
    url = f"{s3.bucket}/out.zarr"
    assert run_cli("embed", f"{s3.bucket}/authors.txt", "--out", url, *EMBED).returncode == 0
    first = fs.cat_file(f"{bucket}/out.zarr/zarr.json")
    again = run_cli("embed", f"{s3.bucket}/authors.txt", "--out", url, *EMBED)
    assert again.returncode == 2 and again.stderr.strip() == f"scalemb: error: {url}: already exists (pass " \
        "overwrite=True / --overwrite to replace it)"
    replaced = run_cli("embed", f"{s3.bucket}/authors.txt", "--out", url, *EMBED[:-2], "7", "--quiet", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert fs.cat_file(f"{bucket}/out.zarr/zarr.json") != first
    assert read_result(url)[1]["seed"] == 7
    # objects scalemb did not write: never replaced, never deleted
    fs.pipe_file(f"{bucket}/theirs.zarr/zarr.json", b'{"zarr_format": 3, "node_type": "group"}')
    fs.pipe_file(f"{bucket}/theirs.zarr/data", b"precious")
    refused = run_cli("embed", f"{s3.bucket}/authors.txt", "--out", f"{s3.bucket}/theirs.zarr", *EMBED,
                      "--overwrite")
    assert refused.returncode == 2 and "was not written by scalemb" in refused.stderr
    assert fs.cat_file(f"{bucket}/theirs.zarr/data") == b"precious"
    with pytest.raises(scalemb.errors.ScalembError, match="was not written by scalemb"):
        storage.remove_output(f"{s3.bucket}/theirs.zarr")
    assert storage.remove_output(url) and not fs.find(f"{bucket}/out.zarr")


@pytest.mark.slow
def test_bad_urls_missing_buckets_objects_and_credentials_are_one_line(s3, edges, monkeypatch, tmp_path):
    fs = s3.filesystem()
    fs.put_file(str(edges), f"{s3.bucket[5:]}/authors.txt")
    cases = {
        "s3://Bad_Bucket/x.txt": "not a valid S3 URL",
        "s3:///x.txt": "not a valid S3 URL",
        "s3://no-such-bucket-scalemb/x.txt": "no such bucket 'no-such-bucket-scalemb'",
        f"{s3.bucket}/missing.txt": "no such object",
    }
    for url, reason in cases.items():
        done = run_cli("embed", url, "--out", tmp_path / "o.zarr", *EMBED)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"scalemb: error: {url}: "), \
            done.stderr
        assert reason in lines[0]
    out = run_cli("embed", f"{s3.bucket}/authors.txt", "--out", "s3://no-such-bucket-scalemb/o.zarr", *EMBED)
    assert out.returncode == 2 and out.stderr.strip() == ("scalemb: error: s3://no-such-bucket-scalemb/o.zarr: "
                                                          "no such bucket 'no-such-bucket-scalemb'")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    url = f"{s3.bucket}/authors.txt"
    done = run_cli("embed", url, "--out", tmp_path / "o.zarr", *EMBED)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"scalemb: error: {url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) "
        "in the environment")
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.slow
def test_unreachable_endpoint_is_one_line(s3, monkeypatch, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    url = f"{s3.bucket}/authors.txt"
    done = run_cli("embed", url, "--out", tmp_path / "o.zarr", *EMBED)
    assert done.returncode == 2 and done.stderr.startswith(f"scalemb: error: {url}: cannot reach the object store "
                                                           f"at http://127.0.0.1:{port}")


@pytest.mark.slow
def test_a_changed_object_is_a_new_copy_and_the_cache_is_reused(s3, edges):
    fs = s3.filesystem()
    key = f"{s3.bucket[5:]}/authors.txt"
    fs.put_file(str(edges), key)
    url = f"{s3.bucket}/authors.txt"
    first = storage.local_input(url)
    assert storage.local_input(url) == first and open(first, "rb").read() == edges.read_bytes()
    fs.pipe_file(key, b"1 2\n2 3\n")
    second = storage.local_input(url)
    assert second != first and open(second, "rb").read() == b"1 2\n2 3\n"


_PUBLISHER = """
import sys, numpy as np
from scalemb.store.results import write_result
from scalemb.io.storage import publish
local, url, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
arrays = {"embedding": rng.normal(size=(4000, 2)), "node_ids": np.arange(4000), "kl_history": rng.random(50)}
import zarr
write_result(local, arrays, {"scalemb_version": "test", "seed": seed}, overwrite=True)
g = zarr.open_group(local, mode="a")
g.create_array("many", data=rng.random(30000), chunks=(200,))  # 150 objects: a publish long enough to cut off
print("publishing", flush=True)
publish(local, url, overwrite=True)
print("published", flush=True)
"""


@pytest.mark.slow
def test_a_publish_killed_at_any_instant_never_shows_a_mix(s3, tmp_path, monkeypatch):
    """SIGKILL a process publishing a 150-object group over an older result at random instants: the URL shows
    the old result, or nothing, or the new one complete -- and after ``recover`` the old or the new one, with no
    temporary left; an object beside it that scalemb did not write is untouched."""
    fs = s3.filesystem()
    bucket = s3.bucket[5:]
    url = f"{s3.bucket}/result.zarr"
    fs.pipe_file(f"{bucket}/notes.txt", b"not scalemb's")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    # the older result: the same script, run to the end in this process (nothing is killed there)
    with monkeypatch.context() as patch:
        patch.setattr(sys, "argv", ["-c", str(tmp_path / "old.zarr"), url, "1"])
        exec(compile(_PUBLISHER, "<publisher>", "exec"), {"__name__": "__main__"})
    old = read_result(url)[0]["embedding"]
    outcomes = set()
    # (phase, delay): killed while uploading the temporary, or once the publishing marker is there (old group
    # unpublished, objects being copied, root last)
    for k, (phase, delay) in enumerate((("upload", 0.5), ("copy", 0.0), ("copy", 1.0), ("copy", 3.0))):
        proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, str(tmp_path / f"new{k}.zarr"), url, str(10 + k)],
                                env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "publishing"
        deadline = time.monotonic() + 120
        while phase == "copy" and not fs.exists(f"{bucket}/result.zarr/{storage.PUBLISHING}"):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        new = np.random.default_rng(10 + k).normal(size=(4000, 2))
        try:  # before recovery: never a mix (the root zarr.json is copied last)
            seen = read_result(url)[0]["embedding"]
            assert np.array_equal(seen, old) or np.array_equal(seen, new)
        except scalemb.errors.ScalembError:
            pass
        storage.recover(url)
        leftovers = [p for p in fs.ls(bucket) if ".result.zarr.tmp-" in p]
        assert leftovers == [], leftovers
        assert fs.cat_file(f"{bucket}/notes.txt") == b"not scalemb's"
        if fs.exists(f"{bucket}/result.zarr/zarr.json"):
            seen = read_result(url)[0]["embedding"]
            outcomes.add("new" if np.array_equal(seen, new) else "old")
            assert np.array_equal(seen, old) or np.array_equal(seen, new)
            old = seen
            assert not fs.exists(f"{bucket}/result.zarr/{storage.PUBLISHING}")
        else:
            outcomes.add("none")
            assert fs.find(f"{bucket}/result.zarr") == []  # an unfinished publish removed whole
    assert "none" in outcomes or "new" in outcomes  # a kill in the copy phase: recovery finished it (new)


@pytest.mark.slow
def test_recovery_finishes_a_complete_publish_and_removes_an_incomplete_one(s3, tmp_path):
    """The two states a publish can be cut off in, made by hand: the temporary complete (finished from it) or
    not (the partial objects removed); a dead writer's temporary on this host is reaped."""
    import socket

    fs = s3.filesystem()
    bucket = s3.bucket[5:]
    arrays = {"embedding": np.ones((5, 2)), "node_ids": np.arange(5), "kl_history": np.arange(3.0)}
    from scalemb.store.results import write_result

    write_result(tmp_path / "g.zarr", arrays, {"scalemb_version": "test"})
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    tmp = f"{bucket}/.r.zarr.tmp-{host}-{dead}-0123abcd"
    fs.put(str(tmp_path / "g.zarr") + "/", tmp, recursive=True)
    fs.pipe_file(f"{tmp}/{storage.TEMP_MARKER}", f"scalemb {host} {dead}\n".encode())
    fs.pipe_file(f"{bucket}/r.zarr/{storage.PUBLISHING}", json.dumps({"from": tmp}).encode())
    fs.pipe_file(f"{bucket}/r.zarr/embedding/zarr.json", fs.cat_file(f"{tmp}/embedding/zarr.json"))
    storage.recover(f"{s3.bucket}/r.zarr")
    assert np.array_equal(read_result(f"{s3.bucket}/r.zarr")[0]["embedding"], arrays["embedding"])
    assert not fs.exists(tmp) and not fs.exists(f"{bucket}/r.zarr/{storage.PUBLISHING}")
    # incomplete temporary (no root zarr.json): the partial target is removed, the temporary reaped
    tmp2 = f"{bucket}/.q.zarr.tmp-{host}-{dead}-4567abcd"
    fs.pipe_file(f"{tmp2}/{storage.TEMP_MARKER}", f"scalemb {host} {dead}\n".encode())
    fs.pipe_file(f"{tmp2}/embedding/zarr.json", b"{}")
    fs.pipe_file(f"{bucket}/q.zarr/{storage.PUBLISHING}", json.dumps({"from": tmp2}).encode())
    fs.pipe_file(f"{bucket}/q.zarr/embedding/zarr.json", b"{}")
    # a look-alike without scalemb's marker, and one of a live process: both kept
    fs.pipe_file(f"{bucket}/.q.zarr.tmp-{host}-{dead}-89abcdef/data", b"someone's")
    live = f"{bucket}/.q.zarr.tmp-{host}-{os.getpid()}-0000aaaa"
    fs.pipe_file(f"{live}/{storage.TEMP_MARKER}", f"scalemb {host} {os.getpid()}\n".encode())
    storage.recover(f"{s3.bucket}/q.zarr")
    assert fs.find(f"{bucket}/q.zarr") == [] and not fs.find(tmp2)
    assert fs.cat_file(f"{bucket}/.q.zarr.tmp-{host}-{dead}-89abcdef/data") == b"someone's"
    assert fs.find(live)


@pytest.mark.slow
def test_an_interrupted_run_publishes_nothing(s3, edges, tmp_path):
    """SIGINT during an embed to an S3 output: exit 130 (the CLI's interrupted status), nothing under the URL."""
    fs = s3.filesystem()
    fs.put_file(str(edges), f"{s3.bucket[5:]}/authors.txt")
    url = f"{s3.bucket}/stopped.zarr"
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-m", "scalemb", "embed", f"{s3.bucket}/authors.txt", "--out", url,
                             "--model", "tsne", "--iterations", "100000", "--tol", "0", "--checkpoint-every", "5"],
                            env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []  # SIGINT once the optimisation has logged an iteration (checkpoints every 5): during the run
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        lines.append(proc.stderr.readline())
        if " iteration " in lines[-1] or not lines[-1]:
            break
    assert proc.poll() is None, "".join(lines)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = "".join(lines) + err
    assert proc.returncode in (75, 130), err
    assert f"nothing published at {url}" in err
    assert fs.find(f"{s3.bucket[5:]}/stopped.zarr") == []
    assert [p for p in fs.ls(s3.bucket[5:]) if "stopped" in p] == []


@pytest.mark.slow
def test_service_reads_inputs_from_and_publishes_results_to_its_storage(s3, edges, tmp_path):
    """``scalemb serve --storage s3://BUCKET/svc``: an input URL under the prefix is snapshot and embedded; the
    result is published at ``svc/jobs/<id>/run.zarr`` (the local group removed) and downloads, metrics and a
    transform job read it from there; an input outside the prefix, a missing object: one line naming the URL;
    deleting the job deletes its published result."""
    from .test_service import Service

    fs = s3.filesystem()
    bucket = s3.bucket[5:]
    fs.put_file(str(edges), f"{bucket}/svc/data/authors.txt")
    fs.put_file(str(edges), f"{bucket}/elsewhere/authors.txt")
    root = tmp_path / "root"
    root.mkdir()
    svc = Service(root, "--storage", f"{s3.bucket}/svc", env=s3.env())
    try:
        url = f"{s3.bucket}/svc/data/authors.txt"
        status, created = svc.json("POST", "/jobs", {"input": url, "model": "tsne", "iterations": 25, "seed": 3})
        assert status == 201, created
        record = svc.wait(created["id"], timeout=180)
        assert record["state"] == "done", record
        assert record["params"]["input"] == url
        job = created["id"]
        published = f"{bucket}/svc/jobs/{job}/run.zarr"
        assert fs.exists(f"{published}/zarr.json")
        deadline = time.monotonic() + 30  # the local group is removed just after the job is marked done
        while (root / "jobs" / job / "run.zarr").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (root / "jobs" / job / "run.zarr").exists()
        status, body, _ = svc.request("GET", f"/jobs/{job}/embedding?format=npy")
        assert status == 200
        import io

        direct = scalemb.embed(str(edges), model="tsne", iterations=25, seed=3, n_threads=2)
        assert np.array_equal(np.load(io.BytesIO(body)), direct.embedding)
        assert np.array_equal(read_result(f"s3://{published}")[0]["embedding"], direct.embedding)
        metrics = svc.wait(job, predicate=lambda r: r.get("metrics_state") in ("done", "failed"), timeout=120)
        assert metrics["metrics_state"] == "done", metrics
        # refusals: one line naming the URL
        for body, code, words in (({"input": f"{s3.bucket}/elsewhere/authors.txt"}, 403, "outside the service's "
                                   f"storage {s3.bucket}/svc"),
                                  ({"input": f"{s3.bucket}/svc/data/missing.txt"}, 404,
                                   f"{s3.bucket}/svc/data/missing.txt: no such object")):
            status, answer = svc.json("POST", "/jobs", {**body, "iterations": 5})
            assert status == code and words in answer["detail"], answer
        # a job deleted: its published result too; nothing else under the prefix touched
        assert svc.request("DELETE", f"/jobs/{job}")[0] == 200
        assert fs.find(published) == []
        assert fs.exists(f"{bucket}/svc/data/authors.txt")
    finally:
        svc.stop()
    # a service whose storage cannot be used does not start: one line naming it
    done = subprocess.run([sys.executable, "-m", "scalemb", "serve", "--data-root", str(root), "--storage",
                           "s3://no-such-bucket-scalemb/svc", "--insecure-no-auth"], env=dict(os.environ, **s3.env()),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == ("scalemb: error: s3://no-such-bucket-scalemb/svc: no such "
                                                            "bucket 'no-such-bucket-scalemb'")
