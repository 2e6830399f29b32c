"""Finite differences for the gradient tests (one definition for every test file)."""
import numpy as np


def central_differences(f, x, entries=None, h=1e-6):
    """``(f(x + h e) - f(x - h e)) / 2h`` for the scalar function ``f`` of the array ``x``, at every entry of ``x``
    or only at ``entries`` (index tuples; the other entries are NaN)."""
    numeric = np.full(x.shape, np.nan)
    for idx in (np.ndindex(x.shape) if entries is None else entries):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (f(up) - f(down)) / (2 * h)
    return numeric
