"""The application layer: a run is one value (``RunSpec``, generated from ``scalemb.params.PARAMS``), its input
one plan (``resolve(source, spec) -> InputPlan``: the only place 'auto' is decided) and one runner (``Runner``,
``run``).  The CLI, the service, the estimators and resume/continue translate what they were given into these."""
from .inputs import InputPlan, input_kind, load_affinity, resolve
from .runner import Runner, run
from .spec import RUN_PARAMS, RunSpec

__all__ = ["InputPlan", "RUN_PARAMS", "RunSpec", "Runner", "input_kind", "load_affinity", "resolve", "run"]
