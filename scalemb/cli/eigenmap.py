"""``scalemb embed --model eigenmap | kernel-eigenmap``.

``eigenmap``: the graph eigenmap of the input's affinity P (any embed input; local threads or Dask).
``kernel-eigenmap``: INPUT is a feature file (.npy, .csv, Zarr array; ``scalemb.affinity.knn.read_features``);
the result store holds the map itself (centres, bandwidth, coefficients) in its ``optimizer`` attributes, so
``scalemb.eigenmaps.kernel_eigenmap_from_result`` rebuilds it to place new points.
"""
from ..errors import ScalembError

EIGENMAP_MODELS = ("eigenmap", "kernel-eigenmap")


def add_eigenmap_arguments(emb) -> None:
    """The embed parser's options for the eigenmap models."""
    from ..eigenmaps import CORRECTIONS, EIGENSOLVERS

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
    if args.time_dims not in (None, 0):
        raise ScalembError(f"model {args.model!r} has no time dimensions; use --time 0")
    if args.model == "eigenmap":
        from ..eigenmaps import Eigenmap

        result = Eigenmap(args.space_dims, method=args.eigensolver, random_state=args.random_state,
                          n_jobs=args.n_jobs, scheduler=args.scheduler, workers=args.workers,
                          verbose=not args.quiet).fit(args.input, args.graph_affinity).result_
        detail = ", ".join(f"{v:.3g}" for v in result.optimizer["eigenvalues"])
    else:
        if args.input is None:
            raise ScalembError("kernel-eigenmap needs a feature file as INPUT (.npy, .csv or a Zarr array)")
        if args.scheduler or args.workers:
            raise ScalembError("kernel-eigenmap runs in-process (its eigenproblem is centres x (D + 1) square)")
        from ..affinity.knn import read_features
        from ..eigenmaps import KernelEigenmap

        X = read_features(args.input)
        result = KernelEigenmap(args.space_dims, n_centres=args.centres, n_neighbors=args.neighbors,
                                bandwidth=args.bandwidth, correction=args.correction, random_state=args.random_state,
                                n_jobs=args.n_jobs).fit(X).to_result(source=args.input)
        detail = ", ".join(f"{v:.4f}" for v in result.optimizer["eigenvalues"])
    result.save(args.out, overwrite=args.overwrite)
    print(f"wrote {args.out}: {result.model} R^{result.space_dims}, N={result.embedding.shape[0]}, "
          f"eigenvalues {detail}, {result.wall_time:.1f} s")
    return 0
