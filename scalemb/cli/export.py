"""``scalemb export RUN.zarr --format {csv,parquet,npy,h5ad,zarr}``: a finished run's embedding in a format other
tools read (``scalemb.store.export``: the writer the service's downloads use too).

The file is written in a temporary directory next to ``--out`` and renamed into place: nothing half-written
(``scalemb.io.atomic.atomic_file``); a sidecar ``.OUT.scalemb`` records its hash, so ``--overwrite`` replaces
it later but never a file scalemb did not write.
"""
from pathlib import Path

from ..errors import ScalembError
from ..io.atomic import atomic_file, check_output_path
from ..store.export import FORMATS, SUFFIXES, check_format, write_embedding
from ..io.storage import is_url, local_input
from ..store.results import read_result


def add_parser(commands) -> None:
    exp = commands.add_parser("export", help="write a finished run's embedding as CSV, Parquet, .npy, .h5ad or a "
                                             "Zarr zip", description=__doc__.split("\n\n")[0])
    exp.add_argument("run", help="a finished embed --out store")
    exp.add_argument("--format", choices=FORMATS, required=True)
    exp.add_argument("--out", default=None, help="output file (default: RUN with the format's suffix)")
    exp.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    exp.add_argument("--quiet", action="store_true", help="no progress output")


def export(run, fmt: str, out=None, overwrite: bool = False) -> Path:
    """Write the result group ``run`` as ``fmt`` to ``out``; returns the path written."""

    check_format(fmt)

    if is_url(run) and not out:  # a run in object storage: the file is written here, named after it
        out = Path(run.rstrip("/").rsplit("/", 1)[-1]).with_suffix(SUFFIXES[fmt])
    run = Path(local_input(run))
    try:
        read_result(run)
    except (KeyError, FileNotFoundError, ValueError) as exc:
        raise ScalembError(f"{run}: not a finished scalemb run ({exc.__class__.__name__}: {exc})") from None
    out = check_output_path(Path(out) if out else run.with_suffix(SUFFIXES[fmt]), overwrite, kind="scalemb-file")
    with atomic_file(out, marked=True) as tmp:
        write_embedding(run, fmt, tmp)
    return out


def run(args) -> int:
    out = export(args.run, args.format, args.out, args.overwrite)
    print(f"wrote {out}")
    return 0
