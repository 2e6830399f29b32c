"""Issue 29: where one spectral-direction iteration's time goes at scale (t-SNE R^2, FFT repulsion).

Wraps the executor's ``evaluate``, ``set_curvature``, ``curvature_diagonal``, ``laplacian_matvec`` and
``factorize_curvature`` (and the returned preconditioner's ``solve``: the multigrid V-cycles) with timers, then runs
``--iterations`` iterations of each ``--candidates`` entry (``sd_scale.candidate`` specs: ``sd``, ``hybrid``,
``auto``, ``dbd``, each with ``:key=value`` overrides) from the same start: the layout after openTSNE's
exaggeration phase (delta-bar-delta with ``OPENTSNE_SCHEDULE`` for its 250 exaggerated iterations, from the default
random start, seed 0; cached in ``--workdir``), or ``--start`` (an ``.npy`` of ``(2, N)`` coordinates).  The
candidate's own exaggeration phase is switched off (``exaggeration_iterations=0``).

Per candidate one row: seconds per iteration, split into evaluations (count, seconds each), curvature updates,
solver set-up (factorisation / multigrid hierarchy), preconditioner applications, Laplacian products (count) and
the rest (CG's vector work, the line search's bookkeeping), the FFT grid's node count at the end, the extent and KL,
and the iteration's cost in evaluations (its seconds over the median evaluation's).

``python benchmarks/sd_profile.py --store P100000.zarr --candidates 'sd:max_point_step=2;sd' --iterations 10``
"""
import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from common import machine_description, markdown_table
from sd_scale import candidate, load

from scalemb.embedding import initial_coords
from scalemb.models.base import OPENTSNE_SCHEDULE
from scalemb.optim import make_optimizer
from scalemb.repulsion.grid import grid_for


class Timed:
    """Seconds and calls per executor method (and per preconditioner ``solve``)."""

    def __init__(self, ex):
        self.ex = ex
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)
        self.evaluation_seconds = []
        for name in ("evaluate", "set_curvature", "curvature_diagonal", "laplacian_matvec", "factorize_curvature"):
            setattr(ex, name, self._wrap(name, getattr(ex, name)))

    def _wrap(self, name, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            dt = time.perf_counter() - t0
            self.seconds[name] += dt
            self.calls[name] += 1
            if name == "evaluate":
                self.evaluation_seconds.append(dt)
            if name == "factorize_curvature":
                out.solve = self._wrap("precondition", out.solve)
            return out
        return timed

    def reset(self):
        self.seconds.clear()
        self.calls.clear()
        self.evaluation_seconds.clear()


def start_layout(store, make, workdir):
    path = Path(workdir) / f"start_{Path(store).name}.npy"
    if path.exists():
        return np.load(path)
    with make() as ex:
        coords = initial_coords(ex.n_points, 2, 0, np.random.default_rng(0))
        opts = {k: v for k, v in OPENTSNE_SCHEDULE.items() if k != "optimizer"}
        result = make_optimizer("dbd", "tsne", ex.n_points, **opts).optimize(ex, coords, 250)
    np.save(path, result.coords)
    return result.coords


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--candidates", default="sd")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--start", default=None, help=".npy of (2, N) start coordinates")
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--fft", default=None,
                        help="FFTParams for the executor as key=value,... (e.g. points=3,box_width=1.0: openTSNE's "
                             "node density); default: scalemb's")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    affinity, make = load(args.store)
    if args.fft:
        import json

        from scalemb.affinity.store import AffinityStore
        from scalemb.engine.local import LocalExecutor
        from scalemb.models import get_model
        from scalemb.repulsion.spec import FFTParams

        params = FFTParams(**{k: json.loads(v) for k, v in (kv.split("=") for kv in args.fft.split(","))})
        partitions = AffinityStore(args.store).partitions
        make = lambda: LocalExecutor(affinity, get_model("tsne"), 2, 0, partitions=partitions,  # noqa: E731
                                     repulsion="auto", fft_params=params)
    n = affinity.n_points
    start = np.load(args.start) if args.start else start_layout(args.store, make, args.workdir)
    rows = []
    header = ["candidate", "it.", "s / it.", "evaluations / it.", "s / evaluation (median)", "curvature s / it.",
              "set-up s / it. (count)", "precondition s / it. (count)", "Laplacian products / it. (s)",
              "rest s / it.", "it. cost in evaluations", "grid nodes (end)", "extent (end)", "KL start -> end"]
    for spec in args.candidates.split(";"):
        label, opts = candidate(spec)
        name = opts.pop("optimizer")
        opts["exaggeration_iterations"] = 0
        if name == "dbd":
            opts["momentum_switch"] = (0,)
        opt = make_optimizer(name, "tsne", n, **opts)
        with make() as ex:
            ex.evaluate(start)  # JIT, FFT plans
            ex.set_curvature(start)
            ex.laplacian_matvec(start)
            timer = Timed(ex)
            t0 = time.perf_counter()
            result = opt.optimize(ex, start, args.iterations)
            total = time.perf_counter() - t0
            grid = grid_for(ex.model, 2, np.ascontiguousarray(result.coords), ex.fft_params)
        k = max(result.iterations, 1)
        s, c = timer.seconds, timer.calls
        med = float(np.median(timer.evaluation_seconds))
        accounted = sum(s[x] for x in ("evaluate", "set_curvature", "curvature_diagonal", "laplacian_matvec",
                                       "factorize_curvature", "precondition"))
        kl0 = result.kl_history[0] if len(result.kl_history) else float("nan")
        rows.append([label, result.iterations, f"{total / k:.2f}", f"{c['evaluate'] / k:.2f}", f"{med:.3f}",
                     f"{(s['set_curvature'] + s['curvature_diagonal']) / k:.3f}",
                     f"{s['factorize_curvature'] / k:.2f} ({c['factorize_curvature']})",
                     f"{s['precondition'] / k:.2f} ({c['precondition']})",
                     f"{c['laplacian_matvec'] / k:.1f} ({s['laplacian_matvec'] / k:.3f})",
                     f"{(total - accounted) / k:.3f}", f"{total / k / med:.1f}", grid.n_nodes,
                     f"{np.ptp(result.coords[0]):.0f}", f"{kl0:.4f} -> {result.kl:.4f}"])
        print(markdown_table(header, rows[-1:]), flush=True)
    import os

    lines = [machine_description(), "", f"load average: {os.getloadavg()}; FFT: {args.fft or 'defaults'}", "",
             markdown_table(header, rows)]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
