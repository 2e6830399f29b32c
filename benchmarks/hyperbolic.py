"""CO-SNE (``--model cosne``) on the paper's synthetic data and larger draws, against the public CO-SNE code and
t-SNE, plus GrQc from the graph and the per-iteration time local vs a 2-worker Dask cluster.

Data: five wrapped normal clusters in the 5-D Poincaré ball (means at the origin, 0.1 e1, -0.2 e2, 0.9 e3,
-0.9 e4; sigma 0.25 as the public code's ``scale``), 20 points each (the paper's set) and larger draws.

Per map: KL(P||Q) under CO-SNE's objective (the same P, gamma 0.1) for every layout in the ball, the norm loss
``H = mean (|x|² - |y|²)²``, the leave-one-out 1-NN error of the cluster labels (Poincaré distance in the disk,
Euclidean for t-SNE), and the Spearman correlation of input and output norms.  t-SNE: scalemb ``tsne`` on the
Euclidean kNN P of the same points (perplexity alike); its KL is under its own kernel and P (not comparable)
and H is not defined (not in the ball).  The public code (github.com/yunhuiguo/CO-SNE, PyTorch, run through
``cosne_public.py`` in a separate environment; it is not a scalemb dependency) uses its own dense P (perplexity
20) and its main.py settings; its output is projected to norm 1 - 1e-5 before measuring, since its projection
``y/|y| - 1e-5`` can leave points outside the ball.

    python benchmarks/hyperbolic.py --torch-python /tmp/cosne-torch/bin/python --public /tmp/cosne-public \\
        --sizes 100 1000 --time-n 10000 --grqc --out benchmarks/results/hyperbolic.md
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from scalemb.affinity import knn_affinity
from scalemb.affinity.hyperbolic import hyperbolic_affinity, poincare_distances, wrapped_normal_clusters
from scalemb.models.cosne import target_radii
from scalemb.embedding import Embedder
from scalemb.geometry import POINCARE
from scalemb.models.cosne import make_kernels, norm_loss

HERE = Path(__file__).resolve().parent  # last on the path (for `common`): `distributed` is the package, not the
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]  # benchmark of that name
from common import Report, machine_description, markdown_table  # noqa: E402

THREADS = len(os.sched_getaffinity(0))
GAMMA = 0.1
DEFAULT_LAMBDA2 = 0.01


def cosne_kl(affinity, Y, gamma=GAMMA) -> float:
    """KL(P||Q) of the rows of ``Y`` (N x d, in the ball) under CO-SNE's kernel (all pairs, exact)."""
    attraction, repulsion, _, _ = make_kernels(gamma)
    coords = np.ascontiguousarray(Y.T)
    P = affinity.P
    n = P.shape[0]
    A = np.zeros((n, coords.shape[0]))
    plogw = attraction(P.indptr.astype(np.int64), P.indices.astype(np.int64), P.data, 0,
                       np.ascontiguousarray(Y), coords.shape[0], A, True)
    z = repulsion(coords, coords.shape[0], 0, n, np.zeros_like(coords))
    return affinity.entropy_term() - plogw + np.log(z)


def one_nn_error(Y, labels, ball: bool) -> float:
    if ball:
        D = poincare_distances(Y, Y)
    else:
        D = np.sqrt(np.maximum(np.sum(Y * Y, 1)[:, None] + np.sum(Y * Y, 1)[None] - 2 * Y @ Y.T, 0))
    np.fill_diagonal(D, np.inf)
    return float(np.mean(labels[np.argmin(D, axis=1)] != labels))


def measure(name, Y, X, labels, affinity, ball, seconds, iterations):
    norms_x, norms_y = np.linalg.norm(X, axis=1), np.linalg.norm(Y, axis=1)
    row = [name, Y.shape[0]]
    row.append(f"{cosne_kl(affinity, Y):.4f}" if ball else "—")
    row.append(f"{norm_loss(np.ascontiguousarray(Y.T), affinity.radii)[0]:.4f}" if ball else "—")
    row.append(f"{one_nn_error(Y, labels, ball):.3f}")
    row.append(f"{spearmanr(norms_x, norms_y).statistic:.3f}")
    row.append(f"{np.max(norms_y):.4f}")
    row.append(iterations)
    row.append(f"{seconds:.1f}")
    return row


def run_scalemb(affinity, model, iterations, optimizer="auto", seed=0, model_params=None):
    start = time.perf_counter()
    embedder = Embedder(model=model, model_params=model_params, space_dims=2, seed=seed, iterations=iterations,
                        n_threads=THREADS, optimizer=optimizer,
                        repulsion="exact" if model == "cosne" else "auto").fit(affinity)
    return embedder.result_, time.perf_counter() - start


def run_public(args, X, n_iter):
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "x.npy", Path(tmp) / "y.npy"
        np.save(source, X)
        start = time.perf_counter()
        done = subprocess.run([args.torch_python, str(Path(__file__).parent / "cosne_public.py"), args.public,
                               str(source), str(out), str(n_iter)], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        Y = np.load(out)
    norms = np.linalg.norm(Y, axis=1)
    outside = int(np.sum(norms >= 1))
    return POINCARE.project(Y.T).T, seconds, outside


def synthetic(args, report):
    header = ["layout", "N", "KL (CO-SNE objective)", "H", "1-NN error", "Spearman ‖x‖ vs ‖y‖", "max ‖y‖",
              "iterations", "seconds"]
    rows = []
    notes = []
    for n in args.sizes:
        X, labels = wrapped_normal_clusters(n_per_cluster=n // 5, seed=args.seed)
        perplexity = 20.0 if n <= 100 else 30.0
        affinity = hyperbolic_affinity(X, perplexity=perplexity)
        runs = [(optimizer, DEFAULT_LAMBDA2) for optimizer in args.optimizers]
        runs += [("dbd", lam) for lam in args.lambda2 if lam != DEFAULT_LAMBDA2]
        for optimizer, lam in runs:
            result, seconds = run_scalemb(affinity, "cosne", args.iterations, optimizer, model_params={"lambda2": lam})
            rows.append(measure(f"scalemb cosne ({optimizer}, λ2 = {lam:g})", result.embedding, X,
                                labels, affinity, True, seconds, result.iterations))
            report(markdown_table(header, rows[-1:]).splitlines()[-1])
        tsne_aff = knn_affinity(X, perplexity=perplexity)
        result, seconds = run_scalemb(tsne_aff, "tsne", args.iterations)
        rows.append(measure("scalemb tsne (Euclidean P)", result.embedding, X, labels, affinity, False, seconds,
                            result.iterations))
        if args.torch_python and n <= args.public_max_n:
            Y, seconds, outside = run_public(args, X, 1000)
            rows.append(measure("public CO-SNE code", Y, X, labels, affinity, True, seconds, 1000))
            notes.append(f"N = {n}: the public code left {outside} of {n} points on or outside the unit ball")
    report(markdown_table(header, rows))
    for note in notes:
        report(f"\n{note}")


def per_iteration_time(args, report):
    """Seconds per evaluation (KL + gradient, exact all pairs) at N = ``args.time_n``: local threads and a Dask
    cluster of 2 single-thread worker processes on loopback."""
    from distributed import Client

    from scalemb.affinity.store import write_affinity_store
    from scalemb.engine import LocalExecutor
    from scalemb.engine.distributed import DaskExecutor
    from scalemb.models import get_model

    X, _ = wrapped_normal_clusters(n_per_cluster=args.time_n // 5, seed=args.seed)
    affinity = hyperbolic_affinity(X, perplexity=30.0)
    model = get_model("cosne")
    coords = POINCARE.initial(affinity.n_points, 2, np.random.default_rng(0), scale=0.3)
    rows = []
    with LocalExecutor(affinity, model, 2, 0, n_threads=THREADS, repulsion="exact") as ex:
        ex.evaluate(coords)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            local = ex.evaluate(coords, iteration=1000)
            times.append(time.perf_counter() - start)
    rows.append([f"local, {THREADS} threads", affinity.n_points, f"{np.median(times):.3f}", f"{local.kl:.6f}"])
    with tempfile.TemporaryDirectory() as tmp:
        store = write_affinity_store(Path(tmp) / "p.zarr", affinity)
        scheduler_file = Path(tmp) / "scheduler.json"
        procs = [subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                   "--scheduler-file", str(scheduler_file)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)]
        try:
            while not scheduler_file.exists() or not scheduler_file.read_text().strip():
                time.sleep(0.1)
            time.sleep(0.3)
            with Client(scheduler_file=str(scheduler_file)) as client:
                address = client.scheduler.address
                procs += [subprocess.Popen(["dask", "worker", address, "--nthreads", "1", "--no-nanny",
                                            "--no-dashboard", "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL) for _ in range(2)]
                client.wait_for_workers(2, timeout=120)
                with DaskExecutor(store, model, 2, 0, client, repulsion="exact") as ex:
                    ex.evaluate(coords)
                    times = []
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        remote = ex.evaluate(coords, iteration=1000)
                        times.append(time.perf_counter() - start)
            rows.append(["Dask, 2 workers x 1 thread", affinity.n_points, f"{np.median(times):.3f}",
                         f"{remote.kl:.6f}"])
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    report(markdown_table(["executor", "N", "seconds per evaluation (median)", "objective"], rows))


def grqc(args, report):
    from scalemb.datasets import grqc as load_grqc
    from scalemb.metrics import neighbourhood_preservation

    affinity = load_grqc()
    degree = np.diff(affinity.P.indptr)
    rows = []
    for scale in args.degree_scales:
        affinity.radii = np.tanh(scale * np.log(degree.max() / np.maximum(degree, 1)))
        result, seconds = run_scalemb(affinity, "cosne", args.grqc_iterations)
        Y = result.embedding
        np_deg = neighbourhood_preservation(affinity, Y, model="cosne", n_threads=THREADS)
        radius = np.linalg.norm(Y, axis=1)
        rows.append([f"c = {scale}", f"{np_deg.value:.4f}", f"{spearmanr(radius, degree).statistic:.3f}",
                     f"{cosne_kl(affinity, Y):.4f}", f"{norm_loss(np.ascontiguousarray(Y.T), affinity.radii)[0]:.4f}",
                     result.iterations, f"{seconds:.0f}"])
        report(markdown_table(["radius rule", "NP@deg", "Spearman radius vs degree", "KL", "H", "iterations",
                               "seconds"], rows[-1:]).splitlines()[-1])
    affinity.radii = None
    assert np.allclose(target_radii(affinity), np.tanh(0.5 * np.log(degree.max() / np.maximum(degree, 1))))
    report(markdown_table(["radius rule", "NP@deg", "Spearman radius vs degree", "KL", "H", "iterations",
                           "seconds"], rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--optimizers", nargs="*", default=["dbd", "gd"])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--lambda2", type=float, nargs="*", default=[0.1, 1.0],
                        help="further delta-bar-delta runs with these lambda2 (lambda1 = 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-python", default=None, help="python of an environment with torch (public code)")
    parser.add_argument("--public", default=None, help="the unpacked public CO-SNE repository")
    parser.add_argument("--public-max-n", type=int, default=100)
    parser.add_argument("--time-n", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grqc", action="store_true")
    parser.add_argument("--grqc-iterations", type=int, default=1000)
    parser.add_argument("--degree-scales", type=float, nargs="*", default=[0.25, 0.5, 1.0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = Report()
    report("# CO-SNE (`--model cosne`): synthetic hyperbolic clusters, GrQc, per-iteration time\n")
    report(machine_description())
    report(f"uname: {' '.join(os.uname())}; nproc {os.cpu_count()}; load average at start "
           f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    if args.sizes:
        report("## Synthetic clusters (5-D ball -> 2-D disk)\n")
        synthetic(args, report)
    if args.time_n:
        report(f"\n## Per-evaluation time, N = {args.time_n}, exact\n")
        per_iteration_time(args, report)
    if args.grqc:
        report("\n## GrQc from the graph: target radii from the degree, tanh(c log(k_max/k))\n")
        grqc(args, report)
    report(f"\nload average at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.out:
        Path(args.out).write_text(report.text())


if __name__ == "__main__":
    main()
