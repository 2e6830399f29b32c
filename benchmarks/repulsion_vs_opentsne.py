"""One t-SNE gradient evaluation (attraction on P + FFT repulsion), scalemb against openTSNE, same run.

Usage: python benchmarks/repulsion_vs_opentsne.py [--sizes 20000,150000,770000] [--rounds 5] [--reps 3]
       [--threads 2] [--baseline PATH] [--out benchmarks/results/repulsion.md]

Each contender is a child process holding its data, warmed up (JIT, FFT plans, kernel spectra), that times
``--reps`` evaluations whenever the parent asks; the parent asks each contender in turn, the order rotated
every round, ``--rounds`` rounds, and reports the median over rounds of each round's median.  Separate
processes because openTSNE switches its process to flush-to-zero arithmetic when it is imported, and so that
``--baseline PATH`` (another scalemb source tree, e.g. ``git archive main scalemb | tar -x -C PATH``) runs
beside this one.

Problems (``--sizes``): N = 2e4: a random symmetric P with ~90 non-zeros per row (perplexity 30's kNN
count) on a clustered layout of extent 50; N = 153,764 and 767,923: the real co-authorship affinity stores
/work/scratch/P200000.zarr and P1000000.zarr (~7 non-zeros per row) on clustered layouts of extent 120 and
200 (openTSNE-like extents), unit-spread Gaussian clusters, points in random order.

Contenders: scalemb ``LocalExecutor(repulsion='fft', n_threads=--threads).evaluate`` with its default
interpolation (5 points in boxes 0.7 wide for t-SNE R^2) and with openTSNE's (``FFTParams(points=3,
box_width=1, min_boxes=50)``); openTSNE ``openTSNE.tsne.kl_divergence_fft`` (its negative gradient
``_tsne.estimate_negative_gradient_fft_2d``, then ``_tsne.estimate_positive_gradient_nn`` with
``n_jobs=--threads``) with ``n_interpolation_points=3, min_num_intervals=50, ints_in_interval=1`` (its
defaults).  Each without the KL (the gradient alone: most iterations of either optimiser) and with it.

``--profile``: instead, the stages of one scalemb evaluation (default interpolation) at each size, CPU ms of
one thread (``time.thread_time``, median of 5 after a warm-up; numba-compiled loops): the box-order sort
(``Grid.visit``), spreading, the FFT convolution, the interpolation of all rows at once (``interpolate_grid``)
and, for comparison, per row block (the Dask workers' path), the attraction over all row blocks, and the
reduction of the blocks (``reduce_blocks``); openTSNE's ``estimate_negative_gradient_fft_2d`` and
``estimate_positive_gradient_nn`` on one thread beside them.

Accuracy: the repulsive force ``F_i = sum_j q_ij² (y_i - y_j) / Z`` and Z of a 5,000-point random subset of
each layout, interpolated by each contender's settings against the exact sums (relative error of F over all
points, of Z).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
STORES = {153764: "/work/scratch/P200000.zarr", 767923: "/work/scratch/P1000000.zarr"}
ALIASES = {150000: 153764, 770000: 767923}
EXTENT = {20000: 50.0, 153764: 120.0, 767923: 200.0}
OPENTSNE_PARAMS = dict(n_interpolation_points=3, min_num_intervals=50, ints_in_interval=1)
SUBSET = 5000


def clustered_layout(n, extent, seed=1):
    """Gaussian clusters (unit spread, Pareto sizes, ~500 points each) at uniform centres in a square of side
    ``extent``, ``(2, n)``, in random point order."""
    rng = np.random.default_rng(seed)
    n_clusters = max(1, n // 500)
    sizes = rng.pareto(1.5, n_clusters) + 1
    labels = rng.choice(n_clusters, n, p=sizes / sizes.sum())
    centres = (rng.random((n_clusters, 2)) - 0.5) * (extent - 6)
    return np.ascontiguousarray((centres[labels] + rng.normal(size=(n, 2))).T)


def random_csr(n, k, seed=0):
    """A symmetric P with ~2k non-zeros per row at random columns, normalised to sum 1."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), k)
    cols = rng.integers(0, n, n * k)
    keep = rows != cols
    A = sp.csr_matrix((rng.random(keep.sum()), (rows[keep], cols[keep])), shape=(n, n))
    A = (A + A.T).tocsr()
    A.data /= A.data.sum()
    return A


def load_problem(n):
    """``(P as CSR, layout (2, N))`` for size ``n``."""
    if n in STORES:
        from scalemb.affinity.store import AffinityStore

        P = AffinityStore(STORES[n]).to_affinity(verify=False).P.tocsr()
    else:
        P = random_csr(n, 45)
    return P, clustered_layout(P.shape[0], EXTENT.get(n, 50.0))


def exact_force(Y):
    """``(F, Z)``: ``F_i = sum_j q_ij² (y_i - y_j) / Z``, ``(2, n)``, and Z, by all pairs (float64)."""
    D = Y[:, :, None] - Y[:, None, :]
    q = 1.0 / (1.0 + (D ** 2).sum(axis=0))
    np.fill_diagonal(q, 0.0)
    Z = q.sum()
    return (q ** 2 * D).sum(axis=2) / Z, Z


# --- children

def child_scalemb(n, threads, setting):
    from scalemb.affinity import Affinity
    from scalemb.engine import LocalExecutor
    from scalemb.models import get_model
    from scalemb.repulsion.fft import fft_repulsion
    from scalemb.repulsion.grid import grid_for
    from scalemb.repulsion.spec import FFTParams

    P, Y = load_problem(n)
    params = FFTParams() if setting == "default" else FFTParams(points=3, box_width=1.0, min_boxes=50)
    model = get_model("tsne")
    executor = LocalExecutor(Affinity(P, np.arange(P.shape[0])), model, 2, 0, repulsion="fft", fft_params=params,
                             n_threads=threads)
    grid = grid_for(model, 2, Y, executor.fft_params)

    def evaluate(with_kl):
        executor.evaluate(Y, with_kl=with_kl)

    def accuracy():
        sub = np.ascontiguousarray(Y[:, np.random.default_rng(0).choice(Y.shape[1], SUBSET, replace=False)])
        F, Z = exact_force(sub)
        R, z = fft_repulsion(model, sub, 2, executor.fft_params)
        return float(np.linalg.norm(-R / (2 * z) - F) / np.linalg.norm(F)), float(abs(z / Z - 1))

    return evaluate, accuracy, grid.describe()


def child_opentsne(n, threads):
    from openTSNE import _tsne
    from openTSNE.tsne import kl_divergence_fft

    P, Y = load_problem(n)
    Yt = np.ascontiguousarray(Y.T)

    def evaluate(with_kl):
        kl_divergence_fft(Yt, P, 1, OPENTSNE_PARAMS, should_eval_error=with_kl, n_jobs=threads)

    def accuracy():
        sub = np.ascontiguousarray(Y[:, np.random.default_rng(0).choice(Y.shape[1], SUBSET, replace=False)])
        F, Z = exact_force(sub)
        g = np.zeros((SUBSET, 2))
        z = _tsne.estimate_negative_gradient_fft_2d(np.ascontiguousarray(sub.T), g, **OPENTSNE_PARAMS, dof=1)
        # openTSNE returns the negative gradient's repulsive part with the opposite sign
        return float(np.linalg.norm(-g.T - F) / np.linalg.norm(F)), float(abs(z / Z - 1))

    cells = max(OPENTSNE_PARAMS["min_num_intervals"], int(np.ceil(float(np.ptp(Y, axis=1).max()))))
    return evaluate, accuracy, f"{cells}x{cells} boxes (width <= 1) x 3 points"


def child_main(args):
    if args.contender == "opentsne":
        evaluate, accuracy, grid = child_opentsne(args.n, args.threads)
    else:
        evaluate, accuracy, grid = child_scalemb(args.n, args.threads, args.contender.split(":", 1)[1])
    for with_kl in (False, True, False):  # warm-up: JIT, FFT plans, kernel spectra
        evaluate(with_kl)
    print(json.dumps({"ready": True, "grid": grid}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["what"] == "accuracy":
            force, z = accuracy()
            print(json.dumps({"force": force, "z": z}), flush=True)
            continue
        times, cpu = [], []
        for _ in range(command["reps"]):
            t0, c0 = time.perf_counter(), time.process_time()
            evaluate(command["with_kl"])
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        print(json.dumps({"ms": 1e3 * float(np.median(times)), "cpu_ms": 1e3 * float(np.median(cpu))}), flush=True)


def profile(n):
    """Stage CPU ms of one thread (see the module docstring), as a dict."""
    from scalemb.affinity import Affinity
    from scalemb.engine import LocalExecutor
    from scalemb.engine.blocks import evaluate_block_fft, point_major, reduce_blocks
    from scalemb.models import get_model
    from scalemb.repulsion import convolution, fft, grid as grid_module

    P, Y = load_problem(n)
    N = Y.shape[1]
    model = get_model("tsne")
    executor = LocalExecutor(Affinity(P, np.arange(N)), model, 2, 0, repulsion="fft", n_threads=1)
    grid = grid_module.grid_for(model, 2, Y, executor.fft_params)

    def cpu_ms(fn):
        fn()
        times = []
        for _ in range(5):
            t0 = time.thread_time()
            fn()
            times.append(time.thread_time() - t0)
        return 1e3 * float(np.median(times))

    visit = grid.visit(Y, 0, N)
    charges = fft.spread(grid, Y, 0, N, visit=visit)
    potentials = convolution.convolve(grid, charges).potentials
    Yt = point_major(Y)
    A = np.zeros((N, 2))
    results = [evaluate_block_fft(model, b, Y, 2, grid, potentials, None, False, Yt) for b in executor.blocks]
    stages = {
        "box-order sort (visit)": cpu_ms(lambda: grid.visit(Y, 0, N)),
        "spread": cpu_ms(lambda: fft.spread(grid, Y, 0, N, visit=visit)),
        "FFT convolution": cpu_ms(lambda: convolution.convolve(grid, charges)),
        "interpolation, all rows (interpolate_grid)": cpu_ms(lambda: fft.interpolate_grid(grid, Y, potentials, 1,
                                                                                          visit)),
        "interpolation per row block (Dask path)": cpu_ms(lambda: [fft.interpolate(grid, Y, potentials, b.r0, b.r1)
                                                                   for b in executor.blocks]),
        "attraction, all blocks": cpu_ms(lambda: [model.attraction(b.indptr, b.indices, b.data, b.r0, Yt, 2,
                                                                   A[b.r0:b.r1], False) for b in executor.blocks]),
        "reduce_blocks": cpu_ms(lambda: reduce_blocks(results, Y.shape, 0.0, with_kl=False)),
    }
    try:
        from openTSNE import _tsne
    except ImportError:
        return stages, grid.describe(), len(executor.blocks)
    Yo = np.ascontiguousarray(Y.T)
    g = np.zeros_like(Yo)
    stages["openTSNE negative gradient (FFT)"] = cpu_ms(
        lambda: _tsne.estimate_negative_gradient_fft_2d(Yo, g, **OPENTSNE_PARAMS, dof=1))
    stages["openTSNE positive gradient"] = cpu_ms(
        lambda: _tsne.estimate_positive_gradient_nn(P.indices, P.indptr, P.data, Yo, Yo, g, 1, num_threads=1,
                                                     should_eval_error=False))
    return stages, grid.describe(), len(executor.blocks)


# --- parent

class Child:
    def __init__(self, contender, n, threads, pythonpath):
        env = dict(os.environ, PYTHONPATH=pythonpath)
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", contender, "--n", str(n),
                                      "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)
        self.info = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child {self.proc.args} ended: exit {self.proc.wait()}")
        return json.loads(line)

    def ask(self, **command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="20000,150000,770000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", help="another scalemb source tree to time beside this one")
    parser.add_argument("--settings", default="default,opentsne", help="scalemb interpolation settings to time")
    parser.add_argument("--out", help="prepend the results as a new top section of this Markdown file")
    parser.add_argument("--profile", action="store_true", help="stage CPU times of one thread instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.contender = args.child
        return child_main(args)

    sys.path.insert(0, str(HERE))
    from common import machine_description, markdown_table

    if args.profile:
        lines = ["## Stages of one evaluation, CPU ms of one thread (benchmarks/repulsion_vs_opentsne.py --profile)",
                 machine_description(), f"load average before {os.getloadavg()[0]:.2f}", ""]
        table = {}
        for size in (int(float(s)) for s in args.sizes.split(",")):
            n = ALIASES.get(size, size)
            stages, grid, blocks = profile(n)
            table[f"N = {n} ({blocks} blocks; {grid})"] = stages
        names = list(next(iter(table.values())))
        lines.append(markdown_table(["stage"] + list(table), [[name] + [f"{t[name]:.1f}" for t in table.values()]
                                                               for name in names]))
        print("\n".join(lines))
        return
    tree = str(HERE.parent)
    what = {"default": "default interpolation", "opentsne": "openTSNE's interpolation"}
    settings = args.settings.split(",")
    contenders = [(f"scalemb:{s}", tree, f"scalemb ({what[s]})") for s in settings]
    if args.baseline:
        contenders += [(f"scalemb:{s}", args.baseline, f"baseline scalemb ({what[s]})") for s in settings]
    contenders.append(("opentsne", tree, "openTSNE"))
    load_before = os.getloadavg()
    lines = []
    for size in (int(float(s)) for s in args.sizes.split(",")):
        n = ALIASES.get(size, size)
        children = [Child(c, n, args.threads, path) for c, path, _ in contenders]
        try:
            results = {(i, kl): [] for i in range(len(children)) for kl in (False, True)}
            cpu = {(i, kl): [] for i in range(len(children)) for kl in (False, True)}
            for r in range(args.rounds):
                shift = r % len(children)
                for i in list(range(shift, len(children))) + list(range(shift)):
                    for with_kl in (False, True):
                        answer = children[i].ask(what="time", with_kl=with_kl, reps=args.reps)
                        results[i, with_kl].append(answer["ms"])
                        cpu[i, with_kl].append(answer["cpu_ms"])
            accuracy = [child.ask(what="accuracy") for child in children]
        finally:
            for child in children:
                child.close()
        ref = len(children) - 1
        medians = {key: float(np.median(v)) for key, v in results.items()}
        rows = []
        for i, (_, _, label) in enumerate(contenders):
            ratio = [np.median(np.array(results[i, kl]) / np.array(results[ref, kl])) for kl in (False, True)]
            cpu_ratio = np.median(np.array(cpu[i, False]) / np.array(cpu[ref, False]))
            rows.append((label, f"{medians[i, False]:.1f}", f"{ratio[0]:.2f}", f"{medians[i, True]:.1f}",
                         f"{ratio[1]:.2f}", f"{np.median(cpu[i, False]):.1f}", f"{cpu_ratio:.2f}",
                         f"{accuracy[i]['force']:.1e}", f"{accuracy[i]['z']:.1e}", children[i].info["grid"]))
        lines.append(f"### N = {n}" + (" (random P, ~90 non-zeros per row)" if n not in STORES else
                                       f" ({STORES[n]}, {os.path.basename(STORES[n])})")
                     + f", layout extent {EXTENT.get(n, 50):.0f}")
        lines.append(markdown_table(["contender", "gradient ms", "/ openTSNE", "KL + gradient ms", "/ openTSNE",
                                     "gradient CPU ms", "/ openTSNE", f"force error ({SUBSET} subset)", "Z error",
                                     "grid"], rows))
        lines.append("")
        print("\n".join(lines[-3:]), flush=True)
    load_after = os.getloadavg()
    header = [f"## One evaluation, scalemb vs openTSNE, {args.threads} threads (benchmarks/repulsion_vs_opentsne.py)",
              f"{machine_description()}",
              f"uname -a: {' '.join(platform.uname())}; nproc: {os.cpu_count()}; load average before "
              f"{load_before[0]:.2f}, after {load_after[0]:.2f}",
              f"Medians over {args.rounds} rotated rounds of the median of {args.reps} evaluations (wall ms; CPU ms: "
              "user + system of the contender's process, all its threads); ratios: the median over rounds of the "
              "same round's ratio.", ""]
    text = "\n".join(header + lines)
    if args.out:
        out = Path(args.out)
        old = out.read_text() if out.exists() else ""
        title, _, rest = old.partition("\n")
        out.write_text(title + "\n\n" + text + "\n" + rest if title.startswith("# ") else text + "\n" + old)
    print(text)


if __name__ == "__main__":
    main()
