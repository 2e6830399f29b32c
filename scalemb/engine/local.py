"""In-process executor: row blocks evaluated on a thread pool (the kernels release the GIL)."""
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..affinity.affinity import Affinity, row_partition
from ..models.base import Model
from .blocks import Evaluation, evaluate_block, reduce_blocks

# Below this many points a thread hand-off costs more than the kernel itself.
_SINGLE_BLOCK_BELOW = 1024


def default_threads() -> int:
    """Threads to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class LocalExecutor:
    """Evaluates KL and its gradient with P split into row blocks, one thread per block."""

    def __init__(self, affinity: Affinity, model: Model, space_dims: int, time_dims: int,
                 n_threads: int | None = None, n_blocks: int | None = None):
        model.check_dims(space_dims, time_dims)
        self.affinity = affinity
        self.model = model
        self.space_dims = space_dims
        self.time_dims = time_dims
        self.n_threads = n_threads or default_threads()
        n = affinity.n_points
        if n_blocks is None:
            n_blocks = 1 if n < _SINGLE_BLOCK_BELOW else self.n_threads
        self.blocks = [affinity.row_block(r0, r1) for r0, r1 in row_partition(n, n_blocks)]
        self._entropy = affinity.entropy_term()
        self._pool = ThreadPoolExecutor(self.n_threads) if len(self.blocks) > 1 else None

    @property
    def n_points(self) -> int:
        return self.affinity.n_points

    def evaluate(self, coords: np.ndarray, exaggeration: float = 1.0) -> Evaluation:
        """KL(P||Q) and gradient at ``coords`` (``(ds + dt, N)``, C-contiguous float64)."""
        coords = np.ascontiguousarray(coords, dtype=np.float64)
        if self._pool is None:
            results = [evaluate_block(self.model, b, coords, self.space_dims) for b in self.blocks]
        else:
            results = list(self._pool.map(lambda b: evaluate_block(self.model, b, coords, self.space_dims),
                                          self.blocks))
        return reduce_blocks(results, coords.shape, self._entropy, exaggeration)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
