"""What a map draws: a run's positions as displayed (``layout_axes``; components packed by
``scalemb.plot.layout``), its affinity's edges and degrees (``run_affinity``), classes and communities, in one
``MapData`` (``map_data``) that the figure (``scalemb.plot.figure``) and the map page (``scalemb.report``) draw."""
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..embedding import EmbeddingResult
from ..errors import ScalembError
from ..geometry import POINCARE
from ..metrics.evaluate import _resolve_affinity, affinity_from_provenance, align_affinity
from ..models import get_model
from .communities import load_communities
from .layout import components, pack_components, robust_frame


def _load(result):
    """An ``EmbeddingResult`` from a result or the path of a result store."""

    if isinstance(result, EmbeddingResult):
        return result
    path = Path(result)
    try:
        return EmbeddingResult.load(path)
    except ScalembError:
        raise
    except Exception as exc:  # a checkpointed (unfinished) run, or not a result store at all
        raise ScalembError(f"{path}: not a finished scalemb result ({type(exc).__name__}: {exc})") from None


def layout_axes(result):
    """``(x, y, xlabel, ylabel)``: the coordinates drawn as positions (see the module docstring)."""
    emb, ds = result.embedding, result.space_dims
    if ds >= 2:
        return emb[:, 0], emb[:, 1], "space 1", "space 2"
    if result.time_dims >= 1:
        return emb[:, 0], emb[:, ds], "space 1", "time 1"
    return emb[:, 0], np.arange(emb.shape[0], dtype=float), "space 1", "row index"


def run_affinity(result, affinity="auto", name: str = "the run"):
    """The run's affinity aligned to its node order: ``affinity`` (an ``Affinity``, store, edge list or dataset
    name; node ids checked) or, with ``"auto"``, the one found from its provenance (``None`` if not found)."""

    if affinity is None:
        return None
    if isinstance(affinity, str) and affinity == "auto":
        try:
            found, source, _ = affinity_from_provenance(dict(result.provenance))
            return None if found is None else align_affinity(found, result.node_ids, source)
        except ScalembError:  # the recorded input is gone or changed: draw without it
            return None
    found, source = _resolve_affinity(affinity, "coauthorship")
    return align_affinity(found, result.node_ids, source)


@dataclass
class MapData:
    """What a map draws, in display coordinates (``xy``, packed) with the per-node values used for colour."""

    result: object
    xy: np.ndarray
    xlabel: str
    ylabel: str
    component: np.ndarray
    sizes: np.ndarray
    frame: tuple
    edges: np.ndarray | None  # (m, 2) row indices, each undirected edge once
    degree: np.ndarray | None
    classes: np.ndarray | None
    ball: bool = False  # a Poincaré-ball map: drawn in the unit disk, components not moved
    communities: tuple | None = None  # (membership, info) of scalemb.plot.communities

    @property
    def n_points(self) -> int:
        return int(self.xy.shape[0])

    @property
    def needs_overview(self) -> bool:
        x0, x1, y0, y1 = self.frame
        inside = (self.xy[:, 0] >= x0) & (self.xy[:, 0] <= x1) & (self.xy[:, 1] >= y0) & (self.xy[:, 1] <= y1)
        return not bool(inside.all())


def map_data(result, affinity="auto", classes=None, communities="auto") -> MapData:
    """The display data of ``result`` (a result or a result store path); see ``run_affinity`` for ``affinity``.
    ``communities``: ``(membership, info)``, ``None``, or ``"auto"``: those stored with the run when ``result`` is
    a store path (``scalemb communities``)."""

    run = result if isinstance(result, (str, os.PathLike)) else None
    result = _load(result)
    if isinstance(communities, str) and communities == "auto":
        communities = None if run is None else load_communities(run)
    if communities is not None and np.shape(communities[0]) != (result.embedding.shape[0],):
        raise ScalembError(f"{run or 'the run'}: its communities have {np.size(communities[0])} nodes, the run "
                           f"{result.embedding.shape[0]} (rerun scalemb communities --overwrite)")
    x, y, xlabel, ylabel = layout_axes(result)
    xy = np.column_stack([x, y]).astype(np.float64)
    if not np.isfinite(xy).all():
        raise ScalembError("the embedding has non-finite coordinates; nothing to draw")
    aff = run_affinity(result, affinity)
    edges = degree = None
    if aff is not None:
        upper = aff.P.tocoo()
        keep = upper.row < upper.col
        edges = np.column_stack([upper.row[keep], upper.col[keep]]).astype(np.int64)
        degree = np.diff(aff.P.indptr).astype(np.int64)
    if classes is not None:
        classes = np.asarray(classes)
        if classes.shape != (xy.shape[0],):
            raise ScalembError(f"classes have shape {classes.shape}; the run has {xy.shape[0]} points")
    ball = is_ball(result)
    component = components(None if aff is None or result.space_dims < 2 or ball else aff.P, xy.shape[0])
    if ball:  # translations are not isometries of the ball: every point stays where the run put it
        return MapData(result, xy, xlabel, ylabel, component, np.array([xy.shape[0]]), DISK_FRAME, edges, degree,
                       classes, True, communities)
    packing = pack_components(xy, component)
    frame = robust_frame(packing.coords, component == 0)
    return MapData(result, packing.coords, xlabel, ylabel, component, packing.sizes, frame, edges, degree, classes,
                   False, communities)


DISK_FRAME = (-1.05, 1.05, -1.05, 1.05)


def is_ball(result) -> bool:
    """True if the run's model embeds in the Poincaré ball (decided by the model's geometry, not its name)."""

    try:
        model = get_model(result.model)
    except (ValueError, TypeError):
        return False
    return model.geometry is POINCARE
