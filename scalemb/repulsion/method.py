"""Choosing the repulsion method: ``exact`` (all pairs, ``scalemb.models.kernels``), ``fft``
(interpolation, ``scalemb.repulsion.fft``) or ``auto``.

``auto`` takes ``fft`` when the model and dimensions are supported and N is at least the crossover measured
by ``benchmarks/repulsion.py`` (section "crossover", recorded in benchmarks/results/repulsion.md) for the
embedding's total dimension ds + dt; 1-D layouts use the 2-D crossover.
"""
from .fft import MODELS

REPULSION_METHODS = ("auto", "exact", "fft")
# N from which one fft evaluation (KL + gradient) is faster than the exact one, per total dimension ds + dt.
# Provisional (this commit): replaced by the crossover benchmarks/repulsion.py measures (section (b)).
AUTO_FFT_MIN_POINTS = {2: 20_000, 3: 20_000, 4: 20_000}


def resolve_repulsion(method: str, model: str, space_dims: int, time_dims: int, n_points: int) -> str:
    """``'exact'`` or ``'fft'`` for the requested ``method`` (see module docstring)."""
    if method not in REPULSION_METHODS:
        raise ValueError(f"unknown repulsion {method!r}; choose one of {', '.join(REPULSION_METHODS)}")
    if method != "auto":
        return method
    supported = model in MODELS and 1 <= space_dims <= 3 and time_dims == (1 if model == "snest" else 0)
    dims = max(2, space_dims + time_dims)
    return "fft" if supported and n_points >= AUTO_FFT_MIN_POINTS[dims] else "exact"
