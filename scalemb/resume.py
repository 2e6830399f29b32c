"""``scalemb.resume(path)``: continue a checkpointed run (``scalemb.io.checkpoint``) to its end;
``continue_finished(path, iterations)``: go on with a finished one from its final optimiser state."""
from .embedding import Embedder, EmbeddingResult
from .errors import ScalembError
from .io.checkpoint import Checkpointer, input_hash, read_config, read_final_state, write_final_state
from .optim import optimizer_from_config


def resume(path, iterations: int | None = None, quiet: bool = True, data=None, handle_signals: bool = True,
           on_checkpoint=None, scheduler: str | None = None) -> EmbeddingResult:
    """Continue the run checkpointed in ``path`` with its stored settings and write the result there.

    ``iterations`` raises (or lowers, not below the checkpoint's) the per-restart maximum; ``data`` replaces
    the stored input reference (needed when the run embedded an in-memory ``Affinity``).  The input must
    have the stored content hash.  Finishing with the stored settings gives exactly the uninterrupted run's
    result.  Raises ``ScalembError`` if ``path`` holds no checkpointed run, ``RunInterrupted`` if stopped again.
    A run on a Dask cluster resumes only on the ``scheduler`` given here: the address stored in the checkpoint
    is never connected to on its own (Dask exchanges pickles; an edited checkpoint must not choose the peer).
    """
    config = read_config(path)["config"]
    source = _source(path, config, data)
    arguments = _on_cluster(path, _arguments(config), scheduler)
    arguments.update(iterations=iterations or config["iterations"], quiet=quiet)
    with Checkpointer(path, every=config["checkpoint_every"], resume=True, handle_signals=handle_signals,
                      on_checkpoint=on_checkpoint) as checkpoint:
        return Embedder(**arguments).fit(source, config["graph_affinity"], checkpoint=checkpoint).result_


def _source(path, config: dict, data):
    source = data if data is not None else config["input"]
    if source is None:
        raise ScalembError(f"{path}: the run embedded an in-memory affinity; pass data= to continue it")
    return source


def _on_cluster(path, arguments: dict, scheduler: str | None) -> dict:
    """A run stored with a Dask scheduler goes on only on the ``scheduler`` given by the caller: the stored address
    is never connected to on its own (Dask exchanges pickles; an edited store must not choose the peer)."""
    if arguments.get("scheduler") and not scheduler:
        raise ScalembError(f"{path}: the run used a Dask scheduler; pass --scheduler ADDRESS (scheduler=) to "
                           "go on on a cluster you trust")
    if scheduler:
        arguments.update(scheduler=scheduler, workers=None)
    return arguments


def _arguments(config: dict) -> dict:
    """The runner's constructor arguments stored in a run's configuration."""
    arguments = dict(config["embedder"])
    if isinstance(arguments.get("fft_params"), dict):
        from .repulsion import FFTParams

        arguments["fft_params"] = FFTParams(**arguments["fft_params"])
    arguments["optimizer"] = optimizer_from_config(config["optimizer"])
    return arguments


def continue_finished(path, iterations: int, quiet: bool = True, data=None,
                      scheduler: str | None = None) -> EmbeddingResult:
    """Continue the finished run stored in ``path`` for ``iterations`` more iterations of its best restart,
    from its final optimiser state (the result is what one run of that many more iterations gives), and
    write the new result (with its final state) over the old one.  The input must have the stored content
    hash.  ``ScalembError`` if ``path`` holds no finished run with its state."""
    from types import SimpleNamespace

    if int(iterations) < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    config, state = read_final_state(path)
    source = _source(path, config, data)
    arguments = _on_cluster(path, _arguments(config), scheduler)
    runner = Embedder(**dict(arguments, quiet=quiet))
    runner.result_ = EmbeddingResult.load(path)
    runner.run_ = SimpleNamespace(state=state)

    def verify(executor, node_ids, provenance):
        if input_hash(provenance, executor, node_ids) != config["input_hash"]:
            raise ScalembError(f"{path}: the input changed since the run (content hash "
                               f"{str(config['input_hash'])[:12]}…); refusing to continue")

    runner.continue_run(source, arguments["optimizer"], int(iterations), config["graph_affinity"], verify=verify)
    result = runner.result_
    result.save(path, overwrite=True)
    write_final_state(path, {**config, "iterations": int(result.iterations)}, runner.run_.state)
    return result
