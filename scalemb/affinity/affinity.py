"""The input affinity matrix P: sparse, symmetric, summing to 1 over ordered pairs, zero diagonal."""
import os
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..io.nodeids import as_node_ids


@dataclass
class RowBlock:
    """Rows ``[r0, r1)`` of P in CSR form with ``indptr`` rebased to start at 0 (the unit of work)."""

    r0: int
    r1: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray

    def entropy_term(self) -> float:
        """``sum p log p`` over the block's non-zeros (KL's constant part, summed over blocks in order)."""
        return float(np.sum(self.data * np.log(self.data)))


@dataclass
class Affinity:
    """P as a SciPy CSR matrix plus the original node ids (int64 or strings) and where it came from.

    ``radii``: optional per-point target radii in the unit ball (N,), ``0 <= r < 1`` (CO-SNE's norm loss keeps
    ``|y_i|`` near them: the input points' norms, or radii derived from the degree for a graph)."""

    P: sp.csr_matrix
    node_ids: np.ndarray
    provenance: dict = field(default_factory=dict)
    radii: np.ndarray | None = None

    def __post_init__(self):
        P = sp.csr_matrix(self.P, dtype=np.float64)
        P.sum_duplicates()
        P.sort_indices()
        P.eliminate_zeros()
        if P.shape[0] != P.shape[1]:
            raise ValueError(f"P must be square, got shape {P.shape}")
        if P.nnz == 0:
            raise ValueError("P has no non-zero entries")
        if not np.all(np.isfinite(P.data)) or P.data.min() < 0:
            raise ValueError("P must be finite and non-negative")
        if P.diagonal().any():
            raise ValueError("P must have a zero diagonal")
        if abs(P - P.T).max() > 1e-12 * P.data.max():
            raise ValueError("P must be symmetric")
        total = P.data.sum()
        if abs(total - 1.0) > 1e-12:  # idempotent: a stored, normalised P round-trips bit for bit
            P.data /= total
        self.P = P
        self.node_ids = as_node_ids(self.node_ids)
        if self.node_ids.shape != (P.shape[0],):
            raise ValueError("node_ids must have one id per row of P")
        self.radii = check_radii(self.radii, P.shape[0])

    @property
    def n_points(self) -> int:
        return int(self.P.shape[0])

    def entropy_term(self) -> float:
        """``sum_ij p_ij log p_ij`` (the constant part of KL(P||Q))."""
        return float(np.sum(self.P.data * np.log(self.P.data)))

    def permuted(self, order: np.ndarray) -> "Affinity":
        """The same affinities with the points renumbered: point k of the result is point ``order[k]`` here
        (``P[order][:, order]``, node ids alike)."""
        return Affinity(self.P[order][:, order], self.node_ids[order], dict(self.provenance),
                        None if self.radii is None else self.radii[order])

    def row_block(self, r0: int, r1: int) -> RowBlock:
        """Rows ``[r0, r1)`` as a ``RowBlock`` (views, no copy of the big arrays beyond the rebased indptr)."""
        indptr = self.P.indptr
        lo, hi = indptr[r0], indptr[r1]
        return RowBlock(r0, r1, (indptr[r0:r1 + 1] - lo).astype(np.int64),
                        self.P.indices[lo:hi].astype(np.int64), self.P.data[lo:hi])


def check_radii(radii, n_points: int, source: str = "radii"):
    """``radii`` as a float64 (N,) array with ``0 <= r < 1`` (None stays None); ValueError naming ``source``."""
    if radii is None:
        return None
    radii = np.asarray(radii, dtype=np.float64)
    if radii.shape != (n_points,):
        raise ValueError(f"{source} must have one entry per point ({n_points}), got shape {radii.shape}")
    bad = ~(np.isfinite(radii) & (radii >= 0) & (radii < 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{source} must be finite and in [0, 1) (inside the unit ball); entry {i} is {radii[i]}")
    return radii


def default_threads() -> int:
    """Threads to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def row_partition(n_rows: int, n_blocks: int) -> list:
    """Split ``range(n_rows)`` into ``n_blocks`` contiguous ``(r0, r1)`` ranges of near-equal length.

    Equal row counts balance the repulsion kernel, whose cost per row is the same for every row.
    """
    n_blocks = max(1, min(n_blocks, n_rows))
    bounds = np.linspace(0, n_rows, n_blocks + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
