"""Figures of embedding results (matplotlib, Agg backend, no pyplot state): ``plot_embedding`` returns a
``Figure``, ``plot_png`` PNG bytes, ``save_plot`` writes a file; ``scalemb plot run.zarr --out fig.png``.
Maps are display-only arrangements (``layout``: packed components, robust frame, label placement);
``map_data`` / ``map_figure`` draw them without the KL panel."""
from .figure import map_figure, plot_embedding, plot_png, save_plot
from .mapdata import map_data

__all__ = ["map_data", "map_figure", "plot_embedding", "plot_png", "save_plot"]
