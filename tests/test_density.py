"""Static maps at scale (``scalemb.plot.density``, ``scalemb plot``): density rasters whose pixels count every point
of the panel, datashader and numpy engines agreeing, the map page's community colours and names, and Poincaré
runs in the disk with their geodesic grid."""
import importlib.util
import io

import numpy as np
import pytest
import scipy.sparse as sp

import scalemb
from scalemb.embedding import EmbeddingResult
from scalemb.errors import ScalembError
from scalemb.plot import density, plot_embedding
from scalemb.plot.communities import PALETTE, community_labels, load_communities
from scalemb.plot.mapdata import map_data
from scalemb.plot.layout import poincare_grid

from .cli_runner import run_cli
from .test_communities import planted

# datashader compiles its aggregations with numba on first use in a process (~10-30 s): its cases are slow.  Whether
# it is installed is asked without importing it (its import alone takes seconds, paid at collection otherwise).
NO_DATASHADER = importlib.util.find_spec("datashader") is None
ENGINES = ["numpy", pytest.param("datashader", marks=[pytest.mark.slow, pytest.mark.skipif(
    NO_DATASHADER, reason="datashader is not installed")])]


def _blobs(n=120_000, seed=0):
    """Three Gaussian blobs (communities 0, 1, 2 of sizes n/2, n/3, n/6) at (0, 0), (10, 0), (5, 9)."""
    rng = np.random.default_rng(seed)
    sizes = [n // 2, n // 3, n - n // 2 - n // 3]
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [5.0, 9.0]])
    membership = np.repeat(np.arange(3), sizes)
    xy = rng.standard_normal((n, 2)) + centres[membership]
    return EmbeddingResult(xy, np.arange(n), 1.0, np.ones(2), "tsne", 2, 0, 1, 0), membership


@pytest.mark.slow
@pytest.mark.skipif(NO_DATASHADER, reason="datashader is not installed")
def test_numpy_aggregation_is_datashaders_and_shading_follows_the_rule():
    rng = np.random.default_rng(0)
    xy = rng.uniform(-1.2, 1.2, (200_000, 2))
    xy[:4] = [[-1, -1], [1, 1], [1, -1], [0.999999, 0.3]]  # on the edges: the last column / row counts them
    values, codes = rng.normal(size=xy.shape[0]), rng.integers(0, 5, xy.shape[0])
    extent, shape = (-1.0, 1.0, -1.0, 1.0), (23, 37)
    inside = int(((np.abs(xy) <= 1).all(axis=1)).sum())
    counts = {e: density.aggregate(xy, extent, shape, engine=e) for e in ("numpy", "datashader")}
    assert np.array_equal(counts["numpy"], counts["datashader"]) and counts["numpy"].sum() == inside
    means = [density.aggregate(xy, extent, shape, "mean", values=values, engine=e) for e in ("numpy", "datashader")]
    assert np.allclose(means[0], means[1], rtol=1e-9, atol=1e-12, equal_nan=True)
    cats = [density.aggregate(xy, extent, shape, "categories", categories=codes, n_categories=5, engine=e)
            for e in ("numpy", "datashader")]
    assert np.array_equal(cats[0], cats[1]) and np.array_equal(cats[0].sum(axis=2), counts["numpy"])
    # shading: transparent exactly where no point is; a pixel of one category is that category's colour; more
    # points never less opaque (histogram equalisation is monotone)
    sparse = np.zeros((4, 5, 3), dtype=np.int64)
    sparse[0, 0, 0], sparse[1, 1, 2], sparse[2, 2, 0], sparse[2, 2, 1], sparse[3, 4, 1] = 1, 50, 3, 3, 1000
    colours = [(255, 0, 0), (0, 0, 255), (0, 200, 0)]
    for engine in ("numpy", "datashader"):
        rgba = density.shade_categories(sparse, colours, engine=engine)
        assert rgba.shape == (4, 5, 4) and rgba.dtype == np.uint8
        assert np.array_equal(rgba[..., 3] > 0, sparse.sum(axis=2) > 0)
        assert tuple(rgba[0, 0, :3]) == (255, 0, 0) and tuple(rgba[1, 1, :3]) == (0, 200, 0)
        assert abs(int(rgba[2, 2, 0]) - 128) <= 2 and abs(int(rgba[2, 2, 2]) - 128) <= 2  # an even mix
        alpha = [rgba[0, 0, 3], rgba[2, 2, 3], rgba[1, 1, 3], rgba[3, 4, 3]]  # 1, 6, 50, 1000 points
        assert list(alpha) == sorted(alpha) and alpha[0] >= density.MIN_ALPHA - 1 and alpha[-1] == 255


def test_engine_choice_and_bad_grids():
    assert density._engine("auto") == density._engine(None) == "numpy"
    xy = np.zeros((3, 2))
    with pytest.raises(ScalembError, match="unknown density engine"):
        density.aggregate(xy, (0, 1, 0, 1), (2, 2), engine="gpu")
    with pytest.raises(ValueError, match="positive width"):
        density.aggregate(xy, (0, 0, 0, 1), (2, 2))
    with pytest.raises(ValueError, match="shape must be positive"):
        density.aggregate(xy, (0, 1, 0, 1), (0, 2))


@pytest.mark.parametrize("engine", ENGINES)
def test_density_map_counts_every_point_of_the_panel_at_its_pixels(engine):
    result, _ = _blobs()
    fig = plot_embedding(result, affinity=None, colour="none", dpi=80, engine=engine, communities=None)
    ax = fig.axes[0]
    image = ax.images[0]
    counts = image.get_array()
    box = ax.get_window_extent()
    assert counts.shape == (round(box.height), round(box.width))  # one cell per pixel of the panel
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    xy = result.embedding
    inside = (xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)
    assert counts.sum() == inside.sum() and inside.mean() > 0.98
    assert fig.axes[2].get_ylabel() == "points per pixel"
    assert image.norm.vmin == 1 and image.norm.vmax == counts.max()


@pytest.mark.parametrize("engine", ENGINES)
def test_community_density_map_uses_the_page_colours_and_names(engine):
    """From 1e5 points the communities are a raster whose single-community pixels have the map page's colour of
    that community, and the labels are the page's names (highest-degree members) of the largest communities."""
    result, membership = _blobs()
    info = {"method": "planted", "count": 3}
    data = map_data(result, affinity=None, communities=(membership, info))
    from scalemb.plot.figure import map_figure

    fig = map_figure(data, labels=3, dpi=80, engine=engine)
    ax = fig.axes[0]
    rgba = ax.images[0].get_array()
    assert rgba.ndim == 3 and rgba.shape[2] == 4
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    counts = density.aggregate(result.embedding, (x0, x1, y0, y1), rgba.shape[:2], "categories",
                               categories=membership, n_categories=3, engine="numpy")
    for c in range(3):
        alone = (counts[..., c] > 0) & (counts.sum(axis=2) == counts[..., c])
        assert alone.sum() > 500 and np.all(rgba[alone, :3] == PALETTE[c])
    assert np.array_equal(rgba[..., 3] > 0, counts.sum(axis=2) > 0)
    names = community_labels(data.xy, membership, None, result.node_ids)["names"]
    assert [t.get_text() for t in ax.texts] == names  # all three, largest first, none overlapping
    assert "3 communities (planted)" in ax.get_title()


@pytest.mark.slow
def test_cli_plot_of_stored_communities_matches_the_map_page(tmp_path):
    """``scalemb communities`` then ``scalemb plot``: colours and names are those of the map page's payload."""
    from scalemb.report.mappage import map_payload

    A, truth = planted()
    edges = tmp_path / "planted.txt"
    upper = sp.triu(A, k=1).tocoo()
    edges.write_text("".join(f"{1000 + a} {1000 + b}\n" for a, b in zip(upper.row, upper.col)))
    run = tmp_path / "run.zarr"
    scalemb.embed(str(edges), model="tsne", iterations=150, seed=0).save(run)
    assert run_cli("communities", run, "--method", "louvain", "--seed", "3").returncode == 0
    out = tmp_path / "map.png"
    proc = run_cli("plot", run, "--out", out, "--labels", "3", "--density-engine", "numpy")
    assert proc.returncode == 0, proc.stderr
    import matplotlib.image

    assert matplotlib.image.imread(io.BytesIO(out.read_bytes()), format="png").shape[1] > 500
    fig = plot_embedding(run, labels=3)
    ax = fig.axes[0]
    payload = map_payload(map_data(run), communities=load_communities(run))
    assert payload["palette"] == [list(c) for c in PALETTE]
    assert {t.get_text() for t in ax.texts} == set(payload["communities"]["names"][:3])
    colours = ax.collections[0].get_facecolors()[:, :3]
    membership, _ = load_communities(run)
    assert np.allclose(colours * 255, np.asarray(PALETTE)[membership % len(PALETTE)], atol=0.5)
    from scalemb.report import build_report

    page, _ = build_report(run)  # the report shows the community map too, first
    assert page.index('alt="map by community"') < page.index('alt="map by degree"')


def test_poincare_grid_is_geodesics_at_unit_hyperbolic_steps():
    lines = poincare_grid()
    assert len(lines) == 2 + 4 * 6
    feet = []
    for line in lines[2:]:
        ends = np.hypot(line[[0, -1], 0], line[[0, -1], 1])
        assert np.allclose(ends, 1.0)  # from boundary to boundary
        assert np.all(np.hypot(line[:, 0], line[:, 1]) <= 1 + 1e-12)
        # an arc of a circle orthogonal to the unit circle: centre c, radius r with |c|^2 = 1 + r^2
        a, b, m = line[0], line[-1], line[len(line) // 2]
        matrix = 2 * np.array([b - a, m - a])
        centre = np.linalg.solve(matrix, [b @ b - a @ a, m @ m - a @ a])
        radius = np.hypot(*(a - centre))
        assert np.allclose(np.hypot(*(line - centre).T), radius)
        assert centre @ centre == pytest.approx(1 + radius ** 2)
        if abs(m[1]) < 1e-12 and m[0] > 0:
            feet.append(m[0])
    # the feet on the positive x-axis lie 1, 2, ... hyperbolic units (2 artanh r) from the centre
    assert np.allclose(2 * np.arctanh(np.sort(feet)), np.arange(1, 7))


@pytest.mark.slow
def test_cosne_run_is_drawn_in_the_disk_with_its_grid_in_the_plot_and_the_page(tmp_path):
    """The model's geometry decides: a CO-SNE run is drawn in the Poincaré disk with the geodesic grid, in
    ``scalemb plot`` and in the map page's data; a Euclidean run has neither."""
    from scalemb.report.mappage import map_payload

    from .test_cosne import cli_cosne_run

    store, out = cli_cosne_run(tmp_path)
    fig = plot_embedding(out, affinity=None)
    ax = fig.axes[0]
    grids = [c for c in ax.collections if c.get_label() == "geodesic grid"]
    assert len(grids) == 1 and len(grids[0].get_segments()) == len(poincare_grid())
    assert ax.get_xlim()[0] < -1 and ax.get_xlim()[1] > 1 and "Poincaré disk" in ax.get_title()
    payload = map_payload(map_data(out, affinity=None))
    assert payload["disk"] is True and len(payload["grid"]) == len(poincare_grid())
    flat = map_payload(map_data(_blobs(2000)[0], affinity=None))
    assert "grid" not in flat and flat["disk"] is False
    plain = plot_embedding(_blobs(2000)[0], affinity=None)
    assert not [c for c in plain.axes[0].collections if c.get_label() == "geodesic grid"]
