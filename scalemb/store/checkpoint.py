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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from ..engine.held import rows_digest, store_chunk
from ..errors import ScalembError
from ..io.atomic import (atomic_directory, recover_directory)
from ..optim import (DBDState, DescentState, OptimizeResult, OptimizerState)
from .results import _json_safe, arrays_hash

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


def write_meta(group, meta: dict) -> None:
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
        write_meta(group, {"format": FORMAT, "config": config, "current": None})
    return Path(path)


def _switch_pointer(group, meta: dict, version: str) -> None:
    write_meta(group, {**meta, "current": version})


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


def check_same_run(path, stored: dict, config: dict) -> None:
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
