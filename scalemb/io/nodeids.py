"""Node ids: all integers (int64, as SNAP files number their nodes) or all strings (names, accessions).

In memory string ids are a NumPy unicode array (``<U``: fixed width, so ``np.unique``/``searchsorted`` sort them
in C); on disk (affinity stores, result groups) they are a Zarr v3 array of data type ``string`` with the
``vlen-utf8`` codec (variable-length UTF-8, from the zarr-extensions registry: zarr-python >= 3.1 writes it
without a warning, xarray opens it, zarrs (Rust) implements the codec).  Fixed-width ``<U`` arrays would be Zarr
``fixed_length_utf32``, for which zarr-python 3.1 warns that it has no Zarr v3 specification.  Content hashes
take integer ids as little-endian int64 bytes (the hashes of stores written before string ids existed are
unchanged) and string ids as their UTF-8 bytes with their lengths, so the width of a ``<U`` array never matters.
"""
import numpy as np

from ..errors import InputError


def is_string_ids(ids) -> bool:
    """True if ``ids`` (an array) holds strings rather than integers (an object array: if its values are str)."""
    array = np.asarray(ids)
    if array.dtype.kind == "O":
        return array.size > 0 and all(isinstance(v, str) for v in array.ravel().tolist())
    return array.dtype.kind in "UT"


def _as_unicode(array: np.ndarray) -> np.ndarray:
    """A ``<U`` array as wide as the longest string (NumPy cannot cast ``StringDType`` to an unsized ``str``)."""
    if array.dtype.kind == "U":
        return array
    return np.array(array.tolist(), dtype=str) if array.size else np.empty(array.shape, dtype="<U1")


def as_node_ids(ids, source="node_ids") -> np.ndarray:
    """``ids`` as int64 or as a ``<U`` unicode array; ``ValueError`` for anything else (floats, bytes, mixed)."""
    array = np.asarray(ids)
    if array.dtype.kind in "iub":
        return array.astype(np.int64)
    if array.dtype.kind in "UT":
        return _as_unicode(array)
    if array.dtype.kind == "O":
        kinds = {type(v) for v in array.ravel().tolist()}
        if kinds <= {str}:
            return _as_unicode(array)
        if kinds and all(issubclass(k, (int, np.integer)) and not issubclass(k, bool) for k in kinds):
            return array.astype(np.int64)
        names = sorted(k.__name__ for k in kinds)
        raise ValueError(f"{source}: node ids must be all integers or all strings, got {names}")
    raise ValueError(f"{source}: node ids must be integers or strings, got dtype {array.dtype}")


def ids_bytes(ids) -> bytes:
    """The bytes a content hash takes for ``ids``: int64 little-endian, or per string its UTF-8 length (int64)
    followed by all the UTF-8 bytes."""
    array = as_node_ids(ids)
    if not is_string_ids(array):
        return np.ascontiguousarray(array, dtype="<i8").tobytes()
    encoded = [s.encode("utf-8") for s in array.tolist()]
    return np.fromiter(map(len, encoded), dtype="<i8", count=len(encoded)).tobytes() + b"".join(encoded)


def to_stored(ids) -> np.ndarray:
    """The array to write to Zarr: int64, or NumPy's variable-width ``StringDType`` (Zarr v3 ``string``)."""
    array = as_node_ids(ids)
    if is_string_ids(array):
        return array.astype(np.dtypes.StringDType())
    return np.ascontiguousarray(array, dtype=np.int64)


def from_stored(array) -> np.ndarray:
    """Ids read back from Zarr: int64 or ``<U``."""
    array = np.asarray(array)
    if is_string_ids(array):
        return _as_unicode(array)
    return array.astype(np.int64)


def case_collision(ids: np.ndarray):
    """The first pair ``(a, b)`` of distinct string ids equal after case folding (``'Alice'``, ``'alice'``), or None.

    Such ids almost always name one entity typed two ways; embedding them as two nodes splits its edges."""
    if not is_string_ids(ids) or ids.size < 2:
        return None
    folded = np.char.lower(ids)
    order = np.argsort(folded, kind="stable")
    same = np.flatnonzero(folded[order][1:] == folded[order][:-1])
    if same.size == 0:
        return None
    return str(ids[order[same[0]]]), str(ids[order[same[0] + 1]])


def check_case_collision(ids: np.ndarray, source, first_lines=None, unit: str = "lines") -> None:
    """``InputError`` naming two ids that differ only in case; ``first_lines(a, b)`` -> the line (``unit``: or
    row) of each, or None, names them."""
    pair = case_collision(ids)
    if pair is None:
        return
    a, b = pair
    where = first_lines(a, b) if first_lines else None
    lines = f" ({unit} {where[0]} and {where[1]})" if where and None not in where else ""
    raise InputError(source, f"node ids {a!r} and {b!r} differ only in case{lines}: ids are case-sensitive, so "
                             "they would be two nodes; spell each node one way")
