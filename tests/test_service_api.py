"""The service's API as a client sees it (issue 33, item 1): the OpenAPI schema, the offline documentation pages,
list filters, DELETE and retention, job logs, downloads (one writer with ``scalemb export``), uploads, and the
metrics phase in the status; against a real ``scalemb serve`` (uvicorn subprocess, SQLite file, Zarr stores)."""
import io
import sqlite3
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from scalemb.store.results import read_result
from scalemb.service import ServiceConfig, create_app
from scalemb.service.database import MIGRATIONS, VERSION, Database, file_system_type

from .cli_runner import run_cli
from .test_service import Service


def _iso(text: str) -> datetime:
    assert text.endswith("Z"), text  # UTC
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- the schema (no server needed) -------------------------------------------------------------------------------

def test_openapi_types_every_route_declares_bearer_auth_and_the_real_422(tmp_path):
    spec = create_app(ServiceConfig(data_root=tmp_path, token="x")).openapi()
    assert spec["components"]["securitySchemes"] == {"HTTPBearer": {
        "type": "http", "scheme": "bearer", "description": "the service's token ($SCALEMB_TOKEN or --token-file)"}}
    schemas = spec["components"]["schemas"]
    assert schemas["Error"]["properties"] == {"detail": {"type": "string", "title": "Detail",
                                                         "description": "what went wrong, one line"}}
    assert "HTTPValidationError" not in schemas  # FastAPI's list-shaped 422 is not what the service answers
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            ok = operation["responses"][next(c for c in operation["responses"] if c.startswith("2"))]
            assert ok.get("content"), where
            for content in ok["content"].values():
                if "json" in next(iter(ok["content"])):
                    assert content["schema"].get("$ref") or content["schema"].get("anyOf"), where  # typed, not {}
            if path == "/health":
                assert "security" not in operation
                continue
            assert operation["security"] == [{"HTTPBearer": []}], where
            for code in ("401", "422"):
                assert operation["responses"][code]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"}, (where, code)
    job = schemas["Job"]["properties"]
    assert {"metrics_state", "metrics_error", "kl_history", "timing"} <= set(job)
    assert schemas["Timing"]["properties"]["created"]["format"] == "date-time"
    listing = {p["name"]: p for p in spec["paths"]["/jobs"]["get"]["parameters"]}
    assert set(listing) == {"state", "limit", "offset"}
    formats = spec["paths"]["/jobs/{job_id}/embedding"]["get"]["parameters"][1]["schema"]["enum"]
    assert formats == ["csv", "parquet", "npy", "h5ad", "zarr"]
    body = spec["paths"]["/uploads/{name}"]["put"]["requestBody"]["content"]
    assert set(body) == {"application/octet-stream", "multipart/form-data"}


# -- the database (no server needed) -----------------------------------------------------------------------------

def test_sqlite_migrates_a_first_release_file_and_refuses_a_newer_schema(tmp_path):
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
        db.execute(MIGRATIONS[1][0].format(real="REAL"))
        db.execute("INSERT INTO jobs (id, state, params, created) VALUES ('a', 'done', '{}', 1.5)")
    database = Database(None, tmp_path)
    assert database.version() == VERSION == 2
    row = database.execute("SELECT id, state, claim, metrics_state FROM jobs")[0]
    assert row == {"id": "a", "state": "done", "claim": 0, "metrics_state": None}
    database.close()
    Database(None, tmp_path).close()  # migrating again changes nothing
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
        db.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(Exception, match="schema version 99 was written by a newer scalemb"):
        Database(None, tmp_path)


def test_sqlite_uses_wal_only_on_a_local_file_system(tmp_path, monkeypatch):
    assert file_system_type(Path("/proc")) == "proc"
    database = Database(None, tmp_path)
    local = file_system_type(tmp_path)
    expected = "wal" if local in ("ext4", "xfs", "btrfs", "tmpfs", "overlay", "ext3", "zfs") else "delete"
    assert database.journal == expected
    assert database.execute("PRAGMA journal_mode")[0]["journal_mode"] == expected
    database.close()
    # the data root on NFS (as the mount table would say): the rollback journal, never WAL
    import scalemb.service.database as module

    monkeypatch.setattr(module, "file_system_type", lambda path: "nfs4")
    (tmp_path / "nfs").mkdir()
    database = Database(None, tmp_path / "nfs")
    assert database.journal == "delete" and database.execute("PRAGMA journal_mode")[0]["journal_mode"] == "delete"
    database.close()


# -- against a service ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api(tmp_path_factory):
    svc = Service(tmp_path_factory.mktemp("api-root"))
    yield svc
    svc.stop()


def _submit(svc, **body):
    status, job = svc.json("POST", "/jobs", {"input": "school", "model": "tsne", "iterations": 20, **body})
    assert status == 201, job
    return job["id"]


def _multipart(fields: list) -> tuple[bytes, str]:
    """A multipart/form-data body of ``(name, filename or None, bytes)`` parts, as ``curl -F`` sends it."""
    boundary = "----scalembtest7MA4YWxk"
    out = io.BytesIO()
    for name, filename, content in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out.write(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


@pytest.mark.slow
def test_list_filters_and_pages_with_iso_timestamps_and_job_logs(api):
    ids = [_submit(api, seed=s) for s in range(3)]
    for job_id in ids:
        assert api.wait(job_id)["state"] == "done"
    mine = [j for j in api.json("GET", "/jobs?limit=1000")[1]["jobs"] if j["id"] in ids]
    assert [j["id"] for j in mine] == ids  # oldest first
    status, page = api.json("GET", "/jobs?state=done&limit=1")
    assert status == 200 and len(page["jobs"]) == 1 and page["limit"] == 1 and page["offset"] == 0
    done_total = page["total"]
    assert done_total >= 3 and all(j["state"] == "done" for j in page["jobs"])
    seen = [api.json("GET", f"/jobs?state=done&limit=1&offset={k}")[1]["jobs"][0]["id"] for k in range(done_total)]
    assert len(set(seen)) == done_total and set(ids) <= set(seen)
    assert api.json("GET", f"/jobs?state=done&offset={done_total}")[1]["jobs"] == []
    assert api.json("GET", "/jobs?state=failed")[1] == {"jobs": [], "total": 0, "limit": 100, "offset": 0}
    for query, fragment in (("state=finished", "query.state: Input should be 'queued'"),
                            ("limit=0", "query.limit: Input should be greater than or equal to 1"),
                            ("limit=1001", "query.limit: Input should be less than or equal to 1000"),
                            ("offset=-1", "query.offset: Input should be greater than or equal to 0")):
        status, err = api.json("GET", f"/jobs?{query}")
        assert status == 422 and set(err) == {"detail"} and err["detail"].startswith(fragment), (query, err)
    record = api.json("GET", f"/jobs/{ids[0]}")[1]
    created, started, finished = (_iso(record["timing"][k]) for k in ("created", "started", "finished"))
    assert created <= started <= finished <= datetime.now(timezone.utc)
    assert record["timing"]["elapsed_s"] == pytest.approx((finished - started).total_seconds(), abs=2e-3)
    # the log: every phase, in order, with ISO times
    api.wait(ids[0], predicate=lambda r: r["metrics_state"] == "done")
    status, log = api.json("GET", f"/jobs/{ids[0]}/log")
    lines = [entry["line"] for entry in log["lines"]]
    assert status == 200 and lines[0] == "queued (embed job)" and lines[1].startswith("claimed by ")
    assert lines[2:] == ["done", "metrics: computing", "metrics: done"], lines
    assert all(_iso(e["time"]) for e in log["lines"])
    assert api.json("GET", "/jobs/nope/log")[0] == 404


@pytest.mark.slow
def test_downloads_are_the_cli_exports_in_every_format(api, tmp_path):
    import anndata
    import pandas as pd
    import zarr

    job_id = _submit(api, model="snest", seed=4)
    assert api.wait(job_id)["state"] == "done"
    run = api.root / "jobs" / job_id / "run.zarr"
    arrays, attrs = read_result(run)
    for fmt, suffix in (("csv", ".csv"), ("parquet", ".parquet"), ("npy", ".npy"), ("h5ad", ".h5ad"),
                        ("zarr", ".zarr.zip")):
        status, content, headers = api.request("GET", f"/jobs/{job_id}/embedding?format={fmt}")
        assert status == 200, content
        assert headers["content-disposition"] == f'attachment; filename="{job_id}{suffix}"'
        served = tmp_path / f"served{suffix}"
        served.write_bytes(content)
        exported = tmp_path / f"cli{suffix}"
        done = run_cli("export", run, "--format", fmt, "--out", exported)
        assert done.returncode == 0, done.stderr
        if fmt in ("csv", "npy", "parquet"):
            assert content == exported.read_bytes(), fmt  # one writer: the same bytes
        if fmt == "csv":
            assert content.decode().splitlines()[0] == "node_id,s1,s2,t1"  # the CLI's header
            table = np.loadtxt(io.StringIO(content.decode()), delimiter=",", skiprows=1)
            assert np.array_equal(table[:, 1:], arrays["embedding"]) and np.array_equal(table[:, 0],
                                                                                         arrays["node_ids"])
        elif fmt == "parquet":
            frame = pd.read_parquet(served)
            assert list(frame.columns) == ["node_id", "s1", "s2", "t1"]
            assert np.array_equal(frame[["s1", "s2", "t1"]].to_numpy(), arrays["embedding"])
        elif fmt == "npy":
            assert np.array_equal(np.load(served), arrays["embedding"])
        elif fmt == "h5ad":
            for path in (served, exported):
                adata = anndata.read_h5ad(path)
                assert np.array_equal(adata.obsm["X_scalemb"], arrays["embedding"])
                assert list(adata.obs_names) == [str(v) for v in arrays["node_ids"]]
        else:
            for path in (served, exported):
                assert zipfile.is_zipfile(path)
                store = zarr.storage.ZipStore(str(path), mode="r")
                group = zarr.open_group(store=store, mode="r")
                for name in ("embedding", "node_ids", "kl_history"):
                    assert np.array_equal(group[name][:], arrays[name]), name
                assert dict(group.attrs)["content_hash"] == attrs["content_hash"]
                store.close()
    status, err = api.json("GET", f"/jobs/{job_id}/embedding?format=xlsx")
    assert status == 422 and err["detail"].startswith("query.format: Input should be 'csv'")


@pytest.mark.slow
def test_uploads_raw_or_multipart_and_empty_or_mismatched_bodies_are_refused(api):
    edges = b"# t\n10 20\n20 30\n30 10\n30 40\n"
    status, raw = api.json("PUT", "/uploads/raw.txt", raw=edges)
    assert status == 201 and raw["bytes"] == len(edges)
    body, content_type = _multipart([("file", "edges.txt", edges)])
    status, form = api.json("PUT", "/uploads/form.txt", raw=body, headers={"Content-Type": content_type})
    assert status == 201 and form == {"input": "uploads/form.txt", "bytes": len(edges), "sha256": raw["sha256"]}
    assert (api.root / "uploads" / "form.txt").read_bytes() == edges  # the file, not the form around it
    status, job = api.json("POST", "/jobs", {"input": "uploads/form.txt", "model": "tsne", "iterations": 20})
    assert status == 201 and api.wait(job["id"])["state"] == "done"
    # a text field beside the file is fine; the file part may be named 'file' without a filename
    body, content_type = _multipart([("note", None, b"hello"), ("file", None, edges)])
    assert api.json("PUT", "/uploads/form2.txt", raw=body, headers={"Content-Type": content_type})[0] == 201
    before = sorted(p.name for p in (api.root / "uploads").iterdir())
    gz_form, gz_type = _multipart([("file", "x.gz", edges)])
    for name, raw_body, headers, fragment in (
            ("empty.txt", b"", {}, "the body is empty"),
            ("empty2.txt", *_multipart([("file", "e.txt", b"")]), "the body is empty"),
            ("two.txt", *_multipart([("a", "a.txt", edges), ("b", "b.txt", edges)]), "one file part"),
            ("none.txt", *_multipart([("note", None, b"x")]), "got 0"),
            ("cut.txt", body[:-20], {"Content-Type": content_type}, "before its closing boundary"),
            ("noboundary.txt", body, {"Content-Type": "multipart/form-data"}, "without a boundary"),
            ("edges.gz", edges, {}, "not gzip"),
            ("x.gz", gz_form, {"Content-Type": gz_type}, "not gzip"),
            ("feats.npy", b"1,2,3\n", {}, "not a NumPy .npy file"),
            ("raw-form.txt", body, {"Content-Type": "application/octet-stream"}, "multipart form sent without")):
        if isinstance(headers, str):  # a (body, content type) pair from _multipart
            raw_body, headers = raw_body, {"Content-Type": headers}
        status, err = api.json("PUT", f"/uploads/{name}", raw=raw_body, headers=headers)
        assert status == 400 and err["detail"].startswith(f"uploads/{name}: ") and fragment in err["detail"], (
            name, status, err)
    assert sorted(p.name for p in (api.root / "uploads").iterdir()) == before  # nothing stored, no temporaries


@pytest.mark.slow
def test_a_transform_jobs_failed_metrics_phase_is_in_its_status_and_log(api):
    assert api.json("PUT", "/uploads/map.txt", raw=b"10 20\n20 30\n30 10\n30 40\n")[0] == 201
    source = _submit(api, input="uploads/map.txt")
    assert api.wait(source)["state"] == "done"
    assert api.json("PUT", "/uploads/new.txt", raw=b"50 10\n60 50\n")[0] == 201
    status, placed = api.json("POST", f"/jobs/{source}/transform", {"new": "uploads/new.txt", "iterations": 20})
    assert status == 201
    record = api.wait(placed["id"], predicate=lambda r: r["metrics_state"] in ("done", "failed"), timeout=120)
    assert record["state"] == "done" and record["kind"] == "transform"
    # the metrics of a placed map need the combined graph, which the run does not name: the phase fails, visibly
    assert record["metrics_state"] == "failed" and record["metrics"] is None
    assert "input cannot be found from its provenance" in record["metrics_error"]
    assert str(api.root) not in record["metrics_error"]
    lines = [e["line"] for e in api.json("GET", f"/jobs/{placed['id']}/log")[1]["lines"]]
    assert any(line.startswith("warning: job ") and "no metrics" in line for line in lines), lines
    listed = {j["id"]: j for j in api.json("GET", "/jobs?state=done&limit=1000")[1]["jobs"]}
    assert listed[placed["id"]]["metrics_state"] == "failed"


@pytest.mark.slow
def test_delete_purges_a_finished_job_and_keeps_what_another_job_reads(tmp_path):
    svc = Service(tmp_path, "--max-running", "1")
    try:
        edges = b"1 2\n2 3\n3 1\n3 4\n"
        for name in ("a.txt", "b.txt"):  # two uploads, one content: one snapshot
            assert svc.json("PUT", f"/uploads/{name}", raw=edges)[0] == 201
        first = _submit(svc, input="uploads/a.txt")
        second = _submit(svc, input="uploads/b.txt")
        for job_id in (first, second):
            svc.wait(job_id, predicate=lambda r: r["metrics_state"] == "done")
        snapshots = list((tmp_path / "snapshots").iterdir())
        assert len(snapshots) == 1
        status, gone = svc.json("DELETE", f"/jobs/{first}")
        assert status == 200 and gone == {"id": first, "deleted": True}
        assert not (tmp_path / "jobs" / first).exists() and svc.json("GET", f"/jobs/{first}")[0] == 404
        assert svc.json("GET", f"/jobs/{first}/log")[0] == 404
        assert snapshots[0].exists()  # the second job still names it
        with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM job_log WHERE job_id = ?", (first,)).fetchone()[0] == 0
        # a done job read by a queued transform job is kept until that job ends
        long = _submit(svc, input="grqc", optimizer="dbd", iterations=100000)
        svc.wait(long, until=("running",))
        assert svc.json("PUT", "/uploads/new.txt", raw=b"9 1\n")[0] == 201
        status, placed = svc.json("POST", f"/jobs/{second}/transform", {"new": "uploads/new.txt", "iterations": 5})
        assert status == 201
        status, err = svc.json("DELETE", f"/jobs/{second}")
        assert status == 409 and f"is read by job {placed['id']}" in err["detail"]
        assert svc.json("DELETE", f"/jobs/{long}")[1]["state"] == "cancelling"
        assert svc.wait(long, timeout=60)["state"] == "cancelled"
        assert svc.wait(placed["id"])["state"] == "done"
        assert svc.json("DELETE", f"/jobs/{long}")[1] == {"id": long, "deleted": True}  # a cancelled job too
        assert svc.json("DELETE", f"/jobs/{placed['id']}")[0] == 200
        assert svc.json("DELETE", f"/jobs/{second}")[0] == 200
        assert not any((tmp_path / "snapshots").iterdir())  # nobody reads it now
        assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == []
        assert svc.json("GET", "/jobs")[1]["total"] == 0
        assert (tmp_path / "uploads" / "a.txt").read_bytes() == edges  # the user's files are never touched
    finally:
        svc.stop()


@pytest.mark.slow
def test_retention_purges_jobs_that_finished_long_enough_ago(tmp_path):
    svc = Service(tmp_path, "--retention-hours", "0.002")  # 7.2 s
    try:
        assert svc.json("PUT", "/uploads/e.txt", raw=b"1 2\n2 3\n3 1\n")[0] == 201
        job_id = _submit(svc, input="uploads/e.txt")
        finished = _iso(svc.wait(job_id)["timing"]["finished"])
        assert (tmp_path / "jobs" / job_id / "run.zarr").exists()
        deadline = time.monotonic() + 120
        while svc.json("GET", f"/jobs/{job_id}")[0] == 200:
            assert time.monotonic() < deadline, "not purged"
            time.sleep(0.5)
        assert (datetime.now(timezone.utc) - finished).total_seconds() >= 7.2  # not before its time
        # the record goes first (it claims the purge among replicas), the files right after it
        while (tmp_path / "jobs" / job_id).exists() or any((tmp_path / "snapshots").iterdir()):
            assert time.monotonic() < deadline, "record purged, files left"
            time.sleep(0.2)
        assert (tmp_path / "uploads" / "e.txt").exists()
    finally:
        svc.stop()


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf"])
def test_retention_must_be_a_finite_positive_number_of_hours(tmp_path, bad, monkeypatch):
    # the command line refuses the value before anything runs: checked in this process (no interpreter start);
    # without a token a service that wrongly got past it stops at once (status 2, another message), never serves
    monkeypatch.delenv("SCALEMB_TOKEN", raising=False)
    proc = run_cli("serve", "--data-root", tmp_path, "--retention-hours", bad, "--port", "1")
    assert proc.returncode == 2, proc.stderr
    assert f"--retention-hours: must be in (0, 1e+300], got {bad}" in proc.stderr, proc.stderr
    assert not (tmp_path / "jobs.sqlite3").exists()


@pytest.mark.slow
def test_docs_and_redoc_render_offline_in_chromium(api, tmp_path):
    from .test_report import Browser, _until, chromium_path

    chromium_path()
    status, page, _ = api.request("GET", "/docs", auth=False)
    assert status == 200 and b"https://" not in page and b"/docs/static/swagger-ui-bundle.js" in page
    status, page, _ = api.request("GET", "/redoc", auth=False)
    assert status == 200 and b"https://" not in page and b"/docs/static/redoc.standalone.js" in page
    status, bundle, _ = api.request("GET", "/docs/static/redoc.standalone.js", auth=False)
    assert status == 200 and b"cdn.redoc.ly" not in bundle and b"/docs/static/favicon.png" in bundle
    browser = Browser(str(tmp_path / "chromium"))
    base, requested = f"http://127.0.0.1:{api.port}", set()
    try:
        browser.call("Network.enable")
        for page, ready in (("/docs", "document.querySelector('.swagger-ui .info .title') && "
                                      "document.querySelector('.swagger-ui .info .title').textContent.includes("
                                      "'scalemb') && document.querySelector('.btn.authorize') && "
                                      "document.querySelectorAll('.opblock').length >= 12"),
                            ("/redoc", "document.querySelector('h1') && document.querySelector('h1').textContent"
                                       ".includes('scalemb') && document.body.textContent.includes('HTTPBearer')")):
            browser.open(f"{base}{page}")
            _until(browser, ready)
            assert browser.errors() == [], page
            requested |= {e["params"]["request"]["url"] for e in browser.events
                          if e["method"] == "Network.requestWillBeSent"}
        # every script, style, font and the schema came from the service: nothing from the Internet
        assert f"{base}/docs/static/swagger-ui-bundle.js" in requested and f"{base}/openapi.json" in requested
        outside = [url for url in requested if not url.startswith((base, "data:", "blob:"))]
        assert outside == []
    finally:
        browser.close()


def _samples(text: str) -> dict:
    """``{'name{labels}': value}`` of a Prometheus text exposition (comments checked for HELP/TYPE pairs)."""
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            assert name.split("{")[0] in typed, line  # every sample's family is declared
            samples[name] = float(value)
    return samples


@pytest.mark.slow
def test_metrics_count_jobs_by_state_and_iterations_for_prometheus(api):
    status, body, headers = api.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    before = _samples(body.decode())
    assert set(before) >= {f'scalemb_jobs{{state="{s}"}}' for s in ("queued", "running", "done", "failed",
                                                                    "cancelled")}
    job_id = _submit(api, seed=11, iterations=30)
    assert api.wait(job_id)["state"] == "done"
    after = _samples(api.request("GET", "/metrics")[1].decode())
    assert after['scalemb_jobs{state="done"}'] == before['scalemb_jobs{state="done"}'] + 1
    assert after["scalemb_iterations_total"] >= before["scalemb_iterations_total"] + 30
    assert after["scalemb_queue_length"] == after['scalemb_jobs{state="queued"}']
    assert after["scalemb_jobs_running_here"] >= 0
    assert api.request("GET", "/metrics", auth=False)[0] == 401  # behind the token like every other route
