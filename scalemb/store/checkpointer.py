"""``Checkpointer``: a run's checkpoints and its finished result, written where ``scalemb.store.checkpoint``'s module
docstring says (versions under ``checkpoints/``, the ``current`` pointer, the result replacing the store), with the
stop requests (SIGINT/SIGTERM) that write one at once; ``StagedResult``: a result whose rows the Dask workers
wrote (``Checkpointer.stage_final``)."""
import logging
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from .._version import __version__
from ..engine.held import store_chunk
from ..errors import ScalembError
from ..io.atomic import check_output_path, hidden_sibling, lock_output, make_temporary, replace_directory, unlock_output
from ..io.nodeids import to_stored
from ..optim import DeltaBarDelta, LineSearchDescent, OptimizeResult, optimizer_config
from .results import DIMENSIONS, _json_safe, hash_attrs
from .checkpoint import (
    Checkpoint, DEFAULT_EVERY, FINAL_ATTR, FINAL_GROUP, FORMAT, NEXT, RunInterrupted, check_same_run, write_meta,
    create_store, own_target, read_checkpoint, read_config, record_hash, settings, with_iterations,
    write_checkpoint, write_final_state)

logger = logging.getLogger("scalemb")


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
        check_same_run(self.path, stored, config)
        checkpoint = read_checkpoint(self.path)
        if checkpoint is not None and checkpoint.iteration > iterations:
            raise ScalembError(f"{self.path}: the checkpoint is at iteration {checkpoint.iteration}; "
                               f"--iterations {iterations} is fewer")
        if iterations != settings(stored)["iterations"]:
            meta = read_config(self.path)
            group = zarr.open_group(store=str(self.path), mode="r+")
            write_meta(group, {**meta, "config": self.config})
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
