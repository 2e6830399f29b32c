"""Helpers shared by the benchmarks: machine description and Markdown tables."""
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path


def machine_description() -> str:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = float("nan")
    versions = []
    for pkg in ("scalemb", "numpy", "scipy", "numba", "zarr", "openTSNE"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        commit = "?"
    return (f"machine: {cpu}, {len(os.sched_getaffinity(0))} cores usable, {mem_gb:.0f} GB RAM, "
            f"Python {platform.python_version()}, {', '.join(versions)}, commit {commit}, "
            f"command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")


def timings(fn, repeats: int, warm_up: bool = True) -> list:
    """Wall seconds of ``repeats`` calls of ``fn()`` (after one untimed call with ``warm_up``: compilation,
    caches)."""
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def option_overrides(text: str) -> dict:
    """``'key=value,...'`` (a candidate's overrides after its ``:``) -> ``{key: value}``, each value read as JSON,
    or as the text itself where it is a bare word (``fft_accuracy=fast``)."""
    overrides = {}
    for item in [x for x in text.split(",") if x]:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def run_description() -> str:
    """The machine line every results file carries: ``uname -a``, ``nproc``, the load average and the UTC time
    of the run (times on a shared machine are only comparable within one run)."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"uname -a: {' '.join(platform.uname())}; nproc: {os.cpu_count()}; load average: {load}; "
            f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


class Report:
    """Prints as it goes and keeps the text for the results file."""

    def __init__(self):
        self.parts = []

    @classmethod
    def start(cls, title: str, *notes: str) -> "Report":
        """A report opened with the preamble every benchmark shares: ``# title``, the machine and the command
        (``machine_description``), the run line (``run_description``), then ``notes``, one line each."""
        report = cls()
        report(f"# {title}")
        report()
        report(machine_description() + "  ")
        report(run_description() + "\n")
        for note in notes:
            report(note)
        if notes:
            report()
        return report

    def save(self, path) -> None:
        """Write the text to ``path`` (nothing when ``path`` is None: printed only)."""
        if path:
            Path(path).write_text(self.text())

    def __call__(self, text=""):
        print(text, flush=True)
        self.parts.append(text)

    def text(self) -> str:
        return "\n".join(self.parts) + "\n"


def adjacency_lists(graph) -> list:
    """Each node's neighbours (row indices) of an edge-list graph (``scalemb.io.edgelist`` result), both directions."""
    adjacency = [[] for _ in range(graph.n_nodes)]
    for a, b in zip(graph.src, graph.dst):
        adjacency[a].append(b)
        adjacency[b].append(a)
    return adjacency


@contextlib.contextmanager
def local_dask_cluster(workers: int, directory=None, memory_limit: str | None = None, env: dict | None = None,
                       timeout: float = 120.0):
    """A real ``dask scheduler`` and ``workers`` single-threaded ``dask worker`` processes (no nanny, no
    dashboard) on 127.0.0.1; yields the scheduler's address once every worker has joined, and stops them all
    (terminate, then kill after 10 s) on the way out.  Logs go to ``directory`` when it is given, else nowhere.
    ``env``: the processes' environment (e.g. a ``PYTHONPATH`` that makes them import another tree)."""
    import json
    import tempfile

    from dask.distributed import Client  # (not "distributed": benchmarks/distributed.py is a benchmark)

    own = directory is None
    d = Path(tempfile.mkdtemp(prefix="bench-dask-") if own else directory)
    d.mkdir(parents=True, exist_ok=True)
    file = d / "scheduler.json"
    file.unlink(missing_ok=True)

    def log(name):
        return subprocess.DEVNULL if own else open(d / f"{name}.log", "w")

    spawn = {"stdout": subprocess.DEVNULL, "env": env}
    procs = [subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(file)], stderr=log("scheduler"), **spawn)]
    try:
        deadline = time.monotonic() + timeout
        while not file.exists() or not file.read_text().strip():
            if procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dask scheduler did not start (logs: {d})")
            time.sleep(0.1)
        time.sleep(0.3)
        address = json.loads(file.read_text())["address"]
        limit = ["--memory-limit", memory_limit] if memory_limit else []
        procs += [subprocess.Popen(["dask", "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                    "--host", "127.0.0.1", *limit], stderr=log(f"worker{i}"), **spawn)
                  for i in range(workers)]
        with Client(address) as client:
            client.wait_for_workers(workers, timeout=timeout)
        yield address
    finally:
        for proc in procs[::-1]:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
