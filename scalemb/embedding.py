"""The engine-level API kept from earlier versions: ``Embedder(model=..., seed=..., n_threads=...)`` and
``embed(data, out, **kwargs)``, translated at this edge into a ``scalemb.run.RunSpec`` and run by the one runner
(``scalemb.run.runner.Runner``); ``EmbeddingResult`` (``scalemb.store.results``) and ``load_affinity``
(``scalemb.run.inputs``) are re-exported from their homes."""
from .store.checkpoint import DEFAULT_EVERY as DEFAULT_CHECKPOINT_EVERY
from .store.checkpointer import Checkpointer
from .store.results import EmbeddingResult
from .models import DEFAULT_MODEL
from .params import GRAPH_AFFINITIES
from .run.inputs import load_affinity, plan_of
from .run.runner import Runner, held_in_memory
from .run.spec import RunSpec, fft_settings
from .init import random_coords
from .io.storage import output_target

__all__ = ["GRAPH_AFFINITIES", "Embedder", "EmbeddingResult", "embed", "initial_coords", "load_affinity"]


def initial_coords(n_points: int, space_dims: int, time_dims: int, rng):
    """Small random start, ``(ds + dt, N)``: space 1e-4 N(0,1), time 1e-5 N(0,1) (``scalemb.init``)."""

    return random_coords(n_points, space_dims, time_dims, rng)


def runner_spec(model=DEFAULT_MODEL, space_dims: int = 2, time_dims: int | None = None, iterations: int = 5000,
                seed: int = 0, restarts: int = 1, optimizer="auto", n_threads: int | None = None,
                repulsion: str = "auto", fft_params=None, scheduler: str | None = None, workers: int | None = None,
                init="random", model_params: dict | None = None, graph_affinity: str = "coauthorship") -> tuple:
    """``(RunSpec, init array or None, optimiser instance or None)`` of the engine-level keywords: ``seed`` is
    ``random_state``, ``n_threads`` ``n_jobs``, an ``FFTParams`` its ``fft_*`` settings, a ``Model`` its name
    and parameters."""
    if not isinstance(model, str) and model is not None:  # a Model: recorded (checkpoints) by name and params
        model_params = {**model.params, **(model_params or {})}
        model = model.name
    array = init if hasattr(init, "shape") else None
    values = {"model": model, "model_params": model_params or None, "space_dims": space_dims,
              "time_dims": time_dims, "iterations": iterations, "random_state": seed, "restarts": restarts,
              "optimizer": optimizer if isinstance(optimizer, str) else getattr(optimizer, "name", "auto"),
              "n_jobs": n_threads, "repulsion": repulsion, "scheduler": scheduler, "workers": workers,
              "init": None if array is not None or init in (None, "random") else str(init),
              "graph_affinity": graph_affinity, **fft_settings(fft_params)}
    if values["optimizer"] not in ("auto", "dbd", "sd", "gd"):
        values["optimizer"] = "auto"
    return RunSpec.from_values(values), array, None if isinstance(optimizer, str) else optimizer


class Embedder(Runner):
    """The runner built from the engine-level keywords (``runner_spec``); see ``scalemb.run.runner.Runner``."""

    def __init__(self, model=DEFAULT_MODEL, space_dims: int = 2, time_dims: int | None = None,
                 iterations: int = 5000, seed: int = 0, restarts: int = 1, optimizer="auto",
                 n_threads: int | None = None, quiet: bool = True, repulsion: str = "auto", fft_params=None,
                 scheduler: str | None = None, workers: int | None = None, init="random",
                 model_params: dict | None = None, client=None):
        spec, array, instance = runner_spec(model, space_dims, time_dims, iterations, seed, restarts, optimizer,
                                            n_threads, repulsion, fft_params, scheduler, workers, init,
                                            model_params)
        super().__init__(spec, init=array, optimizer=instance, quiet=quiet, client=client)


def embed(data=None, out=None, checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY, overwrite: bool = False,
          **kwargs) -> EmbeddingResult:
    """Embed ``data`` (see ``load_affinity``) and return an ``EmbeddingResult`` (``.embedding``, ``.kl``).

    Keyword arguments are ``Embedder``'s (``client``: a running ``distributed.Client`` to run on, or True for
    the active one), plus ``graph_affinity`` for edge-list inputs.  With ``out`` the run
    keeps checkpoints there (every ``checkpoint_every`` iterations, 0: only on SIGINT/SIGTERM, which then
    raise ``RunInterrupted``; ``scalemb.resume(out)`` continues) and the result is saved there at the end
    (``data`` and ``out`` may be object-storage URLs: ``scalemb.io.storage``).
    """
    graph_affinity = kwargs.pop("graph_affinity", "coauthorship")
    quiet = kwargs.pop("quiet", True)
    client = kwargs.pop("client", None)
    spec, array, instance = runner_spec(**kwargs, graph_affinity=graph_affinity)
    runner = Runner(spec, init=array, optimizer=instance, quiet=quiet, client=client)
    if out is None:
        return runner.fit(plan_of(data, graph_affinity)).result_

    with output_target(out, overwrite) as target, \
            Checkpointer(target, every=checkpoint_every, overwrite=overwrite) as checkpoint:
        return held_in_memory(runner.fit(plan_of(data, graph_affinity), checkpoint=checkpoint).result_, target != out)
