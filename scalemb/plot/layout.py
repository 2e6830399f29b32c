"""Display geometry of a map (never written back to the run): packed components, robust frame, label placement.

Disconnected components of P feel only the repulsion between them, so at the optimum they drift apart without
bound (GrQc's 355 components span +-4e4 units while the giant component is ~1e2 wide).  For display each
component keeps its own layout and is translated: the largest stays where it is, the others are shelf-packed
in order of size into a strip right of it, as graph-layout tools pack components.  The main panel is framed
on the largest component with quantile limits, so a few outlying nodes do not shrink it to a dot.
"""
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

FRAME_QUANTILE = 0.005  # the main frame keeps the largest component's [q, 1 - q] quantiles ...
FRAME_PAD = 0.06  # ... padded by this fraction of its extent
FULL_FRAME_SLACK = 1.35  # use the full extent when it is at most this much wider than the quantile extent


@dataclass
class Packing:
    """``coords``: display positions (N x 2); ``component``: component index per node (0 = largest);
    ``sizes``: nodes per component, descending."""

    coords: np.ndarray
    component: np.ndarray
    sizes: np.ndarray


def components(P, n_points: int) -> np.ndarray:
    """Component index per node (0 = largest, then by decreasing size; ties by first node), one component
    without ``P``."""
    if P is None:
        return np.zeros(n_points, dtype=np.int64)
    _, raw = sp.csgraph.connected_components(sp.csr_matrix(P), directed=False)
    counts = np.bincount(raw)
    first = np.full(counts.size, n_points, dtype=np.int64)
    np.minimum.at(first, raw, np.arange(n_points))
    order = np.lexsort((first, -counts))  # largest first, ties by the first node
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[raw].astype(np.int64)


def pack_components(xy: np.ndarray, component: np.ndarray) -> Packing:
    """Translate each component (its own layout kept) into a packed arrangement (see the module docstring)."""
    xy = np.asarray(xy, dtype=np.float64)
    sizes = np.bincount(component)
    out = xy.copy()
    if sizes.size <= 1:
        return Packing(out, component, sizes)
    order = np.argsort(component, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    lo = np.array([xy[order[starts[c]:starts[c + 1]]].min(axis=0) for c in range(sizes.size)])
    hi = np.array([xy[order[starts[c]:starts[c + 1]]].max(axis=0) for c in range(sizes.size)])
    extent = hi - lo
    giant = max(float(extent[0].max()), 1e-12)
    small = extent[1:].max(axis=1)
    gap = max(float(np.median(small)), 0.01 * giant)
    boxes = extent[1:] + gap
    strip_height = max(float(extent[0, 1]), float(boxes[:, 1].max()))
    strip_width = max(float(boxes[:, 0].max()), 1.1 * float(np.prod(boxes, axis=1).sum()) / strip_height)
    x0, top = hi[0, 0] + 2 * gap, hi[0, 1]
    x, y, shelf = 0.0, 0.0, 0.0
    targets = np.empty_like(lo)
    targets[0] = lo[0]
    for c in range(1, sizes.size):
        w, h = boxes[c - 1]
        if x > 0 and x + w > strip_width:
            x, y, shelf = 0.0, y + shelf, 0.0
        targets[c] = (x0 + x, top - y - h + gap)
        x += w
        shelf = max(shelf, h)
    shift = targets - lo
    out += shift[component]
    return Packing(out, component, sizes)


def robust_frame(xy: np.ndarray, mask=None) -> tuple:
    """``(x0, x1, y0, y1)`` framing ``xy[mask]``: its quantile box (``FRAME_QUANTILE``) padded by ``FRAME_PAD``,
    or its whole extent when that is not much wider (``FULL_FRAME_SLACK``)."""
    pts = np.asarray(xy, dtype=np.float64)[mask if mask is not None else slice(None)]
    lo_q, hi_q = np.quantile(pts, [FRAME_QUANTILE, 1 - FRAME_QUANTILE], axis=0)
    lo_f, hi_f = pts.min(axis=0), pts.max(axis=0)
    span_q = np.maximum(hi_q - lo_q, 1e-12)
    full = np.all((hi_f - lo_f) <= FULL_FRAME_SLACK * span_q)
    lo, hi = (lo_f, hi_f) if full else (lo_q, hi_q)
    pad = FRAME_PAD * np.maximum(hi - lo, 1e-12)
    lo, hi = lo - pad, hi + pad
    return float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1])


def place_labels(anchors: np.ndarray, sizes: np.ndarray, bounds: tuple, offset: float = 3.0,
                 centred: bool = False) -> list:
    """Greedy non-overlapping label boxes in display (pixel) coordinates.

    ``anchors`` (k x 2): the labelled points in priority order; ``sizes`` (k x 2): each label's width and height;
    ``bounds``: ``(x0, y0, x1, y1)`` the boxes must stay inside.  Each label tries eight positions around its
    point (right-above first; with ``centred``, centred on it first) and takes the first that overlaps no label
    placed before; a label with no free position is dropped.  Returns ``(index, (x, y))`` of the placed labels'
    lower-left corners.
    """
    placed, boxes = [], []
    for i, ((px, py), (w, h)) in enumerate(zip(anchors, sizes)):
        candidates = [(px + offset, py + offset), (px + offset, py - offset - h), (px - offset - w, py + offset),
                      (px - offset - w, py - offset - h), (px - w / 2, py + offset), (px - w / 2, py - offset - h),
                      (px + offset, py - h / 2), (px - offset - w, py - h / 2)]
        if centred:
            candidates.insert(0, (px - w / 2, py - h / 2))
        for x, y in candidates:
            if x < bounds[0] or y < bounds[1] or x + w > bounds[2] or y + h > bounds[3]:
                continue
            if any(x < bx1 and bx0 < x + w and y < by1 and by0 < y + h for bx0, by0, bx1, by1 in boxes):
                continue
            boxes.append((x, y, x + w, y + h))
            placed.append((i, (x, y)))
            break
    return placed


GRID_SPACING = 1.0  # hyperbolic distance between neighbouring lines of the Poincaré disk's geodesic grid
GRID_REACH = 6.0  # lines up to this distance from the centre (Euclidean radius tanh(3) = 0.995)


def poincare_grid(spacing: float = GRID_SPACING, reach: float = GRID_REACH, samples: int = 65) -> list:
    """The geodesic grid of the Poincaré disk as polylines (each ``samples`` x 2): the two diameters and, at
    signed hyperbolic distances d = +-spacing, +-2 spacing, ... (|d| <= reach) from the centre along each of them,
    the geodesic crossing it at a right angle.  A point at Euclidean radius r lies at hyperbolic distance
    2 artanh(r) from the centre, so that geodesic crosses the diameter at a = tanh(d / 2); geodesics are arcs of
    circles orthogonal to the unit circle, here the one centred at (c, 0) with c = (1 + a^2) / (2a) and radius
    rho = (1 - a^2) / (2|a|) (c^2 = 1 + rho^2: orthogonal), drawn between its two points on the boundary.  The
    grid is the hyperbolic plane's analogue of a square grid: the lines of each family never meet, and equal
    steps between them mean equal hyperbolic distances, so cells shrink towards the boundary as the metric
    grows."""
    t = np.linspace(-1.0, 1.0, samples)
    lines = [np.column_stack([t, 0 * t]), np.column_stack([0 * t, t])]
    steps = int(np.floor(reach / spacing + 1e-9))
    for k in range(1, steps + 1):
        a = float(np.tanh(k * spacing / 2.0))
        c, rho = (1.0 + a * a) / (2.0 * a), (1.0 - a * a) / (2.0 * a)
        phi_max = float(np.arccos(np.clip((c - 1.0 / c) / rho, -1.0, 1.0)))
        phi = np.linspace(-phi_max, phi_max, samples)
        arc = np.column_stack([c - rho * np.cos(phi), rho * np.sin(phi)])
        for sign in (1.0, -1.0):
            lines.append(arc * [sign, 1.0])
            lines.append(arc[:, ::-1] * [1.0, sign])
    return lines
