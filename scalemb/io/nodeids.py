"""Node ids: all integers (int64, as SNAP files number their nodes) or all strings (names, accessions).

In memory string ids are a NumPy unicode array (``<U``: fixed width, so ``np.unique``/``searchsorted`` sort them
in C); on disk (affinity stores, result groups) they are a Zarr v3 array of data type ``string`` with the
``vlen-utf8`` codec (variable-length UTF-8, from the zarr-extensions registry: zarr-python >= 3.1 writes it
without a warning, xarray opens it, zarrs (Rust) implements the codec).  Fixed-width ``<U`` arrays would be Zarr
``fixed_length_utf32``, for which zarr-python 3.1 warns that it has no Zarr v3 specification.  Content hashes
take integer ids as little-endian int64 bytes (the hashes of stores written before string ids existed are
unchanged) and string ids as their UTF-8 bytes with their lengths, so the width of a ``<U`` array never matters.

One validator for string ids from any source: ``id_problem`` (each distinct id: not empty, at most
``SCALEMB_MAX_ID_CHARS`` characters, no ``FORBIDDEN_RANGES`` character) and ``case_collision`` (the set: no two
ids with one ``fold_key``, Unicode case folding and NFC); ``check_node_ids`` applies both.
"""
import os
import re
import unicodedata

import numpy as np

from ..errors import InputError

# Longest node id (characters) read from a file: ids are held as fixed-width ``<U`` arrays, 4 bytes per character
# of the longest id for every node, so one very long id makes every id that long (a 100 KB id among 3000 ids of
# a 122 KB file took 7.3 GB).  Set SCALEMB_MAX_ID_CHARS to read longer ids.
DEFAULT_MAX_ID_CHARS = 256
MAX_ID_CHARS_ENV = "SCALEMB_MAX_ID_CHARS"
# Characters no id may hold: C0/C1 controls (NUL, tab, newline, DEL ...), the line and paragraph separators,
# the bidirectional marks, embeddings, overrides and isolates (an RTL override makes an id display as another
# text), the byte-order mark / zero-width no-break space, interlinear annotation marks, lone surrogates and the
# noncharacters U+FFFE/U+FFFF.  Such ids cannot be written to every output (h5ad, CSV) or read back as they were.
FORBIDDEN_RANGES = ((0x00, 0x1F), (0x7F, 0x9F), (0x061C, 0x061C), (0x200E, 0x200F), (0x2028, 0x202E),
                    (0x2066, 0x2069), (0xD800, 0xDFFF), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0xFFFE, 0xFFFF))
_FORBIDDEN = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in FORBIDDEN_RANGES) + "]")
# the same class in RE2 syntax (pyarrow.compute's regular expressions)
FORBIDDEN_RE2 = "[" + "".join(f"\\x{{{a:04X}}}-\\x{{{b:04X}}}" for a, b in FORBIDDEN_RANGES
                              if b < 0xD800 or a > 0xDFFF) + "]"  # (no surrogates in valid UTF-8)


def env_limit(name: str, default, convert, low, what: str):
    """A reader limit from the environment variable ``name`` (``default`` when unset): ``convert(text)``, refused
    with one line naming the variable unless ``low <= value < inf``."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = convert(text)
    except ValueError:
        value = float("nan")
    if not (low <= value < float("inf")):
        raise ValueError(f"{name} must be {what}, got {text!r}")
    return value


def max_id_chars() -> int:
    """The longest node id accepted (characters): ``SCALEMB_MAX_ID_CHARS`` or ``DEFAULT_MAX_ID_CHARS``."""
    return env_limit(MAX_ID_CHARS_ENV, DEFAULT_MAX_ID_CHARS, int, 1, "a positive integer")


def _shown(name: str) -> str:
    return repr(name if len(name) <= 40 else name[:40] + "...")


def id_problem(name: str, limit: int | None = None) -> str | None:
    """Why the string id ``name`` is refused (empty, longer than ``limit`` characters (default
    ``max_id_chars()``), or holding a ``FORBIDDEN_RANGES`` character), or None if it is accepted: the one check of
    the text of a string id, applied by every reader to every distinct id."""
    if not name:
        return "empty node id"
    limit = max_id_chars() if limit is None else limit
    if len(name) > limit:
        return (f"node id {_shown(name)} has {len(name)} characters, more than the limit of {limit} "
                f"({MAX_ID_CHARS_ENV})")
    match = _FORBIDDEN.search(name)
    if match:
        char = match.group()
        kinds = {"Cc": "a control character", "Cs": "a lone surrogate", "Cn": "a noncharacter"}
        what = unicodedata.name(char, kinds.get(unicodedata.category(char), "unnamed"))
        return (f"node id {_shown(name)} holds U+{ord(char):04X} ({what}): control, line-break and "
                "bidirectional-formatting characters are not allowed in ids")
    return None


def fold_key(name: str) -> str:
    """The key under which two ids are the same name typed two ways: full Unicode case folding of the
    canonical decomposition (``ß`` and ``SS``), the Turkic i's folded to ``i`` (``İ`` folds to ``i`` plus a combining
    dot, ``ı`` to itself: ``Alİce``, ``Alıce`` and ``Alice`` are one name in one locale or another), recomposed to
    NFC (so NFC and NFD spellings of ``é`` meet)."""
    folded = unicodedata.normalize("NFD", name).casefold().replace("i\u0307", "i").replace("\u0131", "i")
    return unicodedata.normalize("NFC", folded)


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
    """The first pair ``(a, b)`` of distinct string ids with the same ``fold_key`` (``'Alice'``, ``'alice'``;
    ``'straße'``, ``'STRASSE'``; NFC and NFD forms of one text), or None.

    Such ids almost always name one entity typed two ways; embedding them as two nodes splits its edges."""
    if not is_string_ids(ids) or ids.size < 2:
        return None
    names = np.asarray(ids).tolist()
    folded = [s.lower() if s.isascii() else fold_key(s) for s in names]
    order = sorted(range(len(names)), key=folded.__getitem__)  # Python strings: no fixed-width copy of the ids
    same = next((k for k in range(len(order) - 1) if folded[order[k]] == folded[order[k + 1]]), None)
    if same is None:
        return None
    return names[order[same]], names[order[same + 1]]


def check_case_collision(ids: np.ndarray, source, first_lines=None, unit: str = "lines") -> None:
    """``InputError`` naming two ids that differ only in case; ``first_lines(a, b)`` -> the line (``unit``: or
    row) of each, or None, names them."""
    pair = case_collision(ids)
    if pair is None:
        return
    a, b = pair
    where = first_lines(a, b) if first_lines else None
    lines = f" ({unit} {where[0]} and {where[1]})" if where and None not in where else ""
    if unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b):
        raise InputError(source, f"node ids {a!r} and {b!r} are one text in two Unicode normalisation forms "
                                 f"(NFC and NFD){lines}: they would be two nodes; write each node one way (NFC)")
    raise InputError(source, f"node ids {a!r} and {b!r} differ only in case{lines}: ids are case-sensitive, so "
                             "they would be two nodes; spell each node one way")


def check_node_ids(ids: np.ndarray, source, first_lines=None, unit: str = "lines") -> None:
    """The checks on a whole set of distinct ids (string ids: ``id_problem`` of each, then ``case_collision``);
    ``InputError`` naming the id and, through ``first_lines(a[, b])`` (-> lines or None), its line."""
    if not is_string_ids(ids):
        return
    limit = max_id_chars()
    for name in np.asarray(ids).tolist():
        problem = id_problem(name, limit)
        if problem is not None:
            where = first_lines(name) if first_lines else None
            raise InputError(source, problem + (f" ({unit[:-1]} {where[0]})" if where and where[0] else ""))
    check_case_collision(ids, source, first_lines, unit)
