"""``scalemb export RUN.zarr --format {csv,parquet,npy,h5ad}``: a finished run's embedding in a format other
tools read.

* ``csv`` / ``parquet``: one row per node, columns ``node_id``, ``s1 .. s{ds}``, ``t1 .. t{dt}`` (parquet needs
  pyarrow: ``pip install 'scalemb[arrow]'``);
* ``npy``: the ``N x (ds + dt)`` embedding only (rows in the run's ``node_ids`` order);
* ``h5ad``: ``scalemb.io.to_anndata`` written by anndata (embedding in ``.obsm['X_scalemb']``).

The file is written in a temporary directory next to ``--out`` and renamed into place: nothing half-written
(``scalemb.io.atomic.atomic_file``); a sidecar ``.OUT.scalemb`` records its hash, so ``--overwrite`` replaces
it later but never a file scalemb did not write.
"""
from pathlib import Path

import numpy as np

from ..errors import ScalembError
from ..io.atomic import atomic_file, check_output_path

FORMATS = ("csv", "parquet", "npy", "h5ad")


def add_parser(commands) -> None:
    exp = commands.add_parser("export", help="write a finished run's embedding as CSV, Parquet, .npy or .h5ad",
                              description=__doc__.split("\n\n")[0])
    exp.add_argument("run", help="a finished embed --out store")
    exp.add_argument("--format", choices=FORMATS, required=True)
    exp.add_argument("--out", default=None, help="output file (default: RUN with the format's suffix)")
    exp.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    exp.add_argument("--quiet", action="store_true", help="no progress output")


def _columns(arrays, attrs) -> dict:
    from ..io.results import column_names

    names = column_names(int(attrs["space_dims"]), int(attrs["time_dims"]))
    return {"node_id": arrays["node_ids"], **{n: arrays["embedding"][:, k] for k, n in enumerate(names)}}


def export(run, fmt: str, out=None, overwrite: bool = False) -> Path:
    """Write the result group ``run`` as ``fmt`` to ``out``; returns the path written."""
    from ..io.results import read_result, to_anndata

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    run = Path(run)
    try:
        arrays, attrs = read_result(run)
    except (KeyError, FileNotFoundError, ValueError) as exc:
        raise ScalembError(f"{run}: not a finished scalemb run ({exc.__class__.__name__}: {exc})") from None
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ScalembError("--format parquet needs pyarrow: pip install 'scalemb[arrow]'") from None
    out = check_output_path(Path(out) if out else run.with_suffix(f".{fmt}"), overwrite, kind="scalemb-file")
    with atomic_file(out, marked=True) as tmp:
        if fmt == "npy":
            with open(tmp, "wb") as f:
                np.save(f, arrays["embedding"])
        elif fmt == "h5ad":
            to_anndata(run).write_h5ad(tmp)
        else:
            import pandas as pd

            frame = pd.DataFrame(_columns(arrays, attrs))
            if fmt == "csv":
                frame.to_csv(tmp, index=False, float_format="%.17g")
            else:
                frame.to_parquet(tmp, index=False)
    return out


def run(args) -> int:
    out = export(args.run, args.format, args.out, args.overwrite)
    print(f"wrote {out}")
    return 0
