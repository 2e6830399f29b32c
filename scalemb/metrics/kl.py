"""``kl(P, Y, model)``: KL(P||Q) of any embedding under a model's kernel, through the executor that optimises it.

Exact all-pairs normaliser below the exact/fft crossover (``scalemb.repulsion.method``), FFT-interpolated
above it (``repulsion='auto'``; force ``'exact'`` or ``'fft'``).  The FFT value's error is that of log Z
(``sum p log w`` is exact, on P's non-zeros): the relative error of Z is below 1e-3 on every layout of
tests/test_fft_repulsion.py, so the KL's is below ~1e-3 (the measured errors: docs/design/metrics.md).
"""
import numpy as np
import scipy.sparse as sp

from ..affinity import Affinity
from ..engine import LocalExecutor
from .quality import _points, resolve_model


def kl(P, Y, model, space_dims=None, *, repulsion: str = "auto", n_threads=None) -> float:
    """``KL(P||Q)`` with ``Q`` the normalised kernel of ``model`` (a name or ``Model``) at ``Y`` (N x d, space
    columns first).  ``P``: an ``Affinity`` or a symmetric sparse matrix with zero diagonal (normalised to sum
    1 here)."""
    Y = _points(Y)
    model, space_dims = resolve_model(model, Y.shape[1], space_dims)
    if model is None:
        raise ValueError("kl needs a model")
    if not isinstance(P, Affinity):
        if not sp.issparse(P):
            raise TypeError(f"P must be an Affinity or a scipy.sparse matrix, got {type(P).__name__}")
        P = Affinity(P, np.arange(P.shape[0]))
    if P.n_points != Y.shape[0]:
        raise ValueError(f"P has {P.n_points} points but the embedding has {Y.shape[0]}")
    with LocalExecutor(P, model, space_dims, Y.shape[1] - space_dims, n_threads=n_threads,
                       repulsion=repulsion) as executor:
        return float(executor.evaluate(np.ascontiguousarray(Y.T)).kl)
