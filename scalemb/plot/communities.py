"""Communities of a run's graph, named for maps, and stored with the run.

Detection maximises the modularity Q = (1 / 2m) sum_ij [A_ij - gamma k_i k_j / 2m] delta(c_i, c_j) of the
weighted graph P (edge weights P_ij, strengths k_i = sum_j P_ij, resolution gamma): with the Leiden algorithm
(``leidenalg`` on ``igraph``, the ``communities`` extra) when installed, else Louvain (``networkx``).  Leiden
refines each Louvain-style move phase so that every community is connected, which Louvain does not guarantee.
Both are seeded, so a run's partition is reproducible.  Communities are numbered by decreasing size (0 = largest;
ties by their first node), as components are.

A community is named on a map by its ``NAME_MEMBERS`` highest-degree members' ids (ties by node order): in a
co-authorship graph, its most connected authors.  Its label sits on its medoid-like member: the member nearest
to the median of the members' display positions, so a label always lies on one of its points.

Stored with the run (``scalemb communities RUN``) as the array ``communities`` (int32, one per node, dimension
``node``) in the run's Zarr group, with its method, resolution, seed and modularity as attributes.  It is written
to a hidden sibling inside the group and renamed into place, so a crash leaves the previous partition (or none).
The run's own arrays and its content hash are not touched.
"""
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import ScalembError

ARRAY = "communities"
NAME_MEMBERS = 3
# Community k is drawn in PALETTE[k % 20] on the map page and in ``scalemb plot``: matplotlib's tab10 colours,
# then tab20's light shades of them (RGB, 0-255).
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (174, 199, 232), (255, 187, 120),
           (152, 223, 138), (255, 152, 150), (197, 176, 213), (196, 156, 148), (247, 182, 210), (199, 199, 199),
           (219, 219, 141), (158, 218, 229))


def _ranked(raw: np.ndarray) -> np.ndarray:
    """Relabel community ids by decreasing size, ties by the first node."""
    raw = np.asarray(raw, dtype=np.int64)
    n = raw.size
    if n == 0:
        return raw
    _, raw = np.unique(raw, return_inverse=True)
    counts = np.bincount(raw)
    first = np.full(counts.size, n, dtype=np.int64)
    np.minimum.at(first, raw, np.arange(n))
    order = np.lexsort((first, -counts))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[raw]


def detect_communities(P, resolution: float = 1.0, seed: int = 0, method: str = "auto") -> tuple:
    """``(membership, info)``: a community per node of the symmetric affinity ``P`` (see the module docstring) and
    ``{"method", "resolution", "seed", "modularity", "count"}``.  ``method``: ``"leiden"``, ``"louvain"`` or
    ``"auto"`` (Leiden when ``leidenalg`` is installed)."""
    if not resolution > 0:
        raise ScalembError(f"--resolution must be > 0, got {resolution}")
    P = sp.csr_matrix(P)
    n = P.shape[0]
    upper = sp.triu(P + P.T, k=1).tocoo()  # each undirected edge once, weight P_ij + P_ji
    if method == "auto":
        try:
            import leidenalg  # noqa: F401

            method = "leiden"
        except ImportError:
            method = "louvain"
    if method == "leiden":
        import igraph
        import leidenalg

        graph = igraph.Graph(n=n, edges=np.column_stack([upper.row, upper.col]).tolist(),
                             edge_attrs={"weight": upper.data.astype(np.float64)})
        part = leidenalg.find_partition(graph, leidenalg.RBConfigurationVertexPartition, weights="weight",
                                        resolution_parameter=resolution, seed=seed)
        raw = np.asarray(part.membership)
        modularity = float(graph.modularity(part.membership, weights="weight")) if upper.nnz else 0.0
    elif method == "louvain":
        import networkx as nx

        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_weighted_edges_from(zip(upper.row.tolist(), upper.col.tolist(), upper.data.tolist()))
        sets = nx.community.louvain_communities(graph, weight="weight", resolution=resolution, seed=seed)
        raw = np.empty(n, dtype=np.int64)
        for k, members in enumerate(sets):
            raw[list(members)] = k
        modularity = float(nx.community.modularity(graph, sets, weight="weight")) if upper.nnz else 0.0
    else:
        raise ScalembError(f"unknown community method {method!r} (leiden, louvain or auto)")
    membership = _ranked(raw)
    info = {"method": method, "resolution": float(resolution), "seed": int(seed), "modularity": modularity,
            "count": int(membership.max() + 1) if n else 0}
    return membership, info


def community_labels(xy: np.ndarray, membership: np.ndarray, degree, ids, members: int = NAME_MEMBERS,
                     limit: int | None = None) -> dict:
    """Per community (in id order; the first ``limit`` only, if given): ``names`` (its ``members``
    highest-degree members' ids joined by " · "), ``sizes`` and the label anchor ``x``, ``y`` (see the module
    docstring)."""
    membership = np.asarray(membership, dtype=np.int64)
    total = int(membership.max() + 1) if membership.size else 0
    count = total if limit is None else min(total, int(limit))
    degree = np.zeros(membership.size) if degree is None else np.asarray(degree, dtype=np.float64)
    order = np.lexsort((np.arange(membership.size), -degree, membership))  # by community, degree desc, node
    sizes = np.bincount(membership, minlength=total)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    names, ax, ay = [], np.empty(count), np.empty(count)
    for c in range(count):
        rows = order[starts[c]:starts[c + 1]]
        names.append(" · ".join(str(ids[i]) for i in rows[:members]))
        pts = xy[rows]
        centre = np.median(pts, axis=0)
        best = rows[int(np.argmin(((pts - centre) ** 2).sum(axis=1)))]
        ax[c], ay[c] = xy[best]
    return {"names": names, "sizes": sizes[:count].tolist(), "x": ax.tolist(), "y": ay.tolist()}


def load_communities(run) -> tuple | None:
    """``(membership, info)`` stored with the run at path ``run``, or ``None``."""
    import zarr

    path = Path(run) / ARRAY
    if not (path / "zarr.json").exists():
        return None
    try:
        array = zarr.open_array(store=str(path), mode="r")
        membership, info = np.asarray(array[:], dtype=np.int64), dict(array.attrs)
    except Exception as exc:  # noqa: BLE001 - anything unreadable is reported as such, in one line
        raise ScalembError(f"{path}: unreadable communities ({type(exc).__name__}); rerun scalemb communities "
                           "--overwrite") from None
    return membership, info


def store_communities(run, membership: np.ndarray, info: dict, n_points: int, overwrite: bool = False) -> Path:
    """Write ``membership`` as the array ``communities`` of the run group at ``run`` (see the module docstring)."""
    import zarr

    run = Path(run)
    target = run / ARRAY
    membership = np.asarray(membership)
    if membership.shape != (n_points,):
        raise ValueError(f"{n_points} nodes in the run, {membership.shape} community labels")
    if target.exists() and not overwrite:
        raise ScalembError(f"{target} already exists (pass --overwrite to replace it)")
    tmp = run / f".{ARRAY}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        array = zarr.create_array(store=str(tmp), data=membership.astype(np.int32), dimension_names=("node_ids",),
                                  zarr_format=3)
        array.attrs.update(info)
        if target.exists():
            old = run / f".{ARRAY}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target
