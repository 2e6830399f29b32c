"""Figures of embedding results (matplotlib, Agg backend, no pyplot state): ``plot_embedding`` returns a
``Figure``, ``plot_png`` PNG bytes, ``save_plot`` writes a file; ``scalemb plot run.zarr --out fig.png``."""
from .figure import plot_embedding, plot_png, save_plot

__all__ = ["plot_embedding", "plot_png", "save_plot"]
