"""The Zarr affinity store: P in CSR on disk, readable by row range, in the AnnData sparse convention.

Layout of a store (a Zarr v3 group):

* attributes ``encoding-type: csr_matrix``, ``encoding-version: 0.1.0``, ``shape: [N, N]`` (AnnData's
  on-disk sparse convention, so ``anndata.io.read_elem`` / ``sparse_dataset`` open it as a CSR matrix);
* 1-D arrays ``data`` (float64), ``indices`` (int64), ``indptr`` (int64, N + 1), ``node_ids`` (int64, N),
  ``partitions`` (int64, K + 1 row boundaries);
* attribute ``scalemb``: ``{"kind": "affinity", "version", "provenance", "content_hash", "chunk_nnz"}``.

``data`` and ``indices`` are chunked by ``chunk_nnz`` non-zeros.  Partition boundaries balance the non-zeros
and sit on the first row that starts at or after a chunk boundary, so a partition's rows read whole chunks
of its own plus at most one chunk shared with each neighbour; ``read_rows(r0, r1)`` reads only the chunks
that hold rows ``[r0, r1)``.  Writing goes to a hidden sibling directory renamed into place at the end, so
a failed or interrupted write leaves nothing under the target name.
"""
import hashlib
from pathlib import Path

import numpy as np
import zarr

from .._version import __version__
from ..errors import InputError
from ..io.atomic import atomic_directory
from .affinity import Affinity, RowBlock

ENCODING = {"encoding-type": "csr_matrix", "encoding-version": "0.1.0"}
DEFAULT_CHUNK_NNZ = 1 << 20


def content_hash(indptr, indices, data, node_ids) -> str:
    """SHA-256 over the CSR arrays and node ids (little-endian bytes): identifies P's content."""
    digest = hashlib.sha256()
    for array, dtype in ((indptr, "<i8"), (indices, "<i8"), (data, "<f8"), (node_ids, "<i8")):
        digest.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
    return digest.hexdigest()


def default_chunk_nnz(nnz: int, n_partitions: int) -> int:
    """Non-zeros per chunk of ``data``/``indices``: about four chunks per partition, within [1024, 2**20]."""
    return int(min(DEFAULT_CHUNK_NNZ, max(1024, -(-nnz // (4 * n_partitions)))))


def write_store_metadata(group, indptr, node_ids, n_partitions: int, chunk_nnz: int, provenance: dict,
                         digest: str):
    """Write ``indptr``, ``node_ids``, ``partitions`` and the group attributes of a store whose ``data`` and
    ``indices`` arrays are already in ``group``."""
    group.create_array("indptr", data=indptr)
    group.create_array("node_ids", data=node_ids)
    group.create_array("partitions", data=balanced_partitions(indptr, n_partitions, chunk_nnz))
    n = int(indptr.size - 1)
    group.attrs.update({**ENCODING, "shape": [n, n],
                        "scalemb": {"kind": "affinity", "version": __version__, "chunk_nnz": int(chunk_nnz),
                                    "provenance": provenance, "content_hash": digest}})


def balanced_partitions(indptr: np.ndarray, n_partitions: int, chunk_nnz: int) -> np.ndarray:
    """Row boundaries ``0 = b_0 < ... < b_K = N`` splitting the non-zeros evenly, each inner boundary moved
    to the first row starting at or after the nearest chunk boundary."""
    n_rows = indptr.size - 1
    nnz = int(indptr[-1])
    n_partitions = max(1, min(n_partitions, n_rows))
    bounds = [0]
    for k in range(1, n_partitions):
        target = round(k * nnz / n_partitions / chunk_nnz) * chunk_nnz
        row = int(np.searchsorted(indptr, target, side="left"))
        row = min(max(row, bounds[-1] + 1), n_rows - (n_partitions - k))
        bounds.append(row)
    bounds.append(n_rows)
    return np.asarray(bounds, dtype=np.int64)


def write_affinity_store(path, affinity: Affinity, n_partitions: int = 8, chunk_nnz: int | None = None,
                         overwrite: bool = False, extra_arrays: dict | None = None) -> Path:
    """Write ``affinity`` as an affinity store at ``path`` (atomic: temporary sibling, then rename).
    ``extra_arrays``: further named 1-D per-point arrays stored alongside (e.g. ``labels``)."""
    extra_arrays = dict(extra_arrays or {})
    for name, array in extra_arrays.items():
        if name in ("data", "indices", "indptr", "node_ids", "partitions"):
            raise ValueError(f"extra array name {name!r} is reserved by the store layout")
        if np.shape(array)[:1] != (affinity.n_points,):
            raise ValueError(f"extra array {name!r} must have one entry per point ({affinity.n_points})")
    P = affinity.P
    chunk_nnz = default_chunk_nnz(int(P.nnz), n_partitions) if chunk_nnz is None else chunk_nnz
    indptr = P.indptr.astype(np.int64)
    indices = P.indices.astype(np.int64)
    with atomic_directory(path, overwrite) as tmp:
        group = zarr.open_group(store=str(tmp), mode="w", zarr_format=3)
        group.create_array("data", data=P.data, chunks=(chunk_nnz,))
        group.create_array("indices", data=indices, chunks=(chunk_nnz,))
        write_store_metadata(group, indptr, affinity.node_ids, n_partitions, chunk_nnz, affinity.provenance,
                             content_hash(indptr, indices, P.data, affinity.node_ids))
        for name, array in extra_arrays.items():
            group.create_array(name, data=np.ascontiguousarray(array))
    return Path(path)


def is_affinity_store(path) -> bool:
    """True if ``path`` is a directory holding a Zarr group with the CSR encoding attributes."""
    path = Path(path)
    if not (path / "zarr.json").is_file():
        return False
    try:
        attrs = zarr.open_group(store=str(path), mode="r").attrs
    except Exception:  # noqa: BLE001 - anything unreadable is simply not a store
        return False
    return attrs.get("encoding-type") == "csr_matrix"


class AffinityStore:
    """Read access to an affinity store; ``read_rows`` is what a worker calls for its partition."""

    def __init__(self, path):
        self.path = Path(path)
        if not is_affinity_store(self.path):
            raise InputError(self.path, "not a scalemb affinity store (Zarr group with encoding-type csr_matrix)")
        self._group = zarr.open_group(store=str(self.path), mode="r")
        attrs = dict(self._group.attrs)
        self.shape = tuple(attrs["shape"])
        meta = attrs.get("scalemb", {})
        self.provenance = dict(meta.get("provenance", {}))
        self.content_hash = meta.get("content_hash")
        self.chunk_nnz = meta.get("chunk_nnz")
        self.indptr = self._group["indptr"][:]
        if self.indptr.size != self.shape[0] + 1 or self.indptr[0] != 0:
            raise InputError(self.path, "indptr does not match the stored shape")

    @property
    def n_points(self) -> int:
        return int(self.shape[0])

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    @property
    def partitions(self) -> np.ndarray:
        return self._group["partitions"][:]

    @property
    def node_ids(self) -> np.ndarray:
        return self._group["node_ids"][:]

    def read_rows(self, r0: int, r1: int) -> RowBlock:
        """Rows ``[r0, r1)`` as a ``RowBlock`` (reads only the chunks of ``data``/``indices`` they span)."""
        if not 0 <= r0 <= r1 <= self.n_points:
            raise ValueError(f"row range [{r0}, {r1}) outside 0..{self.n_points}")
        lo, hi = int(self.indptr[r0]), int(self.indptr[r1])
        return RowBlock(r0, r1, self.indptr[r0:r1 + 1] - lo, self._group["indices"][lo:hi].astype(np.int64),
                        self._group["data"][lo:hi].astype(np.float64))

    def to_affinity(self, verify: bool = True) -> Affinity:
        """Load all of P (for the in-process executor); ``verify`` recomputes the content hash."""
        import scipy.sparse as sp

        block = self.read_rows(0, self.n_points)
        node_ids = self.node_ids
        if verify and self.content_hash is not None:
            if content_hash(self.indptr, block.indices, block.data, node_ids) != self.content_hash:
                raise InputError(self.path, "content hash mismatch: the store is corrupt or was modified")
        P = sp.csr_matrix((block.data, block.indices, self.indptr), shape=self.shape)
        provenance = dict(self.provenance, store=str(self.path), content_hash=self.content_hash)
        return Affinity(P, node_ids, provenance)
