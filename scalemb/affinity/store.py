"""The Zarr affinity store: P in CSR on disk, readable by row range, in the AnnData sparse convention.

Layout of a store (a Zarr v3 group):

* attributes ``encoding-type: csr_matrix``, ``encoding-version: 0.1.0``, ``shape: [N, N]`` (AnnData's
  on-disk sparse convention, so ``anndata.io.read_elem`` / ``sparse_dataset`` open it as a CSR matrix);
* 1-D arrays ``data`` (float64), ``indices`` (int64), ``indptr`` (int64, N + 1), ``node_ids`` (N: int64, or
  Zarr v3 ``string`` for string ids, see ``scalemb.io.nodeids``),
  ``partitions`` (int64, K + 1 row boundaries); ``halo`` (int64, K: per partition the distinct columns outside
  its rows, the coordinate rows a worker holding it needs besides its own; checked where a partition is read);
* optional ``radii`` (float64, N): per-point target radii (``Affinity.radii``);
* attribute ``scalemb``: ``{"kind": "affinity", "version", "provenance", "content_hash", "chunk_nnz"}``; a store
  written in another point order than the input's (``write_affinity_store(point_order=...)``) records it as
  ``provenance["point_order"]`` (name, method, parts, partitioner version), its ``node_ids`` renumbered alike.

``data`` and ``indices`` are chunked by ``chunk_nnz`` non-zeros.  By default the partitions are the
data-determined layout every executor uses (``layout_partitions``: equal row ranges, a function of N only);
partitions asked for by number balance the non-zeros and sit on the first row that starts at or after a chunk
boundary, so a partition's rows read whole chunks
of its own plus at most one chunk shared with each neighbour; ``read_rows(r0, r1)`` reads only the chunks
that hold rows ``[r0, r1)``.  Writing goes to a hidden sibling directory renamed into place at the end, so
a failed or interrupted write leaves nothing under the target name.
"""
import functools
import hashlib
from pathlib import Path

import numpy as np
import zarr

from .._version import __version__
from ..errors import InputError
from ..io.atomic import atomic_directory, file_sha256
from ..io.nodeids import from_stored, ids_bytes, to_stored
from .affinity import Affinity, RowBlock, check_radii, row_partition
from ..io.storage import local_input
from .ordering import check_point_order, store_point_order

ENCODING = {"encoding-type": "csr_matrix", "encoding-version": "0.1.0"}
DEFAULT_CHUNK_NNZ = 1 << 20


def content_hash(indptr, indices, data, node_ids, radii=None) -> str:
    """SHA-256 over the CSR arrays (little-endian bytes), the node ids (``scalemb.io.nodeids.ids_bytes``) and,
    if the store has them, the target radii: identifies P's content (stores without radii keep the hash they
    always had)."""
    digest = hashlib.sha256()
    for array, dtype in ((indptr, "<i8"), (indices, "<i8"), (data, "<f8")):
        digest.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
    digest.update(ids_bytes(node_ids))
    _hash_radii(digest, radii)
    return digest.hexdigest()


def _hash_radii(digest, radii) -> None:
    if radii is not None:
        digest.update(b"radii")
        digest.update(np.ascontiguousarray(radii, dtype="<f8").tobytes())


# The row-block layout every executor evaluates P in is a function of the data only (the number of points),
# never of the thread or worker count, so that a seed gives the same map on any machine (floating-point sums are
# taken block by block in block order): one block below LAYOUT_ONE_BLOCK_BELOW points, else LAYOUT_MIN_BLOCKS
# blocks of equal row counts (the exact repulsion, the dominant cost, costs the same per row), one more per
# LAYOUT_BLOCK_ROWS rows beyond, at most LAYOUT_MAX_BLOCKS: enough blocks that a pool of a few threads (or
# workers) stays evenly busy whatever their number.  A store written with the default partitions has this layout.
LAYOUT_ONE_BLOCK_BELOW = 1024
LAYOUT_MIN_BLOCKS = 16
LAYOUT_BLOCK_ROWS = 16384
LAYOUT_MAX_BLOCKS = 64


def layout_block_count(n_rows: int) -> int:
    """Number of row blocks of the data-determined layout for ``n_rows`` points (see ``LAYOUT_*``)."""
    if n_rows < LAYOUT_ONE_BLOCK_BELOW:
        return 1
    return int(min(LAYOUT_MAX_BLOCKS, max(LAYOUT_MIN_BLOCKS, -(-n_rows // LAYOUT_BLOCK_ROWS))))


def layout_partitions(n_rows: int) -> np.ndarray:
    """Row boundaries ``0 = b_0 < ... < b_K = N`` of the data-determined layout: ``layout_block_count`` ranges
    of near-equal length."""
    bounds = [r0 for r0, _ in row_partition(n_rows, layout_block_count(n_rows))] + [n_rows]
    return np.asarray(bounds, dtype=np.int64)


def default_chunk_nnz(nnz: int, n_partitions: int) -> int:
    """Non-zeros per chunk of ``data``/``indices``: about four chunks per partition, within [1024, 2**20]."""
    return int(min(DEFAULT_CHUNK_NNZ, max(1024, -(-nnz // (4 * n_partitions)))))


def halo_size(indices: np.ndarray, r0: int, r1: int, n_points: int) -> int:
    """Distinct columns outside ``[r0, r1)`` among a row block's column ``indices``: the coordinate rows a worker
    holding the block needs beyond its own (its halo) for the attractive term and the Laplacian products."""
    seen = np.zeros(n_points, dtype=bool)
    seen[indices] = True
    return int(np.count_nonzero(seen)) - int(np.count_nonzero(seen[r0:r1]))


def partition_halos(group, indptr: np.ndarray, partitions: np.ndarray) -> np.ndarray:
    """``halo_size`` of every partition, reading ``group['indices']`` one partition at a time."""
    n = int(indptr.size - 1)
    return np.array([halo_size(group["indices"][int(indptr[a]):int(indptr[b])], int(a), int(b), n)
                     for a, b in zip(partitions[:-1], partitions[1:])], dtype=np.int64)


def _halo_mismatch(k, r0, r1, recorded, found) -> str:
    return (f"partition {k} (rows {r0}..{r1 - 1}): the halo metadata says {recorded} columns outside it, its rows "
            f"touch {found}: the partitions do not match the halo metadata")


def write_store_metadata(group, indptr, node_ids, n_partitions: int | None, chunk_nnz: int, provenance: dict,
                         digest: str, partitions: np.ndarray | None = None):
    """Write ``indptr``, ``node_ids``, ``partitions`` (with each partition's ``halo`` size) and the group
    attributes of a store whose ``data`` and ``indices`` arrays are already in ``group``.  ``partitions``: row
    boundaries to record as they are (a graph partitioner's parts), else from ``n_partitions``."""
    group.create_array("indptr", data=indptr)
    group.create_array("node_ids", data=to_stored(node_ids))
    if partitions is None:
        partitions = (layout_partitions(indptr.size - 1) if n_partitions is None
                      else balanced_partitions(indptr, n_partitions, chunk_nnz))
    partitions = np.asarray(partitions, dtype=np.int64)
    group.create_array("partitions", data=partitions)
    group.create_array("halo", data=partition_halos(group, indptr, partitions))
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


def write_affinity_store(path, affinity: Affinity, n_partitions: int | None = None, chunk_nnz: int | None = None,
                         overwrite: bool = False, extra_arrays: dict | None = None, point_order: str = "given") -> Path:
    """Write ``affinity`` as an affinity store at ``path`` (atomic: temporary sibling, then rename);
    ``n_partitions``: that many partitions balanced by non-zeros; None: the data-determined layout
    (``layout_partitions``) every run uses without a store, so that runs on the store and on ``affinity`` agree.
    ``extra_arrays``: further named 1-D per-point arrays stored alongside (e.g. ``labels``).

    ``point_order`` (``scalemb.affinity.ordering.STORE_POINT_ORDERS``): ``'given'`` keeps ``affinity``'s order;
    ``'rcm'`` renumbers the points in reverse Cuthill-McKee order; ``'partition'`` so that the parts of a graph
    partitioner (METIS, optional dependency pymetis) are the store's partitions, which keeps each partition's halo
    small (``store_point_order``).  Rows, columns, node ids, radii and ``extra_arrays`` all follow the order (so
    results, indexed by node id, map back to the input's points); the provenance records it as ``point_order``
    and the content hash covers the renumbered arrays and ids."""

    check_point_order(point_order)
    extra_arrays = dict(extra_arrays or {})
    for name, array in extra_arrays.items():
        if name in ("data", "indices", "indptr", "node_ids", "partitions", "halo", "radii"):
            raise ValueError(f"extra array name {name!r} is reserved by the store layout")
        if np.shape(array)[:1] != (affinity.n_points,):
            raise ValueError(f"extra array {name!r} must have one entry per point ({affinity.n_points})")
    order, partitions, info = store_point_order(affinity.P, point_order, layout_partitions(affinity.n_points),
                                                n_partitions)
    if order is not None:
        affinity = affinity.permuted(order)
        extra_arrays = {name: np.asarray(array)[order] for name, array in extra_arrays.items()}
    if point_order != "given":
        affinity.provenance = dict(affinity.provenance, point_order=info)
    P = affinity.P
    if chunk_nnz is None:
        chunk_nnz = default_chunk_nnz(int(P.nnz), n_partitions or layout_block_count(P.shape[0]))
    indptr = P.indptr.astype(np.int64)
    indices = P.indices.astype(np.int64)
    with atomic_directory(path, overwrite) as tmp:
        group = zarr.open_group(store=str(tmp), mode="w", zarr_format=3)
        group.create_array("data", data=P.data, chunks=(chunk_nnz,))
        group.create_array("indices", data=indices, chunks=(chunk_nnz,))
        write_store_metadata(group, indptr, affinity.node_ids, n_partitions, chunk_nnz, affinity.provenance,
                             content_hash(indptr, indices, P.data, affinity.node_ids, affinity.radii), partitions)
        if affinity.radii is not None:
            group.create_array("radii", data=affinity.radii)
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


def _checked_end(indptr, path, step: int = 1 << 22) -> int:
    """``indptr[-1]`` of a stored row-pointer array after checking, ``step`` entries at a time, that it never
    decreases (``InputError`` naming ``path`` if it does)."""
    size = indptr.shape[0]
    for lo in range(0, size - 1, step):
        if np.any(np.diff(indptr[lo:min(size, lo + step + 1)].astype(np.int64)) < 0):
            raise InputError(path, "indptr is not non-decreasing")
    return int(indptr[size - 1])


class AffinityStore:
    """Read access to an affinity store; ``read_rows`` is what a worker calls for its partition."""

    def __init__(self, path):
        self.path = Path(local_input(path))  # an object-storage URL: its local copy
        if not is_affinity_store(self.path):
            raise InputError(self.path, "not a scalemb affinity store (Zarr group with encoding-type csr_matrix)")
        self._group = zarr.open_group(store=str(self.path), mode="r")
        attrs = dict(self._group.attrs)
        self.shape = tuple(attrs["shape"])
        meta = attrs.get("scalemb", {})
        self.provenance = dict(meta.get("provenance", {}))
        self.content_hash = meta.get("content_hash")
        self.chunk_nnz = meta.get("chunk_nnz")
        try:
            stored = self._group["indptr"]
            lengths = {name: self._group[name].shape for name in ("indices", "data")}
        except KeyError as exc:
            raise InputError(self.path, f"the store has no array {exc}") from None
        n = self.shape[0] if len(self.shape) == 2 else -1
        if len(self.shape) != 2 or self.shape[0] != self.shape[1] or n < 1:
            raise InputError(self.path, f"shape {list(self.shape)} is not square N x N")
        if len(stored.shape) != 1 or stored.shape[0] != n + 1 or int(stored[0]) != 0:
            raise InputError(self.path, "indptr does not match the stored shape")
        self._nnz = _checked_end(stored, self.path)
        if lengths["indices"] != (self._nnz,) or lengths["data"] != (self._nnz,):
            raise InputError(self.path, f"indices {lengths['indices']} / data {lengths['data']} do not hold "
                                        f"indptr[-1] = {self._nnz} entries")

    @functools.cached_property
    def indptr(self) -> np.ndarray:
        """P's row pointers, read when first asked for (``__init__`` checks them streaming and keeps only nnz: a
        Dask client opening the store holds no O(N) array; ``read_rows`` reads the rows' pointers only)."""
        return self._group["indptr"][:].astype(np.int64)

    @property
    def n_points(self) -> int:
        return int(self.shape[0])

    @property
    def nnz(self) -> int:
        return self._nnz

    @property
    def partitions(self) -> np.ndarray:
        """Row boundaries; a store written without them (e.g. by AnnData) gets balanced ones."""
        if "partitions" not in self._group:
            return balanced_partitions(self.indptr, 8, self.chunk_nnz or default_chunk_nnz(self.nnz, 8))
        bounds = self._group["partitions"][:].astype(np.int64)
        if bounds.ndim != 1 or bounds.size < 2 or bounds[0] != 0 or bounds[-1] != self.n_points or \
                np.any(np.diff(bounds) < 0):
            raise InputError(self.path, "partitions are not row boundaries 0 <= ... <= N")
        if "halo" in self._group and self._group["halo"].shape != (bounds.size - 1,):
            raise InputError(self.path, f"halo metadata has shape {self._group['halo'].shape} but the store has "
                                        f"{bounds.size - 1} partitions: the partitions do not match it")
        return bounds

    @property
    def halo(self) -> np.ndarray | None:
        """Per partition, the coordinate rows outside it that its rows' columns touch (``halo_size``); None for a
        store written without them (older scalemb, AnnData)."""
        if "halo" not in self._group:
            return None
        self.partitions  # noqa: B018 - checks the shape against the partitions
        return self._group["halo"][:].astype(np.int64)

    def _check_halos(self, indices: np.ndarray) -> None:
        """Every partition's recorded halo against all of P's column ``indices`` (in-process runs)."""
        halo = self.halo
        if halo is None:
            return
        bounds, indptr = self.partitions, self.indptr
        for k, (r0, r1) in enumerate(zip(bounds[:-1], bounds[1:])):
            found = halo_size(indices[indptr[r0]:indptr[r1]], int(r0), int(r1), self.n_points)
            if found != halo[k]:
                raise InputError(self.path, _halo_mismatch(k, r0, r1, halo[k], found))

    def read_partition(self, r0: int, r1: int) -> RowBlock:
        """``read_rows(r0, r1)`` for a partition, checked against the store's halo metadata (where a worker reads
        it): ``InputError`` when the rows' halo is not the recorded one."""
        block = self.read_rows(r0, r1)
        halo = self.halo
        if halo is not None:
            bounds = self.partitions
            match = np.flatnonzero((bounds[:-1] == r0) & (bounds[1:] == r1))
            if match.size == 0:
                raise InputError(self.path, f"rows {r0}..{r1 - 1} are not a partition of the store")
            k = int(match[0])
            found = halo_size(block.indices, r0, r1, self.n_points)
            if found != halo[k]:
                raise InputError(self.path, _halo_mismatch(k, r0, r1, halo[k], found))
        return block

    @property
    def node_ids(self) -> np.ndarray:
        """Node ids; a store written without them (e.g. by AnnData) numbers its rows 0..N-1."""
        if "node_ids" not in self._group:
            return np.arange(self.n_points, dtype=np.int64)
        ids = self._group["node_ids"][:]
        if ids.shape != (self.n_points,):
            raise InputError(self.path, f"node_ids has shape {ids.shape}, expected ({self.n_points},)")
        if ids.dtype.kind not in "iuUTO":
            raise InputError(self.path, f"node_ids has dtype {ids.dtype}; expected integers or strings")
        return from_stored(ids)

    @functools.cached_property
    def radii(self) -> np.ndarray | None:
        """Per-point target radii (``Affinity.radii``), None if the store has none (read once)."""
        if "radii" not in self._group:
            return None
        try:
            return check_radii(self._group["radii"][:], self.n_points, "stored radii")
        except ValueError as exc:
            raise InputError(self.path, str(exc)) from None

    def read_rows(self, r0: int, r1: int) -> RowBlock:
        """Rows ``[r0, r1)`` as a ``RowBlock`` (reads only the chunks of ``data``/``indices`` they span)."""
        if not 0 <= r0 <= r1 <= self.n_points:
            raise ValueError(f"row range [{r0}, {r1}) outside 0..{self.n_points}")
        pointers = self.indptr[r0:r1 + 1] if "indptr" in self.__dict__ else \
            self._group["indptr"][r0:r1 + 1].astype(np.int64)
        lo, hi = int(pointers[0]), int(pointers[-1])
        indices = self._group["indices"][lo:hi].astype(np.int64)
        data = self._group["data"][lo:hi].astype(np.float64)
        # structural checks of the rows read (cheap, per partition, where it is read): bad indices would make
        # the numba kernels read out of bounds
        if indices.size and (indices.min() < 0 or indices.max() >= self.n_points):
            raise InputError(self.path, f"rows {r0}..{r1 - 1}: column index out of range 0..{self.n_points - 1}")
        if data.size and not (np.all(np.isfinite(data)) and data.min() >= 0):
            raise InputError(self.path, f"rows {r0}..{r1 - 1}: P has negative or non-finite entries")
        return RowBlock(r0, r1, pointers - lo, indices, data)

    def verify_hash(self, step: int = 1 << 22) -> None:
        """Recompute the recorded content hash streaming (``step`` entries at a time: the caller never holds
        P); ``InputError`` on a mismatch.  Stores without a hash are not checked here (``read_rows`` checks
        their structure)."""
        if self.content_hash is None:
            return
        digest = hashlib.sha256()
        for name, dtype, size in (("indptr", "<i8", self.n_points + 1), ("indices", "<i8", self.nnz),
                                  ("data", "<f8", self.nnz)):
            array = self._group[name]
            for lo in range(0, size, step):
                digest.update(np.ascontiguousarray(array[lo:lo + step], dtype=dtype).tobytes())
        digest.update(ids_bytes(self.node_ids))
        _hash_radii(digest, self.radii)
        if digest.hexdigest() != self.content_hash:
            raise InputError(self.path, "content hash mismatch: the store is corrupt or was modified")

    def to_affinity(self, verify: bool = True) -> Affinity:
        """Load all of P (for the in-process executor); ``verify`` recomputes the content hash."""
        import scipy.sparse as sp

        block = self.read_rows(0, self.n_points)
        node_ids = self.node_ids
        if verify and self.content_hash is not None:
            if content_hash(self.indptr, block.indices, block.data, node_ids, self.radii) != self.content_hash:
                raise InputError(self.path, "content hash mismatch: the store is corrupt or was modified")
        if verify:
            self._check_halos(block.indices)
        P = sp.csr_matrix((block.data, block.indices, self.indptr), shape=self.shape)
        provenance = dict(self.provenance, store=str(self.path), content_hash=self.content_hash)
        return Affinity(P, node_ids, provenance, self.radii)


def check_source(provenance: dict) -> None:
    """``InputError`` if the file the run's affinity was read from (``source``) no longer has the SHA-256 recorded
    when the run read it (``source_sha256``; ``scalemb.embedding``), as ``resume`` refuses a changed input."""

    source, recorded = provenance.get("source"), provenance.get("source_sha256")
    if source and recorded and Path(source).is_file() and file_sha256(source) != recorded:
        raise InputError(source, "changed since the run (content hash differs); refusing to use it as the run's "
                                 "input")


def check_store(store, provenance: dict) -> None:
    """``InputError`` if the affinity store ``store`` no longer has the content hash the run recorded."""
    recorded = provenance.get("content_hash")
    if recorded and AffinityStore(store).content_hash not in (None, recorded):
        raise InputError(store, "the affinity store changed since the run (content hash differs)")
