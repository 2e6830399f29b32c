"""The spectral maps as registered methods (``scalemb.methods``): ``eigenmap`` and ``kernel-eigenmap``.

``eigenmap``: the graph eigenmap of the input's affinity P (any embed input; local threads or Dask); new nodes are
placed by the map's Nyström extension (``scalemb.engine.eigenmap.nystrom_extend``, weights: the new rows of the
grown ``P'`` on the stored columns), with no optimisation.
``kernel-eigenmap``: the input is a feature file (.npy, .csv, Zarr array; ``scalemb.affinity.knn.read_features``);
the result store holds the map itself (centres, bandwidth, coefficients) in its ``optimizer`` attributes, so
``KernelEigenmap.from_result`` rebuilds it and new feature rows are mapped by ``KernelEigenmap.transform``.
"""
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..engine.eigenmap import EIGENSOLVERS, nystrom_extend
from ..errors import InputError, ScalembError
from ..methods import Method
from ..params import Param
from .kernel import CORRECTIONS, KernelEigenmap
from ..affinity.knn import read_features
from ..placement import PlacementRun, grown_affinity, new_feature_rows, new_point_ids, placed_result, reference_of

GRAPH_PARAMS = (
    Param("eigensolver", "lanczos", "eigenmap: Lanczos (default) or LOBPCG on the row-block Laplacian products",
          EIGENSOLVERS, "--eigensolver", type=str, run=False),
)
KERNEL_PARAMS = (
    Param("centres", 64, "kernel-eigenmap: landmark kernels (default 64)", None, "--centres", type=int, run=False),
    Param("neighbors", 12, "kernel-eigenmap: kNN graph degree (default 12)", None, "--neighbors", type=int,
          run=False),
    Param("bandwidth", None, "kernel-eigenmap: kernel sigma (default: median centre-to-nearest-centre distance)",
          None, "--bandwidth", type=float, run=False),
    Param("correction", "reweighted", "kernel-eigenmap: correction of the translational eigenvector (default "
          "reweighted)", CORRECTIONS, "--correction", type=str, run=False),
)


def _check_output(name: str, values: dict, out, overwrite: bool) -> None:
    if out is not None and Path(out).exists() and not overwrite:
        raise ScalembError(f"{out}: already exists (pass --overwrite to replace it)")
    if values.get("time_dims") not in (None, 0):
        raise ScalembError(f"model {name!r} has no time dimensions; use --time 0")


def fit_graph_eigenmap(source, values: dict, *, out=None, overwrite: bool = False, checkpoint_every=None,
                       front: str = "python", quiet: bool = True):
    """The graph eigenmap of ``source``'s P (``Eigenmap``), written to ``out`` if given."""
    from .estimator import Eigenmap  # scikit-learn's estimator base: loaded by this method alone

    values = GRAPH_EIGENMAP.values(values)
    _check_output(GRAPH_EIGENMAP.name, values, out, overwrite)
    result = Eigenmap(values.get("space_dims", 2), method=values["eigensolver"],
                      random_state=values.get("random_state"), n_jobs=values.get("n_jobs"),
                      scheduler=values.get("scheduler"), workers=values.get("workers"),
                      verbose=not quiet).fit(source, values.get("graph_affinity", "coauthorship")).result_
    if out is not None:
        result.save(out, overwrite=overwrite)
    return result


def fit_kernel_eigenmap(source, values: dict, *, out=None, overwrite: bool = False, checkpoint_every=None,
                        front: str = "python", quiet: bool = True):
    """The kernel eigenmap of the feature file ``source`` (``KernelEigenmap``), written to ``out`` if given."""

    values = KERNEL_EIGENMAP.values(values)
    _check_output(KERNEL_EIGENMAP.name, values, out, overwrite)
    if source is None:
        raise ScalembError("kernel-eigenmap needs a feature file as INPUT (.npy, .csv or a Zarr array)")
    if values.get("scheduler") or values.get("workers"):
        raise ScalembError("kernel-eigenmap runs in-process (its eigenproblem is centres x (D + 1) square)")
    X = read_features(source)
    result = KernelEigenmap(values.get("space_dims", 2), n_centres=values["centres"], n_neighbors=values["neighbors"],
                            bandwidth=values["bandwidth"], correction=values["correction"],
                            random_state=values.get("random_state"),
                            n_jobs=values.get("n_jobs")).fit(X).to_result(source=source)
    if out is not None:
        result.save(out, overwrite=overwrite)
    return result


def _new_points_provenance(result, run_name, method: str, n_new: int) -> dict:
    return {"transform_of": str(run_name), "method": method, "n_old": int(result.node_ids.size), "n_new": int(n_new),
            "n_unattached": 0, "run_provenance": result.provenance, "start_kl": float("nan")}


def place_nystrom(result, new, *, reference=None, run_name="the stored map", n_threads: int | None = None, **_):
    """Eigenmap runs: the new points of the grown ``P'`` through the map's continuous (Nyström) extension, no
    optimisation (weights: the new rows of ``P'`` on the stored columns)."""

    reference = reference or reference_of(run_name, result.provenance, result.node_ids)
    P, new_ids = grown_affinity(reference, result.node_ids, new, n_threads)
    eigenvalues = result.optimizer.get("eigenvalues")
    if eigenvalues is None:
        raise InputError(run_name, "an eigenmap run without its eigenvalues")
    n = result.node_ids.size
    weights = sp.csr_matrix(P)[n:, :n]
    lonely = int(np.count_nonzero(np.asarray(weights.sum(axis=1)).ravel() <= 0))
    if lonely:
        raise ScalembError(f"{lonely} new nodes have no edge to the stored map: the Nyström extension of an "
                           "eigenmap cannot place them")
    start = time.perf_counter()
    coords = nystrom_extend(weights, result.embedding, np.asarray(eigenvalues))
    run = PlacementRun(np.ascontiguousarray(coords.T), float("nan"), np.zeros(0), 0, True,
                       time.perf_counter() - start, 0, {"method": "nystrom"})
    return placed_result(result, run, new_ids, _new_points_provenance(result, run_name, "nystrom", new_ids.size),
                         repulsion={})


def place_kernel_map(result, new, *, reference=None, run_name="the stored map", n_threads: int | None = None, **_):
    """Kernel-eigenmap runs: the stored continuous map ``y(x) = V^T z(x)`` applied to new feature rows (a path or
    an array), no optimisation."""

    fitted = KernelEigenmap.from_result(result)
    X_new = new_feature_rows(new, fitted.centres_.shape[1], "the stored map takes")
    start = time.perf_counter()
    coords = fitted.transform(X_new)
    run = PlacementRun(np.ascontiguousarray(coords.T), float("nan"), np.zeros(0), 0, True,
                       time.perf_counter() - start, 0, {"method": "kernel map"})
    new_ids = new_point_ids(result.node_ids, X_new.shape[0])
    return placed_result(result, run, new_ids, _new_points_provenance(result, run_name, "kernel map",
                                                                      X_new.shape[0]), repulsion={})


GRAPH_EIGENMAP = Method(
    "eigenmap", "graph (Laplacian) eigenmap of P", output="spectral", needs="affinity", fit=fit_graph_eigenmap,
    describe=lambda result: "eigenvalues " + ", ".join(f"{v:.3g}" for v in result.optimizer["eigenvalues"]),
    place=place_nystrom, params=GRAPH_PARAMS)
KERNEL_EIGENMAP = Method(
    "kernel-eigenmap", "Brand's kernel eigenmap of feature rows: a continuous map", output="spectral",
    needs="features", fit=fit_kernel_eigenmap,
    describe=lambda result: "eigenvalues " + ", ".join(f"{v:.4f}" for v in result.optimizer["eigenvalues"]),
    place=place_kernel_map, params=KERNEL_PARAMS)
