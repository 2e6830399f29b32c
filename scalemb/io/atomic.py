"""Atomic replacement of an output directory (a Zarr group): build under a hidden sibling, then rename.

A crash or an exception while writing never leaves a half-written group under the requested name; an
existing group is replaced only after the new one is complete (``overwrite``).
"""
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path

from ..errors import ScalembError


def check_output_path(path, overwrite: bool) -> Path:
    """``path`` as a ``Path`` once it is known to be writable: refuses an existing target without ``overwrite``
    and a missing parent directory."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ScalembError(f"{path}: already exists (pass overwrite=True / --overwrite to replace it)")
    if not path.parent.exists():
        raise ScalembError(f"{path.parent}: output directory does not exist")
    return path


def hidden_sibling(path: Path, tag: str) -> Path:
    """A fresh hidden name next to ``path`` (``.NAME.TAG-xxxxxxxx``)."""
    return path.parent / f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}"


@contextmanager
def atomic_directory(path, overwrite: bool = False):
    """Yield a temporary sibling directory path to write into; on normal exit it is renamed to ``path``
    (replacing an existing one when ``overwrite``), on an exception it is removed."""
    path = check_output_path(path, overwrite)
    tmp = hidden_sibling(path, "tmp")
    try:
        yield tmp
        if path.exists():
            old = hidden_sibling(path, "old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
