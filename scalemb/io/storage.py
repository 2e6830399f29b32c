"""Object storage for inputs and outputs: fsspec URLs (``s3://bucket/key``; s3fs: ``pip install 'scalemb[s3]'``).

This module is the one place that tells a URL from a local path (``is_url``) and the one place that reads or
writes objects; everything else in scalemb works on local paths:

* **Inputs** (``local_input``, called by ``scalemb.run.resolve`` and the commands that read an input): an object
  (an edge list, a feature file) or a prefix (an affinity store or a result: a Zarr group, the objects below it)
  is downloaded once into a local cache, ``$SCALEMB_CACHE_DIR`` (default ``~/.cache/scalemb/objects``), as
  ``<identity>/<name>``.  The identity is the SHA-256 of the URL and of every object's relative key, size and
  ETag, so a changed object is a new copy and an unchanged one is read from the cache; the listing is taken again
  after the download and a difference (the object changed while it was read) is an error, so a copy is always one
  version.  The copy is made in a temporary directory and renamed into place.
* **Outputs** (``output_target``, called by ``scalemb.run.run`` and the commands that write a store): a group is
  written on local disk with scalemb's usual atomic machinery (``scalemb.io.atomic``), then published
  (``publish``).  S3 has no rename, so publishing is copy-then-publish-marker: the complete group is uploaded
  under the hidden sibling prefix ``.NAME.tmp-<host>-<pid>-<hex>/`` (its first object the marker
  ``.scalemb-temporary``), a marker ``NAME/.scalemb-publishing`` naming it is written, every object but the root
  ``zarr.json`` is copied (server side) to ``NAME/``, the root ``zarr.json`` last -- a Zarr v3 group does not
  exist without it, so readers see the old group, no group, or the new complete group, never a mix -- and then
  the marker and the temporary prefix are deleted.  An existing ``NAME`` is replaced only with ``overwrite`` and
  only when it is a group scalemb wrote (its root ``zarr.json`` carries a scalemb marker,
  ``scalemb.io.atomic.is_scalemb_output``'s rule); it is unpublished (root ``zarr.json`` deleted first) before
  the new objects are copied.
* **Recovery** (``recover``, before every write and read of an output URL): a ``NAME/`` with a
  ``.scalemb-publishing`` marker and no root ``zarr.json`` is an interrupted publish: if the temporary it names
  is complete (it holds its root ``zarr.json``) the publish is finished from it, else the objects under ``NAME/``
  (all scalemb's: the marker says so) are deleted.  A temporary prefix whose marker names this host and a process
  that no longer runs is deleted.  Nothing without one of scalemb's markers is ever deleted.

Credentials and endpoint come from the standard AWS settings (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``); ``configure(endpoint_url=...)``
(``scalemb --s3-endpoint URL``) overrides the endpoint.  Every failure is one ``ScalembError`` line naming the
URL (``InputError`` for inputs): a malformed URL, a missing bucket or object, no credentials, access denied, an
unreachable endpoint.
"""
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError, ScalembError
from .markers import has_marker

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)$")
TEMP_MARKER = ".scalemb-temporary"
PUBLISHING = ".scalemb-publishing"
ROOT_META = "zarr.json"
_SKIP = (".scalemb.lock", TEMP_MARKER)  # a local group's lock and marker files are not part of what is published
_settings = {"endpoint_url": None}


def is_url(value) -> bool:
    """Whether ``value`` is an object-storage URL (``scheme://...``, ``file://`` excepted): the one test."""
    if not isinstance(value, str):
        return False
    match = _URL.match(value)
    return match is not None and match.group(1).lower() != "file"


def configure(endpoint_url: str | None = None) -> None:
    """The S3 endpoint to use (``--s3-endpoint``); None: the AWS settings' (``AWS_ENDPOINT_URL``...)."""
    _settings["endpoint_url"] = endpoint_url or None


def endpoint() -> str | None:
    """The S3 endpoint URL in use (None: AWS's own)."""
    return _settings["endpoint_url"] or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def split(url: str) -> tuple[str, str]:
    """``(protocol, bucket/key)`` of ``url``; ``ScalembError`` for a URL that names no bucket or a bad key."""
    match = _URL.match(url) if isinstance(url, str) else None
    if match is None:
        raise ScalembError(f"{url}: not an object-storage URL (s3://BUCKET/KEY)")
    protocol, rest = match.group(1).lower(), match.group(2).rstrip("/")
    bucket = rest.split("/", 1)[0]
    if protocol in ("s3", "s3a") and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
        raise ScalembError(f"{url}: not a valid S3 URL (s3://BUCKET/KEY; bucket names are 3-63 lower-case letters, "
                           "digits, '.' and '-')")
    if any(part in ("", ".", "..") for part in rest.split("/")):
        raise ScalembError(f"{url}: empty, '.' or '..' path components are refused")
    return protocol, rest


_filesystems = {}  # (protocol, endpoint, credentials' identity, pid) -> filesystem: a client costs ~0.1 s of CPU
_filesystems_lock = threading.Lock()


def _credentials_key() -> str:
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
             "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
    return hashlib.sha256("\0".join(os.environ.get(n, "") for n in names).encode()).hexdigest()


def filesystem(url: str):
    """``(fsspec filesystem, bucket/key)`` for ``url`` (listings never cached: other writers change them).  One
    filesystem per protocol, endpoint and credentials in a process, shared by its threads."""
    protocol, path = split(url)
    key = (protocol, endpoint(), _credentials_key(), os.getpid())
    with _filesystems_lock:
        if key not in _filesystems:
            _filesystems[key] = _new_filesystem(url, protocol)
        return _filesystems[key], path


def _new_filesystem(url: str, protocol: str):
    try:
        import fsspec

        options = {}
        if protocol in ("s3", "s3a"):
            import s3fs  # noqa: F401 - the error below names the extra

            for name in ("botocore", "aiobotocore", "s3fs"):  # "Found credentials in ..." is not news
                if logging.getLogger(name).level == logging.NOTSET:
                    logging.getLogger(name).setLevel(logging.WARNING)
            options = {"use_listings_cache": False, "skip_instance_cache": True}
            if endpoint():
                options["client_kwargs"] = {"endpoint_url": endpoint()}
        return fsspec.filesystem(protocol, **options)
    except ImportError:
        raise ScalembError(f"{url}: object storage needs s3fs: pip install 'scalemb[s3]'") from None
    except ValueError as exc:  # an unknown protocol
        raise ScalembError(f"{url}: {exc}") from None


def describe(url: str, exc: BaseException) -> tuple[str, str]:
    """``(kind, reason)``: why ``exc`` (raised by a call about ``url``) failed, in one line, and the kind of
    failure (``missing``, ``denied``, ``credentials``, ``unreachable`` or ``other``: what the service answers)."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    bucket = split(url)[1].split("/", 1)[0]
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return "credentials", ("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) "
                               "in the environment")
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionError") or \
            isinstance(exc, ConnectionError):
        return "unreachable", f"cannot reach the object store at {endpoint() or 'the AWS endpoint'} ({text})"
    if isinstance(exc, FileNotFoundError):
        if "specified bucket does not exist" in text.lower() or "nosuchbucket" in text.lower():
            return "missing", f"no such bucket {bucket!r}"
        return "missing", "no such object"
    if isinstance(exc, PermissionError):
        return "denied", f"access denied ({text})"
    return "other", f"object storage error: {name}: {text}"


@contextmanager
def errors(url: str, error=ScalembError):
    """Turn what the object store raises about ``url`` into one ``error`` line naming it (its ``kind``
    attribute: ``describe``'s kind)."""
    try:
        yield
    except (ScalembError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - botocore, aiohttp and fsspec errors all become one line
        kind, reason = describe(url, exc)
        raised = InputError(url, reason) if error is InputError else error(f"{url}: {reason}")
        raised.kind = kind
        raise raised from None


def within(url: str, prefix: str) -> bool:
    """Whether object URL ``url`` lies under the URL ``prefix`` (same protocol, key below the prefix)."""
    (protocol, path), (base_protocol, base) = split(url), split(prefix)
    return protocol == base_protocol and (path == base or path.startswith(base + "/"))


def join(prefix: str, *keys: str) -> str:
    """``prefix/key/...`` (the keys checked as ``split`` checks a URL)."""
    url = "/".join([prefix.rstrip("/"), *keys])
    split(url)
    return url


def check_prefix(url: str) -> str:
    """``url`` as a storage prefix once its bucket answers (``ScalembError`` naming it otherwise)."""
    fs, path = filesystem(url)
    with errors(url):
        _check_bucket(url, fs, path, bucket_only=True)
    return url.rstrip("/")


# ---------------------------------------------------------------------------------------------------- inputs


def cache_dir() -> Path:
    """Where downloaded inputs are kept (``$SCALEMB_CACHE_DIR``, else ``$XDG_CACHE_HOME/scalemb/objects``)."""
    configured = os.environ.get("SCALEMB_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scalemb" / "objects"


def listing(fs, path: str) -> dict:
    """``{relative key: (size, ETag)}`` of the object ``path`` ('' for itself) or of every object below it."""
    info = fs.info(path)
    if info.get("type") == "directory":
        found = fs.find(path, detail=True)
        return {key[len(path):].lstrip("/"): (int(v.get("size") or 0), str(v.get("ETag", v.get("etag", ""))))
                for key, v in found.items() if v.get("type") != "directory"}
    return {"": (int(info.get("size") or 0), str(info.get("ETag", info.get("etag", ""))))}


def _identity(url: str, objects: dict) -> str:
    digest = hashlib.sha256(f"scalemb-object-1\0{url}\0".encode())
    for key in sorted(objects):
        size, etag = objects[key]
        digest.update(f"{key}\0{size}\0{etag}\0".encode())
    return digest.hexdigest()


def download(url: str, target: Path, error=InputError) -> dict:
    """Download the object or prefix ``url`` to the new local path ``target`` (a file, or a directory of the
    objects below the prefix); returns the listing it copied (``listing``).  An interrupted download leaves
    ``target`` partial: callers write it inside a temporary directory."""
    fs, path = filesystem(url)
    with errors(url, error):
        objects = listing(fs, path)
        if not objects:
            raise FileNotFoundError(url)
        if list(objects) == [""]:
            fs.get_file(path, str(target))
        else:
            target.mkdir()
            keys = sorted(objects)
            for key in keys:
                (target / key).parent.mkdir(parents=True, exist_ok=True)
            fs.get([f"{path}/{key}" for key in keys], [str(target / key) for key in keys])  # concurrent
        if listing(fs, path) != objects:
            raise InputError(url, "changed while it was being read; try again")
    return objects


def local_input(source, cache: Path | None = None):
    """``source`` itself if it is not a URL; else the local copy of the object or prefix it names (module
    docstring), downloaded now unless the cache holds this version.  ``InputError`` naming the URL."""
    if not is_url(source):
        return source
    fs, path = filesystem(source)
    with errors(source, InputError):
        objects = listing(fs, path)
    if not objects:
        raise InputError(source, "no such object (an empty prefix)")
    name = path.rstrip("/").rsplit("/", 1)[-1]
    folder = Path(cache or cache_dir())
    target = folder / _identity(source, objects) / name
    if target.exists():
        return str(target)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
    try:
        download(source, tmp / name)
        target.parent.mkdir(exist_ok=True)
        try:
            os.rename(tmp / name, target)
        except OSError:  # another process made the same copy first
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


# --------------------------------------------------------------------------------------------------- outputs


def _meta_attrs(fs, path: str) -> dict | None:
    """The attributes of the group whose root ``zarr.json`` is ``path/zarr.json``; None if it has none."""
    try:
        meta = json.loads(fs.cat_file(f"{path}/{ROOT_META}"))
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    attrs = meta.get("attributes", {}) if isinstance(meta, dict) else {}
    return attrs if isinstance(attrs, dict) else {}


def is_scalemb_output(url: str) -> bool:
    """Whether ``url`` is a published group whose root attributes carry a scalemb marker."""
    fs, path = filesystem(url)
    with errors(url):
        attrs = _meta_attrs(fs, path)
    return attrs is not None and has_marker(attrs)


def _exists(fs, path: str) -> bool:
    return bool(fs.exists(path)) or bool(fs.find(path, maxdepth=1))


def _check_bucket(url: str, fs, path: str, bucket_only: bool = False) -> None:
    bucket = path.split("/", 1)[0]
    try:
        if hasattr(fs, "call_s3"):
            fs.call_s3("head_bucket", Bucket=bucket)  # raises what is wrong (credentials, endpoint), not False
        elif not fs.exists(bucket):
            raise FileNotFoundError(bucket)
    except FileNotFoundError:
        raise FileNotFoundError(f"The specified bucket does not exist: {bucket}") from None
    if path == bucket and not bucket_only:
        raise ScalembError(f"{url}: names a bucket; give a key for the output (s3://BUCKET/NAME.zarr)")


def check_output(url: str, overwrite: bool) -> str:
    """``url`` once it may be written: its bucket exists; an existing object or group there is refused without
    ``overwrite``, and refused with it unless scalemb wrote it.  ``ScalembError`` naming the URL."""
    fs, path = filesystem(url)
    with errors(url):
        _check_bucket(url, fs, path)
        recover(url)
        if _exists(fs, path):
            if not overwrite:
                raise ScalembError(f"{url}: already exists (pass overwrite=True / --overwrite to replace it)")
            if not is_scalemb_output(url):
                raise ScalembError(f"{url}: exists and was not written by scalemb (no scalemb marker); refusing to "
                                   "overwrite it: remove it yourself or choose another output")
    return url


def _parent_and_name(path: str) -> tuple[str, str]:
    parent, _, name = path.rstrip("/").rpartition("/")
    return parent, name


def _marker_text() -> bytes:
    return f"scalemb {socket.gethostname()} {os.getpid()}\n".encode()


def publish(local: Path, url: str, overwrite: bool = False) -> str:
    """Publish the complete local group directory ``local`` at ``url`` (module docstring: temporary prefix,
    publishing marker, objects, root ``zarr.json`` last); returns ``url``."""
    local = Path(local)
    if not (local / ROOT_META).is_file():
        raise ScalembError(f"{local}: not a Zarr group (no {ROOT_META}); nothing published")
    check_output(url, overwrite)
    fs, path = filesystem(url)
    parent, name = _parent_and_name(path)
    tmp = f"{parent}/.{name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*")
                   if p.is_file() and p.name not in _SKIP)
    with errors(url):
        try:
            fs.pipe_file(f"{tmp}/{TEMP_MARKER}", _marker_text())
            rest = [key for key in files if key != ROOT_META]
            if rest:  # concurrent uploads; the root zarr.json last: the temporary is complete once it is there
                fs.put([str(local / key) for key in rest], [f"{tmp}/{key}" for key in rest])
            fs.put_file(str(local / ROOT_META), f"{tmp}/{ROOT_META}")
            _publish_from(fs, tmp, path, overwrite)
        finally:
            _remove_prefix(fs, tmp)
    return url


def _publish_from(fs, tmp: str, path: str, overwrite: bool) -> None:
    """Copy the complete temporary group ``tmp`` to ``path``: publishing marker, old group unpublished (root
    first) and removed, objects, root ``zarr.json``, marker removed."""
    keys = sorted(k[len(tmp):].lstrip("/") for k in fs.find(tmp))
    keys = [k for k in keys if k != TEMP_MARKER]
    if _exists(fs, path) and not overwrite and not fs.exists(f"{path}/{PUBLISHING}"):
        raise ScalembError(f"{path}: appeared while the output was written; not replaced")
    # the marker first: from here on whatever is under path is scalemb's until the new root is in place
    fs.pipe_file(f"{path}/{PUBLISHING}", json.dumps({"from": tmp}).encode())
    if fs.exists(f"{path}/{ROOT_META}"):
        fs.rm_file(f"{path}/{ROOT_META}")  # unpublished: no group is visible until the new root is copied
    old = [key for key in fs.find(path) if not key.endswith(f"/{PUBLISHING}")]
    if old:
        fs.rm(old)
    rest = [key for key in keys if key != ROOT_META]
    if rest:  # concurrent server-side copies, the root last
        fs.copy([f"{tmp}/{key}" for key in rest], [f"{path}/{key}" for key in rest])
    fs.copy(f"{tmp}/{ROOT_META}", f"{path}/{ROOT_META}")
    fs.rm_file(f"{path}/{PUBLISHING}")


def _remove_prefix(fs, prefix: str) -> None:
    """Delete every object under ``prefix``, scalemb's markers (``.scalemb-*``) last: cut off half way, what is
    left still carries the marker that lets the recovery rule delete it."""
    try:
        keys = fs.find(prefix)
    except Exception:  # noqa: BLE001 - cleaning up after a failure: the recovery rule removes it later
        return
    markers = [k for k in keys if k.rsplit("/", 1)[-1].startswith(".scalemb-")]
    for batch in ([k for k in keys if k not in markers], markers):
        if batch:
            try:
                fs.rm(batch)
            except Exception:  # noqa: BLE001
                pass


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def recover(url: str) -> None:
    """Apply the recovery rule (module docstring) to output ``url``."""
    fs, path = filesystem(url)
    parent, name = _parent_and_name(path)
    with errors(url):
        _finish_publishing(fs, path, parent, name)
        _remove_dead_temporaries(fs, path, parent, name)


def _finish_publishing(fs, path: str, parent: str, name: str) -> None:
    """A publication cut off at ``path`` (its marker is there): completed from its temporary if that is whole,
    else the half-published group removed; a complete group keeps its content and loses the marker."""
    try:
        marker = json.loads(fs.cat_file(f"{path}/{PUBLISHING}"))
    except FileNotFoundError:
        return
    except ValueError:
        marker = {}
    if not fs.exists(f"{path}/{ROOT_META}"):
        source = str(marker.get("from", "")) if isinstance(marker, dict) else ""
        if source.startswith(f"{parent}/.{name}.tmp-") and fs.exists(f"{source}/{ROOT_META}"):
            _publish_from(fs, source, path, overwrite=True)
            _remove_prefix(fs, source)
        else:
            _remove_prefix(fs, path)
        return
    try:  # complete (the old group or the new one), the marker's removal was cut off
        fs.rm_file(f"{path}/{PUBLISHING}")
    except FileNotFoundError:
        pass


def _remove_dead_temporaries(fs, path: str, parent: str, name: str) -> None:
    """This host's temporaries of ``name`` whose writing process is gone (their marker names it) are removed."""
    host = socket.gethostname()
    pattern = re.compile(rf"\.{re.escape(name)}\.tmp-{re.escape(host)}-(\d+)-[0-9a-f]{{8}}")
    try:
        siblings = fs.ls(parent or path.split("/", 1)[0], detail=False) if parent else []
    except FileNotFoundError:
        siblings = []
    for entry in siblings:
        match = pattern.fullmatch(entry.rstrip("/").rsplit("/", 1)[-1])
        if match is None or _alive(match.group(1)):
            continue
        try:
            text = fs.cat_file(f"{entry}/{TEMP_MARKER}").decode().split()
        except FileNotFoundError:
            continue
        if text == ["scalemb", host, match.group(1)]:
            _remove_prefix(fs, entry)


def remove_output(url: str) -> bool:
    """Delete the published group at ``url`` if scalemb wrote it (root first: unpublished at once); False if
    there is none.  ``ScalembError`` for a group without scalemb's marker."""
    fs, path = filesystem(url)
    with errors(url):
        recover(url)
        if not _exists(fs, path):
            return False
        if not is_scalemb_output(url):
            raise ScalembError(f"{url}: was not written by scalemb (no scalemb marker); not deleted")
        fs.rm_file(f"{path}/{ROOT_META}")
        _remove_prefix(fs, path)
    return True


@contextmanager
def output_target(out, overwrite: bool = False):
    """Where to write output ``out``: ``out`` itself for a local path; for a URL (checked by ``check_output``
    first) a fresh local staging directory's ``NAME``, published at ``out`` when the block ends normally and
    removed in any case (an interrupted or failed write publishes nothing)."""
    if not is_url(out):
        yield out
        return
    check_output(out, overwrite)
    name = _parent_and_name(split(out)[1])[1]
    stage = Path(tempfile.mkdtemp(prefix="scalemb-stage-"))
    try:
        yield stage / name
        publish(stage / name, out, overwrite)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
