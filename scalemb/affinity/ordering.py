"""A locality-preserving point order for P, for the sparse kernels' neighbour gathers.

The attraction (``scalemb.models.kernels``) reads, for each row i of P, the coordinates of i's neighbours j.
In the input's order (e.g. points of many clusters interleaved) the neighbours of consecutive rows lie all
over the coordinate array, and most reads miss the caches.  The reverse Cuthill-McKee order of P's graph
(Cuthill & McKee 1969; George & Liu 1981, ``scipy.sparse.csgraph.reverse_cuthill_mckee``) numbers every
point close to its neighbours (it minimises the bandwidth ``max |order(i) - order(j)|`` over the edges,
heuristically), so consecutive rows share the neighbours' cache lines: the attraction on a 1e5-point kNN P
(``benchmarks/repulsion.py``) ran ~1.5x faster single-threaded in this order.  After convergence, neighbours
in P are also close in the embedding, so the interpolation's grid accesses gain a little too.
"""
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee


def locality_order(P: sp.csr_matrix) -> np.ndarray:
    """The points of the symmetric ``P`` in reverse Cuthill-McKee order: ``order[k]`` is the k-th point
    (int64, a permutation of ``range(N)``; deterministic)."""
    return np.asarray(reverse_cuthill_mckee(sp.csr_matrix(P), symmetric_mode=True), dtype=np.int64)


def inverse_permutation(order: np.ndarray) -> np.ndarray:
    """``rank`` with ``rank[order[k]] = k``."""
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0], dtype=order.dtype)
    return rank
