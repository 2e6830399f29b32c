"""Threads for the grid loops: ``thread_count`` reads scipy's ``workers`` convention (``-1``: every CPU this
process may use), ``on_threads`` runs one function per thread index.  Results never depend on the count: the
callers split work so that every split sums the same (fixed-point charges, rows in a fixed order)."""
import os
from concurrent.futures import ThreadPoolExecutor


def on_threads(fn, workers: int) -> None:
    """``fn(t)`` for ``t < workers``, on that many threads (here if one)."""
    if workers == 1:
        fn(0)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(fn, range(workers)))


def thread_count(workers: int) -> int:
    """``workers`` as a thread count (scipy's ``-1``: every CPU this process may use)."""
    return len(os.sched_getaffinity(0)) if workers < 0 else max(1, int(workers))


def threads_for(workers: int, items: int, per_thread: int) -> int:
    """Threads for ``items`` units of work split among them, each worth a thread only with ``per_thread`` of them:
    at most ``thread_count(workers)``, at least one."""
    return max(1, min(thread_count(workers), items // per_thread))
