"""``scalemb embed --model eigenmap | kernel-eigenmap`` and the ``--init`` option of the SNE-family models.

``eigenmap``: the graph eigenmap of the input's affinity P (any embed input; local threads or Dask).
``kernel-eigenmap``: INPUT is a feature file (.npy, .csv, Zarr array; ``scalemb.affinity.knn.read_features``);
the result store holds the map itself (centres, bandwidth, coefficients) in its ``optimizer`` attributes, so
``scalemb.eigenmaps.kernel_eigenmap_from_result`` rebuilds it to place new points.
"""
import argparse

from ..errors import ScalembError

EIGENMAP_MODELS = ("eigenmap", "kernel-eigenmap")


def _init_value(text):
    from ..init import INIT_NAMES

    if text in INIT_NAMES or text.endswith(".npy"):
        return text
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(INIT_NAMES)} or a .npy file, got {text!r}")


def add_eigenmap_arguments(emb) -> None:
    """The embed parser's options for the start and for the eigenmap models."""
    from ..eigenmaps import CORRECTIONS, EIGENSOLVERS

    emb.add_argument("--init", type=_init_value, default="random", metavar="{random,spectral,pca,FILE.npy}",
                     help="sne/tsne/snest start: random (1e-4 N(0,1), default), spectral (graph eigenmap of P, "
                          "first coordinate std 1e-4), pca (kNN store built from a feature file), or an (N, space "
                          "[+ time]) .npy array in node order")
    emb.add_argument("--eigensolver", choices=EIGENSOLVERS, default="lanczos",
                     help="eigenmap: Lanczos (default) or LOBPCG on the row-block Laplacian products")
    emb.add_argument("--centres", type=int, default=64, help="kernel-eigenmap: landmark kernels (default 64)")
    emb.add_argument("--neighbors", type=int, default=12, help="kernel-eigenmap: kNN graph degree (default 12)")
    emb.add_argument("--bandwidth", type=float, default=None,
                     help="kernel-eigenmap: kernel sigma (default: median centre-to-nearest-centre distance)")
    emb.add_argument("--correction", choices=CORRECTIONS, default="reweighted",
                     help="kernel-eigenmap: correction of the translational eigenvector (default reweighted)")


def run_eigenmap(args) -> int:
    """Fit the eigenmap model of ``args.model`` and write its result store (refusing an existing --out)."""
    from pathlib import Path

    if Path(args.out).exists() and not args.overwrite:
        raise ScalembError(f"{args.out}: already exists (pass --overwrite to replace it)")
    if args.time not in (None, 0):
        raise ScalembError(f"model {args.model!r} has no time dimensions; use --time 0")
    if args.model == "eigenmap":
        from ..eigenmaps import Eigenmap

        result = Eigenmap(args.space, method=args.eigensolver, seed=args.seed, n_threads=args.threads,
                          scheduler=args.scheduler, workers=args.workers,
                          quiet=args.quiet).fit(args.input, args.graph_affinity).result_
        detail = ", ".join(f"{v:.3g}" for v in result.optimizer["eigenvalues"])
    else:
        if args.input is None:
            raise ScalembError("kernel-eigenmap needs a feature file as INPUT (.npy, .csv or a Zarr array)")
        if args.scheduler or args.workers:
            raise ScalembError("kernel-eigenmap runs in-process (its eigenproblem is centres x (D + 1) square)")
        from ..affinity.knn import read_features
        from ..eigenmaps import KernelEigenmap

        X = read_features(args.input)
        result = KernelEigenmap(args.space, n_centres=args.centres, n_neighbors=args.neighbors,
                                bandwidth=args.bandwidth, correction=args.correction, seed=args.seed,
                                n_jobs=args.threads).fit(X).to_result(source=args.input)
        detail = ", ".join(f"{v:.4f}" for v in result.optimizer["eigenvalues"])
    result.save(args.out, overwrite=args.overwrite)
    print(f"wrote {args.out}: {result.model} R^{result.space_dims}, N={result.embedding.shape[0]}, "
          f"eigenvalues {detail}, {result.wall_time:.1f} s")
    return 0
