"""Embedding figure: the layout panel and a KL-vs-iteration panel.

Positions are the first two space coordinates.  With one space dimension the vertical axis is the first
time coordinate (SNEST) or, without time, the row index.  With time (SNEST, the paper's Figures 3-4) each
point is coloured by its first time coordinate on a diverging colormap centred at 0, its marker area grows
with |t| (the Euclidean norm of the time coordinates), and the ``labels`` nodes of largest |t| are labelled
with their node ids.  sne/tsne results get plain uniform markers.
"""
import io
from pathlib import Path

import numpy as np

from ..errors import ScalembError

DIVERGING_CMAP = "RdBu_r"
MIN_SIZE, MAX_SIZE, PLAIN_SIZE = 4.0, 120.0, 12.0


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import TwoSlopeNorm
        from matplotlib.figure import Figure
    except ImportError:
        raise ScalembError("plotting needs matplotlib: pip install 'scalemb[plot]'") from None
    return Figure, FigureCanvasAgg, TwoSlopeNorm


def _load(result):
    """An ``EmbeddingResult`` from a result or the path of a result store."""
    from ..embedding import EmbeddingResult

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


def plot_embedding(result, labels: int = 10, title: str | None = None, figsize=(12.0, 5.5)):
    """A two-panel ``matplotlib.figure.Figure`` (layout, KL history) of a result or a result store path."""
    Figure, FigureCanvasAgg, TwoSlopeNorm = _matplotlib()
    result = _load(result)
    emb, ds, dt = result.embedding, result.space_dims, result.time_dims
    x, y, xlabel, ylabel = layout_axes(result)
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    ax, kl_ax = fig.subplots(1, 2, width_ratios=(1.35, 1))
    if dt >= 1:
        t = emb[:, ds]
        magnitude = np.linalg.norm(emb[:, ds:], axis=1)
        top = float(magnitude.max()) if magnitude.size else 0.0
        bound = max(float(np.abs(t).max()) if t.size else 0.0, 1e-12)
        sizes = MIN_SIZE + (MAX_SIZE - MIN_SIZE) * (magnitude / top if top > 0 else np.zeros_like(magnitude))
        order = np.argsort(magnitude)  # large markers drawn last, on top
        points = ax.scatter(x[order], y[order], c=t[order], s=sizes[order], cmap=DIVERGING_CMAP,
                            norm=TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound),
                            edgecolors="black", linewidths=0.3, alpha=0.9)
        fig.colorbar(points, ax=ax, label="time 1" + (" (size: |time|)" if dt == 1 else " (size: ‖time‖)"))
        for i in order[::-1][:max(0, int(labels))]:
            ax.annotate(str(result.node_ids[i]), (x[i], y[i]), xytext=(3, 3), textcoords="offset points",
                        fontsize=8, color="black")
    else:
        ax.scatter(x, y, s=PLAIN_SIZE, color="tab:blue", alpha=0.8, linewidths=0)
    if ds >= 2:
        ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    dims = f"R^{ds}" + (f",{dt}" if dt else "")
    ax.set_title(title or f"{result.model} in {dims}, N = {emb.shape[0]}")
    history = np.asarray(result.kl_history, dtype=float)
    computed = np.flatnonzero(~np.isnan(history))  # dbd with kl_every > 1 leaves NaN between computed entries
    kl_ax.plot(computed, history[computed], color="tab:red", linewidth=1.2)
    kl_ax.set_xlabel("iteration")
    kl_ax.set_ylabel("KL(P‖Q)")
    kl_ax.set_title(f"KL {result.kl:.4f} after {result.iterations} iterations")
    kl_ax.grid(True, alpha=0.3)
    return fig


def plot_png(result, dpi: int = 110, **kwargs) -> bytes:
    """The figure of ``plot_embedding`` as PNG bytes."""
    buffer = io.BytesIO()
    plot_embedding(result, **kwargs).savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def save_plot(result, out, dpi: int = 110, **kwargs) -> Path:
    """Write the figure to ``out``; the format follows the suffix (png, pdf, svg, ...)."""
    out = Path(out)
    if not out.parent.exists():
        raise ScalembError(f"{out.parent}: output directory does not exist")
    fig = plot_embedding(result, **kwargs)
    try:
        fig.savefig(out, dpi=dpi)
    except ValueError as exc:  # unsupported format
        raise ScalembError(f"{out}: {exc}") from None
    return out
