"""``scalemb.resume(path)``: continue a checkpointed run (``scalemb.store.checkpoint``) to its end;
``continue_finished(path, iterations)``: go on with a finished one from its final optimiser state.  Both read
the run's stored ``RunSpec`` back (``stored_spec``) and hand it to the one runner."""
from ..errors import ScalembError
from ..store.checkpoint import read_config, read_final_state, with_iterations, write_final_state
from ..store.checkpointer import Checkpointer
from ..store.results import EmbeddingResult
from ..optim import optimizer_from_config
from .inputs import input_hash, plan_of, resolve
from .runner import Runner
from .spec import RunSpec, fft_settings

# a configuration written before the RunSpec held the runner's constructor arguments under these names
_LEGACY_NAMES = {"seed": "random_state", "n_threads": "n_jobs"}


def stored_spec(config: dict) -> RunSpec:
    """The ``RunSpec`` a checkpoint or a finished run's state stored (one written before the spec existed: from
    its runner arguments and graph affinity)."""
    if "spec" in config:
        return RunSpec.from_json(config["spec"])
    values = {_LEGACY_NAMES.get(k, k): v for k, v in config["embedder"].items() if k != "fft_params"}
    values.update(fft_settings(config["embedder"].get("fft_params")), graph_affinity=config["graph_affinity"],
                  iterations=config["iterations"])
    if values.get("init") == "random":
        values["init"] = None
    return RunSpec.from_values(values)


def resume(path, iterations: int | None = None, quiet: bool = True, data=None, handle_signals: bool = True,
           on_checkpoint=None, scheduler: str | None = None, in_process: bool = False) -> EmbeddingResult:
    """Continue the run checkpointed in ``path`` with its stored settings and write the result there.

    ``iterations`` raises (or lowers, not below the checkpoint's) the per-restart maximum; ``data`` replaces
    the stored input reference (needed when the run embedded an in-memory ``Affinity``).  The input must
    have the stored content hash.  Finishing with the stored settings gives exactly the uninterrupted run's
    result.  Raises ``ScalembError`` if ``path`` holds no checkpointed run, ``RunInterrupted`` if stopped again.
    A run on a Dask cluster resumes only on the ``scheduler`` given here: the address stored in the checkpoint
    is never connected to on its own (Dask exchanges pickles; an edited checkpoint must not choose the peer);
    ``in_process`` continues such a run in this process instead (the executors agree bit for bit).
    """
    config = read_config(path)["config"]
    if in_process and scheduler:
        raise ValueError("in_process: give a scheduler or in_process, not both")
    spec = stored_spec(config)
    spec = spec.replace(scheduler=None, workers=None) if in_process else _on_cluster(path, spec, scheduler)
    spec = spec.replace(iterations=iterations or spec.iterations)
    plan = _plan(path, config, data, spec)
    with Checkpointer(path, every=config["checkpoint_every"], resume=True, handle_signals=handle_signals,
                      on_checkpoint=on_checkpoint) as checkpoint:
        runner = Runner(spec, optimizer=optimizer_from_config(config["optimizer"]), quiet=quiet)
        return runner.fit(plan, checkpoint=checkpoint).result_


def _plan(path, config: dict, data, spec: RunSpec):
    """The input again: ``data`` as given, else the stored reference resolved under the stored spec."""
    if data is not None:
        return plan_of(data, spec.graph_affinity)
    if config["input"] is None:
        raise ScalembError(f"{path}: the run embedded an in-memory affinity; pass data= to continue it")
    return resolve(config["input"], spec)


def _on_cluster(path, spec: RunSpec, scheduler: str | None) -> RunSpec:
    """A run stored with a Dask scheduler goes on only on the ``scheduler`` given by the caller: the stored address
    is never connected to on its own (Dask exchanges pickles; an edited store must not choose the peer)."""
    if spec.scheduler and not scheduler:
        raise ScalembError(f"{path}: the run used a Dask scheduler; pass --scheduler ADDRESS (scheduler=) to "
                           "go on on a cluster you trust")
    if scheduler:
        spec = spec.replace(scheduler=scheduler, workers=None)
    return spec


def continue_finished(path, iterations: int, quiet: bool = True, data=None,
                      scheduler: str | None = None, in_process: bool = False) -> EmbeddingResult:
    """Continue the finished run stored in ``path`` for ``iterations`` more iterations of its best restart,
    from its final optimiser state (the result is what one run of that many more iterations gives), and
    write the new result (with its final state) over the old one.  The input must have the stored content
    hash.  ``ScalembError`` if ``path`` holds no finished run with its state.  A run on a Dask cluster goes on
    on the ``scheduler`` given, or with ``in_process`` in this process (the executors agree bit for bit)."""
    from types import SimpleNamespace

    if int(iterations) < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if in_process and scheduler:
        raise ValueError("in_process: give a scheduler or in_process, not both")
    config, state = read_final_state(path)
    spec = stored_spec(config)
    spec = spec.replace(scheduler=None, workers=None) if in_process else _on_cluster(path, spec, scheduler)
    optimizer = optimizer_from_config(config["optimizer"])
    runner = Runner(spec, optimizer=optimizer, quiet=quiet)
    runner.result_ = EmbeddingResult.load(path)
    runner.run_ = SimpleNamespace(state=state)

    def verify(executor, node_ids, provenance):
        if input_hash(provenance, executor, node_ids) != config["input_hash"]:
            raise ScalembError(f"{path}: the input changed since the run (content hash "
                               f"{str(config['input_hash'])[:12]}…); refusing to continue")

    runner.continue_run(_plan(path, config, data, spec), optimizer, int(iterations), verify=verify)
    result = runner.result_
    result.save(path, overwrite=True)
    write_final_state(path, with_iterations(config, result.iterations), runner.run_.state)
    return result
