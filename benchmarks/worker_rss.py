"""Dask workers' memory over many small jobs: does a worker's RSS grow with every job?

Starts a ``dask scheduler`` and ``--workers`` single-threaded ``dask worker`` processes (no nanny, as
``benchmarks/service_prod.py`` does; their logs in ``--dir``), runs ``--jobs`` small t-SNE jobs through the
executor the service uses (``scalemb.embed(..., scheduler=address)``: a new client per job, as the service's
``Runner`` makes), ``--concurrency`` at a time, and after every ``--every`` jobs records each worker's RSS
(``psutil``, through a monitoring client's ``client.run``), Dask-managed data, task states and Python objects.
Prints the RSS curve as a table, and with ``--inspect`` the growth between two points of the run by Python
object type (``gc.get_objects``) and by allocation site (``tracemalloc``, started on the workers).

    PYTHONPATH=$PWD python benchmarks/worker_rss.py --jobs 50 --every 5
    PYTHONPATH=$PWD python benchmarks/worker_rss.py --jobs 50 --optimizer dbd --repulsion exact
"""
import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]  # distributed.py: a benchmark
from common import local_dask_cluster  # noqa: E402


def worker_state(dask_worker=None, trim=False):
    """RSS and what the worker holds (runs on a worker through ``client.run``)."""
    import ctypes
    import gc

    import psutil

    gc.collect()
    before = psutil.Process().memory_info().rss
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    state = {"rss": psutil.Process().memory_info().rss, "rss_before_trim": before,
             "data": len(dask_worker.data), "tasks": len(dask_worker.state.tasks),
             "objects": len(gc.get_objects())}
    return state


def object_counts(dask_worker=None):
    import gc
    from collections import Counter

    gc.collect()
    def name(t):
        module, qualname = getattr(t, "__module__", None), getattr(t, "__qualname__", None)
        return f"{module if isinstance(module, str) else '?'}.{qualname if isinstance(qualname, str) else t}"

    objects = gc.get_objects()
    counts = Counter(name(type(o)) for o in objects)
    import numpy as np

    counts["<bytes of ndarrays>"] = sum(o.nbytes for o in objects if isinstance(o, np.ndarray) and o.base is None)
    try:
        from numba.core.registry import CPUDispatcher

        dispatchers = [o for o in objects if isinstance(o, CPUDispatcher)]
        counts["<numba dispatchers>"] = len(dispatchers)
        counts["<numba overloads>"] = sum(len(o.overloads) for o in dispatchers)
    except ImportError:
        pass
    return dict(counts)


def mark_objects(dask_worker=None):
    """Remember the ids of the worker's gc-tracked objects now (for ``new_objects``)."""
    import gc

    gc.collect()
    dask_worker._rss_mark = gc.get_objects()  # kept alive: a new object cannot take a marked one's id
    return len(dask_worker._rss_mark)


def new_objects(dask_worker=None, per_type=4):
    """Some objects created since ``mark_objects`` and still alive, of the most grown types: their repr, their
    ``__self__`` (bound methods) and the types of what refers to them, two levels up."""
    import gc
    from collections import defaultdict

    gc.collect()
    mark = {id(o) for o in dask_worker._rss_mark}
    new = [o for o in gc.get_objects() if id(o) not in mark]
    by_type = defaultdict(list)
    for o in new:
        by_type[type(o).__name__].append(o)
    out = []
    from collections import Counter

    for name, describe in (("builtin_function_or_method", lambda o: f"{type(o.__self__).__name__}.{o.__name__}"),
                           ("ReferenceType", lambda o: type(o()).__name__)):
        kinds = Counter(describe(o) for o in by_type.get(name, []))
        out.append((name, len(by_type.get(name, [])), str(kinds.most_common(8)), None, []))
    for name, objs in sorted(by_type.items(), key=lambda kv: -len(kv[1]))[:6]:
        for o in objs[:per_type]:
            owner = getattr(o, "__self__", None)
            refs = []
            for r in gc.get_referrers(o):
                if r is new or r is objs:
                    continue
                up = [type(q).__name__ + (":" + repr(q)[:80] if not isinstance(q, (list, dict)) else "")
                      for q in gc.get_referrers(r)[:4] if q is not new and q is not objs]
                refs.append((type(r).__name__, repr(r)[:120], up))
            out.append((name, len(objs), repr(o)[:160], type(owner).__name__ if owner is not None else None,
                        refs[:4]))
    del new, by_type
    return out


def start_tracemalloc(dask_worker=None):
    import tracemalloc

    if not tracemalloc.is_tracing():
        tracemalloc.start(8)
    return True


def snapshot_top(dask_worker=None, limit=25):
    """Top allocation sites by size now, with tracebacks (kept on the worker for a diff)."""
    import gc
    import tracemalloc

    gc.collect()
    snap = tracemalloc.take_snapshot()
    previous = getattr(dask_worker, "_rss_snapshot", None)
    dask_worker._rss_snapshot = snap
    if previous is None:
        return []
    stats = snap.compare_to(previous, "traceback")
    out = []
    for s in stats[:limit]:
        out.append((s.size_diff, s.count_diff, [str(f) for f in s.traceback.format()[-12:]]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--every", type=int, default=5, help="record the workers' state every this many jobs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--input", default="school")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--optimizer", default=None)
    ap.add_argument("--repulsion", default=None)
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--inspect", action="store_true", help="object growth after the first --every")
    ap.add_argument("--tracemalloc", action="store_true", help="and allocation sites (slow: jobs take ~10x)")
    ap.add_argument("--dir", default=None, help="where the scheduler's and workers' logs go")
    ap.add_argument("--json", default=None, help="write the curve here")
    args = ap.parse_args()

    import scalemb
    from distributed import Client

    d = Path(args.dir or tempfile.mkdtemp(prefix="worker-rss-"))
    with local_dask_cluster(args.workers, d, args.memory_limit) as address, Client(address) as monitor:
        options = {k: v for k, v in (("optimizer", args.optimizer), ("repulsion", args.repulsion)) if v}
        curve = []

        def record(done):
            states = monitor.run(worker_state)
            row = {"jobs": done, **{w: s for w, s in sorted(states.items())}}
            curve.append(row)
            print(f"{done:5d} " + "  ".join(f"{s['rss'] / 2**20:7.1f} MiB ({s['data']} keys, {s['tasks']} tasks, "
                                             f"{s['objects']} obj)" for _, s in sorted(states.items())), flush=True)

        errors = []
        lock = threading.Lock()
        counter = [0]

        def job(i):
            try:
                scalemb.embed(args.input, model="tsne", iterations=args.iterations, seed=i % 5, scheduler=address,
                              **options)
            except Exception as exc:  # noqa: BLE001 - counted and shown
                errors.append(repr(exc))
            with lock:
                counter[0] += 1

        record(0)
        counts0 = None
        next_mark = args.every
        i = 0
        t0 = time.monotonic()
        while i < args.jobs:
            batch = min(args.concurrency, args.jobs - i)
            threads = [threading.Thread(target=job, args=(i + k,)) for k in range(batch)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            i += batch
            if i >= next_mark or i == args.jobs:
                next_mark += args.every
                record(i)
                if args.inspect and counts0 is None:
                    counts0 = monitor.run(object_counts)
                    monitor.run(mark_objects)
                    if args.tracemalloc:
                        monitor.run(start_tracemalloc)
                        monitor.run(snapshot_top)
        seconds = time.monotonic() - t0
        if args.inspect and counts0 is not None:
            counts1 = monitor.run(object_counts)
            for w in sorted(counts1):
                grown = sorted(((n - counts0[w].get(t, 0), t) for t, n in counts1[w].items()), reverse=True)[:20]
                print(f"\nobjects grown on {w} since job {args.every}:")
                for n, t in grown:
                    if n > 0:
                        print(f"  {n:8d} {t}")
            for w, found in sorted(monitor.run(new_objects).items()):
                print(f"\nnew objects alive on {w}:")
                for name, n, text, owner, refs in found:
                    print(f"  {name} ({n}): {text} self={owner}")
                    for ref in refs:
                        print(f"      <- {ref}")
            tops = monitor.run(snapshot_top) if args.tracemalloc else {}
            for w, top in sorted(tops.items()):
                print(f"\ntracemalloc growth on {w} since job {args.every}:")
                for size, count, tb in top[:12]:
                    print(f"  {size / 1024:9.1f} KiB {count:7d} blocks")
                    for line in tb:
                        print("      " + line)
        trimmed = monitor.run(worker_state, trim=True)
        print("\nafter malloc_trim(0): " + "  ".join(
            f"{s['rss_before_trim'] / 2**20:.1f} -> {s['rss'] / 2**20:.1f} MiB" for _, s in sorted(trimmed.items())))
        print(f"{args.jobs} jobs, {len(errors)} errors, {seconds:.0f} s")
        for err in errors[:3]:
            print(err)
        if args.json:
            Path(args.json).write_text(json.dumps(curve))

if __name__ == "__main__":
    main()
