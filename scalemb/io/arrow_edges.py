"""Parquet, Arrow IPC and Feather edge lists (``.parquet``, ``.arrow``, ``.feather``; pyarrow, the ``arrow`` extra):
``arrow_chunks`` yields their ``Edges`` batch by batch for ``scalemb.io.edgelist.parse_edge_chunks``, the one
reader of edge lists (whose docstring states the columns read, the id and weight rules and the limits)."""
from pathlib import Path

import numpy as np

from ..errors import InputError
from .edges import _DECODED_ROW_BYTES, _INT64_MAX, MAX_WEIGHT, MIN_WEIGHT, Edges, expansion_error, expansion_limit
from .nodeids import FORBIDDEN_RE2, id_problem, max_id_chars


def _require_pyarrow(path: Path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError(path, f"reading {path.suffix} edge lists needs pyarrow: pip install 'scalemb[arrow]'") \
            from None
    return pyarrow


def _arrow_batches(path: Path, chunk_rows: int):
    """``(columns, iterator of record batches)`` of a Parquet, Arrow IPC (file or stream) or Feather file: the
    columns read (``_arrow_columns``), string id columns dictionary-encoded as stored (a batch's rows then cost
    their codes, not copies of their ids).  A Parquet file whose rows or pages decode to more than
    ``expansion_limit`` is refused from its footer, before anything is decoded."""
    pa = _require_pyarrow(path)
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path)
            columns = _arrow_columns(path, meta.schema_arrow)
            limit, rows = expansion_limit(path), meta.metadata.num_rows
            decoded = sum(meta.metadata.row_group(k).total_byte_size for k in range(meta.metadata.num_row_groups))
            if rows * _DECODED_ROW_BYTES > limit or decoded > limit:
                raise expansion_error(path, f"{rows:,} rows ({decoded:,} bytes of pages) decode to")
            strings = [name for name in columns[:2] if _is_text(meta.schema_arrow.field(name).type)]
            reader = pq.ParquetFile(path, read_dictionary=strings)
            return columns, reader.iter_batches(batch_size=chunk_rows, columns=columns)
        import pyarrow.ipc as ipc

        try:
            reader = ipc.open_file(path)
            batches = (reader.get_batch(k) for k in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            reader = ipc.open_stream(path)
            batches = iter(reader)
        return _arrow_columns(path, reader.schema), batches
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, f"cannot read as a {path.suffix[1:]} table ({exc.__class__.__name__}: {exc})") \
            from None


def _is_text(kind) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _arrow_columns(path: Path, schema) -> list:
    names = list(schema.names)
    if "src" in names and "dst" in names:
        columns = ["src", "dst"] + (["weight"] if "weight" in names else [])
    elif len(names) not in (2, 3):
        raise InputError(path, f"columns {names}: expected 'src', 'dst' [, 'weight'] columns, or two or three "
                               "columns (endpoints, then the weight)")
    else:
        columns = names
    for name in columns:
        if names.count(name) > 1:
            raise InputError(path, f"column name {name!r} occurs {names.count(name)} times (columns {names}): "
                                   "rename the columns so that each is named once")
    return columns


def _arrow_integer_ids(path: Path, name: str, column, row0: int, check: bool) -> np.ndarray:
    ids = column.to_numpy(zero_copy_only=False)
    if check and ids.size and (ids.min() < 0 or (ids.dtype == np.uint64 and ids.max() > _INT64_MAX)):
        row = int(np.flatnonzero((ids < 0) | (ids > _INT64_MAX))[0])
        raise InputError(path, f"column {name!r}: node id {ids[row]} at row {row0 + row + 1} is outside "
                               f"0..{_INT64_MAX}")
    return ids.astype(np.int64)


def _dictionary(column):
    """``(dictionary as large_string, indices as int64)`` of a string or dictionary-of-strings column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    return column.dictionary.cast(pa.large_string()), column.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _arrow_string_ids(path: Path, columns: list, src, dst, row0: int, check: bool):
    """``(src codes, dst codes, names)`` of two string id columns through one dictionary; with ``check``, each
    distinct id of the batch passes ``id_problem`` (else ``InputError`` naming the column and row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    (d0, i0), (d1, i1) = _dictionary(src), _dictionary(dst)
    unified = pc.dictionary_encode(pa.concat_arrays([d0, d1]))
    table = unified.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    codes = (table[:len(d0)][i0], table[len(d0):][i1])
    # only the ids this batch uses (a Parquet dictionary is its row group's, every batch of it shares it)
    used = np.unique(np.concatenate(codes))
    codes = tuple(np.searchsorted(used, c) for c in codes)
    names = unified.dictionary.take(pa.array(used))
    if check:
        lengths, limit = pc.utf8_length(names), max_id_chars()
        if pc.min(lengths).as_py() == 0 or pc.max(lengths).as_py() > limit or \
                pc.any(pc.match_substring_regex(names, FORBIDDEN_RE2)).as_py():
            code, name = next((k, name) for k, name in enumerate(names.to_pylist()) if id_problem(name, limit))
            row, column = min((int(np.flatnonzero(ids == code)[0]), column)
                              for column, ids in zip(columns, codes) if (ids == code).any())
            raise InputError(path, f"column {column!r} has an empty node id at row {row0 + row + 1}" if not name
                             else f"column {column!r}, row {row0 + row + 1}: {id_problem(name, limit)}")
    return codes[0], codes[1], names.to_pylist()


def _arrow_ids(path: Path, columns: list, batch, row0: int, check: bool):
    """``(src, dst, names)`` of a batch: int64 ids and None, or string ids as codes into ``names``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    src, dst = (batch.column(name) for name in columns[:2])
    for name, column in zip(columns, (src, dst)):
        if check and column.null_count:
            row = int(pc.index(pc.is_null(column), True).as_py())
            raise InputError(path, f"column {name!r} has a null node id at row {row0 + row + 1}")
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        if not (pa.types.is_integer(kind) or _is_text(kind)):
            raise InputError(path, f"column {name!r} has type {column.type}: node ids must be integers or strings")
    text = [_is_text(column.type) for column in (src, dst)]
    if text[0] != text[1]:
        if not check:  # (first_lines of a file the checked reading accepted: never mixed)
            return src.to_numpy(zero_copy_only=False), dst.to_numpy(zero_copy_only=False), None
        raise InputError(path, f"column {columns[0]!r} holds {('integer', 'string')[text[0]]} ids and "
                               f"{columns[1]!r} {('integer', 'string')[text[1]]} ids: ids must be all integers or all "
                               "strings")
    if text[0]:
        return _arrow_string_ids(path, columns, src, dst, row0, check)
    src, dst = (c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in (src, dst))
    return _arrow_integer_ids(path, columns[0], src, row0, check), \
        _arrow_integer_ids(path, columns[1], dst, row0, check), None


def _arrow_weights(path: Path, name: str, column, row0: int) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise InputError(path, f"column {name!r} has type {column.type}: the weight must be a number")
    if column.null_count:
        row = int(pc.index(pc.is_null(column), True).as_py())
        raise InputError(path, f"column {name!r} has a null weight at row {row0 + row + 1}")
    weight = column.to_numpy(zero_copy_only=False).astype(np.float64)
    bad = ~((weight >= MIN_WEIGHT) & (weight <= MAX_WEIGHT))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InputError(path, f"weight {weight[row]} at row {row0 + row + 1} must be a finite positive number in "
                               f"[{MIN_WEIGHT:.3g}, {MAX_WEIGHT:.3g}]")
    return weight


def arrow_chunks(path: Path, chunk_rows: int, check: bool = True):
    """``Edges`` of the record batches of a Parquet / Arrow / Feather file; errors name the column and row.  The
    rows read may decode to at most ``expansion_limit`` bytes (16 per row), checked batch by batch."""
    columns, batches = _arrow_batches(path, chunk_rows)
    row0, limit = 0, expansion_limit(path)
    for batch in batches:
        if check and (row0 + batch.num_rows) * _DECODED_ROW_BYTES > limit:
            raise expansion_error(path, f"its first {row0 + batch.num_rows:,} rows decode to")
        src, dst, names = _arrow_ids(path, columns, batch, row0, check)
        weight = _arrow_weights(path, columns[2], batch.column(columns[2]), row0) if len(columns) == 3 \
            else np.ones(len(src))
        row0 += len(src)
        yield Edges(src, dst, weight, names)
