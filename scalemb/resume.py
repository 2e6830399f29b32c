"""``scalemb.resume(path)``: continue a checkpointed run (``scalemb.io.checkpoint``) to its end."""
from .embedding import Embedder, EmbeddingResult
from .errors import ScalembError
from .io.checkpoint import Checkpointer, read_config
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
    source = data if data is not None else config["input"]
    if source is None:
        raise ScalembError(f"{path}: the run embedded an in-memory affinity; pass data= to resume it")
    arguments = dict(config["embedder"])
    if isinstance(arguments.get("fft_params"), dict):
        from .repulsion import FFTParams

        arguments["fft_params"] = FFTParams(**arguments["fft_params"])
    if arguments.get("scheduler") and not scheduler:
        raise ScalembError(f"{path}: the run used a Dask scheduler; pass --scheduler ADDRESS (scheduler=) to "
                           "resume on a cluster you trust")
    if scheduler:
        arguments.update(scheduler=scheduler, workers=None)
    arguments.update(iterations=iterations or config["iterations"], quiet=quiet,
                     optimizer=optimizer_from_config(config["optimizer"]))
    with Checkpointer(path, every=config["checkpoint_every"], resume=True, handle_signals=handle_signals,
                      on_checkpoint=on_checkpoint) as checkpoint:
        return Embedder(**arguments).fit(source, config["graph_affinity"], checkpoint=checkpoint).result_
