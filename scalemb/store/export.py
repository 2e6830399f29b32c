"""A finished run's embedding in the formats other tools read: the one writer of ``scalemb export`` and of the
service's ``GET /jobs/{id}/embedding?format=...``.

* ``csv`` / ``parquet``: one row per node, columns ``node_id``, ``s1 .. s{ds}``, ``t1 .. t{dt}``
  (``scalemb.store.results.column_names``; CSV floats with 17 significant digits, so they read back exactly;
  parquet needs pyarrow: ``pip install 'scalemb[arrow]'``);
* ``npy``: the ``N x (ds + dt)`` float64 embedding only (rows in the run's ``node_ids`` order);
* ``h5ad``: ``scalemb.store.results.to_anndata`` written by anndata (embedding in ``.obsm['X_scalemb']``);
* ``zarr``: the result group (``scalemb.store.results`` layout: ``embedding``, ``node_ids``, ``kl_history`` and the
  run's attributes) in a Zarr v3 zip store, opened with ``zarr.open_group(zarr.storage.ZipStore(path,
  mode='r'))``.
"""
from pathlib import Path

import numpy as np

from ..errors import ScalembError
from .results import column_names, read_result, to_anndata, write_group

FORMATS = ("csv", "parquet", "npy", "h5ad", "zarr")
SUFFIXES = {"csv": ".csv", "parquet": ".parquet", "npy": ".npy", "h5ad": ".h5ad", "zarr": ".zarr.zip"}
MEDIA_TYPES = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet", "npy": "application/octet-stream",
               "h5ad": "application/x-hdf5", "zarr": "application/zip"}


def check_format(fmt: str) -> None:
    """``ValueError`` for an unknown format, ``ScalembError`` when the format's library is missing."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    needs = {"parquet": ("pyarrow", "arrow"), "h5ad": ("anndata", "anndata")}.get(fmt)
    if needs is not None:
        try:
            __import__(needs[0])
        except ImportError:
            raise ScalembError(f"format {fmt} needs {needs[0]}: pip install 'scalemb[{needs[1]}]'") from None


def columns(arrays: dict, attrs: dict) -> dict:
    """The table of ``csv``/``parquet``: ``node_id`` then one column per embedding component."""

    names = column_names(int(attrs["space_dims"]), int(attrs["time_dims"]))
    return {"node_id": arrays["node_ids"], **{n: arrays["embedding"][:, k] for k, n in enumerate(names)}}


def write_embedding(run, fmt: str, target) -> None:
    """Write result group ``run`` as ``fmt`` to the new file ``target`` (the caller makes it atomic)."""

    check_format(fmt)
    run, target = Path(run), Path(target)
    try:
        arrays, attrs = read_result(run)
    except (KeyError, FileNotFoundError, ValueError) as exc:
        raise ScalembError(f"{run}: not a finished scalemb run ({exc.__class__.__name__}: {exc})") from None
    if fmt == "npy":
        with open(target, "wb") as f:
            np.save(f, arrays["embedding"])
    elif fmt == "h5ad":
        to_anndata(run).write_h5ad(target)
    elif fmt == "zarr":
        import zarr

        store = zarr.storage.ZipStore(str(target), mode="w")
        try:
            write_group(zarr.open_group(store=store, mode="w", zarr_format=3), arrays, attrs)
        finally:
            store.close()
    else:
        import pandas as pd

        frame = pd.DataFrame(columns(arrays, attrs))
        if fmt == "csv":
            frame.to_csv(target, index=False, float_format="%.17g")
        else:
            frame.to_parquet(target, index=False)
