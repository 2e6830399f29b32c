"""The neighbour-embedding runner as a registered method (``scalemb.methods``): the method of every model name.

``fit`` is ``scalemb.run.run`` on the ``RunSpec`` of the table's values (checkpoints in ``out``; ``scalemb resume``
continues them); placing new points is ``scalemb.placement``'s optimisation against the fixed map (``place``
None)."""
from ..io.atomic import check_output_path
from ..methods import Method
from ..progress import value_label
from .runner import run
from .spec import RUN_PARAMS, RunSpec


def fit_run(source, values: dict, *, out=None, overwrite: bool = False, checkpoint_every: int | None = None,
            front: str = "python", quiet: bool = True):
    """Run the ``RunSpec`` of ``values`` (the table's run rows among them, each checked and named as ``front``
    spells it) on ``source``; an existing ``out`` is refused unless ``overwrite`` (and then only one scalemb
    wrote), as is an ``out`` that is the input."""
    spec = RunSpec.from_values({p.name: values[p.name] for p in RUN_PARAMS if p.name in values}, front=front)
    if out is not None:
        check_output_path(out, overwrite, (source,), "directory")
    return run(spec, source, out=out, checkpoint_every=checkpoint_every, overwrite=overwrite, front=front,
               quiet=quiet)


def describe(result) -> str:
    """``KL 1.2345, 300 iterations`` (the model's objective's name)."""
    return f"{value_label(result.model)} {result.kl:.4f}, {result.iterations} iterations"


NEIGHBOUR_EMBEDDING = Method("neighbour-embedding", "a neighbour-embedding model (scalemb.models) minimising its "
                             "objective by the runner", output="objective", needs="affinity", fit=fit_run,
                             describe=describe)
