"""Embedding results as a Zarr v3 group, written atomically.

Layout: arrays ``embedding`` (N x (ds + dt) float64, space columns first), ``node_ids`` (int64, or Zarr v3
``string`` for string ids: ``scalemb.io.nodeids``),
``kl_history`` (float64, one exact KL per iteration of the best restart); attributes ``model``,
``space_dims``, ``time_dims``, ``iterations``, ``kl``, ``seed``, ``scalemb_version``, ``provenance`` and
``optimizer``; ``content_hash`` (below).  Each array names its dimensions (Zarr v3 ``dimension_names``:
``node_ids``, ``component``, ``iteration``), so ``xarray.open_zarr(path)`` opens the group as a Dataset indexed
by the node ids (``ds.embedding.sel(node_ids=...)``).  The group is written to a hidden sibling
directory and renamed into place, so a crash never leaves a half-written result under the requested name.

``content_hash`` has two forms, told apart by the attributes.  A result with ``blocked`` (``{"embedding": [dtype,
shape]}``) and ``row_blocks`` (``[[r0, r1], ...]``: consecutive row ranges covering all N rows, the affinity
store's partitions or the in-process executor's blocks) hashes the embedding as the SHA-256 digests of its row
blocks ``embedding[r0:r1]`` in order (``blocked_hash``), so processes that each hold some rows can write them and
report their digests, and the client composes the hash without ever holding the whole embedding; both executors
write this form over the same blocks, so the hash does not depend on where the run executed.  A result written
before (no ``blocked``) carries ``arrays_hash`` over the whole arrays.  ``read_result`` recomputes whichever form
the attributes name.
"""
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from .._version import __version__
from ..engine.held import rows_digest
from ..errors import ScalembError
from ..io.atomic import atomic_directory, recover_directory
from ..io.nodeids import from_stored, ids_bytes, is_string_ids, to_stored
from ..io.storage import local_input

_ARRAYS = ("embedding", "node_ids", "kl_history")
# the node axis is named after the node ids, so that xarray opens them as its index: ds.sel(node_ids=...)
DIMENSIONS = {"embedding": ("node_ids", "component"), "node_ids": ("node_ids",), "kl_history": ("iteration",)}


def _json_safe(value):
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def arrays_hash(arrays: dict) -> str:
    """SHA-256 over the named arrays (name, dtype, shape and bytes, in name order): a result's or a
    checkpoint version's content hash, checked on load."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        if is_string_ids(array):  # strings: independent of a <U array's width and of the in-memory dtype
            digest.update(f"{name}\0str\0{array.shape}\0".encode())
            digest.update(ids_bytes(array))
            continue
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


BLOCKED = ("embedding",)  # the arrays hashed by row blocks (``blocked_hash``)


def check_row_blocks(row_blocks, n: int) -> list:
    """``row_blocks`` as ``[[r0, r1], ...]`` if they are consecutive, non-empty row ranges covering ``0 .. n``
    (one ``[0, 0]`` block for no rows); ``ValueError`` otherwise."""
    try:
        blocks = [[int(a), int(b)] for a, b in row_blocks]
    except (TypeError, ValueError):
        raise ValueError(f"row_blocks {row_blocks!r} are not [[r0, r1], ...] pairs of integers") from None
    if n == 0 and blocks == [[0, 0]]:
        return blocks
    end = 0
    for a, b in blocks:
        if a != end or b <= a:
            raise ValueError(f"row_blocks {blocks[:4]}... do not cover rows 0 .. {n} in consecutive ranges")
        end = b
    if end != n or not blocks:
        raise ValueError(f"row_blocks cover rows 0 .. {end}, not 0 .. {n}")
    return blocks


def blocked_hash(arrays: dict, blocked: dict, row_blocks: list, digests: dict | None = None) -> str:
    """The blocked ``content_hash``: SHA-256 over ``arrays_hash`` of the arrays not in ``blocked``, the row
    blocks, and for each array of ``blocked`` (``{name: [dtype, shape]}``, in name order) its name, dtype and
    shape followed by the digests of its row blocks ``array[r0:r1]`` in block order (``engine.held.rows_digest``:
    SHA-256 of the C-ordered float64 rows).  ``digests`` (``{name: [hex, ...]}``): those digests as the
    processes that wrote the blocks reported them (``arrays`` then needs no entry for the blocked arrays)."""
    digest = hashlib.sha256(arrays_hash({k: v for k, v in arrays.items() if k not in blocked}).encode())
    digest.update(json.dumps([[int(a), int(b)] for a, b in row_blocks], separators=(",", ":")).encode())
    for name in sorted(blocked):
        dtype, shape = blocked[name]
        digest.update(f"{name}\0{dtype}\0{tuple(int(s) for s in shape)}\0".encode())
        parts = digests[name] if digests is not None and name in digests else \
            [rows_digest(arrays[name][r0:r1]) for r0, r1 in row_blocks]
        for part in parts:
            digest.update(bytes.fromhex(part))
    return digest.hexdigest()


def result_hash(arrays: dict, attrs: dict) -> str:
    """The ``content_hash`` of a stored result in the form its attributes name (module docstring)."""
    blocked = attrs.get("blocked")
    if blocked is None:
        return arrays_hash(arrays)
    if not isinstance(blocked, dict) or set(blocked) - set(arrays):
        raise ValueError(f"blocked {blocked!r} names arrays the result does not have")
    for name, spec in blocked.items():
        array = arrays[name]
        if not isinstance(spec, (list, tuple)) or len(spec) != 2 or array.dtype.str != spec[0] or \
                list(array.shape) != list(spec[1]):
            raise ValueError(f"{name} is {array.dtype.str} {array.shape}, its hash says {spec!r}")
    n = next(iter(arrays[name].shape[0] for name in blocked))
    return blocked_hash(arrays, blocked, check_row_blocks(attrs.get("row_blocks"), n))


def write_result(path, arrays: dict, attrs: dict, overwrite: bool = False, row_blocks=None) -> Path:
    """Write ``arrays`` (``embedding``, ``node_ids``, ``kl_history``) and ``attrs`` to a Zarr group at ``path``;
    the content hash over ``row_blocks`` (None: the blocks ``attrs`` names, else one block of all rows)."""
    missing = [name for name in _ARRAYS if name not in arrays]
    if missing:
        raise ValueError(f"result is missing arrays {missing}")
    with atomic_directory(path, overwrite) as tmp:
        write_group(zarr.open_group(store=str(tmp), mode="w", zarr_format=3), arrays, attrs, row_blocks)
    return Path(path)


def write_group(group, arrays: dict, attrs: dict, row_blocks=None) -> None:
    """The result's arrays and attributes (with their blocked content hash over ``row_blocks``: None, the blocks
    ``attrs`` names, else one block of all rows) into the empty Zarr v3 ``group``."""
    for name in _ARRAYS:
        data = to_stored(arrays[name]) if name == "node_ids" else np.ascontiguousarray(arrays[name])
        group.create_array(name, data=data, dimension_names=DIMENSIONS[name])
    group.attrs.update(_json_safe(hash_attrs({n: arrays[n] for n in _ARRAYS}, attrs, row_blocks)))


def hash_attrs(arrays: dict, attrs: dict, row_blocks=None, digests: dict | None = None) -> dict:
    """``attrs`` with the blocked content hash's attributes (``blocked``, ``row_blocks``, ``content_hash``).
    ``digests``: the blocked arrays' block digests as their writers reported them over ``row_blocks``; ``arrays``
    then holds only the others and ``attrs['blocked']`` gives the blocked arrays' dtype and shape."""
    attrs = {k: v for k, v in attrs.items() if k != "content_hash"}
    if digests is None:
        n = np.asarray(arrays["embedding"]).shape[0]
        if row_blocks is None:
            row_blocks = attrs.get("row_blocks") if attrs.get("blocked") is not None else None
        blocks = check_row_blocks([[0, n]] if row_blocks is None else row_blocks, n)
        blocked = {name: [np.asarray(arrays[name]).dtype.str, list(np.shape(arrays[name]))] for name in BLOCKED}
    else:
        blocks, blocked = check_row_blocks(row_blocks, attrs["blocked"]["embedding"][1][0]), attrs["blocked"]
    attrs.update(blocked=blocked, row_blocks=blocks)
    return {**attrs, "content_hash": blocked_hash(arrays, blocked, blocks, digests)}


def read_result(path) -> tuple[dict, dict]:
    """Read a result group: ``(arrays, attrs)`` with NumPy arrays; an object-storage URL from its local copy."""

    path = Path(local_input(path))
    recover_directory(path)
    if not path.exists():
        raise ScalembError(f"{path}: no such result")
    try:
        group = zarr.open_group(store=str(path), mode="r")
        arrays, attrs = {name: group[name][:] for name in _ARRAYS}, dict(group.attrs)
        arrays["node_ids"] = from_stored(arrays["node_ids"])
    except Exception as exc:  # noqa: BLE001 - anything unreadable is reported as such, in one line
        raise ScalembError(f"{path}: not a finished scalemb result ({type(exc).__name__})") from None
    recorded = attrs.get("content_hash")
    if recorded is not None:
        try:
            ok = result_hash(arrays, attrs) == recorded
        except ValueError as exc:
            raise ScalembError(f"{path}: the result's hash attributes are invalid ({exc})") from None
        if not ok:
            raise ScalembError(f"{path}: content hash mismatch: the result is corrupt or was modified")
    return arrays, attrs


def to_anndata(run):
    """An ``anndata.AnnData`` of a result (an ``EmbeddingResult`` or the path of a result group): one observation
    per node (``obs_names``: the node ids), the embedding in ``.obsm['X_scalemb']``, the run's attributes and KL
    history in ``.uns['scalemb']``.  Needs the ``anndata`` package."""
    import anndata
    import pandas as pd

    if isinstance(run, (str, Path)):
        arrays, attrs = read_result(run)
    else:
        arrays = {"embedding": run.embedding, "node_ids": run.node_ids, "kl_history": run.kl_history}
        attrs = _json_safe(run.attrs())
    obs = pd.DataFrame(index=pd.Index([str(v) for v in arrays["node_ids"]], name="node_id"))
    adata = anndata.AnnData(obs=obs)
    adata.obsm["X_scalemb"] = np.asarray(arrays["embedding"])
    adata.uns["scalemb"] = {**{k: attrs[k] for k in ("model", "space_dims", "time_dims", "kl", "iterations", "seed")
                               if attrs.get(k) is not None},
                            "kl_history": np.asarray(arrays["kl_history"]), "attrs_json": json.dumps(attrs)}
    return adata


def column_names(space_dims: int, time_dims: int) -> list:
    """Names of the embedding's columns: ``s1 .. s{ds}``, then ``t1 .. t{dt}``."""
    return [f"s{k + 1}" for k in range(space_dims)] + [f"t{k + 1}" for k in range(time_dims)]


@dataclass
class EmbeddingResult:
    """A finished embedding: ``embedding`` is N x (ds + dt), space columns first, rows in ``node_ids`` order."""

    embedding: np.ndarray
    node_ids: np.ndarray
    kl: float
    kl_history: np.ndarray
    model: str
    space_dims: int
    time_dims: int
    iterations: int
    seed: int
    restart_kls: list = field(default_factory=list)
    wall_time: float = 0.0
    provenance: dict = field(default_factory=dict)
    optimizer: dict = field(default_factory=dict)
    repulsion: dict = field(default_factory=dict)  # {"method": "exact"} or {"method": "fft", **FFTParams}
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # wall time at each kl_history entry
    model_params: dict = field(default_factory=dict)  # the model is get_model(model, **model_params)
    row_blocks: list | None = None  # the content hash's row blocks (None: one block of all rows)

    def attrs(self) -> dict:
        attrs = {"model": self.model, "space_dims": self.space_dims, "time_dims": self.time_dims,
                 "iterations": self.iterations, "kl": self.kl, "seed": self.seed,
                 "restarts": len(self.restart_kls), "restart_kls": self.restart_kls,
                 "wall_time_s": self.wall_time, "scalemb_version": __version__,
                 "provenance": self.provenance, "optimizer": self.optimizer, "repulsion": self.repulsion}
        if self.model_params:  # models without parameters keep the attributes they always had
            attrs["model_params"] = self.model_params
        return attrs

    def save(self, path, overwrite: bool = False) -> Path:
        """Write the result as a Zarr v3 group (the layout of this module)."""
        return write_result(path, {"embedding": self.embedding, "node_ids": self.node_ids,
                                   "kl_history": self.kl_history}, self.attrs(), overwrite=overwrite,
                            row_blocks=self.row_blocks)

    def stored_at(self, path) -> None:
        """The result now lives in the store ``path``: an embedding this object does not hold (None: the workers
        wrote it there) is read from it when first asked for (``embedding``), checked against its hash."""
        self.__dict__["_store"] = Path(path)

    @classmethod
    def load(cls, path) -> "EmbeddingResult":
        arrays, attrs = read_result(path)
        return cls(arrays["embedding"], arrays["node_ids"], attrs["kl"], arrays["kl_history"], attrs["model"],
                   attrs["space_dims"], attrs["time_dims"], attrs["iterations"], attrs["seed"],
                   attrs.get("restart_kls", []), attrs.get("wall_time_s", 0.0), attrs.get("provenance", {}),
                   attrs.get("optimizer", {}), attrs.get("repulsion", {}), model_params=attrs.get("model_params", {}),
                   row_blocks=attrs.get("row_blocks") if attrs.get("blocked") is not None else None)


def _embedding(self):
    """``embedding``: held, or read from the store it was written to (``stored_at``) on first use."""
    value = self.__dict__.get("_embedding")
    if value is None and self.__dict__.get("_store") is not None:
        value = self.__dict__["_embedding"] = read_result(self.__dict__["_store"])[0]["embedding"]
    return value


def _set_embedding(self, value) -> None:
    self.__dict__["_embedding"] = value


# a property beside the dataclass field (set after the class is built, so the field keeps no default): a result
# whose embedding the workers wrote into its store reads it only when asked (``scalemb embed --out`` never does)
EmbeddingResult.embedding = property(_embedding, _set_embedding)
