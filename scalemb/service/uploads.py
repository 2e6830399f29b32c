"""Uploads to the service's data root (``PUT /uploads/{name}``): a raw body or the one file part of a
``multipart/form-data`` form, streamed to a temporary file, checked (size, emptiness, that the bytes match the
name's suffix) and moved into place atomically; a full disk leaves the previous upload in place."""
import hashlib
import os
import re
import time
from pathlib import Path

from fastapi import HTTPException, Request

from .jobs import disk_full

UPLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DISK_FULL = "insufficient storage: the data root's file system is full"


class _Sink:
    """Where an upload's bytes go: the temporary file (until the disk is full: the rest is still read, so the
    client gets the answer, not a reset), a running size checked against ``limit`` (413), the first 4 KiB for
    ``_sniff`` and the SHA-256."""

    def __init__(self, handle, limit: int):
        self.handle, self.limit = handle, limit
        self.size, self.full, self.head, self.digest = 0, None, bytearray(), hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise HTTPException(413, f"upload exceeds the limit of {self.limit} bytes")
        if len(self.head) < 4096:
            self.head.extend(chunk[:4096 - len(self.head)])
        self.digest.update(chunk)
        if self.full is None:
            try:
                self.handle.write(chunk)
            except OSError as exc:
                if not disk_full(exc):
                    raise
                self.full = exc

    def sync(self) -> None:
        """Flush to disk, or raise the full disk's error."""
        if self.full is not None:
            raise self.full
        self.handle.flush()
        os.fsync(self.handle.fileno())


async def _receive(name: str, request: Request, sink: _Sink) -> None:
    """Stream ``request``'s body into ``sink``: as is, or the one file part of a multipart form (400 for a
    form refused by ``_Multipart``)."""
    content_type = request.headers.get("content-type", "")
    form = _Multipart(content_type, sink.write) if content_type.lower().startswith("multipart/") else None
    async for chunk in request.stream():
        if form is None:
            sink.write(chunk)
        elif form.error is None:
            form.feed(chunk)
    if form is not None:
        form.finish()
        if form.error is not None:
            raise HTTPException(400, f"uploads/{name}: {form.error}")


async def store_upload(root: Path, name: str, request: Request, limit: int) -> dict:
    """Store ``request``'s body as ``root/uploads/NAME`` (at most ``limit`` bytes): ``schemas.Upload``'s fields,
    or ``HTTPException`` 400 (a bad name, an empty body, a form without exactly one file part, a body that does
    not match its name), 413 (over ``limit``) or 507 (a full disk: nothing stored)."""
    if not UPLOAD_NAME.fullmatch(name):
        raise HTTPException(400, f"upload name {name[:80]!r}: use letters, digits, '.', '_' and '-' only")
    target = Path(root) / "uploads" / name
    tmp = target.with_name(f".{name}.{time.monotonic_ns()}.part")
    try:
        with open(tmp, "wb") as handle:
            sink = _Sink(handle, limit)
            await _receive(name, request, sink)
            sink.sync()
        if sink.size == 0:
            raise HTTPException(400, f"uploads/{name}: the body is empty; nothing was stored")
        mismatch = _sniff(name, bytes(sink.head))
        if mismatch is not None:
            raise HTTPException(400, f"{mismatch}; nothing was stored")
        os.replace(tmp, target)
    except OSError as exc:
        if disk_full(exc):
            raise HTTPException(507, f"{DISK_FULL}: uploads/{name} was not stored; retry once space is "
                                     "freed") from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return {"input": f"uploads/{name}", "bytes": sink.size, "sha256": sink.digest.hexdigest()}


def remove_cut_off(root: Path, shared: bool) -> None:
    """Remove the temporary files of uploads cut off by a killed service; with a ``shared`` database (other
    replicas may be uploading into the same root) only those untouched for an hour."""
    for partial in (Path(root) / "uploads").glob(".*.part"):
        try:
            if not shared or partial.stat().st_mtime < time.time() - 3600:
                partial.unlink(missing_ok=True)
        except OSError:
            pass


def _sniff(name: str, head: bytes) -> str | None:
    """Why the first bytes of upload ``name`` do not match its name (a ``.gz`` that is not gzip, a ``.npy``
    without NumPy's magic, ...), or None."""
    magic = {".gz": (b"\x1f\x8b", "gzip"), ".npy": (b"\x93NUMPY", "a NumPy .npy file"),
             ".parquet": (b"PAR1", "a Parquet file"), ".zip": (b"PK", "a zip file")}
    for suffix, (start, what) in magic.items():
        if name.endswith(suffix) and not head.startswith(start):
            return f"uploads/{name}: the body is not {what} (its name ends in {suffix})"
    if head.startswith(b"--") and b"content-disposition: form-data" in head[:2048].lower():
        return (f"uploads/{name}: the body is a multipart form sent without Content-Type multipart/form-data; "
                "send it with curl -F 'file=@PATH' (or the raw file with --data-binary @PATH)")
    return None


class _Multipart:
    """A streaming ``multipart/form-data`` reader (python-multipart) passing the bytes of the one file part (a
    part with a filename, or named 'file') to ``write``; ``error`` says why the form is refused."""

    def __init__(self, content_type: str, write):
        from python_multipart.multipart import MultipartParser, parse_options_header

        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        self.error = None if boundary else "multipart upload without a boundary in its Content-Type"
        self.write, self.files, self._in_file = write, 0, False
        self._field, self._value, self._headers = b"", b"", {}
        self._options = parse_options_header
        callbacks = {"on_part_begin": self._begin, "on_header_field": self._header_field,
                     "on_header_value": self._header_value, "on_header_end": self._header_end,
                     "on_headers_finished": self._headers_finished, "on_part_data": self._data}
        self.parser = MultipartParser(boundary, callbacks) if boundary else None

    def _begin(self):
        self._headers, self._in_file = {}, False

    def _header_field(self, data, start, end):
        self._field += data[start:end]

    def _header_value(self, data, start, end):
        self._value += data[start:end]

    def _header_end(self):
        self._headers[self._field.lower()] = self._value
        self._field, self._value = b"", b""

    def _headers_finished(self):
        _, options = self._options(self._headers.get(b"content-disposition", b""))
        if b"filename" in options or options.get(b"name") == b"file":
            self.files += 1
            self._in_file = self.files == 1

    def _data(self, data, start, end):
        if self._in_file:
            self.write(data[start:end])

    def feed(self, chunk: bytes) -> None:
        if self.parser is not None:
            self.parser.write(chunk)

    def finish(self) -> None:
        if self.parser is None:
            return
        from python_multipart.multipart import MultipartState

        try:
            self.parser.finalize()
        except Exception as exc:  # noqa: BLE001 - a malformed form, whatever the parser says
            self.error = f"malformed multipart upload ({type(exc).__name__})"
        if self.error is None and self.parser.state != MultipartState.END:  # the parser does not check this
            self.error = "the multipart upload ends before its closing boundary (cut off?)"
            return
        if self.error is None and self.files != 1:
            self.error = (f"a multipart upload holds one file part (a part with a filename, or named 'file'); "
                          f"got {self.files}")

