"""``RunSpec``: a run as one value, generated from the parameter table (``scalemb.params.PARAMS``).

One frozen field per table row marked ``run`` (model, dimensions, input kind and kNN settings, iterations, seed,
restarts, the optimiser's and the FFT grid's settings, where it runs).  Every front translates what it was given
into a ``RunSpec`` (``from_values``: each value checked by its row, the message naming the setting as that front
spells it) and hands it to the runner (``scalemb.run.runner``); checkpoints, service job records and results
store ``to_json()`` and read it back with ``from_json``, so a resumed, continued or re-run job is the same value.
Python-only values that JSON cannot hold (an init array, an optimiser instance, callbacks) travel beside the spec,
never in it.
"""
from dataclasses import field, fields, make_dataclass, replace

from ..params import BY_NAME, FFT_PARAMS, OPTIMIZER_PARAMS, PARAMS
from ..repulsion import FFTParams

RUN_PARAMS = tuple(p for p in PARAMS if p.run)
FRONTS = ("python", "cli", "service")


def front_name(param, front: str = "python") -> str:
    """How ``front`` spells ``param``: its CLI flag, its service field or the table's name."""
    return {"cli": param.cli, "service": param.service}.get(front) or param.name


class _Spec:
    @classmethod
    def from_values(cls, values: dict, front: str = "python") -> "RunSpec":
        """A spec from ``{row name: value}`` (missing rows: their defaults), every value checked by its row;
        ``ValueError`` naming the setting as ``front`` spells it for a bad value or an unknown name."""
        unknown = sorted(set(values) - {p.name for p in RUN_PARAMS})
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
        checked = {name: BY_NAME[name].check(value, front_name(BY_NAME[name], front))
                   for name, value in values.items()}
        return cls(**checked)

    @classmethod
    def from_front(cls, values: dict, front: str) -> "RunSpec":
        """A spec from a front's own names (``{"space": 2, "seed": 3}`` for the service, ``{"--space": 2}`` for
        the CLI); names that are no table row's are ignored (the front's own fields)."""
        names = {front_name(p, front): p.name for p in RUN_PARAMS if front == "python" or getattr(p, front)}
        return cls.from_values({names[k]: v for k, v in values.items() if k in names}, front)

    def to_json(self) -> dict:
        """The spec as JSON values (every field; ``ValueError`` for an init array: store it as a .npy file)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "shape"):
                raise ValueError("a stored run records its init: pass the init array as a .npy path")
            out[f.name] = dict(value) if isinstance(value, dict) else value
        return out

    @classmethod
    def from_json(cls, data: dict) -> "RunSpec":
        """Inverse of ``to_json``; a field a newer scalemb added and the record lacks takes its default."""
        return cls.from_values(dict(data))

    def replace(self, **changes) -> "RunSpec":
        """A copy with ``changes`` (checked)."""
        return replace(self, **{k: BY_NAME[k].check(v) for k, v in changes.items()})

    @property
    def seed(self) -> int:
        """The random start's seed (``random_state`` None: 0)."""
        return 0 if self.random_state is None else int(self.random_state)

    @property
    def threads(self):
        """Threads for an in-process run (None: every usable CPU)."""
        return None if self.n_jobs in (None, -1) else int(self.n_jobs)

    def optimizer_options(self) -> dict:
        """The optimiser settings given (``make_optimizer``'s options; None: the optimiser's default)."""
        return {name: getattr(self, name) for name in OPTIMIZER_PARAMS if getattr(self, name) is not None}

    def fft_params(self):
        """The ``scalemb.repulsion.FFTParams`` of the ``fft_*`` settings."""

        return FFTParams(**{attr: getattr(self, name) for name, attr in FFT_PARAMS.items()})


RunSpec = make_dataclass("RunSpec", [(p.name, object, field(default=p.default)) for p in RUN_PARAMS],
                         bases=(_Spec,), frozen=True)
RunSpec.__module__ = __name__
RunSpec.__doc__ = "A run's settings, one field per ``scalemb.params.PARAMS`` row marked ``run`` (see the module)."


def fft_settings(fft_params) -> dict:
    """The ``fft_*`` rows of an ``FFTParams`` (or its ``as_dict``), for a Python caller that holds one."""
    if fft_params is None:
        return {}
    values = fft_params if isinstance(fft_params, dict) else {attr: getattr(fft_params, attr)
                                                              for attr in FFT_PARAMS.values()}
    return {name: values[attr] for name, attr in FFT_PARAMS.items() if attr in values}
