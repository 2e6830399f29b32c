"""``scalemb plot`` and ``scalemb.plot``: real results, real PNGs."""
import io

import numpy as np
import pytest

import scalemb
from scalemb.errors import ScalembError
from scalemb.plot import plot_embedding, plot_png, save_plot
from scalemb.plot.mapdata import layout_axes, map_data
from scalemb.plot.layout import components, place_labels, robust_frame

from .cli_runner import run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def snest_result():
    return scalemb.embed("school", model="snest", iterations=150, seed=1)


def _image(png: bytes) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(png), format="png")


def test_snest_figure_colours_sizes_and_labels_by_time(snest_result):
    fig = plot_embedding(snest_result, labels=5)
    layout, kl = fig.axes[0], fig.axes[1]
    points = layout.collections[0]
    t = snest_result.embedding[:, 2]
    order = np.argsort(np.abs(t))
    # colour is the time coordinate on a diverging map centred at 0; size grows with |t|
    assert np.allclose(points.get_array(), t[order])
    assert points.norm.vcenter == 0.0 and points.norm.vmin == -points.norm.vmax == -np.abs(t).max()
    sizes = points.get_sizes()
    assert np.all(np.diff(sizes) >= 0) and sizes[-1] > 10 * sizes[0]
    # positions are the two space coordinates
    assert np.allclose(points.get_offsets(), snest_result.embedding[order, :2])
    # the five nodes of largest |t| are labelled with their node ids
    labels = {text.get_text() for text in layout.texts}
    assert labels == {str(snest_result.node_ids[i]) for i in order[-5:]}
    assert "20" in labels and "41" in labels  # SCHOOL's two teachers stand out in time
    # KL panel draws the history
    assert np.allclose(kl.lines[0].get_ydata(), snest_result.kl_history)
    assert "colorbar" in fig.axes[2].get_label() or len(fig.axes) == 3


def test_png_bytes_are_a_real_image(snest_result):
    png = plot_png(snest_result, dpi=50)
    assert png.startswith(PNG_MAGIC)
    image = _image(png)
    assert image.shape[0] > 200 and image.shape[1] > 500
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_tsne_and_one_dimensional_layouts(tmp_path):
    tsne = scalemb.embed("school", model="tsne", iterations=50)
    plain = plot_embedding(tsne, affinity=None, colour="none")
    assert len(plain.axes) == 2 and not plain.axes[0].texts  # no colourbar, no labels, no edges
    assert np.allclose(plain.axes[0].collections[0].get_offsets(), tsne.embedding)
    # default with the affinity found from the provenance (dataset school): colour by degree, edges, top-degree ids
    fig = plot_embedding(tsne, labels=3)
    points, edges = fig.axes[0].collections[:2]
    degree = np.diff(scalemb.datasets.school().P.indptr)
    order = np.argsort(degree, kind="stable")
    assert np.array_equal(points.get_array(), degree[order]) and fig.axes[2].get_ylabel() == "degree"
    assert len(edges.get_segments()) == 121 and edges.get_zorder() < points.get_zorder()
    assert {"20", "41"} <= {t.get_text() for t in fig.axes[0].texts}  # the teachers have the largest degree
    one = scalemb.embed("school", model="snest", space_dims=1, iterations=50)
    x, y, _, ylabel = layout_axes(one)
    assert ylabel == "time 1" and np.array_equal(y, one.embedding[:, 1])
    sne = scalemb.embed("school", model="sne", space_dims=1, iterations=20)
    x, y, _, ylabel = layout_axes(sne)
    assert ylabel == "row index" and np.array_equal(y, np.arange(42))
    assert save_plot(sne, tmp_path / "sne.svg").read_text().lstrip().startswith("<?xml")


def test_kl_curve_skips_entries_not_computed():
    from scalemb.optim import DeltaBarDelta

    result = scalemb.embed("school", model="sne", optimizer=DeltaBarDelta(kl_every=5), iterations=30)
    assert np.isnan(result.kl_history).sum() == 24  # 0, 5, ..., 25 and the final KL computed
    x, y = plot_embedding(result).axes[1].lines[0].get_data()
    assert list(x) == [0, 5, 10, 15, 20, 25, 30] and np.all(np.isfinite(y))


def test_cli_plot_writes_png_and_refuses_bad_paths(tmp_path, snest_result):
    run = tmp_path / "run.zarr"
    snest_result.save(run)
    out = tmp_path / "fig.png"
    proc = run_cli("plot", run, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)
    again = run_cli("plot", run, "--out", out)
    assert again.returncode == 2 and "already exists" in again.stderr
    missing = run_cli("plot", tmp_path / "nope.zarr", "--out", tmp_path / "x.png")
    assert missing.returncode == 2 and "no such result" in missing.stderr
    assert missing.stderr.count("\n") == 1


def test_unfinished_run_is_refused(tmp_path):
    with pytest.raises(ScalembError, match="not a finished scalemb result"):
        plot_embedding(tmp_path)


def _two_rings(tmp_path, n=30):
    """Edge list of two rings (ids 0.. and 1000..) plus a pendant pair: three components of 30, 30 and 2."""
    lines = [f"{i} {(i + 1) % n}" for i in range(n)] + [f"{1000 + i} {1000 + (i + 1) % n}" for i in range(n)]
    path = tmp_path / "rings.txt"
    path.write_text("\n".join(lines + ["5000 5001"]) + "\n")
    return path


@pytest.fixture(scope="module")
def rings(tmp_path_factory):
    """A t-SNE run of three components with the small ones moved 1e4 away (as the repulsion does in long runs)."""
    import dataclasses

    path = _two_rings(tmp_path_factory.mktemp("rings"))
    run = scalemb.embed(str(path), model="tsne", iterations=200, seed=0)
    far = run.embedding.copy()
    far[run.node_ids >= 1000] += [1e4, -2e4]
    far[run.node_ids >= 5000] += [-3e4, 0]
    return dataclasses.replace(run, embedding=far), path


def test_components_ranked_by_size_and_packing_keeps_each_layout(rings):
    run, path = rings
    data = map_data(run, affinity=str(path))
    assert list(data.sizes) == [30, 30, 2]
    assert np.array_equal(data.component[run.node_ids >= 5000], [2, 2])
    for c in range(3):  # each component translated as a whole
        members = data.component == c
        shift = data.xy[members] - run.embedding[members, :2]
        assert np.allclose(shift, shift[0], atol=1e-9)
    assert np.allclose(data.xy[data.component == 0], run.embedding[data.component == 0, :2])  # largest stays put
    boxes = [(data.xy[data.component == c].min(0), data.xy[data.component == c].max(0)) for c in range(3)]
    for a in range(3):
        for b in range(a + 1, 3):
            (lo_a, hi_a), (lo_b, hi_b) = boxes[a], boxes[b]
            assert np.any(hi_a < lo_b) or np.any(hi_b < lo_a)  # bounding boxes do not overlap
    span = data.xy.max(0) - data.xy.min(0)
    giant = boxes[0][1] - boxes[0][0]
    assert np.all(span < 4 * giant.max())  # packed: was 3e4 wide
    x0, x1, y0, y1 = data.frame  # framed on the largest component
    assert x0 <= boxes[0][0][0] and x1 >= boxes[0][1][0] and x1 < boxes[0][1][0] + 0.2 * giant[0]


def test_map_of_separated_components_has_overview_and_readable_frame(rings):
    run, path = rings
    fig = plot_embedding(run, affinity=str(path))
    main, overview = fig.axes[0], fig.axes[-1]
    assert "3 components packed" in main.get_title() and overview.get_title().startswith("overview")
    width = main.get_xlim()[1] - main.get_xlim()[0]
    giant = np.ptp(run.embedding[run.node_ids < 1000, 0])
    assert width < 3 * giant  # the main panel shows the largest component, not 3e4 units of empty space
    assert len(fig.axes[0].collections[1].get_segments()) == 61  # all edges drawn
    png = _image(plot_png(run, affinity=str(path), dpi=60))
    assert png[..., :3].std() > 0.05


def test_labels_do_not_overlap(snest_result):
    fig = plot_embedding(snest_result, labels=42)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert 5 <= len(boxes) < 42  # some labels found no free place
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            assert not boxes[a].overlaps(boxes[b])
    panel = fig.axes[0].get_window_extent(renderer)
    assert all(panel.x0 <= bb.x0 and bb.x1 <= panel.x1 and panel.y0 <= bb.y0 and bb.y1 <= panel.y1 for bb in boxes)


def test_place_labels_and_robust_frame_units():
    anchors = np.array([[10.0, 10.0], [11.0, 10.0], [12.0, 11.0], [80.0, 80.0]])
    placed = dict(place_labels(anchors, np.full((4, 2), [20.0, 8.0]), (0, 0, 100, 100), offset=2))
    assert 0 in placed and 3 in placed and len(placed) >= 3
    corners = [placed[k] for k in placed]
    for a in range(len(corners)):
        for b in range(a + 1, len(corners)):
            (xa, ya), (xb, yb) = corners[a], corners[b]
            assert abs(xa - xb) >= 20 or abs(ya - yb) >= 8
    assert place_labels(anchors[:1], np.array([[200.0, 8.0]]), (0, 0, 100, 100)) == []  # no room: dropped
    rng = np.random.default_rng(0)
    pts = np.vstack([rng.standard_normal((1000, 2)), [[1e4, 1e4]]])
    x0, x1, y0, y1 = robust_frame(pts)
    assert x1 < 10 and y1 < 10 and x0 < -2.5  # one outlier does not set the frame
    uniform = rng.uniform(size=(1000, 2))
    assert robust_frame(uniform)[1] >= uniform[:, 0].max()  # no outlier: everything framed
    assert np.array_equal(components(None, 5), np.zeros(5))


def test_colour_by_label_and_density_from_1e5_points(rings):
    import dataclasses

    run, path = rings
    classes = np.where(run.node_ids >= 1000, "ring b", "ring a")
    fig = plot_embedding(run, affinity=str(path), colour="label", classes=classes)
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["ring a", "ring b"]
    renderer = fig.canvas.get_renderer()
    assert not legend.get_window_extent(renderer).overlaps(fig.axes[0].get_window_extent(renderer))  # beside
    with pytest.raises(ScalembError, match="shape"):
        plot_embedding(run, classes=classes[:-1])
    with pytest.raises(ScalembError, match="needs a model with time"):
        plot_embedding(run, colour="time")
    rng = np.random.default_rng(1)
    big = dataclasses.replace(run, embedding=np.vstack([rng.standard_normal((50_000, 2)),
                                                        rng.standard_normal((50_000, 2)) + [8, 0]]),
                              node_ids=np.arange(100_000), provenance={})
    fig = plot_embedding(big, affinity=None)
    assert not fig.axes[0].collections and fig.axes[2].get_ylabel() == "points per pixel"  # a raster, no markers
    counts = fig.axes[0].images[0].get_array()
    assert 0.98e5 < counts.sum() <= 1e5  # all but the frame's 0.5% quantile tails (tests/test_density.py: exact)
