"""Checkpoints of a running embedding, kept in its output store (a Zarr v3 group) and written atomically.

Layout while a run is in progress (``scalemb.store.results`` is the layout once it has finished)::

    run.zarr/                  attrs["scalemb_checkpoint"] = {"format": 1, "config": {...}, "current": "000007"}
      checkpoints/000007/      attrs: restart, iteration, restart_kls, elapsed, state (scalars), best (scalars)
        state/<field>          the optimiser state's arrays (coords, gains, update, gradient, ...)
        best/<field>           coords, kl_history, seconds of the best finished restart, if any

``config`` holds what ``scalemb resume`` needs to rebuild the run: ``spec`` (the run's settings,
``scalemb.run.RunSpec.to_json``: the only place they are stored), the input reference and its content hash, and
what the run resolved from them: the point count, the time dimensions, the optimiser (every constructor field),
the repulsion, the checkpoint interval and the scalemb version.  A checkpoint written before the spec existed
holds the settings as keys of ``config`` itself (``settings`` reads both).  ``current`` is ``null`` until the
first checkpoint.

A write creates version ``n + 1`` completely, then switches ``current`` (zarr rewrites the root's
``zarr.json`` through a temporary file and a rename), then deletes the older versions.  An optimiser whose
per-point state is held on Dask workers (``scalemb.engine.held``, ``remote``) has the workers write their own rows
of the version's state arrays (``(d, N)``, chunked by at most the narrowest partition: ``write_rows``); the client
creates the empty arrays, writes the small ones (KL history, seconds) and, once every worker has reported, the
version's attributes and the pointer.  Its ``record_hash`` then covers each array as the SHA-256 digests of its
row blocks (``row_blocks``, attribute ``blocked``: name, dtype, shape), which any reader recomputes from the
arrays; a write that fails (a worker lost) removes its version and leaves ``current`` as it was.  Such a run's
result (one restart) is written the same way (``Checkpointer.stage_final``): the workers write their rows of the
embedding and of the final state into the staged result group, the client the small arrays and the attributes
(the result's blocked ``content_hash``: ``scalemb.store.results``), then the group replaces the store.  A crash at
any point leaves ``current`` naming a complete version; a version nobody points at is ignored and removed by the
next write.  Durability against power loss (fsync) is not attempted.
"""
import logging
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from .._version import __version__
from ..engine.held import rows_digest, store_chunk
from ..errors import ScalembError
from ..io.atomic import (atomic_directory, check_output_path, hidden_sibling, lock_output, make_temporary,
                         recover_directory, replace_directory, unlock_output)
from ..io.nodeids import to_stored
from ..optim import (DBDState, DeltaBarDelta, DescentState, LineSearchDescent, OptimizeResult, OptimizerState,
                     optimizer_config)
from .results import DIMENSIONS, _json_safe, arrays_hash, hash_attrs

logger = logging.getLogger("scalemb")

FORMAT = 1
ATTR = "scalemb_checkpoint"
DEFAULT_EVERY = 100
NEXT = ".next"  # a run started with ``overwrite`` on an existing OUT works in OUT.next until it finishes


class RunInterrupted(Exception):
    """A stop was requested (SIGINT, SIGTERM or ``Checkpointer.request_stop``); a checkpoint was written."""

    def __init__(self, path, restart: int, iteration: int):
        self.path, self.restart, self.iteration = Path(path), restart, iteration
        super().__init__(f"interrupted at iteration {iteration} of restart {restart + 1}; checkpoint written to "
                         f"{path}; continue with: scalemb resume {path}")


@dataclass
class Checkpoint:
    """A run between two iterations: restart ``restart`` is at the start of iteration ``iteration``."""

    restart: int
    iteration: int
    state: OptimizerState
    restart_kls: list = field(default_factory=list)
    best: OptimizeResult | None = None  # best finished restart so far
    elapsed: float = 0.0  # the run's wall time so far


def _state_class(optimizer_name: str):
    return DBDState if optimizer_name == "dbd" else DescentState


def record_hash(arrays: dict, attrs: dict, digests: dict | None = None) -> str:
    """SHA-256 over a stored record: its arrays (``arrays_hash``: name, dtype, shape, bytes) and its JSON
    attributes (canonical JSON: sorted keys, no whitespace; the ``record_hash`` key itself left out).  A
    checkpoint version hashes its arrays with its attributes, the run configuration its own JSON, a finished
    run's final state its arrays with its scalars and configuration: every read-back recomputes and compares.
    The arrays named in ``attrs['blocked']`` (``{name: [dtype, shape]}``, ``(d, N)`` arrays written by blocks)
    enter as their name, dtype, shape and the digests of their row blocks ``attrs['row_blocks']``
    (``engine.held.rows_digest`` of ``array[:, r0:r1]``), in block order: ``digests`` (``{name: [hex, ...]}``)
    from the writers, else computed from ``arrays``."""
    import hashlib
    import json

    body = {k: v for k, v in _json_safe(attrs).items() if k != "record_hash"}
    blocked = body.get("blocked") or {}
    digest = hashlib.sha256(arrays_hash({k: v for k, v in arrays.items() if k not in blocked}).encode())
    for name in sorted(blocked):
        dtype, shape = blocked[name]
        digest.update(f"{name}\0{dtype}\0{tuple(shape)}\0".encode())
        parts = digests[name] if digests is not None else \
            [rows_digest(arrays[name][:, r0:r1]) for r0, r1 in body["row_blocks"]]
        for part in parts:
            digest.update(bytes.fromhex(part))
    digest.update(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True).encode())
    return digest.hexdigest()


def _check_hash(arrays: dict, attrs: dict) -> None:
    """``ValueError`` unless ``attrs["record_hash"]`` is ``record_hash(arrays, attrs)`` (a record written before
    it existed carries ``content_hash``, over its arrays only)."""
    recorded = attrs.get("record_hash")
    for name, (dtype, shape) in (attrs.get("blocked") or {}).items():
        if name not in arrays or arrays[name].dtype.str != dtype or list(arrays[name].shape) != list(shape):
            raise ValueError(f"{name} is missing or not {dtype} {tuple(shape)}")
    if recorded is not None:
        if recorded != record_hash(arrays, attrs):
            raise ValueError("content hash mismatch: corrupt or modified")
    elif attrs.get("content_hash") is not None and attrs["content_hash"] != arrays_hash(arrays):
        raise ValueError("content hash mismatch: corrupt or modified")


def _config_hash(config: dict) -> str:
    return record_hash({}, {"config": config})


def read_config(path) -> dict:
    """The run configuration of a checkpointed store; ``ScalembError`` (one line) if ``path`` is not one."""
    path = Path(path)
    recover_directory(path)
    if not path.exists():
        raise ScalembError(f"{path}: no such checkpointed run")
    try:
        group = zarr.open_group(store=str(path), mode="r")
        meta = dict(group.attrs).get(ATTR)
    except Exception as exc:  # not a Zarr group at all
        raise ScalembError(f"{path}: not a checkpointed scalemb run ({type(exc).__name__})") from None
    if meta is None:
        if "embedding" in group and "model" in group.attrs:
            raise ScalembError(f"{path}: the run has finished (a result, no checkpoint to resume); "
                               f"add iterations with: scalemb continue {path} --iterations N")
        raise ScalembError(f"{path}: not a checkpointed scalemb run")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ScalembError(f"{path}: checkpoint format {meta.get('format') if isinstance(meta, dict) else meta} "
                           f"is not supported (expected {FORMAT})")
    recorded = meta.get("config_hash")
    if recorded is not None and recorded != _config_hash(meta.get("config")):
        raise ScalembError(f"{path}: the run configuration does not match its content hash (corrupt or edited); "
                           "refusing to use it")
    if not isinstance(meta.get("config"), dict):
        raise ScalembError(f"{path}: the checkpoint has no run configuration")
    return meta


def _write_meta(group, meta: dict) -> None:
    """The root's checkpoint attribute, its configuration hash recomputed (scalemb's own edits: ``iterations``)."""
    meta = _json_safe(meta)
    group.attrs[ATTR] = {**meta, "config_hash": _config_hash(meta["config"])}


def read_checkpoint(path) -> Checkpoint | None:
    """The checkpoint ``current`` points at, or ``None`` before the first one."""
    meta = read_config(path)
    current = meta.get("current")
    if current is None:
        return None
    group = zarr.open_group(store=str(path), mode="r")
    try:
        version = group[f"checkpoints/{current}"]
        attrs = dict(version.attrs)
        state_arrays = {name: array[:] for name, array in version["state"].arrays()}
        b = {name: array[:] for name, array in version["best"].arrays()} if attrs["best"] is not None else {}
        arrays = {**{f"state/{k}": v for k, v in state_arrays.items()}, **{f"best/{k}": v for k, v in b.items()}}
        _check_hash(arrays, attrs)
        _check_state(state_arrays, b, attrs, meta["config"])
        check_state_arrays(state_arrays, attrs["state"], meta["config"])
        state = _state_class(meta["config"]["optimizer"]["name"]).join(state_arrays, attrs["state"])
        best = None
        if b:
            best = OptimizeResult(b["coords"], attrs["best"]["kl"], b["kl_history"], attrs["best"]["iterations"],
                                  attrs["best"]["converged"], attrs["best"]["backoffs"], b["seconds"],
                                  attrs["best"]["evaluations"])
        checkpoint = Checkpoint(int(attrs["restart"]), int(attrs["iteration"]), state,
                                [float(k) for k in attrs["restart_kls"]], best, float(attrs["elapsed"]))
    except Exception as exc:  # noqa: BLE001 - a malformed checkpoint is reported in one line, never a traceback
        raise ScalembError(f"{path}: checkpoint {current} is unreadable ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return checkpoint


def interruption_note(out, started_before: bool = False) -> str:
    """What an embed/resume run stopped by a second Ctrl-C (or before its store existed) left at ``out``, in words,
    from what is on disk: the store (``out``, or ``OUT.next`` for a run replacing ``out``) with its last checkpoint
    and how to resume it, a store without a checkpoint yet, or nothing.  ``started_before``: ``out`` held a
    checkpointed run before this command (``scalemb resume``): what it keeps is that run's."""
    out = Path(out)
    for path in (out.with_name(out.name + NEXT), out):
        try:
            meta = read_config(path)
        except ScalembError:
            continue
        current = meta.get("current")
        if current is None:
            return (f"interrupted before the first checkpoint; {path} holds the run's settings only (scalemb "
                    f"resume {path} starts it from iteration 0)")
        try:
            checkpoint = read_checkpoint(path)
            where = f" (restart {checkpoint.restart + 1}, iteration {checkpoint.iteration})"
        except ScalembError:
            where = ""
        return f"interrupted; {path} keeps the last checkpoint{where} (scalemb resume {path})"
    if started_before:
        return f"interrupted; {out} is not a checkpointed run"
    return f"interrupted before the first checkpoint; nothing written ({out} does not exist)" if not out.exists() \
        else f"interrupted before the first checkpoint; {out} is as it was"


def settings(config: dict) -> dict:
    """The run's settings in a stored configuration: its ``spec``, or (written before the spec existed) the
    configuration itself, whose keys named them (``model``, ``space_dims``, ``seed``, ``restarts``...)."""
    return config.get("spec") or config


def _check_state(state: dict, best: dict, attrs: dict, config: dict) -> None:
    """Shapes and values of a checkpoint's arrays against the run configuration (``ValueError``)."""
    if "coords" not in state:
        raise ValueError("no state/coords")
    n = config.get("n_points")
    space_dims = settings(config).get("space_dims")
    dims = int(space_dims) + int(config["time_dims"]) if space_dims is not None else None
    for name, array in list(state.items()) + [(f"best {k}", v) for k, v in best.items() if k == "coords"]:
        if name.endswith("coords") and n is not None and dims is not None and \
                array.shape not in ((int(n), dims), (dims, int(n))):  # layouts: point- or dim-major
            raise ValueError(f"{name} has shape {array.shape}, expected {(n, dims)} or {(dims, n)}")
        if name.endswith("coords") and not np.all(np.isfinite(array)):
            raise ValueError(f"{name} has non-finite values")
    if not 0 <= int(attrs["restart"]) < int(settings(config).get("restarts", attrs["restart"] + 1)) or \
            int(attrs["iteration"]) < 0:
        raise ValueError(f"restart {attrs['restart']} / iteration {attrs['iteration']} out of range")


_LIKE_COORDS = ("coords", "update", "best_coords", "gradient", "curvature_coords", "factor_coords")


def check_state_arrays(arrays: dict, scalars: dict, config: dict) -> None:
    """An optimiser state's arrays against the run configuration, before any reaches a compiled kernel
    (``ValueError``): ``coords`` is ``(d, n)`` or ``(n, d)`` with ``d = space_dims + time_dims`` and
    ``n = n_points``, finite; the other per-point arrays have ``n`` on the same axis and ``d``, ``space_dims`` or
    ``time_dims`` rows (the arrays of ``_LIKE_COORDS`` exactly ``coords``' shape), float64; ``kl_history`` and
    ``seconds`` hold one float64 entry per iteration done; ``ordering`` is a permutation of ``0 .. n - 1``."""
    if "coords" not in arrays:
        raise ValueError("no coords")
    n, ds, dt = int(config["n_points"]), int(settings(config)["space_dims"]), int(config["time_dims"])
    coords = arrays["coords"]
    if coords.shape not in ((ds + dt, n), (n, ds + dt)):
        raise ValueError(f"coords has shape {coords.shape}, expected {(ds + dt, n)} or {(n, ds + dt)}")
    axis = 1 if coords.shape == (ds + dt, n) else 0  # the point axis (dim-major first when d = n)
    iteration = scalars.get("iteration")
    if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
        raise ValueError(f"iteration {iteration!r} is not a count")
    for name, array in arrays.items():
        if name in ("kl_history", "seconds"):
            if array.dtype != np.float64 or array.shape != (iteration,):
                raise ValueError(f"{name} has shape {array.shape} ({array.dtype}), expected ({iteration},) float64")
        elif name == "ordering":
            if array.shape != (n,) or array.dtype.kind not in "iu" or \
                    not np.array_equal(np.sort(array), np.arange(n)):
                raise ValueError(f"ordering is not a permutation of the {n} points")
        else:
            _check_point_array(name, array, coords, axis, ds, dt)


def _check_point_array(name: str, array: np.ndarray, coords: np.ndarray, axis: int, ds: int, dt: int) -> None:
    """A per-point state array: float64, 2-D with the points on ``axis`` as in ``coords`` and ``ds + dt``, ``ds``
    or ``dt`` rows (``coords``' shape for ``_LIKE_COORDS``); coordinates finite."""
    if array.ndim != 2:
        raise ValueError(f"{name} has shape {array.shape}: not an optimiser state array")
    n, rows = coords.shape[axis], array.shape[1 - axis]
    if array.dtype != np.float64 or array.shape[axis] != n or rows not in {ds + dt, ds, dt} or \
            (name in _LIKE_COORDS and array.shape != coords.shape):
        raise ValueError(f"{name} has shape {array.shape} ({array.dtype}); coords are {coords.shape}")
    if name in ("coords", "best_coords") and not np.all(np.isfinite(array)):
        raise ValueError(f"{name} has non-finite values")


def create_store(path, config: dict, overwrite: bool = False) -> Path:
    """A new checkpointed run at ``path`` (atomically; replaces an existing store only with ``overwrite``)."""
    with atomic_directory(path, overwrite) as tmp:
        group = zarr.open_group(store=str(tmp), mode="w", zarr_format=3)
        group.create_group("checkpoints")
        _write_meta(group, {"format": FORMAT, "config": config, "current": None})
    return Path(path)


def _switch_pointer(group, meta: dict, version: str) -> None:
    _write_meta(group, {**meta, "current": version})


def write_checkpoint(path, checkpoint: Checkpoint, rows=None) -> str:
    """Add ``checkpoint`` as a new version of the store at ``path``, point at it, drop the older ones.  ``rows``
    (an ``engine.held.RowsExport``): the state's per-point arrays are written by the processes holding them
    (module docstring; ``checkpoint.state`` holds None in their fields) and ``rows.written`` is told the
    version's directory and digests once it is current."""
    path = Path(path)
    meta = read_config(path)
    group = zarr.open_group(store=str(path), mode="r+")
    folder = path / "checkpoints"
    existing = [p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit()] if folder.exists() else []
    name = f"{max([int(n) for n in existing], default=0) + 1:06d}"
    try:
        attrs = _write_version(group, folder.resolve() / name, name, checkpoint, rows)
    except BaseException:
        shutil.rmtree(folder / name, ignore_errors=True)  # never pointed at: nothing half-written stays
        raise
    _switch_pointer(group, meta, name)
    if rows is not None:
        rows.written(str((folder / name / "state").resolve()), attrs["digests"], checkpoint.state)
    for old in existing:
        shutil.rmtree(folder / old, ignore_errors=True)
    return name


def _write_version(group, directory: Path, name: str, checkpoint: Checkpoint, rows) -> dict:
    """Version ``name`` (at ``directory``): its groups, arrays and attributes (with ``record_hash``);
    ``{"digests": ...}`` of the rows written by their holders."""
    version = group.create_group(f"checkpoints/{name}")
    arrays, scalars = checkpoint.state.split()
    state_group = version.create_group("state")
    for key, value in arrays.items():
        state_group.create_array(key, data=np.ascontiguousarray(value))
    blocked, digests, blocks = {}, None, None
    if rows is not None:
        blocks = [[int(a), int(b)] for a, b in rows.bounds]
        chunk = store_chunk(rows.bounds)
        for key, shape in rows.shapes.items():
            scalars.pop(key, None)
            state_group.create_array(key, shape=shape, chunks=(shape[0], chunk), dtype="float64", fill_value=0.0)
            blocked[f"state/{key}"] = ["<f8", list(shape)]
        written = rows.write(str(directory / "state"))
        digests = {f"state/{key}": parts for key, parts in written.items()}
    best = None
    if checkpoint.best is not None:
        b = checkpoint.best
        best_group = version.create_group("best")
        for key, value in (("coords", b.coords), ("kl_history", b.kl_history), ("seconds", b.seconds)):
            best_group.create_array(key, data=np.ascontiguousarray(value))
        best = {"kl": float(b.kl), "iterations": int(b.iterations), "converged": bool(b.converged),
                "backoffs": int(b.backoffs), "evaluations": int(b.evaluations)}
    hashed = {**{f"state/{k}": np.ascontiguousarray(v) for k, v in arrays.items()},
              **({} if checkpoint.best is None else {f"best/{k}": np.ascontiguousarray(v) for k, v in
                                                     (("coords", b.coords), ("kl_history", b.kl_history),
                                                      ("seconds", b.seconds))})}
    attrs = {"restart": checkpoint.restart, "iteration": checkpoint.iteration,
             "restart_kls": [float(k) for k in checkpoint.restart_kls],
             "elapsed": checkpoint.elapsed, "state": scalars, "best": best}
    if rows is not None:
        attrs.update(row_blocks=blocks, blocked=blocked)
    attrs = _json_safe(attrs)
    version.attrs.update({**attrs, "record_hash": record_hash(hashed, attrs, digests)})
    return {"digests": None if rows is None else written}


def _check_same_run(path, stored: dict, config: dict) -> None:
    if stored.get("input_hash") != config["input_hash"]:
        raise ScalembError(f"{path}: the input changed since the run was checkpointed (content hash "
                           f"{str(stored.get('input_hash'))[:12]}…, now {config['input_hash'][:12]}…); "
                           "refusing to resume")
    changed = [k for k in ("time_dims", "optimizer", "repulsion") if _json_safe(config[k]) != stored.get(k)]
    old, new = settings(stored), config["spec"]
    for key in ("model", "model_params", "space_dims", "restarts", "random_state", "graph_affinity"):
        before = old.get(key, old.get("seed") if key == "random_state" else None)
        if key == "random_state":  # None is seed 0 (a record written before the spec holds the number)
            before, now = before or 0, new.get(key) or 0
        else:
            now = new.get(key)
        if key in old or key == "random_state":
            if _json_safe(now) != _json_safe(before) and not (key == "model_params" and not now and not before):
                changed.append(key)
    if changed:
        raise ScalembError(f"{path}: settings differ from the checkpointed run ({', '.join(changed)}); "
                           "refusing to resume")


FINAL_ATTR = "scalemb_final"
FINAL_GROUP = "final_state"


def write_final_state(path, config: dict, state: OptimizerState) -> None:
    """Keep, next to a finished result, the run configuration and the best run's final optimiser state
    (group ``final_state``; attribute ``scalemb_final``, with ``record_hash`` over both), from which
    ``scalemb continue`` goes on."""
    group = zarr.open_group(store=str(path), mode="r+")
    arrays, scalars = state.split()
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    final = group.create_group("final_state", overwrite=True)
    for key, value in arrays.items():
        final.create_array(key, data=value)
    meta = _json_safe({"format": FORMAT, "config": config, "state": scalars})
    group.attrs[FINAL_ATTR] = {**meta, "record_hash": record_hash(arrays, meta)}


def read_final_state(path) -> tuple[dict, OptimizerState]:
    """``(config, state)`` of a finished run written with its final state; ``ScalembError`` otherwise (also when
    the state does not match its hash or its run: ``check_state_arrays``)."""
    path = Path(path)
    recover_directory(path)
    try:
        group = zarr.open_group(store=str(path), mode="r")
        meta = dict(group.attrs).get(FINAL_ATTR)
    except Exception as exc:  # noqa: BLE001 - not a Zarr group at all
        raise ScalembError(f"{path}: not a scalemb run ({type(exc).__name__})") from None
    if meta is None:
        if ATTR in group.attrs:
            raise ScalembError(f"{path}: the run has not finished; continue it with: scalemb resume {path}")
        raise ScalembError(f"{path}: not a finished scalemb run with its optimiser state (runs written by "
                           "`scalemb embed` from this version on keep it)")
    try:
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError("unsupported format")
        arrays = {name: array[:] for name, array in group["final_state"].arrays()}
        _check_hash(arrays, meta)
        check_state_arrays(arrays, meta["state"], meta["config"])
        state = _state_class(meta["config"]["optimizer"]["name"]).join(arrays, meta["state"])
    except Exception as exc:  # noqa: BLE001 - a malformed state is reported in one line, never a traceback
        raise ScalembError(f"{path}: the final optimiser state is unreadable ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return meta["config"], state


class Checkpointer:
    """Checkpoints for ``Embedder.fit``: every ``every`` iterations (0: only on a stop request) and when a
    stop is requested (SIGINT/SIGTERM while used as a context manager on the main thread, or
    ``request_stop()``): the state is written and ``RunInterrupted`` raised.  ``resume=True`` continues the
    run stored at ``path``; otherwise a new store is created (``overwrite`` replaces one).  The finished
    result replaces the checkpoints (``finish``); a diverging run removes the store.  ``on_checkpoint(self,
    restart, iteration)`` is called after each write."""

    def __init__(self, path, every: int = DEFAULT_EVERY, overwrite: bool = False, resume: bool = False,
                 handle_signals: bool = True, on_checkpoint=None):
        if int(every) < 0:
            raise ValueError(f"checkpoint interval must be >= 0, got {every}")
        self.path = Path(path)
        self.every = int(every)
        self.overwrite = overwrite
        self.resume = resume
        self.handle_signals = handle_signals
        self.on_checkpoint = on_checkpoint
        self.written = 0
        self._stop = threading.Event()
        self._previous_handlers = {}
        self._created = False
        self._locked = []  # outputs whose advisory lock this run holds (``scalemb.io.atomic.lock_output``)
        self.target = None  # the store a run started with ``overwrite`` replaces once it has finished
        self.client_writes = False  # True once the workers could not see the store: the client writes the rows
        self._staged = []  # results the workers wrote (``stage_final``), removed at exit unless renamed into place

    # -- signals ---------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Finish the current iteration, write a checkpoint and raise ``RunInterrupted``."""
        self._stop.set()

    def _on_signal(self, signum, frame):
        if self._stop.is_set():  # a second signal: stop now, without a checkpoint
            raise KeyboardInterrupt
        if not self._created and not self.resume:  # nothing to checkpoint yet (reading, kNN, init): stop now
            raise KeyboardInterrupt
        logger.warning("%s received: finishing the iteration and writing a checkpoint (again to abort)",
                       signal.Signals(signum).name)
        self.request_stop()

    def __enter__(self):
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, exc_type, exc, tb):
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()
        self._unlock()
        for staged in self._staged:  # a restart not the best, or a run stopped before ``finish``
            staged.discard()
        self._staged = []
        if exc_type is not None and issubclass(exc_type, FloatingPointError) and self._created:
            shutil.rmtree(self.path, ignore_errors=True)  # a diverging run leaves nothing, as without checkpoints
        return False

    # -- the run ---------------------------------------------------------------------------------------
    def start(self, *, spec: dict, source, input_ref, input_hash: str, time_dims, executor, node_ids, provenance,
              optimizer, repulsion) -> Checkpoint | None:
        """Record the run configuration (new run) or check it against the stored one (resume); returns the
        checkpoint to continue from (``None``: start at restart 0, iteration 0).  ``spec``: the run's settings
        (``RunSpec.to_json``); ``source``: the input as given; ``input_ref``: how ``resume`` finds it again (a
        dataset name, an absolute path, or None: in memory); ``input_hash``: its content's identity."""
        if not isinstance(optimizer, (DeltaBarDelta, LineSearchDescent)):
            raise ValueError(f"checkpoints need a scalemb optimiser (dbd, sd or gd), got {optimizer!r}")
        iterations = int(spec["iterations"])
        if spec.get("n_jobs") is None and getattr(executor, "n_threads", None) is not None:
            spec = {**spec, "n_jobs": executor.n_threads}  # resumed with the threads it ran on
        config = {"input": input_ref, "provenance": dict(provenance), "input_hash": input_hash,
                  "n_points": len(node_ids),
                  "time_dims": time_dims, "optimizer": optimizer_config(optimizer), "repulsion": repulsion,
                  "checkpoint_every": self.every, "scalemb_version": __version__, "spec": spec}
        data = source
        self.config = _json_safe(config)
        if not self.resume:
            check_output_path(self.path, self.overwrite, inputs=(data,))
            if self.path.exists():  # scalemb's own output: keep it until the new result is complete
                self._lock(self.path)  # no other writer replaces it while this run works in OUT.next
                self.target, self.path = self.path, self.path.with_name(self.path.name + NEXT)
                check_output_path(self.path, True, inputs=(data,))
            config["replaces"] = None if self.target is None else str(self.target.resolve())
            create_store(self.path, _json_safe(config), overwrite=True)
            self._lock(self.path)
            self._created = True
            return None
        self._lock(self.path)  # a second ``resume`` (or ``--overwrite``) of a live run is refused
        stored = read_config(self.path)["config"]
        if stored.get("replaces"):
            self.target = own_target(self.path, stored["replaces"])
            self._lock(self.target)
        self.config = with_iterations(stored, iterations)
        _check_same_run(self.path, stored, config)
        checkpoint = read_checkpoint(self.path)
        if checkpoint is not None and checkpoint.iteration > iterations:
            raise ScalembError(f"{self.path}: the checkpoint is at iteration {checkpoint.iteration}; "
                               f"--iterations {iterations} is fewer")
        if iterations != settings(stored)["iterations"]:
            meta = read_config(self.path)
            group = zarr.open_group(store=str(self.path), mode="r+")
            _write_meta(group, {**meta, "config": self.config})
        return checkpoint

    def _lock(self, path) -> None:
        lock_output(path)
        self._locked.append(Path(path))

    def _unlock(self) -> None:
        for path in self._locked:
            unlock_output(path)
        self._locked = []

    def hook(self, restart: int, restart_kls: list, best, started: float, final_rows: bool = False):
        """The ``checkpoint(it, export)`` callable for restart ``restart`` (``started``: the run's
        ``time.perf_counter()`` origin).  ``final_rows``: rows held by workers are written by them into the
        staged result at the end (``checkpoint.final_rows``: ``stage_final``), not gathered to the client."""
        def checkpoint(iteration, export):
            stopping = self._stop.is_set()
            if not stopping and not (self.every and iteration % self.every == 0):
                return
            rows = None if self.client_writes else getattr(export, "rows", lambda: None)()
            written = False
            if rows is not None:  # the per-point arrays are written by the workers holding them
                try:
                    self.write(Checkpoint(restart, iteration, export(light=True), list(restart_kls), best,
                                          time.perf_counter() - started), rows)
                    written = True
                except FileNotFoundError as exc:  # workers on hosts without this file system
                    logger.warning("%s; the client writes the checkpoints from now on", exc)
                    self.client_writes = True
            if not written:
                self.write(Checkpoint(restart, iteration, export(), list(restart_kls), best,
                                      time.perf_counter() - started))
            if self.on_checkpoint is not None:
                self.on_checkpoint(self, restart, iteration)
            if stopping or self._stop.is_set():
                raise RunInterrupted(self.path, restart, iteration)
        checkpoint.stop_requested = self._stop.is_set  # polled by long solver set-ups (optim.solvers.interruptible)
        if final_rows:
            checkpoint.final_rows = self.stage_final
        return checkpoint

    def stage_final(self, rows):
        """A finished run's held rows written by their holders (``rows``: an ``engine.held.RowsExport``) into a
        new result group in a temporary beside the output (``atomic.make_temporary``): the embedding ``(N, d)``
        chunked by rows and the final state's per-point arrays ``(d, N)``, both at ``store_chunk`` of the blocks;
        the ``StagedResult`` that ``finish`` completes and renames into place.  None where the workers cannot
        see the output (the client then gathers and writes, as it does the checkpoints).  A failure (a worker
        lost: ``HeldRowsLost``) removes the temporary: nothing half-written stays."""
        if self.client_writes:
            return None
        final = self.target if self.target is not None else self.path
        tmp = make_temporary(final, "tmp")
        group_path = tmp / final.name
        try:
            n, dims, chunk = rows.held.n_points, rows.shapes["coords"][0], store_chunk(rows.bounds)
            group = zarr.open_group(store=str(group_path), mode="w", zarr_format=3)
            group.create_array("embedding", shape=(n, dims), chunks=(chunk, dims), dtype="float64",
                               fill_value=0.0, dimension_names=DIMENSIONS["embedding"])
            state = group.create_group(FINAL_GROUP)
            for key, shape in rows.shapes.items():
                state.create_array(key, shape=shape, chunks=(shape[0], chunk), dtype="float64", fill_value=0.0)
            digests = rows.write_result(str(group_path), FINAL_GROUP)
        except FileNotFoundError as exc:  # workers on hosts without this file system
            shutil.rmtree(tmp, ignore_errors=True)
            logger.warning("%s; the client writes the result", exc)
            self.client_writes = True
            return None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        staged = StagedResult(tmp, group_path, digests, [[int(a), int(b)] for a, b in rows.bounds],
                              {key: list(shape) for key, shape in rows.shapes.items()})
        self._staged.append(staged)
        return staged

    def write(self, checkpoint: Checkpoint, rows=None) -> str:
        name = write_checkpoint(self.path, checkpoint, rows)
        self.written += 1
        return name

    def finish(self, result, run: OptimizeResult | None = None) -> Path:
        """Replace the checkpoints by the final result (``scalemb.store.results`` layout) and, if ``run`` (the best
        restart's) carries its final state, keep it for ``scalemb continue`` (``write_final_state``).  A run
        started with ``overwrite`` on an existing store worked in ``OUT.next``; its result now replaces ``OUT`` in
        one atomic step (``scalemb.io.atomic``) and ``OUT.next`` is removed."""
        keep_state = run is not None and getattr(run, "state", None) is not None and getattr(self, "config", None)
        staged = getattr(run, "written", None)
        if staged is not None:
            return self._finish_staged(result, run, staged, keep_state)
        if self.target is None:
            path = result.save(self.path, overwrite=True)
            if keep_state:
                write_final_state(path, self.config, run.state)
            self._unlock()
            return path
        check_output_path(self.target, True)
        staged = hidden_sibling(self.target, "tmp")
        result.save(staged)
        if keep_state:
            write_final_state(staged, self.config, run.state)
        replace_directory(staged, self.target)
        shutil.rmtree(self.path, ignore_errors=True)
        self.path = self.target
        self._unlock()
        return self.target

    def _finish_staged(self, result, run: OptimizeResult, staged: "StagedResult", keep_state) -> Path:
        """``finish`` of a result whose rows the workers wrote (``stage_final``): the client adds the small
        arrays (node ids, KL history; the final state's scalars and histories) and the attributes, with the
        content hashes composed from the workers' block digests, then renames the group into place."""
        final = self.target if self.target is not None else self.path
        group = zarr.open_group(store=str(staged.group), mode="r+")
        small = {"node_ids": result.node_ids, "kl_history": np.ascontiguousarray(result.kl_history)}
        for name, value in small.items():
            group.create_array(name, data=to_stored(value) if name == "node_ids" else value,
                               dimension_names=DIMENSIONS[name])
        n, dims = staged.shapes["coords"][1], staged.shapes["coords"][0]
        attrs = hash_attrs(small, {**result.attrs(), "blocked": {"embedding": ["<f8", [n, dims]]}}, staged.bounds,
                           {"embedding": staged.digests["embedding"]})
        group.attrs.update(_json_safe(attrs))
        if keep_state:
            arrays, scalars = run.state.split()
            state = group[FINAL_GROUP]
            for key in staged.shapes:
                scalars.pop(key, None)
            for key, value in arrays.items():
                state.create_array(key, data=np.ascontiguousarray(value))
            meta = _json_safe({"format": FORMAT, "config": self.config, "state": scalars, "row_blocks": staged.bounds,
                               "blocked": {key: ["<f8", shape] for key, shape in staged.shapes.items()}})
            digests = {key: staged.digests[f"{FINAL_GROUP}/{key}"] for key in staged.shapes}
            group.attrs[FINAL_ATTR] = {**meta, "record_hash": record_hash(arrays, meta, digests)}
        check_output_path(final, True)
        replace_directory(staged.group, final)
        staged.discard()
        if self.target is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = self.target
        self._unlock()
        result.stored_at(final)
        return final


@dataclass
class StagedResult:
    """A finished run's rows written by the workers holding them (``Checkpointer.stage_final``): the result group
    ``group`` inside the temporary ``tmp``, the block digests ``{path: [hex, ...]}`` (``embedding``,
    ``final_state/<field>``), the blocks and the final state's per-point arrays' shapes."""

    tmp: Path
    group: Path
    digests: dict
    bounds: list
    shapes: dict

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def own_target(path, replaces) -> Path:
    """The store a run started with ``overwrite`` replaces when it finishes: always its own name, ``OUT`` for the
    run working in ``OUT.next`` (``Checkpointer.start``); the recorded ``replaces`` must name it, else
    ``ScalembError`` (a configuration naming any other directory is never followed)."""
    path = Path(path)
    if not path.name.endswith(NEXT) or len(path.name) == len(NEXT):
        raise ScalembError(f"{path}: the checkpoint says it replaces {replaces}, but only a run working in "
                           f"OUT{NEXT} replaces anything (OUT); refusing to resume")
    target = path.with_name(path.name[:-len(NEXT)])
    if str(replaces) != str(target.resolve()):
        raise ScalembError(f"{path}: the checkpoint says it replaces {replaces}, not the run's own output "
                           f"{target.resolve()}; refusing to resume")
    return target


def with_iterations(config: dict, iterations: int) -> dict:
    """``config`` with the run's per-restart maximum ``iterations`` (in its spec, or in a configuration written
    before the spec existed, in its own key)."""
    if "spec" in config:
        return {**config, "spec": {**config["spec"], "iterations": int(iterations)}}
    return {**config, "iterations": int(iterations)}
