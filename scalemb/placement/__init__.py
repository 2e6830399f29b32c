"""Placing new nodes or points into a stored map: ``scalemb transform RUN.zarr NEW --out placed.zarr``.

The old rows stay fixed.  The new rows of the grown affinity ``P'`` (``placement.affinity``: the run's rule on
the union graph, or kNN of new feature rows against the reference) start at the weighted median of their old
neighbours and are optimised against the fixed map: the whole map's ``KL(P'||Q)`` as a function of the new
coordinates (``placement.objective``, the same row kernels as the embedding), by ``placement.optimize``.
Runs of a method with its own placement (``scalemb.methods``: the graph eigenmap's Nyström extension, the kernel
eigenmap's stored continuous map) are placed by that method instead, with no optimisation.

Where the run's P came from is read from its provenance: ``store`` (an affinity store, which must still
exist), ``dataset`` (bundled), ``source`` (the edge list or, for kNN stores, the feature file).  Bad input
raises ``InputError`` / ``ScalembError`` before anything is written; the output is written atomically.
"""
import dataclasses
from dataclasses import dataclass, field
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..affinity import Affinity, AffinityStore, read_features
from ..affinity.knn import PERPLEXITY
from ..datasets import dataset_graph, recorded_graph
from ..errors import InputError, ScalembError
from ..io.atomic import check_output_path
from ..io.edges import Graph
from ..io.edgelist import read_edge_list
from ..io.nodeids import is_string_ids
from ..methods import affinity_metric, method_of
from ..models import get_model
from .affinity import extended_graph_affinity, extended_knn_affinity, read_new_edges
from .objective import PlacementObjective
from .optimize import KNN_FINAL_EXAGGERATION, UNATTACHED_RULE, PlacementOptimizer, PlacementRun, initial_positions
from ..affinity.store import check_source, check_store
from ..engine.cluster import dask_client
from ..store.results import EmbeddingResult

__all__ = ["FREE_EXAGGERATION", "FREE_HOPS", "FREE_ITERATIONS", "FREE_MAX_SHARE", "FREE_STORED_ATTRACTION",
           "PRE_FREE_ITERATIONS", "Reference", "auto_free_hops",
           "placement_defaults", "PlacementOptimizer", "PlacementObjective", "UNATTACHED_RULE",
           "freed_points", "knn_optimizer", "knn_settings", "new_feature_rows", "place", "placement_repulsion",
           "place_into", "reference_of", "transform_run"]


@dataclass
class Reference:
    """What placing needs besides the map: for graph runs the run's graph and rule; for kNN runs the run's P
    and the reference features with the kNN settings."""

    kind: str  # "graph" or "knn"
    graph: Graph | None = None
    rule: str = "coauthorship"
    affinity: Affinity | None = None
    features: np.ndarray | None = None
    knn: dict = field(default_factory=dict)


def knn_settings(provenance: dict) -> dict:
    """The kNN settings of a run's provenance that placing new feature rows repeats: ``n_neighbors``, ``metric``,
    ``perplexity`` and, for a registered metric (``scalemb.methods.affinity_metric``), its fitted state as
    ``fitted`` (the provenance entry its ``provenance_key`` names)."""
    knn = {k: provenance.get(k) for k in ("n_neighbors", "metric", "perplexity")}
    registered = affinity_metric(knn["metric"])
    if registered is not None and registered.provenance_key is not None:
        knn["fitted"] = provenance.get(registered.provenance_key)
    return knn


def _knn_reference(run, provenance: dict, store) -> Reference:
    """A kNN run's reference: its stored P and the feature file it was built from (both must still be there)."""
    if store is None:
        raise InputError(run, "a kNN run without an affinity store (built in memory): use Embedder.transform")
    affinity = AffinityStore(store).to_affinity()
    source = provenance.get("source")
    if source is None or not Path(source).exists():
        raise InputError(run, f"the reference features {source} the affinity was built from are gone")
    features = read_features(source)
    if features.shape[0] != affinity.n_points:
        raise InputError(source, f"has {features.shape[0]} rows, the run's affinity {affinity.n_points}")
    return Reference("knn", affinity=affinity, features=features, knn=knn_settings(provenance))


def reference_of(run, provenance: dict, node_ids: np.ndarray) -> Reference:
    """The ``Reference`` of a stored run from its provenance (``run`` names it in errors)."""

    store = provenance.get("store")
    if store is not None and not Path(store).exists():
        raise InputError(run, f"the run's affinity store {store} is gone; cannot place new points against it")
    check_source(provenance)  # a reference file or store changed since the run is refused, as resume does
    if store is not None:
        check_store(store, provenance)
    if provenance.get("method") == "knn":
        return _knn_reference(run, provenance, store)
    if provenance.get("method") is not None:
        raise InputError(run, f"placing needs a graph or kNN run, this affinity is {provenance.get('method')!r}")
    kind, source = recorded_graph(provenance)
    if kind == "dataset":
        graph = dataset_graph(source)
    else:
        if source is None or not Path(source).exists():
            raise InputError(run, f"the edge list {source} the run's affinity was built from is gone")
        graph = read_edge_list(source)
    if graph.n_nodes != len(node_ids) or not np.array_equal(np.sort(graph.node_ids), np.sort(node_ids)):
        raise InputError(run, f"the edge list {graph.source} no longer has the run's {len(node_ids)} nodes")
    return Reference("graph", graph=graph, rule=provenance.get("affinity", "coauthorship"))


def new_feature_rows(new, width: int, holder: str = "the reference has") -> np.ndarray:
    """New feature rows (a file path or an array) checked against the ``width`` the map takes (``InputError``
    naming the file, or "new feature rows", for another width or a non-finite value)."""
    where = new if isinstance(new, (str, Path)) else "new feature rows"
    X_new = read_features(new) if isinstance(new, (str, Path)) else np.asarray(new, dtype=np.float64)
    if X_new.ndim != 2 or X_new.shape[1] != width:
        raise InputError(where, f"new rows have shape {X_new.shape}; {holder} {width} columns")
    if not np.all(np.isfinite(X_new)):
        raise InputError(where, "non-finite values in the new rows")
    return X_new


def grown_affinity(reference: Reference, node_ids: np.ndarray, new, n_jobs: int | None = None):
    """``(P', new_ids)`` for ``new``: an edge-list path (graph runs) or features (path or array, kNN runs)."""
    if reference.kind == "graph":
        if not isinstance(new, (str, Path)):
            raise ScalembError("a graph run places new nodes from an edge list file (NEW_ID OTHER_ID [weight])")
        new_ids, src, dst, weight = read_new_edges(new, node_ids)
        return extended_graph_affinity(reference.graph, reference.rule, node_ids, new_ids, src, dst, weight), new_ids
    X_new = new_feature_rows(new, reference.features.shape[1], "the reference has")
    knn = reference.knn
    P = extended_knn_affinity(reference.affinity, reference.features, X_new, knn.get("n_neighbors") or 90,
                              knn.get("metric") or "euclidean", knn.get("perplexity") or PERPLEXITY, n_jobs,
                              fitted=knn.get("fitted"))
    return P, new_point_ids(node_ids, X_new.shape[0])


def new_point_ids(node_ids: np.ndarray, m: int) -> np.ndarray:
    """Ids of ``m`` new feature rows: integers after the largest old id, or for a map with string ids
    ``new-0 .. new-{m-1}`` (``ScalembError`` if the map already uses one of them)."""
    if is_string_ids(node_ids):
        ids = np.array([f"new-{k}" for k in range(m)], dtype=str)
        if np.isin(ids, node_ids).any():
            raise ScalembError("the stored map already has ids of the form 'new-K'; place these rows as an edge list")
        return ids
    return np.arange(m, dtype=np.int64) + (int(np.max(node_ids)) + 1 if len(node_ids) else 0)


# the free phase's descent direction: 'spectral' (the moving stored points are coupled by their edges: the solved
# partial Hessian moves a freed region as a whole where Jacobi moves each point alone; chosen on GrQc's random
# split, docs/design/placement.md)
FREE_DIRECTION = "spectral"
# free_hops=None (the default, "auto"): the stored points within FREE_HOPS edges of a new node move in a second
# phase of FREE_ITERATIONS iterations, unless they are more than FREE_MAX_SHARE of the stored map (then the map
# stays fixed: moving most of it is a re-embedding); the first phase then stops after PRE_FREE_ITERATIONS at most
# (the free phase goes on descending the new points; maps without time coordinates).  Measured on GrQc and a
# generated co-authorship graph of 1e4 nodes against a re-embedding (docs/design/placement.md)
FREE_HOPS = 1
FREE_MAX_SHARE = 0.5
FREE_ITERATIONS = 30
PRE_FREE_ITERATIONS = 50
# the free phase's objective (maps without time coordinates): the attraction of the pairs with a placed point x
# FREE_EXAGGERATION, of the freed stored points' other pairs (to each other and to the fixed map) x
# FREE_STORED_ATTRACTION (``PlacementObjective``'s ``stored_attraction``): the freed points follow the new links the
# stored map lacks instead of holding to its old layout (docs/design/placement.md).  The KL reported is the map's own
FREE_EXAGGERATION = 4.0
FREE_STORED_ATTRACTION = 0.75
# repulsion="auto": the frozen FFT grid from this many old points, or this many old x new pairs, on (if the model
# has an FFT repulsion); below, the exact sums (cheap there, and exact)
FFT_MIN_OLD = 20_000
FFT_MIN_PAIRS = 20_000_000


def placement_defaults() -> dict:
    """The placement's default settings of a map without time coordinates, by name (what ``scalemb
    transform`` does without flags)."""
    first = PlacementOptimizer().resolved(with_time=False)
    return {"iterations": first.iterations, "iterations before a free phase": PRE_FREE_ITERATIONS,
            "tol": first.tol, "direction": first.direction, "exaggeration": first.exaggeration,
            "exaggeration_iterations": first.exaggeration_iterations,
            "final_exaggeration": first.final_exaggeration,
            "final_exaggeration of new feature rows": KNN_FINAL_EXAGGERATION, "free_hops": f"{FREE_HOPS} if at most "
            f"{FREE_MAX_SHARE:g} of the stored map, else 0", "free_iterations": FREE_ITERATIONS,
            "free_direction": FREE_DIRECTION, "free_exaggeration": FREE_EXAGGERATION,
            "free_stored_attraction": FREE_STORED_ATTRACTION}


def auto_free_hops(P: sp.csr_matrix, n: int) -> int:
    """``free_hops=None``: ``FREE_HOPS`` if the stored points within that many edges of a new point are at most
    ``FREE_MAX_SHARE`` of the ``n`` stored points, else 0 (module constants)."""
    return FREE_HOPS if freed_points(P, n, FREE_HOPS).size <= FREE_MAX_SHARE * n else 0


def placement_repulsion(model, n_old: int, n_new: int, repulsion: str = "auto") -> str:
    """``"exact"`` or ``"fft"`` for ``repulsion`` ``"auto"`` / ``"exact"`` / ``"fft"`` (module constants)."""
    if repulsion not in ("auto", "exact", "fft"):
        raise ValueError(f"placement repulsion must be 'auto', 'exact' or 'fft', got {repulsion!r}")
    if repulsion != "auto":
        return repulsion
    big = n_old >= FFT_MIN_OLD or n_old * n_new >= FFT_MIN_PAIRS
    return "fft" if big and model.fft is not None else "exact"


def freed_points(P: sp.csr_matrix, n: int, hops: int) -> np.ndarray:
    """The stored points (indices ``< n``) within ``hops`` edges of ``P'`` (its non-zeros) of a new point,
    sorted."""
    P = sp.csr_matrix(P)
    reach = np.zeros(P.shape[0], dtype=bool)
    reach[n:] = True
    for _ in range(int(hops)):
        grown = reach | (np.asarray(abs(P).T @ reach.astype(np.float64)).ravel() > 0)
        if np.array_equal(grown, reach):
            break
        reach = grown
    return np.flatnonzero(reach[:n])


def place(model_name: str, space_dims: int, old: np.ndarray, P: sp.csr_matrix, optimizer=None, seed: int = 0,
          n_threads: int | None = None, refuse_unattached: bool = False, callback=None, free_hops: int | None = None,
          free_iterations: int = FREE_ITERATIONS, repulsion: str = "auto", free_direction: str = FREE_DIRECTION,
          client=None, free_exaggeration: float | None = None, free_stored_attraction: float | None = None):
    """Place the new points of ``P'`` (rows after ``old``'s ``N = old.shape[1]`` columns) into the fixed map
    ``old`` (``(ds + dt, N)``).  Returns ``(PlacementRun, n_unattached)``.

    ``free_hops = h > 0`` adds a second phase: the stored points within ``h`` edges of a new point
    (``freed_points``) move too, jointly with the new ones, for at most ``free_iterations`` iterations of the
    same descent on the same whole-map KL (the objective is ``PlacementObjective`` with the freed stored points
    numbered among the "new" rows, so only the rest of the map is fixed).  Why: with every stored point fixed,
    a new node whose neighbours lie in regions the stored map put far apart (it was embedded without the node
    that links them) can only sit near one of them; a full re-embedding pulls them together.  Placing GrQc's
    held-out 10 % into the full re-embedding's own stored rows reaches its neighbourhood preservation, into the
    map of the other 90 % it cannot (docs/design/placement.md): the gap is the stored map's, and
    only moving stored points closes it.  The freed rows are returned in ``PlacementRun.moved`` /
    ``moved_coords``; every other stored row stays exactly where it was.  The free phase descends along
    ``free_direction`` (``PlacementOptimizer.direction``; default ``FREE_DIRECTION``, the spectral one), on the
    KL with the attraction of the pairs with a placed point x ``free_exaggeration`` and of the freed points' other
    pairs x ``free_stored_attraction`` (``PlacementObjective``; defaults ``FREE_EXAGGERATION`` and
    ``FREE_STORED_ATTRACTION``, 1.0 and 1.0 with time coordinates: the free phase then descends the KL itself).

    ``repulsion``: ``"exact"`` sums, the frozen FFT grid of the fixed map (``"fft"``, ``placement.frozen``), or
    ``"auto"`` (``placement_repulsion``).  ``client``: a ``distributed.Client``; the objective's row blocks
    (``placement.objective.block_terms``, the same function as on local threads) then run on its workers, the
    old map and its frozen grid broadcast to them once: the result is bit-identical to the local one.

    Defaults (``free_hops=None``, ``optimizer`` None or with ``iterations=None``): the free phase of
    ``auto_free_hops`` (1 hop unless that frees more than half the stored map), after a first phase of at most
    ``PRE_FREE_ITERATIONS`` (``ITERATIONS`` without a free phase or with time coordinates), the attraction
    exaggerated as ``PlacementOptimizer`` says."""
    if (free_hops is not None and free_hops < 0) or free_iterations < 1:
        raise ValueError(f"free_hops must be >= 0 and free_iterations >= 1, got {free_hops}, {free_iterations}")
    with_time = old.shape[0] > space_dims
    if with_time and (free_exaggeration not in (None, 1.0) or free_stored_attraction not in (None, 1.0)):
        raise ValueError("an exaggerated free phase is not supported for models with time coordinates")
    link = (1.0 if with_time else FREE_EXAGGERATION) if free_exaggeration is None else float(free_exaggeration)
    stored = (1.0 if with_time else FREE_STORED_ATTRACTION) if free_stored_attraction is None \
        else float(free_stored_attraction)
    if not (link > 0 and stored > 0):
        raise ValueError(f"free_exaggeration and free_stored_attraction must be > 0, got {link}, {stored}")
    model = get_model(model_name)
    n = old.shape[1]
    P = sp.csr_matrix(P)
    if free_hops is None:
        free_hops = auto_free_hops(P, n)
    optimizer = optimizer or PlacementOptimizer()
    if optimizer.iterations is None and free_hops > 0 and old.shape[0] == space_dims:
        # (maps with time coordinates keep ITERATIONS: SNEST's first phase is far from converged at 300)
        optimizer = dataclasses.replace(optimizer, iterations=PRE_FREE_ITERATIONS)
    method = placement_repulsion(model, n, P.shape[0] - n, repulsion)
    X0, unattached = initial_positions(P[n:], old, space_dims, seed)
    if unattached and refuse_unattached:
        raise ScalembError(f"{unattached} new nodes share no edge path with the stored map (placing them is "
                           "refused; without the refusal: " + UNATTACHED_RULE + ")")
    with PlacementObjective(model, space_dims, P, old, n_threads=n_threads, repulsion=method,
                            client=client) as objective:
        run = optimizer.optimize(objective, X0, space_dims, callback=callback)
    run.settings["repulsion"] = method
    if free_hops == 0:
        return run, unattached
    free = freed_points(P, n, free_hops)
    fixed = np.setdiff1d(np.arange(n), free)
    if fixed.size == 0:
        raise ScalembError(f"free_hops={free_hops} frees every stored point: re-embed instead (or use fewer hops)")
    order = np.concatenate([fixed, free, np.arange(n, P.shape[0])])
    second = PlacementOptimizer(iterations=free_iterations, tol=optimizer.tol, window=optimizer.window,
                                mu=optimizer.mu, time_ratio=optimizer.time_ratio, growth=optimizer.growth,
                                max_step=optimizer.max_step, c=optimizer.c, rho=optimizer.rho,
                                direction=free_direction, exaggeration=1.0, exaggeration_iterations=0,
                                final_exaggeration=link)
    start = np.ascontiguousarray(np.concatenate([old[:, free], run.coords], axis=1))
    with PlacementObjective(model, space_dims, P[order][:, order], np.ascontiguousarray(old[:, fixed]),
                            n_threads=n_threads, repulsion=method, client=client, n_placed=P.shape[0] - n,
                            stored_attraction=stored) as objective:
        run2 = second.optimize(objective, start, space_dims)
    settings = dict(run.settings, free_hops=int(free_hops), free_iterations=int(free_iterations),
                    n_moved=int(free.size), free_exaggeration=link, free_stored_attraction=stored)
    return PlacementRun(np.ascontiguousarray(run2.coords[:, free.size:]), run2.kl,
                        np.concatenate([run.kl_history, run2.kl_history[1:]]), run.iterations + run2.iterations,
                        run2.converged, run.seconds + run2.seconds, run.evaluations + run2.evaluations, settings,
                        free.astype(np.int64), np.ascontiguousarray(run2.coords[:, :free.size])), unattached


def placed_result(result, run: PlacementRun, new_ids: np.ndarray, provenance: dict, repulsion: dict | None = None):
    """An ``EmbeddingResult`` of the whole map: the old rows (unchanged but for the ones ``run.moved``
    names), the placed rows after them; ``repulsion``: its record (default: the placement's repulsion method)."""

    stored = result.embedding.copy()
    if run.moved.size:
        stored[run.moved] = run.moved_coords.T
    embedding = np.concatenate([stored, run.coords.T])
    return EmbeddingResult(embedding=np.ascontiguousarray(embedding),
                           node_ids=np.concatenate([result.node_ids, new_ids]), kl=run.kl,
                           kl_history=run.kl_history, model=result.model, space_dims=result.space_dims,
                           time_dims=result.time_dims, iterations=run.iterations, seed=result.seed,
                           restart_kls=[run.kl], wall_time=run.seconds, provenance=provenance,
                           optimizer=run.settings,
                           repulsion={"method": run.settings.get("repulsion", "exact")} if repulsion is None
                           else repulsion)


def knn_optimizer(optimizer, with_time: bool) -> PlacementOptimizer:
    """The placement rule of new feature rows: ``optimizer`` (default ``PlacementOptimizer()``) with
    ``final_exaggeration`` ``KNN_FINAL_EXAGGERATION`` where it is unset and the map has no time coordinates
    (their rows hold only their own conditional affinities, half a re-embedding's row mass:
    ``placement.optimize``)."""
    optimizer = optimizer or PlacementOptimizer()
    if with_time or optimizer.final_exaggeration is not None:
        return optimizer
    return dataclasses.replace(optimizer, final_exaggeration=KNN_FINAL_EXAGGERATION)


def place_into(result, new, reference: Reference | None = None, optimizer=None, seed: int = 0,
               n_threads: int | None = None, refuse_unattached: bool = False, run_name="the stored map",
               free_hops: int | None = None, free_iterations: int = FREE_ITERATIONS, repulsion: str = "auto",
               scheduler: str | None = None, workers: int | None = None, free_exaggeration: float | None = None,
               free_stored_attraction: float | None = None):
    """Place ``new`` (edge list path, or feature rows: path or array) into the map of the ``EmbeddingResult``
    ``result``; ``reference`` defaults to the one its provenance names.  Returns the whole map's
    ``EmbeddingResult`` (old rows first, unchanged unless a free phase moved some: see ``place``).
    ``free_hops=None``: ``place``'s default for new graph nodes; new feature rows (kNN) keep the map fixed
    (a free phase of a kNN map was not measured).  New feature rows of a map without time coordinates are
    placed with ``KNN_FINAL_EXAGGERATION`` unless ``optimizer`` sets ``final_exaggeration`` (``knn_optimizer``).
    ``scheduler`` / ``workers``: optimise on a Dask cluster
    (``engine.cluster.dask_client``; ``place``'s ``client``).  A run of a method with its own placement
    (``scalemb.methods.Method.place``: the eigenmaps' continuous extensions) is placed by it."""
    method = method_of(result.model)
    if method.place is not None:
        return method.place(result, new, reference=reference, run_name=run_name, n_threads=n_threads)
    reference = reference or reference_of(run_name, result.provenance, result.node_ids)
    P, new_ids = grown_affinity(reference, result.node_ids, new, n_threads)
    if reference.kind == "knn":
        free_hops = 0 if free_hops is None else free_hops
        optimizer = knn_optimizer(optimizer, result.embedding.shape[1] > result.space_dims)
    with ExitStack() as stack:
        client = None
        if scheduler is not None or workers is not None:
            client = stack.enter_context(dask_client(scheduler, workers))
        placed, unattached = place(result.model, result.space_dims, np.ascontiguousarray(result.embedding.T), P,
                                   optimizer, seed, n_threads, refuse_unattached, free_hops=free_hops,
                                   free_iterations=free_iterations, repulsion=repulsion, client=client,
                                   free_exaggeration=free_exaggeration,
                                   free_stored_attraction=free_stored_attraction)
    provenance = {"transform_of": str(run_name), "new": str(new) if isinstance(new, (str, Path)) else "array",
                  "n_old": int(result.node_ids.size), "n_new": int(new_ids.size), "n_unattached": unattached,
                  "n_moved": int(placed.moved.size), "run_provenance": result.provenance,
                  "start_kl": float(placed.kl_history[0])}
    return placed_result(result, placed, new_ids, provenance)


def transform_run(run, new, out, overwrite: bool = False, optimizer=None, seed: int = 0,
                  n_threads: int | None = None, refuse_unattached: bool = False, free_hops: int | None = None,
                  free_iterations: int = FREE_ITERATIONS, repulsion: str = "auto", scheduler: str | None = None,
                  workers: int | None = None, free_exaggeration: float | None = None,
                  free_stored_attraction: float | None = None):
    """Read the stored run ``run``, place ``new`` (edge list or features) and write the whole map to ``out``
    (atomically; nothing is written on any error).  Returns the ``EmbeddingResult`` written."""

    out = check_output_path(out, overwrite)
    try:
        result = EmbeddingResult.load(run)
    except ScalembError:
        raise
    except Exception as exc:  # noqa: BLE001 - zarr raises many types for what is not a result group
        raise InputError(run, f"not a scalemb result ({exc.__class__.__name__}: {exc})") from None
    combined = place_into(result, new, None, optimizer, seed, n_threads, refuse_unattached, run_name=run,
                          free_hops=free_hops, free_iterations=free_iterations, repulsion=repulsion,
                          scheduler=scheduler, workers=workers, free_exaggeration=free_exaggeration,
                          free_stored_attraction=free_stored_attraction)
    combined.save(out, overwrite=overwrite)
    return combined
