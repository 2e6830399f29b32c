import numpy as np
import pytest

from scalemb.datasets import school


@pytest.fixture(scope="session")
def school_affinity():
    return school()


def dense_kl(P, coords, model, space_dims):
    """Reference KL(P||Q) computed densely from the model's definition (SNEST paper, eqs. 1-8)."""
    S = coords[:space_dims].T
    T = coords[space_dims:].T
    d2s = ((S[:, None] - S[None]) ** 2).sum(-1)
    d2t = ((T[:, None] - T[None]) ** 2).sum(-1)
    W = {"sne": np.exp(-d2s), "tsne": 1 / (1 + d2s), "snest": np.exp(d2t) / (1 + d2s)}[model]
    np.fill_diagonal(W, 0)
    Q = W / W.sum()
    mask = P > 0
    return float(np.sum(P[mask] * np.log(P[mask] / Q[mask])))
