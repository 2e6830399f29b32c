"""The FFT repulsion's grid stages on one thread and on two, and the thread count the thresholds give each.

Usage: python benchmarks/grid_threads.py [--sizes 16000,64000,153764,767923] [--rounds 11]

For each layout (t-SNE R^2, the default grid for its size): the box-order sort (``Grid.visit``), spreading
(``spread``), the convolution (``convolve``) and the interpolation of all rows (``interpolate_grid``), each timed
with 1 and with 2 threads forced (the row thresholds ``SORT_ROWS_PER_THREAD`` / ``SPREAD_ROWS_PER_THREAD`` set to
1 for the run), the two alternated round by round; the table gives the medians (wall ms) and the thread count the
shipped thresholds choose for that many rows.  Layouts: the 16,000 x 50 mixture of ``users.py`` at its converged
t-SNE map and at half its scale (a ``fit_transform`` with the defaults runs first), then ``cluster._start``'s
clustered layouts of the other sizes.  Every stage's result is the same for either thread count (tests).
"""
import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from cluster import _start  # noqa: E402
from common import machine_description, markdown_table  # noqa: E402

from scalemb.models import get_model  # noqa: E402
from scalemb.repulsion import convolution as convolution_module, fft as fft_module, grid as grid_module  # noqa: E402,E501
from scalemb.repulsion.convolution import convolve  # noqa: E402
from scalemb.repulsion.fft import interpolate_grid, spread  # noqa: E402
from scalemb.repulsion.grid import grid_for, make_grid  # noqa: E402
from scalemb.repulsion.method import resolve_repulsion_settings  # noqa: E402

SHIPPED = {"visit": grid_module.SORT_ROWS_PER_THREAD, "spread": grid_module.SPREAD_ROWS_PER_THREAD,
           "convolve": convolution_module.TRANSFORM_NODES_PER_THREAD, "interpolate": grid_module.SPREAD_ROWS_PER_THREAD}
STAGES = ("visit", "spread", "convolve", "interpolate")


def mixture_layouts():
    """The users.py mixture's converged t-SNE map (defaults, seed 0) and the same at half its scale."""
    from sklearn.model_selection import train_test_split

    import scalemb
    from users import load

    X, y = load("mixture")
    X_fit = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)[0]
    Y = np.ascontiguousarray(scalemb.TSNE(random_state=0).fit_transform(X_fit).T)
    return [("mixture, converged", Y), ("mixture, half scale", Y * 0.5)]


def stage_times(grid, Y, workers):
    """Wall seconds of each stage with ``workers`` threads."""
    n = Y.shape[1]
    out = {}
    t = time.perf_counter()
    visit = grid.visit(Y, 0, n, workers)
    out["visit"] = time.perf_counter() - t
    t = time.perf_counter()
    charges = spread(grid, Y, 0, n, workers=workers, visit=visit)
    out["spread"] = time.perf_counter() - t
    t = time.perf_counter()
    potentials = convolve(grid, charges, workers=workers).potentials
    out["convolve"] = time.perf_counter() - t
    t = time.perf_counter()
    interpolate_grid(grid, Y, potentials, workers, visit)
    out["interpolate"] = time.perf_counter() - t
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64000,153764,767923", help="sizes of the clustered layouts")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--skip-mixture", action="store_true")
    ap.add_argument("--extents", default="10,20,30,40,50,60,70,85,100",
                    help="square t-SNE grids of these extents (16,000 points' grid): the convolution alone")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    model = get_model("tsne")
    layouts = [] if args.skip_mixture else mixture_layouts()
    layouts += [("clustered", _start(int(n), 2)) for n in args.sizes.split(",")]
    for name in ("SORT_ROWS_PER_THREAD", "SPREAD_ROWS_PER_THREAD"):
        setattr(grid_module, name, 1)
    fft_module.SPREAD_ROWS_PER_THREAD = 1
    convolution_module.TRANSFORM_NODES_PER_THREAD = 1
    print(machine_description())
    rows = []
    for name, Y in layouts:
        n = Y.shape[1]
        grid = grid_for(model, 2, Y, resolve_repulsion_settings("fft", model, 2, 0, n)[1])
        times = {1: [], 2: []}
        for r in range(args.rounds + 1):
            for w in ((1, 2) if r % 2 else (2, 1)):
                got = stage_times(grid, Y, w)
                if r:  # the first round warms up
                    times[w].append(got)
        med = {w: {s: 1e3 * float(np.median([t[s] for t in times[w]])) for s in STAGES} for w in (1, 2)}
        cells = []
        for s in STAGES:
            chosen = max(1, min(2, (grid.n_nodes if s == "convolve" else n) // SHIPPED[s]))
            cells.append(f"{med[1][s]:.2f} / {med[2][s]:.2f} ({chosen})")
        rows.append([f"{name}, {n:,} rows", f"{grid.n_nodes:,}"] + cells)
        print(rows[-1], flush=True)
    print(f"\nWall ms on 1 / 2 threads, medians of {args.rounds} alternated rounds (the thread count the shipped "
          "thresholds give in brackets); load average at the end: "
          + " ".join(f"{x:.2f}" for x in __import__("os").getloadavg()))
    print(markdown_table(["layout", "grid nodes", *STAGES], rows))
    print(f"\nThe convolution alone on square grids (1 / 2 threads, medians of {args.rounds} alternated rounds; CPU: "
          "the process's, all threads; random charges):")
    print(markdown_table(["extent", "grid nodes", "FFT lengths", "wall ms", "CPU ms", "threads given"],
                         convolution_by_size(model, [float(e) for e in args.extents.split(",")], args.rounds)))


def convolution_by_size(model, extents, rounds):
    """Rows of the convolution's wall ms on 1 / 2 threads for square grids of the given extents."""
    params = resolve_repulsion_settings("fft", model, 2, 0, 16_000)[1]
    rows = []
    for extent in extents:
        grid = make_grid(model, 2, [0.0, 0.0], [extent, extent], params, 16_000)
        charges = np.random.default_rng(0).random(grid.n_nodes)
        times = {1: [], 2: []}
        for r in range(rounds + 1):
            for w in ((1, 2) if r % 2 else (2, 1)):
                t, c = time.perf_counter(), time.process_time()
                convolve(grid, charges, workers=w)
                if r:
                    times[w].append((time.perf_counter() - t, time.process_time() - c))
        med = {w: 1e3 * np.median(np.array(times[w]), axis=0) for w in (1, 2)}
        chosen = max(1, min(2, grid.n_nodes // SHIPPED["convolve"]))
        rows.append([f"{extent:g}", f"{grid.n_nodes:,}", "x".join(map(str, grid.padded())),
                     f"{med[1][0]:.2f} / {med[2][0]:.2f}", f"{med[1][1]:.2f} / {med[2][1]:.2f}", str(chosen)])
    return rows


if __name__ == "__main__":
    main()
