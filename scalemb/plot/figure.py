"""Embedding figures: a readable map (layout panel, overview) and a KL-vs-iteration panel.

Positions are the first two space coordinates, displayed as ``scalemb.plot.layout`` arranges them: components
packed by size, each keeping its own layout, the main panel framed on the largest component with robust limits,
and an overview panel (the whole packed arrangement, the main frame outlined) whenever the frame leaves nodes
out.  The stored embedding is never changed.  With one space dimension the vertical axis is the first time
coordinate (SNEST) or, without time, the row index (no packing).

Colour (``colour``): ``community``: the communities stored with the run (``scalemb communities``), one colour
per community from ``communities.PALETTE`` (the map page's colours), the largest communities named by their
highest-degree members (the map page's names) at their anchors; ``time`` (SNEST, the paper's Figures 3-4):
time 1 on a diverging colormap centred at 0, marker area growing with |t| (the norm of the time coordinates),
the nodes of largest |t| labelled with their ids; ``label``: one colour per class of ``classes`` (the key beside
the panel); ``degree``: the graph degree (number of non-zeros of the node's row of P) on a log scale, the
highest-degree nodes labelled; ``none``.  ``auto`` takes the first that applies in that order.  With the run's
affinity (given, or found from its provenance) its edges are drawn thin and translucent under the points.
Labels are placed so that they do not overlap (a label with no free place is left out).  From
``DENSITY_MIN_POINTS`` points on, the main panel is a density raster (``scalemb.plot.density``) at the panel's
own pixels instead of individual markers: communities and labels as their count-weighted colour mix, opacity by
histogram-equalised count; degree and |time| as their mean per pixel; otherwise the count per pixel on a log
scale.

Poincaré-ball runs (a model whose geometry is the ball, e.g. CO-SNE) are drawn where they lie in the unit disk,
with its boundary and its geodesic grid (``layout.poincare_grid``) under the points.
"""
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ScalembError
from .layout import place_labels, poincare_grid
from . import density
from ..models.registry import objective_of
from .communities import PALETTE, community_labels
from .mapdata import MapData, map_data

DIVERGING_CMAP = "RdBu_r"
MIN_SIZE, MAX_SIZE, PLAIN_SIZE = 4.0, 120.0, 12.0
DENSITY_MIN_POINTS = 100_000
MAX_EDGES = 300_000  # more edges are subsampled (seed 0) for drawing
COLOURS = ("auto", "community", "time", "label", "degree", "none")
# Text from the data (node ids, class labels, titles) is drawn as it is: matplotlib would read a text holding two
# '$' as mathtext, so an id such as '$\foo$' would fail to draw (or draw as something else).
PARSE_MATH = False


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import TwoSlopeNorm
        from matplotlib.figure import Figure
    except ImportError:
        raise ScalembError("plotting needs matplotlib: pip install 'scalemb[plot]'") from None
    return Figure, FigureCanvasAgg, TwoSlopeNorm


def _resolve_colour(data: MapData, colour: str) -> str:
    if colour not in COLOURS:
        raise ScalembError(f"unknown colour {colour!r}; choose one of {', '.join(COLOURS)}")
    available = {"community": data.communities is not None, "time": data.result.time_dims >= 1,
                 "label": data.classes is not None, "degree": data.degree is not None, "none": True}
    if colour == "auto":
        return next(name for name in ("community", "time", "label", "degree", "none") if available[name])
    if not available[colour]:
        raise ScalembError({"community": "colour by community needs communities stored with the run "
                                         "(scalemb communities RUN)",
                            "time": "colour by time needs a model with time coordinates (snest)",
                            "label": "colour by label needs labels", "degree": "colour by degree needs the run's "
                            "affinity (--input)"}[colour])
    return colour


def _size_scale(n_points: int) -> float:
    """Marker areas shrink with N so that a few thousand points do not cover each other (1 up to 250 points)."""
    return float(np.clip(np.sqrt(250.0 / max(n_points, 1)), 0.08, 1.0))


def _draw_edges(ax, data: MapData, zorder=1):
    from matplotlib.collections import LineCollection

    edges = data.edges
    if edges is None or edges.shape[0] == 0:
        return None
    if edges.shape[0] > MAX_EDGES:
        edges = edges[np.sort(np.random.default_rng(0).choice(edges.shape[0], MAX_EDGES, replace=False))]
    alpha = float(np.clip(25.0 / np.sqrt(edges.shape[0]), 0.06, 0.5))
    lines = LineCollection(data.xy[edges], colors="0.25", linewidths=0.35, alpha=alpha, zorder=zorder)
    ax.add_collection(lines, autolim=False)
    return lines


@dataclass
class Label:
    """A label to place: its text, its anchor in data units and whether it is centred on the anchor."""

    text: str
    x: float
    y: float
    centred: bool = False
    bold: bool = False


def _in_frame(data: MapData, xy: np.ndarray) -> np.ndarray:
    x0, x1, y0, y1 = data.frame
    return (xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)


def _label_candidates(data: MapData, colour: str, count: int) -> list:
    """Labels in priority order: the largest communities (community colour, named as on the map page), or the
    nodes of largest |time| (time colour) or largest degree."""
    if count <= 0:
        return []
    result = data.result
    if colour == "community":
        membership, _ = data.communities
        # the largest communities first; a few times ``count`` of them, since some anchors lie outside the frame
        named = community_labels(data.xy, membership, data.degree, result.node_ids, limit=4 * count)
        anchors = np.column_stack([named["x"], named["y"]]).reshape(-1, 2)
        keep = np.flatnonzero(_in_frame(data, anchors))[:count]
        return [Label(named["names"][k], anchors[k, 0], anchors[k, 1], centred=True, bold=True) for k in keep]
    if colour == "time" or (result.time_dims >= 1 and data.degree is None):
        key = np.linalg.norm(result.embedding[:, result.space_dims:], axis=1)
    elif data.degree is not None:
        key = data.degree.astype(np.float64)
    else:
        return []
    order = np.argsort(-key, kind="stable")
    rows = order[_in_frame(data, data.xy[order])][:count]
    return [Label(str(result.node_ids[i]), data.xy[i, 0], data.xy[i, 1]) for i in rows]


@dataclass
class Raster:
    """A density layer of the main panel, rasterised by ``finish_map`` once the panel's pixel size is final:
    ``fill(extent, (H, W))`` sets the image's data (and its colour scale, then the colour bar's)."""

    image: object
    fill: object
    colorbar: object = None


def _density_raster(fig, ax, data: MapData, colour: str, colorbar: bool, engine=None):
    """The density layer of the main panel (module docstring) as a ``Raster`` (drawn empty until filled)."""
    from matplotlib.colors import LogNorm, Normalize

    xy, result = data.xy, data.result
    categorical = colour in ("community", "label")
    image = ax.imshow(np.zeros((1, 1, 4)) if categorical else np.ma.masked_all((1, 1)), extent=data.frame,
                      origin="lower", interpolation="nearest", aspect="auto", zorder=2)
    if categorical:
        if colour == "community":
            codes, colours = np.asarray(data.communities[0], dtype=np.int64), np.asarray(PALETTE, dtype=float)
        else:
            cmap = _categorical(np.unique(data.classes).size)
            codes = np.unique(data.classes, return_inverse=True)[1]
            colours = 255.0 * np.asarray([cmap(k)[:3] for k in range(cmap.N)])
        codes = codes % colours.shape[0]

        def fill(extent, shape):
            counts = density.aggregate(xy, extent, shape, "categories", categories=codes,
                                       n_categories=colours.shape[0], engine=engine)
            image.set_data(density.shade_categories(counts, colours, engine=engine))

        return Raster(image, fill)
    if colour == "degree":
        how, values, label = "mean", data.degree.astype(np.float64), "mean degree per pixel"
    elif colour == "time":  # a mean of signed times is ~0 everywhere (the sign is arbitrary): mean |time| instead
        how, values, label = "mean", np.abs(result.embedding[:, result.space_dims]), "mean |time 1| per pixel"
    else:
        how, values, label = "count", None, "points per pixel"
    norm = Normalize(0.0, 1.0) if colour == "time" else LogNorm(1.0, 10.0)
    image.set_cmap("viridis")
    image.set_norm(norm)
    bar = fig.colorbar(image, ax=ax, label=label) if colorbar else None

    def fill(extent, shape):
        grid = density.aggregate(xy, extent, shape, how, values=values, engine=engine).astype(np.float64)
        grid = np.ma.masked_invalid(np.where(grid > 0, grid, np.nan) if how == "count" else grid)
        shown = grid.compressed()
        if colour == "time":
            norm.vmin, norm.vmax = 0.0, max(float(np.abs(result.embedding[:, result.space_dims]).max()), 1e-12)
        else:
            norm.vmin = max(float(shown.min()), 1.0) if shown.size else 1.0
            norm.vmax = max(float(shown.max()) if shown.size else 2.0, norm.vmin * 2.0)
        image.set_data(grid)

    return Raster(image, fill, bar)


def draw_map(fig, ax, data: MapData, colour: str = "auto", labels: int = 10, density="auto", title=None,
             colorbar: bool = True, engine=None):
    """Draw the main map panel of ``data`` on ``ax``; returns ``(colour used, labels, rasters)`` (the labels are
    placed and the density rasters filled by ``finish_map`` once the figure layout is fixed)."""
    result = data.result
    colour = _resolve_colour(data, colour)
    n = data.n_points
    dense = n >= DENSITY_MIN_POINTS if density == "auto" else bool(density)
    scale = _size_scale(n)
    ds = result.space_dims
    x0, x1, y0, y1 = data.frame
    rasters = []
    if dense:
        rasters.append(_density_raster(fig, ax, data, colour, colorbar, engine))
    _draw_points(fig, ax, data, colour, dense, scale, colorbar)
    if not dense:
        _draw_edges(ax, data)  # added after the points (collections[0] stays the points), drawn under them
    if data.ball:  # the Poincaré disk: its boundary and its geodesic grid, under the points
        from matplotlib.collections import LineCollection
        from matplotlib.patches import Circle

        ax.add_collection(LineCollection(poincare_grid(), colors="0.72", linewidths=0.6, zorder=0.5,
                                         label="geodesic grid"), autolim=False)
        ax.add_patch(Circle((0.0, 0.0), 1.0, fill=False, edgecolor="black", linewidth=1.0, zorder=3))
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)  # made equal-aspect by finish_map once the panel's size is known
    ax.set_xlabel(data.xlabel)
    ax.set_ylabel(data.ylabel)
    dims = f"R^{ds}" + (f",{result.time_dims}" if result.time_dims else "")
    if data.ball:
        dims = f"the Poincaré {'disk' if ds == 2 else f'ball B^{ds}'}"
    heading = title or f"{result.model} in {dims}, N = {n}" + (" (density: each pixel its points)" if dense else "")
    if colour == "community":
        info = data.communities[1]
        heading += (f"\ncolour: {info.get('count', int(np.max(data.communities[0])) + 1)} communities "
                    f"({info.get('method', '?')}); labels: their best-connected members")
    if data.sizes.size > 1:
        heading += (f"\n{data.sizes.size} components packed for display; framed on the largest "
                    f"({int(data.sizes[0])} nodes)")
    ax.set_title(heading, fontsize=10, parse_math=PARSE_MATH)
    return colour, _label_candidates(data, colour, labels), rasters


def _draw_points(fig, ax, data: MapData, colour: str, dense: bool, scale: float, colorbar: bool) -> None:
    """The points of the main panel coloured by ``colour`` (scatter, unless ``dense``: the density rasters draw
    them) and the colour's key: a colour bar, or the labels' legend beside the panel."""
    from matplotlib.colors import LogNorm, TwoSlopeNorm

    result, xy, ds = data.result, data.xy, data.result.space_dims
    if colour == "community" and not dense:
        palette = np.asarray(PALETTE, dtype=float) / 255.0
        ax.scatter(xy[:, 0], xy[:, 1], c=palette[np.asarray(data.communities[0]) % palette.shape[0]],
                   s=PLAIN_SIZE * scale * 1.5, linewidths=0, alpha=0.9, zorder=2)
    elif colour == "time" and not dense:
        t = result.embedding[:, ds]
        bound = max(float(np.abs(t).max()) if t.size else 0.0, 1e-12)
        norm = TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound)
        magnitude = np.linalg.norm(result.embedding[:, ds:], axis=1)
        top = float(magnitude.max()) if magnitude.size else 0.0
        sizes = scale * (MIN_SIZE + (MAX_SIZE - MIN_SIZE) * (magnitude / top if top > 0 else 0 * magnitude))
        order = np.argsort(magnitude, kind="stable")  # large markers drawn last, on top
        mappable = ax.scatter(xy[order, 0], xy[order, 1], c=t[order], s=sizes[order], cmap=DIVERGING_CMAP,
                              norm=norm, edgecolors="black", linewidths=0.3 * np.sqrt(scale), alpha=0.9, zorder=2)
        if colorbar:
            fig.colorbar(mappable, ax=ax, label="time 1" + (" (size: |time|)" if result.time_dims == 1
                                                          else " (size: ‖time‖)"))
    elif colour == "degree" and not dense:
        norm = LogNorm(vmin=max(1, int(data.degree.min())), vmax=max(2, int(data.degree.max())))
        order = np.argsort(data.degree, kind="stable")
        mappable = ax.scatter(xy[order, 0], xy[order, 1], c=np.maximum(data.degree[order], 1),
                              s=PLAIN_SIZE * scale * 1.5, cmap="viridis", norm=norm, linewidths=0, alpha=0.9,
                              zorder=2)
        if colorbar:
            fig.colorbar(mappable, ax=ax, label="degree")
    elif colour == "label":
        names, codes = np.unique(data.classes, return_inverse=True)
        cmap = _categorical(names.size)
        if not dense:
            ax.scatter(xy[:, 0], xy[:, 1], c=cmap(codes % cmap.N), s=PLAIN_SIZE * scale * 1.5, linewidths=0,
                       alpha=0.9, zorder=2)
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], marker="o", linestyle="", color=cmap(k % cmap.N), label=str(name))
                   for k, name in enumerate(names[:20])]
        # beside the panel, never over the points
        legend = ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                           borderaxespad=0.0, framealpha=0.8, title_fontsize=7,
                           title=None if names.size <= 20 else f"first 20 of {names.size} labels")
        for text in legend.get_texts():
            text.set_parse_math(PARSE_MATH)
    elif not dense:
        ax.scatter(xy[:, 0], xy[:, 1], s=PLAIN_SIZE * scale, color="tab:blue", alpha=0.8, linewidths=0, zorder=2)


def _categorical(count: int):
    from matplotlib import colormaps

    return colormaps["tab10" if count <= 10 else "tab20"]


def draw_overview(ax, data: MapData, main_ax=None):
    """The whole packed arrangement (largest component dark, the others grey), the main frame outlined."""
    from matplotlib.patches import Rectangle

    xy, giant = data.xy, data.component == 0
    pick = np.arange(data.n_points)
    if pick.size > 50_000:
        pick = np.sort(np.random.default_rng(0).choice(pick.size, 50_000, replace=False))
    size = float(np.clip(2000.0 / data.n_points, 0.2, 4.0))
    ax.scatter(xy[pick, 0], xy[pick, 1], s=size, linewidths=0,
               c=np.where(giant[pick], "tab:blue", "0.45"), rasterized=True)
    x0, x1, y0, y1 = main_ax.get_xlim() + main_ax.get_ylim() if main_ax is not None else data.frame
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="tab:red", linewidth=1.0))
    ax.set_aspect("equal", adjustable="box")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"overview: all {data.n_points} nodes, {data.sizes.size} component"
                 f"{'s' if data.sizes.size != 1 else ''}\nred: the main panel's frame", fontsize=8)


def _equal_aspect(ax, frame):
    """Widen the frame's shorter side so that one unit is as long on both axes of the panel as drawn."""
    box = ax.get_window_extent()
    x0, x1, y0, y1 = frame
    per_pixel = max((x1 - x0) / box.width, (y1 - y0) / box.height)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    ax.set_xlim(cx - per_pixel * box.width / 2, cx + per_pixel * box.width / 2)
    ax.set_ylim(cy - per_pixel * box.height / 2, cy + per_pixel * box.height / 2)


def finish_map(fig, ax, data: MapData, labels, overview_ax=None, rasters=()):
    """Fix the figure's layout, fill the density rasters at the panel's pixels, then place the labels without
    overlaps and draw the overview; returns the texts of the labels placed."""
    fig.canvas.draw()
    fig.set_layout_engine("none")  # positions are final from here: labels are placed in pixels
    if data.result.space_dims >= 2:
        _equal_aspect(ax, data.frame)
    if rasters:
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        box = ax.get_window_extent()
        shape = (max(1, int(round(box.height))), max(1, int(round(box.width))))
        for raster in rasters:
            raster.fill((x0, x1, y0, y1), shape)
            raster.image.set_extent((x0, x1, y0, y1))
            if raster.colorbar is not None:
                raster.colorbar.update_normal(raster.image)
    if overview_ax is not None:
        draw_overview(overview_ax, data, ax)
    if len(labels) == 0:
        return []
    renderer = fig.canvas.get_renderer()
    from matplotlib import patheffects

    halo = [patheffects.withStroke(linewidth=2.5, foreground="white", alpha=0.85)]  # readable over edges
    texts = [ax.text(label.x, label.y, label.text, fontsize=8, color="black", ha="left", va="bottom", zorder=5,
                     clip_on=True, path_effects=halo, parse_math=PARSE_MATH,
                     fontweight="bold" if label.bold else "normal") for label in labels]
    extents = [t.get_window_extent(renderer) for t in texts]
    anchors = ax.transData.transform(np.array([(label.x, label.y) for label in labels]))
    box = ax.get_window_extent(renderer)
    placed = dict(place_labels(anchors, np.array([(e.width, e.height) for e in extents]),
                               (box.x0, box.y0, box.x1, box.y1), offset=3.0 * fig.dpi / 72,
                               centred=any(label.centred for label in labels)))
    inverse = ax.transData.inverted()
    kept = []
    for k, text in enumerate(texts):
        if k in placed:
            text.set_position(inverse.transform(placed[k]))
            kept.append(text.get_text())
        else:
            text.remove()
    return kept


def draw_kl(ax, result):
    """The run's objective (KL(P‖Q), or its model's own, e.g. EE's E) per computed iteration on ``ax``."""

    objective = objective_of(result)
    history = np.asarray(result.kl_history, dtype=float)
    computed = np.flatnonzero(~np.isnan(history))  # dbd with kl_every > 1 leaves NaN between computed entries
    ax.plot(computed, history[computed], color="tab:red", linewidth=1.2)
    ax.set_xlabel("iteration")
    ax.set_ylabel(objective.label)
    ax.set_title(f"{objective.label} {result.kl:.4f} after {result.iterations} iterations")
    ax.grid(True, alpha=0.3)


def new_figure(figsize, dpi: float = 100.0):
    """An Agg ``Figure`` with constrained layout (no pyplot state); ``dpi`` should be the one it is saved at, so
    that a density raster has one cell per image pixel."""
    Figure, FigureCanvasAgg, _ = _matplotlib()
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_embedding(result, labels: int = 10, title: str | None = None, figsize=(12.0, 5.5), affinity="auto",
                   colour: str = "auto", classes=None, density="auto", communities="auto", dpi: float = 100.0,
                   engine=None):
    """A ``matplotlib.figure.Figure`` of a result or a result store path: the map (module docstring), the KL
    history, and an overview panel when the map's frame leaves nodes out.  ``affinity``: see ``run_affinity``;
    ``communities``: see ``map_data``; ``dpi``: the resolution it will be saved at (density rasters);
    ``engine``: the density engine (``scalemb.plot.density``)."""
    data = map_data(result, affinity, classes, communities)
    return map_figure(data, labels=labels, title=title, figsize=figsize, colour=colour, density=density, dpi=dpi,
                      engine=engine)


def map_figure(data: MapData, labels: int = 10, title=None, figsize=(12.0, 5.5), colour="auto", density="auto",
               kl_panel: bool = True, dpi: float = 100.0, engine=None):
    """The figure of ``plot_embedding`` from ``MapData``; ``kl_panel=False`` draws the map and overview only."""
    fig = new_figure(figsize, dpi)
    overview = data.needs_overview
    if kl_panel:
        grid = fig.add_gridspec(2, 2, width_ratios=(1.35, 1))
        ax = fig.add_subplot(grid[:, 0])
        kl_ax = fig.add_subplot(grid[1, 1] if overview else grid[:, 1])
        draw_kl(kl_ax, data.result)
    else:
        grid = fig.add_gridspec(1, 2, width_ratios=(2.6, 1)) if overview else fig.add_gridspec(1, 1)
        ax = fig.add_subplot(grid[:, 0] if overview else grid[0, 0])
    _, candidates, rasters = draw_map(fig, ax, data, colour=colour, labels=labels, density=density, title=title,
                                      engine=engine)
    overview_ax = None
    if overview:
        overview_ax = fig.add_subplot(grid[0, 1])
    finish_map(fig, ax, data, candidates, overview_ax, rasters)
    return fig


def figure_png(fig, dpi: int = 110) -> bytes:
    """``fig`` as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def plot_png(result, dpi: int = 110, **kwargs) -> bytes:
    """The figure of ``plot_embedding`` as PNG bytes."""
    return figure_png(plot_embedding(result, dpi=dpi, **kwargs), dpi=dpi)


def save_plot(result, out, dpi: int = 110, **kwargs) -> Path:
    """Write the figure to ``out``; the format follows the suffix (png, pdf, svg, ...)."""
    out = Path(out)
    if not out.parent.exists():
        raise ScalembError(f"{out.parent}: output directory does not exist")
    fig = plot_embedding(result, dpi=dpi, **kwargs)
    try:
        fig.savefig(out, dpi=dpi)
    except ValueError as exc:  # unsupported format
        raise ScalembError(f"{out}: {exc}") from None
    return out
