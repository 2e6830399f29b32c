"""LVQ epochs on a Dask cluster: each worker holds row partitions of ``(X, y)``; per epoch the client sends
the current prototypes and matrices (``m x D`` and ``R x M x D``: small), every partition runs its stochastic
sweep (``kernels.partition_sweep``), and the client sums the parameter changes in partition order -- the
same reduction ``_LocalRunner`` does, so local and Dask runs with the same partitions agree."""
import numpy as np

from ..engine.cluster import dask_client
from .kernels import partition_sweep


class DaskRunner:
    def __init__(self, scheduler: str, X: np.ndarray, y: np.ndarray, blocks):
        self._ctx = dask_client(scheduler)
        self.client = self._ctx.__enter__()
        workers = sorted(self.client.scheduler_info()["workers"])
        if not workers:
            self.close()
            raise RuntimeError(f"the Dask cluster at {scheduler} has no workers")
        self.blocks = blocks
        self.parts = []
        for k, (r0, r1) in enumerate(blocks):  # partition k lives on worker k mod W, for the whole fit
            where = [workers[k % len(workers)]]
            self.parts.append((self.client.scatter(np.ascontiguousarray(X[r0:r1]), workers=where, hash=False),
                               self.client.scatter(np.ascontiguousarray(y[r0:r1]), workers=where, hash=False), where))

    def epoch(self, orders, W, proto_labels, omegas, omega_of, a1, a2):
        futures = [self.client.submit(partition_sweep, Xf, yf, order, W, proto_labels, omegas, omega_of, a1, a2,
                                      workers=where, pure=False)
                   for (Xf, yf, where), order in zip(self.parts, orders)]
        total, dW, dO = 0.0, np.zeros_like(W), np.zeros_like(omegas)
        for c, w, o in self.client.gather(futures):
            total, dW, dO = total + c, dW + w, dO + o
        return total, dW, dO

    def close(self):
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None
