"""Density rendering of large maps: points aggregated onto the pixel grid of the panel that shows them.

A static figure of 1e5-1e6 points drawn as markers is a single blot (markers cover each other and the last
drawn wins) and costs seconds per 1e5 markers; a raster of per-pixel aggregates shows where the points are and
what they hold at the cost of one pass over them.  Pixel (row r, column c) of a W x H grid over the extent
[x0, x1] x [y0, y1] holds the points with c = floor((x - x0) / (x1 - x0) * W) and r = floor((y - y0) /
(y1 - y0) * H), clipped to the last column / row (points on the upper edge count), row 0 at y0; points outside
the extent are left out.  Aggregates:

* ``count``: points per pixel;
* ``mean`` of a per-point value (NaN where a pixel holds no point);
* per-category counts (H x W x K), shaded as datashader's categorical shading does: a pixel's colour is the
  count-weighted mean of its categories' colours and its opacity grows with its total count by histogram
  equalisation (the rank of the count among the non-empty pixels' counts, from ``MIN_ALPHA`` to opaque), so a
  few points in a sparse region stay visible beside 1e4 points in a dense one.

Two engines draw the same raster: ``"datashader"`` (``Canvas.points`` aggregates, ``transfer_functions.shade``
shades; the ``plot`` extra) and ``"numpy"`` (``numpy.bincount`` on the same grid: the same integers, tested, and
the rule above; shaded images equal to 2/255).  ``"auto"`` (``ENGINE``) is numpy: a ``scalemb plot`` process
draws one raster, and datashader's import and its numba compilation of the aggregation on first use cost more
(CPU and memory) than numpy's whole aggregation of 1e6 points (~0.1 s); datashader is the engine to ask for
where its out-of-core / Dask aggregation is wanted.
"""
import numpy as np

from ..errors import ScalembError

MIN_ALPHA = 110  # opacity (of 255) of the sparsest non-empty pixel: a lone point keeps its colour
ENGINE = "auto"


def have_datashader() -> bool:
    try:
        import datashader  # noqa: F401
    except ImportError:
        return False
    return True


def _engine(engine: str | None) -> str:
    engine = engine or ENGINE
    if engine == "auto":
        return "numpy"
    if engine == "datashader" and not have_datashader():
        raise ScalembError("density rendering with datashader needs it installed: pip install 'scalemb[plot]'")
    if engine not in ("datashader", "numpy"):
        raise ScalembError(f"unknown density engine {engine!r} (auto, datashader or numpy)")
    return engine


def _pixels(xy: np.ndarray, extent, shape):
    """``(flat pixel index, kept)`` of each point inside ``extent`` (the module docstring's convention)."""
    x0, x1, y0, y1 = extent
    height, width = shape
    x, y = xy[:, 0], xy[:, 1]
    kept = (x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)
    col = np.minimum(np.floor((x[kept] - x0) / (x1 - x0) * width).astype(np.int64), width - 1)
    row = np.minimum(np.floor((y[kept] - y0) / (y1 - y0) * height).astype(np.int64), height - 1)
    return row * width + col, kept


def _frame(xy, extent, shape, columns: dict):
    import datashader
    import pandas as pd

    x0, x1, y0, y1 = (float(v) for v in extent)
    canvas = datashader.Canvas(plot_width=int(shape[1]), plot_height=int(shape[0]), x_range=(x0, x1),
                               y_range=(y0, y1))
    frame = pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], **columns}, copy=False)
    return canvas, frame


def aggregate(xy, extent, shape, how: str = "count", values=None, categories=None, n_categories: int = 0,
              engine: str | None = None) -> np.ndarray:
    """Per-pixel aggregate of the points ``xy`` (N x 2) on an ``shape = (H, W)`` grid over ``extent = (x0, x1,
    y0, y1)``: ``how="count"`` (H x W counts), ``"mean"`` of ``values`` (H x W, NaN where empty) or
    ``"categories"`` (H x W x ``n_categories`` counts of the integer ``categories`` in [0, n_categories))."""
    xy = np.asarray(xy, dtype=np.float64)
    height, width = (int(v) for v in shape)
    if height < 1 or width < 1:
        raise ValueError(f"density grid shape must be positive, got {shape}")
    if not (extent[1] > extent[0] and extent[3] > extent[2]):
        raise ValueError(f"density extent must have positive width and height, got {extent}")
    engine = _engine(engine)
    if how == "count":
        if engine == "datashader":
            import datashader

            canvas, frame = _frame(xy, extent, shape, {})
            return np.asarray(canvas.points(frame, "x", "y", datashader.count()).values, dtype=np.int64)
        flat, _ = _pixels(xy, extent, shape)
        return np.bincount(flat, minlength=height * width).reshape(height, width)
    if how == "mean":
        values = np.asarray(values, dtype=np.float64)
        if engine == "datashader":
            import datashader

            canvas, frame = _frame(xy, extent, shape, {"v": values})
            return np.asarray(canvas.points(frame, "x", "y", datashader.mean("v")).values, dtype=np.float64)
        flat, kept = _pixels(xy, extent, shape)
        total = np.bincount(flat, weights=values[kept], minlength=height * width)
        count = np.bincount(flat, minlength=height * width)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), np.nan).reshape(height, width)
    if how == "categories":
        categories = np.asarray(categories, dtype=np.int64)
        k = int(n_categories)
        if engine == "datashader":
            import datashader
            import pandas as pd

            canvas, frame = _frame(xy, extent, shape, {"c": pd.Categorical.from_codes(categories, range(k))})
            agg = canvas.points(frame, "x", "y", datashader.count_cat("c"))
            return np.asarray(agg.transpose("y", "x", "c").values, dtype=np.int64)
        flat, kept = _pixels(xy, extent, shape)
        counts = np.bincount(flat * k + categories[kept], minlength=height * width * k)
        return counts.reshape(height, width, k)
    raise ValueError(f"unknown aggregate {how!r}")


def shade_categories(counts: np.ndarray, colours, engine: str | None = None) -> np.ndarray:
    """RGBA image (H x W x 4, uint8, row 0 at the extent's bottom) of per-category ``counts`` (H x W x K) with
    ``colours`` (K RGB triples in [0, 255]), shaded as the module docstring says; empty pixels transparent."""
    counts = np.asarray(counts)
    colours = np.asarray(colours, dtype=np.float64)
    height, width, k = counts.shape
    if _engine(engine) == "datashader":
        import datashader.transfer_functions as tf
        import xarray as xr

        agg = xr.DataArray(counts.astype(np.uint32), dims=("y", "x", "c"),
                           coords={"y": np.arange(height), "x": np.arange(width), "c": np.arange(k)})
        key = ["#%02x%02x%02x" % tuple(int(round(v)) for v in c) for c in colours[:k]]
        image = tf.shade(agg, color_key=key, how="eq_hist", min_alpha=MIN_ALPHA)
        return np.ascontiguousarray(image.data).view(np.uint8).reshape(height, width, 4).copy()
    total = counts.sum(axis=2)
    rgba = np.zeros((height, width, 4), dtype=np.uint8)
    full = total > 0
    if not full.any():
        return rgba
    mixed = counts[full].astype(np.float64) @ colours[:k] / total[full][:, None]
    rgba[full, :3] = np.clip(np.round(mixed), 0, 255).astype(np.uint8)
    levels = np.unique(total[full])  # histogram equalisation: the rank of a pixel's count among the non-empty
    cdf = np.cumsum(np.bincount(np.searchsorted(levels, total[full]), minlength=levels.size)) / full.sum()
    rank = cdf[np.searchsorted(levels, total[full])]
    lowest = cdf[0]
    spread = (rank - lowest) / (1.0 - lowest) if lowest < 1.0 else np.ones_like(rank)
    rgba[full, 3] = np.round(MIN_ALPHA + (255 - MIN_ALPHA) * spread).astype(np.uint8)
    return rgba
