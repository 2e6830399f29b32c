"""What a model is: a name, which (space, time) dimension pairs it accepts, and its compiled kernels."""
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Model:
    """An SNE-family output kernel ``w_ij = w(|s_i - s_j|^2, |t_i - t_j|^2)`` (see ``kernels``)."""

    name: str
    description: str
    has_time: bool
    attraction: Callable = field(repr=False)
    repulsion: Callable = field(repr=False)
    curvature: Callable = field(repr=False)
    cross_repulsion: Callable = field(repr=False)
    # numba function (d2s, d2t) -> a strictly increasing function of the kernel w_ij: "more similar" in this
    # model's output space, the order quality metrics rank neighbours by (scalemb.metrics)
    similarity: Callable = field(default=None, repr=False)

    def check_dims(self, space_dims: int, time_dims: int) -> None:
        """Raise ValueError unless this model can embed in R^{space_dims, time_dims}."""
        if space_dims < 1:
            raise ValueError(f"model {self.name!r} needs at least one space dimension, got {space_dims}")
        if time_dims < 0:
            raise ValueError(f"time dimensions must be >= 0, got {time_dims}")
        if self.has_time and time_dims < 1:
            raise ValueError(f"model {self.name!r} needs at least one time dimension (--time 1)")
        if not self.has_time and time_dims != 0:
            raise ValueError(f"model {self.name!r} has no time dimensions; use --time 0 or --model snest")
