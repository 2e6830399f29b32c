"""Job state on a real PostgreSQL server (issue 33, item 2): migrations, claims that never hand a job to two
services, fenced writes, and two ``scalemb serve`` replicas on one database and one data root -- jobs run once,
a killed replica's job is taken over from its checkpoint, killed database connections are survived.  The server
is the ``postgres`` fixture (``tests/postgres_server.py``: Debian's package, a cluster of its own on loopback)."""
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import scalemb
from scalemb.embedding import EmbeddingResult
from scalemb.service.database import VERSION, Database
from scalemb.service.jobs import JobStore

from .test_service import Service


def _stores(url, tmp_path, n=2, lease=30.0):
    return [JobStore(Database(url, tmp_path), lease) for _ in range(n)]


@pytest.mark.slow
def test_replicas_starting_together_migrate_once(postgres, tmp_path):
    url = postgres.create_database()
    with ThreadPoolExecutor(6) as pool:
        databases = list(pool.map(lambda _: Database(url, tmp_path), range(6)))
    assert [db.version() for db in databases] == [VERSION] * 6
    assert postgres.sql("SELECT COUNT(*) FROM schema_version", url.rsplit("/", 1)[1]) == [(1,)]
    columns = {row[0] for row in postgres.sql("SELECT column_name FROM information_schema.columns WHERE "
                                              "table_name = 'jobs'", url.rsplit("/", 1)[1])}
    assert {"claim", "lease_until", "owner", "metrics_state"} <= columns
    kinds = dict(postgres.sql("SELECT column_name, data_type FROM information_schema.columns WHERE "
                              "table_name = 'jobs'", url.rsplit("/", 1)[1]))
    assert kinds["created"] == kinds["kl"] == "double precision"  # not REAL (4 bytes) on PostgreSQL
    for db in databases:
        db.close()


@pytest.mark.slow
def test_concurrent_claims_hand_each_job_to_exactly_one_service(postgres, tmp_path):
    url = postgres.create_database()
    a, b = _stores(url, tmp_path)
    ids = [a.add({"input": "school", "n": k}, max_queue=1000)["id"] for k in range(150)]
    claimed, lock = [], threading.Lock()

    def drain(store, owner):
        while (record := store.claim(owner)) is not None:
            with lock:
                claimed.append((record["id"], owner))

    threads = [threading.Thread(target=drain, args=(store, f"{name}{k}")) for name, store in (("a", a), ("b", b))
               for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(job for job, _ in claimed) == sorted(ids)  # every job once, none twice
    assert {owner[0] for _, owner in claimed} == {"a", "b"}  # both services took some
    rows = postgres.sql("SELECT state, claim, COUNT(*) FROM jobs GROUP BY state, claim", url.rsplit("/", 1)[1])
    assert rows == [("running", 1, 150)]
    for store in (a, b):
        store.close()


@pytest.mark.slow
def test_a_lost_claim_fences_the_old_owner(postgres, tmp_path):
    url = postgres.create_database()
    a, b = _stores(url, tmp_path, lease=1.0)
    job_id = a.add({"input": "school"}, max_queue=10)["id"]
    assert a.claim("A")["claim"] == 1
    assert b.claim("B") is None  # leased to A
    time.sleep(1.5)  # A stopped renewing: the lease ran out
    taken = b.claim("B")
    assert taken["id"] == job_id and taken["claim"] == 2
    a.update(job_id, state="done", finished=time.time())  # A's late write changes nothing
    assert job_id in a.lost
    record = b.get(job_id)
    assert record["state"] == "running" and record["owner"] == "B"
    assert a.heartbeat("A", {job_id}) == ({job_id}, set())
    b.update(job_id, state="done", finished=time.time())
    assert a.get(job_id)["state"] == "done"
    for store in (a, b):
        store.close()


def _replicas(tmp_path, url, *args):
    return [Service(tmp_path, "--database", url, "--lease-seconds", "6", *args) for _ in range(2)]


def _claims(postgres, url, job_id) -> list:
    return postgres.sql(f"SELECT line FROM job_log WHERE job_id = '{job_id}' AND line LIKE 'claimed by %' "
                        "ORDER BY seq", url.rsplit("/", 1)[1])


@pytest.mark.slow
def test_two_replicas_on_one_database_run_every_job_once(postgres, tmp_path):
    url = postgres.create_database()
    replicas = _replicas(tmp_path, url)
    try:
        seeds = list(range(16))
        with ThreadPoolExecutor(8) as pool:  # concurrent submissions, alternating replicas
            ids = list(pool.map(lambda s: replicas[s % 2].json("POST", "/jobs", {
                "input": "school", "model": "tsne", "iterations": 30, "seed": s})[1]["id"], seeds))
        records = [replicas[k % 2].wait(job_id, timeout=300) for k, job_id in enumerate(ids)]
        assert [r["state"] for r in records] == ["done"] * len(ids)
        owners = set()
        for seed, job_id in zip(seeds, ids):
            claims = _claims(postgres, url, job_id)
            assert len(claims) == 1, claims  # run once
            owners.add(claims[0][0].split()[2].rsplit(":", 1)[0])
            stored = EmbeddingResult.load(tmp_path / "jobs" / job_id / "run.zarr")
            direct = scalemb.embed("school", model="tsne", iterations=30, seed=seed, n_threads=2)
            assert np.array_equal(stored.embedding, direct.embedding)
        assert len(owners) == 2  # both replicas ran jobs
        # either replica answers for every job: the listing is the database's
        listings = [{j["id"]: j["state"] for j in svc.json("GET", "/jobs?limit=1000")[1]["jobs"]} for svc in replicas]
        assert listings[0] == listings[1] == {job_id: "done" for job_id in ids}
        # a job cancelled through the replica that does not run it stops
        _, long = replicas[0].json("POST", "/jobs", {"input": "grqc", "optimizer": "dbd", "iterations": 100000})
        replicas[0].wait(long["id"], until=("running",), predicate=lambda r: (r["iteration"] or 0) >= 1)
        for svc in replicas:
            svc.json("DELETE", f"/jobs/{long['id']}")
        assert replicas[1].wait(long["id"], timeout=60)["state"] == "cancelled"
    finally:
        for svc in replicas:
            svc.stop()


@pytest.mark.slow
def test_a_killed_replicas_job_is_taken_over_from_its_checkpoint(postgres, tmp_path):
    url = postgres.create_database()
    replicas = _replicas(tmp_path, url, "--checkpoint-every", "20")
    try:
        params = {"input": "grqc", "optimizer": "dbd", "iterations": 150, "seed": 4}
        _, job = replicas[0].json("POST", "/jobs", params)
        replicas[0].wait(job["id"], until=("running",), predicate=lambda r: (r["iteration"] or 0) >= 45, timeout=120)
        owner = postgres.sql(f"SELECT owner FROM jobs WHERE id = '{job['id']}'", url.rsplit("/", 1)[1])[0][0]
        victim = next(svc for svc in replicas if f":{svc.proc.pid}:" in owner)
        survivor = next(svc for svc in replicas if svc is not victim)
        victim.stop(signal.SIGKILL)
        record = survivor.wait(job["id"], timeout=180)
        assert record["state"] == "done", record
        assert record["resumed_from"] >= 40 and record["resumed_from"] % 20 == 0
        claims = _claims(postgres, url, job["id"])
        assert len(claims) == 2 and f":{survivor.proc.pid}:" in claims[1][0]
        stored = EmbeddingResult.load(tmp_path / "jobs" / job["id"] / "run.zarr")
        direct = scalemb.embed("grqc", optimizer="dbd", iterations=150, seed=4, n_threads=2)
        assert np.array_equal(stored.embedding, direct.embedding)
    finally:
        for svc in replicas:
            svc.stop()


@pytest.mark.slow
def test_replicas_survive_their_database_connections_being_killed(postgres, tmp_path):
    url = postgres.create_database()
    replicas = _replicas(tmp_path, url)
    try:
        ids = [replicas[s % 2].json("POST", "/jobs", {"input": "school", "model": "snest", "iterations": 150,
                                                       "seed": s})[1]["id"] for s in range(8)]
        statuses, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                for k, job_id in enumerate(ids):
                    statuses.append(replicas[k % 2].request("GET", f"/jobs/{job_id}")[0])

        poller = threading.Thread(target=poll)
        poller.start()
        killed = 0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            killed += postgres.kill_connections(url)
            states = [replicas[0].json("GET", f"/jobs/{job_id}")[1].get("state") for job_id in ids]
            if all(state in ("done", "failed", "cancelled") for state in states):
                break
            time.sleep(0.7)
        stop.set()
        poller.join()
        assert killed > 0
        assert set(statuses) <= {200, 503}, set(statuses)  # never a 500; a 503 asks to retry
        for seed, job_id in enumerate(ids):
            record = replicas[0].wait(job_id, timeout=120)
            assert record["state"] == "done", record
            stored = EmbeddingResult.load(tmp_path / "jobs" / job_id / "run.zarr")
            direct = scalemb.embed("school", model="snest", iterations=150, seed=seed, n_threads=2)
            assert np.array_equal(stored.embedding, direct.embedding)
    finally:
        for svc in replicas:
            svc.stop()


@pytest.mark.slow
def test_an_unreachable_database_is_one_line_at_start(tmp_path):
    from .test_service_hardening import serve_once

    proc = serve_once(tmp_path, "--database", "postgresql://nobody:secret@127.0.0.1:1/none")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "unreachable" in proc.stderr and "secret" not in proc.stderr
    proc = serve_once(tmp_path, "--database", "mysql://x/y")
    assert proc.returncode == 2 and "use sqlite:///PATH or postgresql://" in proc.stderr
