"""One t-SNE/SNEST run on an affinity store with a given optimiser, printing every 10th iteration's KL, wall
time, layout extent and median radius, then the final KL and sampled NP@deg (the "Defaults at scale" runs of
benchmarks/results/scale.md); layouts are saved every 250 iterations (for ``scale.py --cap-layouts``).

    python benchmarks/scale_runs.py STORE NAME ITERATIONS '{"optimizer": "dbd", "exaggeration": 12, ...}'

JSON options: ``optimizer`` (default sd), ``repulsion``, ``model`` (tsne), ``init``, ``max_nodes`` (the FFT node
cap), anything else is passed to ``make_optimizer``.  Outputs go to ``--out-dir`` (env SCALEMB_RUNS_DIR, default
the current directory).
"""
import json
import os
import sys
import time

import numpy as np
from scalemb.affinity import AffinityStore
from scalemb.embedding import Embedder
from scalemb.metrics.quality import neighbourhood_preservation
from scalemb.optim import make_optimizer
from scalemb.repulsion import FFTParams

OUT = os.environ.get("SCALEMB_RUNS_DIR", ".")


def main():
    store, name, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
    opts = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    opt = opts.pop("optimizer", "sd")
    repulsion = opts.pop("repulsion", "auto")
    model = opts.pop("model", "tsne")
    init = opts.pop("init", "random")
    cap = opts.pop("max_nodes", None)
    optimizer = make_optimizer(opt, model, **opts)
    t0 = time.perf_counter()

    def stop(restart, it, kl, coords):
        extent = float(np.ptp(coords[:2], axis=1).max())
        radius = float(np.median(np.linalg.norm(coords[:2] - np.median(coords[:2], axis=1, keepdims=True), axis=0)))
        if it % 250 == 0 and it:
            np.save(f"{OUT}/{name}_{it}.npy", coords)
        if it % 10 == 0:
            print(f"{name} it {it} kl {kl:.4f} t {time.perf_counter() - t0:.1f}s extent {extent:.1f} "
                  f"median r {radius:.2f}", flush=True)
        return False

    embedder = Embedder(model=model, optimizer=optimizer, iterations=iters, repulsion=repulsion, init=init,
                        fft_params=FFTParams(max_nodes=cap) if cap else None)
    embedder.stop = stop
    embedder.fit(store)
    seconds = time.perf_counter() - t0
    P = AffinityStore(store).to_affinity().P
    np_deg = neighbourhood_preservation(P, embedder.embedding_, model=model, sample=20000)
    print(f"RESULT {name}: KL {embedder.kl_:.4f} iters {embedder.result_.iterations} time {seconds:.1f}s "
          f"NP {np_deg}", flush=True)
    np.save(f"{OUT}/{name}.npy", embedder.embedding_)


if __name__ == "__main__":
    main()
