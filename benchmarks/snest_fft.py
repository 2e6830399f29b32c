"""SNEST's FFT repulsion with and without the time band (``scalemb.repulsion.fft.grid_for``): seconds per
evaluation and error against the exact kernel, old path (``FFTParams(time_band=False)``: the grid spans the whole
time extent) against new (the default: the cheapest band, outliers summed directly), in the same run.

Layouts (``--layout LABEL=STORE:FILE``, FILE a ``.npy`` of shape (d, N) or a result store): the P of STORE (an
affinity store, or 'grqc') for the evaluation, the coordinates from FILE.  ``--synthetic LABEL=STORE:FILE``: a layout
for STORE's N points with space ~ N(0, 30²) (openTSNE's extent, as benchmarks/scale.py) and time coordinates
resampled from FILE's (a real run's time distribution at a size where no run was made).

Per layout and path: the grid (time nodes, rank, band, outliers), seconds per ``LocalExecutor.evaluate`` (gradient
only; median of ``--rounds`` after a warm-up, the two paths alternating), and the errors of ``fft_repulsion``'s Z,
R / Z, and of its space and time rows against the exact all-pairs kernel (for N <= ``--exact-max``, cached next to
FILE as FILE.exact.npz) or, above, of ``--sample`` random rows against their exact sums (Z then only as the two
paths' difference).

``--embed STORE``: full SNEST runs with defaults, old and new, one after the other in child processes (wall,
peak RSS, KL, iterations, NP@deg on 20 000 sampled rows).

    python benchmarks/snest_fft.py --layout grqc=grqc:/tmp/grqc_snest.zarr \\
        --layout 1e5/200=/tmp/P1e5.zarr:/tmp/s1e5_200.npy --synthetic 1e6=/tmp/P1e6.zarr:/tmp/s1e5_200.npy \\
        --out benchmarks/results/snest_fft.md
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import Report, markdown_table  # noqa: E402

from scalemb.affinity import AffinityStore  # noqa: E402
from scalemb.engine import LocalExecutor  # noqa: E402
from scalemb.models import get_model  # noqa: E402
from scalemb.repulsion.fft import fft_repulsion  #noqa: E402
from scalemb.repulsion.grid import grid_for  #noqa: E402
from scalemb.repulsion.spec import FFTParams  #noqa: E402

PATHS = {"old": FFTParams(time_band=False), "new": FFTParams()}


def load_affinity(store):
    if store == "grqc":
        from scalemb.embedding import load_affinity as load

        return load("grqc")
    return AffinityStore(store).to_affinity()


def load_layout(path) -> np.ndarray:
    if path.endswith(".npy"):
        return np.ascontiguousarray(np.load(path), dtype=np.float64)
    from scalemb.embedding import EmbeddingResult

    return np.ascontiguousarray(EmbeddingResult.load(path).embedding.T, dtype=np.float64)


def exact_repulsion(Y, threads=2):
    """The exact all-pairs ``(R, Z)`` of SNEST R^{2,1} (row blocks on ``threads`` threads)."""
    model = get_model("snest")
    cuts = np.linspace(0, Y.shape[1], threads + 1).astype(int)

    def part(k):
        R = np.zeros_like(Y)
        return R, model.repulsion(Y, 2, int(cuts[k]), int(cuts[k + 1]), R)

    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(part, range(threads)))
    return sum(r for r, _ in parts), sum(z for _, z in parts)


def exact_rows(Y, rows):
    """Exact repulsion rows ``(d, len(rows))`` of the points ``rows`` against all points."""
    Yq = np.ascontiguousarray(Y[:, rows])
    R = np.zeros_like(Yq)
    get_model("snest").cross_repulsion(Yq, 0, Yq.shape[1], Y, 2, True, R)
    return R


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def describe(grid) -> str:
    text = f"m {grid.points[-1]}, rank {grid.time_in.shape[1]}, {grid.n_nodes / 1e6:.2f} M nodes"
    if grid.capped:
        text += ", capped"
    if grid.time_band is not None:
        text += f", band [{grid.time_band[0]:.3f}, {grid.time_band[1]:.3f}], {grid.n_outliers} outside"
    return text


def layout_rows(label, affinity, Y, reference, rounds, sample, seed=0):
    n = Y.shape[1]
    t = Y[2]
    head = f"{label} (N {n}, time extent {np.ptp(t):.2f}, std {t.std():.3f})"
    executors = {name: LocalExecutor(affinity, get_model("snest"), 2, 1, repulsion="fft", fft_params=p)
                 for name, p in PATHS.items()}
    seconds = {name: [] for name in PATHS}
    try:
        for ex in executors.values():
            ex.evaluate(Y, with_kl=False)
        for r in range(rounds):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                start = time.perf_counter()
                executors[name].evaluate(Y, with_kl=False)
                seconds[name].append(time.perf_counter() - start)
    finally:
        for ex in executors.values():
            ex.close()
    rows, results = [], {}
    if reference is None:
        rows_idx = np.sort(np.random.default_rng(seed).choice(n, min(sample, n), replace=False))
        exact_sample = exact_rows(Y, rows_idx)
    for name, params in PATHS.items():
        grid = grid_for("snest", 2, Y, params)
        R, z = fft_repulsion("snest", Y, 2, params, workers=2)
        results[name] = z
        if reference is not None:
            Re, ze = reference
            errors = (f"{z / ze - 1:.1e}", f"{rel(R / z, Re / ze):.1e}", f"{rel(R[:2], Re[:2]):.1e}",
                      f"{rel(R[2], Re[2]):.1e}")
        else:
            errors = ("-", "-", f"{rel(R[:2, rows_idx], exact_sample[:2]):.1e}",
                      f"{rel(R[2, rows_idx], exact_sample[2]):.1e}")
        rows.append([head if name == "old" else "", name, describe(grid), f"{np.median(seconds[name]):.3f}",
                     *errors])
    ratio = np.median(seconds["old"]) / np.median(seconds["new"])
    rows[1][3] += f" ({ratio:.2f}x)"
    if reference is None:
        rows[1][4] = f"new/old {results['new'] / results['old'] - 1:.1e}"
    return rows


def embed_child(store, path, out):
    """(Child process.)  SNEST with defaults on ``store`` along ``path``; prints a JSON line."""
    import resource

    from scalemb.embedding import Embedder

    start = time.perf_counter()
    e = Embedder(model="snest", fft_params=PATHS[path]).fit(store)
    wall = time.perf_counter() - start
    np.save(out, np.ascontiguousarray(e.result_.embedding))
    print(json.dumps({"wall": wall, "kl": e.kl_, "iterations": e.result_.iterations,
                      "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}))


def embed_rows(store, workdir):
    from scalemb.metrics import graph_metrics

    affinity = AffinityStore(store).to_affinity()
    rows = []
    for path in PATHS:
        out = os.path.join(workdir, f"snest_{path}.npy")
        proc = subprocess.run([sys.executable, __file__, "--embed-child", store, path, out], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"embed {path} failed: {proc.stderr[-2000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        np_deg = graph_metrics(affinity.P, np.load(out), "snest", sample=20000)["np@deg"]
        rows.append([path, f"{res['wall']:.0f}", f"{res['rss_gb']:.2f}", res["iterations"], f"{res['kl']:.4f}",
                     f"{np_deg.value:.3f} ± {np_deg.stderr or 0:.3f}"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", action="append", default=[], help="LABEL=STORE:FILE")
    parser.add_argument("--synthetic", action="append", default=[], help="LABEL=STORE:FILE (time from FILE)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--exact-max", type=int, default=100_000)
    parser.add_argument("--sample", type=int, default=2000)
    parser.add_argument("--embed", default=None, help="affinity store: full runs old and new")
    parser.add_argument("--embed-dir", default="/tmp")
    parser.add_argument("--embed-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.embed_child:
        return embed_child(*args.embed_child)
    report = Report.start("SNEST FFT repulsion: the time band (old: grid over the whole time extent; new: default)")
    header = ["layout", "path", "grid", "s / evaluation (old/new)", "Z rel. err.", "R/Z rel. err.",
              "space rows rel. err.", "time rows rel. err."]
    rows = []
    for spec, synthetic in [(s, False) for s in args.layout] + [(s, True) for s in args.synthetic]:
        label, rest = spec.split("=", 1)
        store, path = rest.split(":", 1)
        affinity = load_affinity(store)
        Y = load_layout(path)
        if synthetic:
            rng = np.random.default_rng(0)
            n = affinity.n_points
            Y = np.ascontiguousarray(np.concatenate([rng.normal(size=(2, n)) * 30,
                                                     rng.choice(Y[2], size=(1, n), replace=True)]))
            label += " (synthetic)"
        reference = None
        if Y.shape[1] <= args.exact_max:
            cache = path.rstrip("/") + ".exact.npz"
            if not synthetic and os.path.exists(cache):
                data = np.load(cache)
                reference = (data["R"], float(data["z"]))
            else:
                reference = exact_repulsion(Y)
                if not synthetic:
                    np.savez(cache, R=reference[0], z=reference[1])
        rows += layout_rows(label, affinity, Y, reference, args.rounds, args.sample)
        print(markdown_table(header, rows[-2:]), flush=True)
    if rows:
        report("## Seconds per evaluation and error against the exact kernel")
        report()
        report(markdown_table(header, rows))
        report()
    if args.embed:
        report(f"## Full SNEST R^{{2,1}} runs with defaults on {args.embed}, old then new")
        report()
        report(markdown_table(["path", "wall s", "peak RSS GB", "iterations", "KL", "NP@deg"],
                              embed_rows(args.embed, args.embed_dir)))
        report()
    report.save(args.out)


if __name__ == "__main__":
    main()
