"""Dask task keys named by the operation a task performs (``task_key``), so that the dashboard's task stream and
progress bars read as the algorithm, not as the generic wrapper every call goes through."""
import uuid

# Dask task keys by operation, so that the dashboard's task stream and progress bars read as the algorithm
# ("gradient", "repulsion-spread", "laplacian"), not as the generic wrapper every call goes through.
_OPERATIONS = {
    "evaluate_partition": "gradient", "evaluate_block_on_grid": "gradient-fft",
    "spread_view": "repulsion-spread", "spread_packed": "repulsion-spread", "restrict_share": "repulsion-pack",
    "add_grids": "repulsion-sum-grids",
    "convolve_part": "repulsion-convolution", "convolve_grids": "repulsion-convolution",
    "visit_view": "repulsion-box-order", "attraction_view": "attraction",
    "finish_view": "gradient-rows", "finish_prepared": "gradient-rows", "held_finish_view": "held-gradient-rows",
    "prepare_view": "attraction",
    "convolution_z": "repulsion-normaliser", "curvature_partition": "curvature", "curvature_view": "curvature",
    "laplacian_block": "laplacian", "laplacian_compact": "laplacian", "diagonal_partition": "curvature-diag",
    "own_halo": "halo-own-rows", "make_view": "halo-view", "plan_view": "halo-view", "worker_plan": "halo-plan",
    "plan_sizes": "halo-plan", "plan_needs": "halo-plan", "take_columns": "halo-cut",
    "assemble": "halo-join", "relay": "halo-relay", "factorize_partitions": "curvature-factorize",
    "factor_ordering": "curvature-ordering", "entropy_partition": "entropy", "solve_factorized": "curvature-solve",
    "getitem": "take",
}


def task_key(fn) -> str:
    """A unique Dask key named by the operation ``fn`` performs: ``'<operation>-<uuid>'``.  Dask groups keys by
    ``dask.utils.key_split``, which drops any 8-letter word starting with a-f as if it were a hash ("convolve",
    "assemble", "diagonal"): operation names avoid such words.  Unlisted functions are named after themselves
    (``_`` written ``-``)."""
    name = getattr(fn, "__name__", type(fn).__name__)
    name = _OPERATIONS.get(name, name.strip("_<>").replace("_", "-"))
    return f"{name}-{uuid.uuid4().hex}"
