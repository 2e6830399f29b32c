"""``scalemb plot`` and ``scalemb.plot``: real results, real PNGs."""
import io
import subprocess
import sys

import numpy as np
import pytest

import scalemb
from scalemb.errors import ScalembError
from scalemb.plot import plot_embedding, plot_png, save_plot
from scalemb.plot.figure import layout_axes

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
    fig = plot_embedding(tsne)
    assert len(fig.axes) == 2 and not fig.axes[0].texts  # no colourbar, no time labels
    assert np.allclose(fig.axes[0].collections[0].get_offsets(), tsne.embedding)
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
    cmd = [sys.executable, "-m", "scalemb", "plot", str(run), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already exists" in again.stderr
    missing = subprocess.run([sys.executable, "-m", "scalemb", "plot", str(tmp_path / "nope.zarr"), "--out",
                              str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no such result" in missing.stderr
    assert missing.stderr.count("\n") == 1


def test_unfinished_run_is_refused(tmp_path):
    with pytest.raises(ScalembError, match="not a finished scalemb result"):
        plot_embedding(tmp_path)
