"""Helpers shared by the benchmarks: machine description and Markdown tables."""
import os
import platform
import subprocess
import sys
from importlib import metadata


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


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Report:
    """Prints as it goes and keeps the text for the results file."""

    def __init__(self):
        self.parts = []

    def __call__(self, text=""):
        print(text, flush=True)
        self.parts.append(text)

    def text(self) -> str:
        return "\n".join(self.parts) + "\n"
