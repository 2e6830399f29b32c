"""Choosing the repulsion method: ``exact`` (all pairs, ``scalemb.models.kernels``), ``fft``
(interpolation, ``scalemb.repulsion.fft``) or ``auto``.

``auto`` takes ``fft`` when the model and dimensions are supported and N is at least the crossover measured
by ``benchmarks/repulsion.py`` (section "crossover", recorded in benchmarks/results/repulsion.md) for the
embedding's total dimension ds + dt; 1-D layouts use the 2-D crossover.
"""
from .fft import MODELS, FFTParams, check_supported

REPULSION_METHODS = ("auto", "exact", "fft")
# N from which fft is used, per total dimension ds + dt, from benchmarks/repulsion.py section (b) on the 2-core
# AMD EPYC machine (benchmarks/results/repulsion.md): on clustered layouts t-SNE R^2's fft evaluation is faster
# from N = 5000 (6 nodes per unit), but GrQc (N = 5241), whose layouts fly apart to ~7e4 units, ran ~4x slower
# with fft (capped grid, near field), so t-SNE stays exact below 10000.  SNEST R^{2,1} (time kernel through 12
# SVD components) is faster from N = 20000; SNEST R^{3,1} was never faster up to N = 40000 (its capped 3-D grid's
# near field dominates), so auto keeps it exact (None).
AUTO_FFT_MIN_POINTS = {2: 10_000, 3: 20_000, 4: None}


def resolve_repulsion(method: str, model: str, space_dims: int, time_dims: int, n_points: int) -> str:
    """``'exact'`` or ``'fft'`` for the requested ``method`` (see module docstring)."""
    if method not in REPULSION_METHODS:
        raise ValueError(f"unknown repulsion {method!r}; choose one of {', '.join(REPULSION_METHODS)}")
    if method != "auto":
        return method
    supported = model in MODELS and 1 <= space_dims <= 3 and time_dims == (1 if model == "snest" else 0)
    threshold = AUTO_FFT_MIN_POINTS.get(max(2, space_dims + time_dims)) if supported else None
    return "fft" if threshold is not None and n_points >= threshold else "exact"


def resolve_repulsion_settings(method: str, model: str, space_dims: int, time_dims: int, n_points: int,
                               fft_params: FFTParams | None = None) -> tuple:
    """``(method, params)`` for an executor: ``resolve_repulsion``'s method and, for ``fft`` (checked to be
    supported), ``fft_params`` with the model's defaults filled in (``FFTParams.resolved``)."""
    resolved = resolve_repulsion(method, model, space_dims, time_dims, n_points)
    params = fft_params or FFTParams()
    if resolved == "fft":
        check_supported(model, space_dims, time_dims)
        params = params.resolved(model, space_dims)
    return resolved, params
