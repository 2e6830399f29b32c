"""``Eigenmap``: the graph (Laplacian) eigenmap as an estimator whose result is stored like an embed run."""
import time

import numpy as np

from .._version import __version__
from ..engine.eigenmap import EIGENSOLVERS, laplacian_eigenmap, nystrom_extend


class Eigenmap:
    """Laplacian eigenmap of an affinity P (``scalemb.engine.eigenmap``), on local threads or a Dask cluster.

    Parameters: ``n_components`` (output dimensions), ``method`` ('lanczos' or 'lobpcg'), ``tol``, ``seed``
    (the solver's start vector), ``n_threads``, ``scheduler`` / ``workers`` (as ``Embedder``: P stays in row
    blocks on the workers; the client sees only products with it).
    After ``fit``: ``embedding_`` (N x k, ``v_k = D^{-1/2} u_k``), ``eigenvalues_`` (``lambda_k`` of
    ``L_sym``), ``residuals_``, ``n_graph_components_``, ``result_`` (an ``EmbeddingResult``: ``save`` writes
    the same Zarr result group as an embed run, with ``kl`` NaN and the eigenpairs in ``optimizer``).
    ``transform(weights)``: Nyström coordinates of new points from their weights to the fitted ones.
    """

    def __init__(self, n_components: int = 2, method: str = "lanczos", tol: float = 1e-10, seed: int = 0,
                 n_threads: int | None = None, scheduler: str | None = None, workers: int | None = None,
                 quiet: bool = True):
        self.n_components = n_components
        self.method = method
        self.tol = tol
        self.seed = seed
        self.n_threads = n_threads
        self.scheduler = scheduler
        self.workers = workers
        self.quiet = quiet

    def fit(self, data=None, graph_affinity: str = "coauthorship") -> "Eigenmap":
        from ..io.results import EmbeddingResult
        from ..run.inputs import plan_of
        from ..run.runner import executor_for
        from ..run.spec import RunSpec

        if int(self.n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {self.n_components}")
        if self.method not in EIGENSOLVERS:
            raise ValueError(f"unknown eigensolver {self.method!r}; choose one of {', '.join(EIGENSOLVERS)}")
        # An eigenmap uses only the executors' row-block maps and Laplacian products with the constant weights
        # 4 P, never a model's evaluation: its executor has no model (model=None).
        where = RunSpec.from_values({"space_dims": 1, "time_dims": 0, "repulsion": "exact", "n_jobs": self.n_threads,
                                     "scheduler": self.scheduler, "workers": self.workers})
        start = time.perf_counter()
        with executor_for(where, plan_of(data, graph_affinity), None, 0) as (executor, node_ids, provenance):
            solution = laplacian_eigenmap(executor, int(self.n_components), method=self.method, seed=self.seed,
                                          tol=self.tol, quiet=self.quiet)
        wall = time.perf_counter() - start
        self.solution_ = solution
        self.embedding_ = solution.coords
        self.eigenvalues_ = solution.eigenvalues
        self.residuals_ = solution.residuals
        self.n_graph_components_ = solution.n_components
        solver = {"name": "eigenmap", "method": self.method, "tol": self.tol,
                  "eigenvalues": [float(v) for v in solution.eigenvalues],
                  "residuals": [float(r) for r in solution.residuals],
                  "graph_components": solution.n_components, "matvecs": solution.matvecs,
                  "scalemb_version": __version__}
        self.result_ = EmbeddingResult(
            embedding=np.ascontiguousarray(solution.coords), node_ids=node_ids, kl=float("nan"),
            kl_history=np.zeros(0), model="eigenmap", space_dims=int(self.n_components), time_dims=0,
            iterations=solution.iterations, seed=self.seed, restart_kls=[], wall_time=wall,
            provenance=provenance, optimizer=solver, repulsion={})
        return self

    def fit_transform(self, data=None, graph_affinity: str = "coauthorship") -> np.ndarray:
        return self.fit(data, graph_affinity).embedding_

    def transform(self, weights) -> np.ndarray:
        """Coordinates of new points from their ``(n_new, N)`` weights to the fitted points (Nyström,
        ``scalemb.eigenmaps.nystrom_extend``)."""
        if not hasattr(self, "solution_"):
            raise ValueError("fit the Eigenmap before transform")
        return nystrom_extend(weights, self.solution_.coords, self.solution_.eigenvalues)
