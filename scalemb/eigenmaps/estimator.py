"""``Eigenmap``: the graph (Laplacian) eigenmap as an estimator whose result is stored like an embed run."""
import time

import numpy as np
from sklearn.base import BaseEstimator

from .._version import __version__
from ..engine.eigenmap import EIGENSOLVERS, laplacian_eigenmap, nystrom_extend
from ..params import BY_NAME
from ..progress import phase, reporting
from ..run.inputs import plan_of
from ..run.runner import executor_for
from ..run.spec import RunSpec
from ..store.results import EmbeddingResult


class Eigenmap(BaseEstimator):
    """Laplacian eigenmap of an affinity P (``scalemb.engine.eigenmap``), on local threads or a Dask cluster.

    Parameters, by the names scikit-learn users know: ``n_components`` (output dimensions), ``method``
    ('lanczos' or 'lobpcg'), ``tol``, ``max_iter`` (the eigensolver's iterations; None: its default),
    ``random_state`` (the solver's start vector; None: 0), ``n_jobs`` (threads; None or -1: every CPU),
    ``verbose`` (the solver's progress), ``scheduler`` / ``workers`` (as ``Embedder``: P stays in row blocks on
    the workers; the client sees only products with it).  ``seed``, ``n_threads`` and ``quiet`` are deprecated
    aliases of ``random_state``, ``n_jobs`` and ``verbose`` (``quiet=True`` is ``verbose=False``).  The shared
    settings are checked by their ``scalemb.params.PARAMS`` rows, a bad value named in a one-line message.
    After ``fit``: ``embedding_`` (N x k, ``v_k = D^{-1/2} u_k``), ``eigenvalues_`` (``lambda_k`` of
    ``L_sym``), ``residuals_``, ``n_graph_components_``, ``result_`` (an ``EmbeddingResult``: ``save`` writes
    the same Zarr result group as an embed run, with ``kl`` NaN and the eigenpairs in ``optimizer``).
    ``transform(weights)``: Nyström coordinates of new points from their weights to the fitted ones.
    """

    def __init__(self, n_components: int = 2, method: str = "lanczos", tol: float = 1e-10,
                 max_iter: int | None = None, random_state: int | None = None, n_jobs: int | None = None,
                 verbose: bool = False, scheduler: str | None = None, workers: int | None = None,
                 seed: int | None = None, n_threads: int | None = None, quiet: bool | None = None):
        self.n_components = n_components
        self.method = method
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.scheduler = scheduler
        self.workers = workers
        self.seed = seed
        self.n_threads = n_threads
        self.quiet = quiet

    def _settings(self) -> dict:
        """The checked settings: each alias resolved (FutureWarning), each value checked (``ValueError`` naming
        the parameter)."""
        import numbers
        import warnings

        def alias(old, new, value, default):
            given = getattr(self, old)
            if given is None:
                return value
            if value != default:
                raise ValueError(f"{old} and {new} are one setting; give {new} only")
            warnings.warn(f"{old} is a deprecated alias of {new}; use {new}", FutureWarning, stacklevel=4)
            return given

        random_state = alias("seed", "random_state", self.random_state, None)
        n_jobs = alias("n_threads", "n_jobs", self.n_jobs, None)
        verbose = self.verbose if self.quiet is None else \
            not BY_NAME["quiet"].check(alias("quiet", "verbose", self.verbose, False), "quiet")
        if not isinstance(self.n_components, numbers.Integral) or isinstance(self.n_components, bool) or \
                self.n_components < 1:
            raise ValueError(f"n_components: must be an integer >= 1, got {self.n_components!r}")
        if self.method not in EIGENSOLVERS:
            raise ValueError(f"method: must be one of {', '.join(EIGENSOLVERS)}, got {self.method!r}")
        if not isinstance(self.tol, numbers.Real) or isinstance(self.tol, bool) or not 0 < self.tol < 1:
            raise ValueError(f"tol: must be a number > 0 and < 1, got {self.tol!r}")
        if self.max_iter is not None and (not isinstance(self.max_iter, numbers.Integral) or
                                          isinstance(self.max_iter, bool) or self.max_iter < 1):
            raise ValueError(f"max_iter: must be an integer >= 1 or None, got {self.max_iter!r}")
        return {"random_state": BY_NAME["random_state"].check(random_state, "random_state"),
                "n_jobs": BY_NAME["n_jobs"].check(n_jobs, "n_jobs"),
                "verbose": BY_NAME["verbose"].check(verbose, "verbose"),
                "scheduler": BY_NAME["scheduler"].check(self.scheduler, "scheduler"),
                "workers": BY_NAME["workers"].check(self.workers, "workers")}

    def fit(self, data=None, graph_affinity: str = "coauthorship") -> "Eigenmap":
        settings = self._settings()
        seed = 0 if settings["random_state"] is None else int(settings["random_state"])
        # An eigenmap uses only the executors' row-block maps and Laplacian products with the constant weights
        # 4 P, never a model's evaluation: its executor has no model (model=None).
        where = RunSpec.from_values({"space_dims": 1, "time_dims": 0, "repulsion": "exact",
                                     "n_jobs": None if settings["n_jobs"] == -1 else settings["n_jobs"],
                                     "scheduler": settings["scheduler"], "workers": settings["workers"]})
        start = time.perf_counter()
        with reporting(settings["verbose"]), \
                executor_for(where, plan_of(data, graph_affinity), None, 0) as (executor, node_ids, provenance), \
                phase("eigenmap", f"{len(node_ids)} nodes, {self.n_components} components, {self.method}"):
            solution = laplacian_eigenmap(executor, int(self.n_components), method=self.method, seed=seed,
                                          tol=self.tol, max_iterations=self.max_iter,
                                          quiet=not settings["verbose"])
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
            iterations=solution.iterations, seed=seed, restart_kls=[], wall_time=wall,
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
