"""Edge-list parsing: the one reader (``scalemb.io.edgelist.parse_edge_chunks``, numpy's C parser per chunk,
line by line only for a chunk with a bad line) vs the line-by-line ``read_edge_list`` of an older tree.

A synthetic co-authorship edge list of ``--authors`` authors (about 4 edges each) is written once; child
processes (old, new, alternating, ``--rounds`` each) time ``read_edge_list`` on it.

Usage: ``python benchmarks/edgelist_reader.py --old /tmp/scalemb-old --out benchmarks/results/edgelist_reader.md``
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
from common import Report, markdown_table  # noqa: E402

CHILD = ("import sys, time; from scalemb.io.edgelist import read_edge_list; t = time.perf_counter(); "
         "g = read_edge_list(sys.argv[1]); print(time.perf_counter() - t, g.n_edges)")


def timed(tree: Path, path: Path) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=dict(os.environ, PYTHONPATH=str(tree)),
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--authors", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = Report.start("Edge-list reader: one parser (numpy C parser per chunk) vs the old line-by-line reader",
                          f"old tree: {args.old}")
    sys.path.insert(0, str(HERE.parent))
    from scalemb.io.coauthor_generator import write_coauthor_edge_list

    with tempfile.TemporaryDirectory() as tmp:
        path = write_coauthor_edge_list(Path(tmp) / "edges.txt", args.authors, seed=1)
        lines = sum(1 for _ in open(path))
        old, new = [], []
        for r in range(args.rounds):
            for label in (("old", "new") if r % 2 == 0 else ("new", "old")):
                seconds, edges = timed(args.old if label == "old" else HERE.parent, path)
                (old if label == "old" else new).append(seconds)
        rows = [["old read_edge_list (line by line)", f"{statistics.median(old):.2f}",
                 f"{lines / statistics.median(old) / 1e6:.2f}"],
                ["new read_edge_list (parse_edge_chunks)", f"{statistics.median(new):.2f}",
                 f"{lines / statistics.median(new) / 1e6:.2f}"]]
        report(f"{lines} lines, {edges} edges after merging; median of {args.rounds} runs each\n")
        report(markdown_table(["reader", "seconds", "M lines/s"], rows))
        report(f"\nratio old/new: {statistics.median(old) / statistics.median(new):.2f}")
    report.save(args.out)


if __name__ == "__main__":
    main()
