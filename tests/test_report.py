"""``scalemb report`` and the interactive map page: real runs, real files, opened in a real headless Chromium
(Debian's ``chromium``) driven over the DevTools protocol.  Under CI (``CI=true``) a missing browser fails."""
import base64
import dataclasses
import io
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import scalemb
from scalemb.embedding import EmbeddingResult

from .cli_runner import run_cli

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """The Debian chromium binary; a failure under CI when it is missing, a skip elsewhere."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if path is None:
        message = "Debian chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol (websocket-client)."""

    def __init__(self, user_dir, width=1200, height=800):
        import websocket

        self.proc = subprocess.Popen([chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={user_dir}",
                                      "--remote-debugging-port=0", "--remote-allow-origins=*",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(user_dir) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        while True:
            pages = [t for t in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
                     if t["type"] == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=120, suppress_origin=True)
        self.next_id, self.events = 0, []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        # the screen as large as the window (headless Chromium's screen is 800 x 600 otherwise, and regl-scatterplot
        # renders into a canvas no larger than the screen)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False,
                  screenWidth=width, screenHeight=height)

    def _receive(self):
        message = json.loads(self.ws.recv())
        if "method" in message:
            self.events.append(message)
        return message

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def wait_event(self, name, timeout=120):
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while not any(e["method"] == name for e in self.events[seen - 1 if seen else 0:]):
            if time.monotonic() > deadline:
                raise TimeoutError(name)
            self._receive()

    def open(self, url):
        self.events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 120
        while not any(e["method"] == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load")
            self._receive()

    def open_map(self, url, timeout=120):
        """Open a map page and wait until it has drawn its first frame (``document.body.dataset.ready``)."""
        self.open(url)
        self.evaluate(f"new Promise((ok, fail) => {{ const t = performance.now(), f = () => document.body.dataset.ready"
                      f" ? ok(1) : performance.now() - t > {timeout * 1000} ? fail('not ready') : setTimeout(f, 20);"
                      f" f(); }})")

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list:
        """Console errors, uncaught exceptions and error log entries (failed loads, ...) since the last open."""
        found = []
        for event in self.events:
            method, params = event["method"], event["params"]
            if method == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"].get("text", "") + str(params["exceptionDetails"]))
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"])
        return found

    def screenshot(self) -> np.ndarray:
        import matplotlib.image

        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        return matplotlib.image.imread(io.BytesIO(data), format="png")[..., :3]

    def mouse(self, kind, x, y, **extra):
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def close(self):
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - closing a dead connection
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium_path()
    b = Browser(str(tmp_path_factory.mktemp("chromium")))
    yield b
    b.close()


@pytest.fixture(scope="module")
def school_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("school") / "run.zarr"
    scalemb.embed("school", model="snest", iterations=150, seed=1).save(path)
    return path


@pytest.mark.slow
def test_report_opens_in_chromium_with_every_figure(school_run, tmp_path, browser):
    labels = tmp_path / "y.npy"
    np.save(labels, np.where(EmbeddingResult.load(school_run).node_ids < 21, 0, 1))
    out, js, page = tmp_path / "report.html", tmp_path / "m.json", tmp_path / "map.html"
    proc = run_cli("report", school_run, "--labels", labels, "--out", out, "--json", js, "--map", page)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(js.read_text())
    assert {"kl", "np@deg", "jaccard@deg", "1nn_error"} <= set(metrics)
    assert abs(metrics["kl"]["value"] - EmbeddingResult.load(school_run).kl) < 1e-6  # affinity from provenance
    text = out.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    browser.open(out.as_uri())
    assert browser.errors() == []
    images = browser.evaluate("[...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
    assert [alt for alt, *_ in images] == ["map by time", "map by label", "map by degree", "KL(P‖Q) per iteration",
                                           "time against degree"]
    assert all(done and w > 300 and h > 200 for _, done, w, h in images)  # every image decoded
    decoded = browser.evaluate("Promise.all([...document.images].map(i => i.decode().then(() => true)))")
    assert decoded == [True] * 5
    rows = browser.evaluate("[...document.querySelectorAll('#metrics tr')].slice(1).map(r => r.cells[0].textContent)")
    assert rows == list(metrics)
    assert browser.evaluate("document.querySelector('a').getAttribute('href')") == "map.html"
    shot = browser.screenshot()
    assert shot.std() > 0.05
    browser.open_map(page.as_uri())
    assert browser.errors() == [] and browser.evaluate("document.body.dataset.ready") == "1"
    assert browser.evaluate("[...document.getElementById('colour').options].map(o => o.value)") == \
        ["community", "time", "label", "degree", "np", "none"]
    info = browser.evaluate("scalembMap.find('20'), document.getElementById('info').textContent")
    assert info.startswith("node 20community ") and "degree 21time " in info  # the first teacher
    assert "NP@deg" in info and "label 0" in info
    from scalemb.plot.mapdata import run_affinity
    from scalemb.report.mappage import _per_node_np

    result = EmbeddingResult.load(school_run)
    assert np.mean(_per_node_np(result, run_affinity(result))) == pytest.approx(metrics["np@deg"]["value"])


def _two_clusters(n_each=3000, seed=0):
    """A result with two tight clusters: ids 0.. at (-10, 0), ids 100000.. at (+10, 4) (radius 1)."""
    rng = np.random.default_rng(seed)
    angle, radius = rng.uniform(0, 2 * np.pi, 2 * n_each), np.sqrt(rng.uniform(0, 1, 2 * n_each))
    disc = np.column_stack([radius * np.cos(angle), radius * np.sin(angle)])
    emb = disc + np.repeat([[-10.0, 0.0], [10.0, 4.0]], n_each, axis=0)
    ids = np.concatenate([np.arange(n_each), 100_000 + np.arange(n_each)])
    return EmbeddingResult(emb, ids, 1.0, np.ones(3), "tsne", 2, 0, 2, 0)


@pytest.mark.parametrize("renderer", ["webgl", "canvas"])
@pytest.mark.slow
def test_map_page_draws_points_where_the_data_says(tmp_path, browser, renderer):
    from scalemb.report.mappage import build_map_page

    run = tmp_path / "two.zarr"
    _two_clusters().save(run)
    page = tmp_path / "map.html"
    page.write_text(build_map_page(run))
    browser.open_map(page.as_uri() + f"#renderer={renderer}")
    assert browser.errors() == [] and browser.evaluate("scalembMap.renderer") == renderer
    box = browser.evaluate("(r => [r.left, r.top, r.width, r.height])(document.getElementById('map')"
                           ".getBoundingClientRect())")
    left, top, width, height = (round(v) for v in box)
    centres = browser.evaluate("[scalembMap.toScreen(-10, 0), scalembMap.toScreen(10, 4)]")
    scale = browser.evaluate("scalembMap.view.scale")
    (ax, ay), (bx, by) = centres
    assert ax < bx and ay > by  # cluster b is right of and above cluster a, as in the data
    assert abs((bx - ax) / scale - 20) < 1e-6 and scale * 20 > 0.5 * width  # the view frames the data
    shot = browser.screenshot()[top:top + height, left:left + width]
    ink = shot.min(axis=2) < 0.9  # not white
    yy, xx = np.mgrid[0:height, 0:width]
    near = [np.hypot(xx - cx, yy - cy) <= scale * 1.0 + 4 for cx, cy in centres]
    assert ink[near[0]].mean() > 0.3 and ink[near[1]].mean() > 0.3  # both discs are drawn (filled)
    assert not ink[~(near[0] | near[1])].any()  # and nothing anywhere else
    # hover over cluster a shows one of its nodes; find a node of cluster b by id
    browser.mouse("mouseMoved", left + ax, top + ay)
    tip = browser.evaluate("[getComputedStyle(tip).display, tip.textContent]")
    assert tip[0] == "block" and int(tip[1].split("node")[1].split("component")[0]) < 100_000
    browser.evaluate("document.getElementById('node').value = '100007';"
                     "document.getElementById('find').requestSubmit(); 0")
    assert "node 100007" in browser.evaluate("document.getElementById('info').textContent")
    index = browser.evaluate("scalembMap.find('100007')")
    assert index == 3007
    assert browser.evaluate("scalembMap.view.cx") == pytest.approx(float(_two_clusters().embedding[3007, 0]), 1e-6)
    assert "no node matches" in browser.evaluate("scalembMap.find('5'.repeat(12)), document.getElementById('info')"
                                         ".textContent")


# the mean time per frame while the view pans by 5 px per frame (each step waits for the scatterplot's next draw)
PAN_FRAME_MS = """(async () => {
  const m = scalembMap, frames = () => Number(document.body.dataset.frames || 0), steps = 20;
  const t0 = performance.now();
  for (let k = 0; k < steps; k++) {
    const before = frames();
    m.setView(m.view.cx + 5 / m.view.scale, m.view.cy, m.view.scale);
    await new Promise(ok => { const f = () => frames() > before ? ok() : requestAnimationFrame(f); f(); });
  }
  return (performance.now() - t0) / steps;
})()"""


@pytest.mark.slow
def test_map_page_pans_and_zooms_1e6_points(tmp_path, browser):
    """1e6 points: the page loads, draws with WebGL, pans in well under a second per frame, zooms with the wheel
    and pans with a drag."""
    from scalemb.report.mappage import build_map_page

    rng = np.random.default_rng(2)
    n = 1_000_000
    emb = np.vstack([rng.standard_normal((n // 2, 2)), rng.standard_normal((n // 2, 2)) * 0.5 + [6.0, 0.0]])
    big = EmbeddingResult(emb, np.arange(n), 1.0, np.ones(2), "tsne", 2, 0, 1, 0)
    page = tmp_path / "big.html"
    page.write_text(build_map_page(big))
    assert page.stat().st_size < 40e6
    browser.open_map(page.as_uri())
    assert browser.errors() == [] and browser.evaluate("scalembMap.n") == n
    # software WebGL (this machine, CI): the page draws with its canvas-2-D scatter
    software = "swiftshader" in browser.evaluate("String(scalembMap.glName)").lower()
    assert browser.evaluate("scalembMap.renderer") == ("canvas" if software else "webgl")
    frame = browser.evaluate(PAN_FRAME_MS)
    print(f"1e6 points: {frame:.1f} ms per frame while panning")
    assert frame < 1000
    before = browser.evaluate("scalembMap.view.scale")
    browser.mouse("mouseWheel", 500, 400, deltaX=0, deltaY=-300)
    browser.mouse("mousePressed", 500, 400, button="left", clickCount=1)
    browser.mouse("mouseMoved", 400, 400, button="left", buttons=1)
    browser.mouse("mouseReleased", 400, 400, button="left", clickCount=1)
    browser.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    assert browser.evaluate("scalembMap.view.scale") > 1.2 * before
    shot = browser.screenshot()
    assert (shot.min(axis=2) < 0.9).mean() > 0.05  # points drawn


def _wait_frames(browser):
    """Request an overlay frame and wait until it is drawn: it then shows the page's current state."""
    browser.evaluate("new Promise(ok => { const start = Number(document.body.dataset.overlays || 0), f = () => "
                     "Number(document.body.dataset.overlays || 0) > start ? ok(1) : setTimeout(f, 20);"
                     " scalembMap.redraw(); f(); })")


def _until(browser, condition, timeout=30):
    """Wait until the JavaScript expression ``condition`` is true (a failed wait raises, it does not hang)."""
    browser.evaluate(f"new Promise((ok, fail) => {{ const t = performance.now(), f = () => ({condition}) ? ok(1) :"
                     f" performance.now() - t > {timeout * 1000} ? fail('timed out: ' + {json.dumps(condition)}) :"
                     f" setTimeout(f, 20); f(); }})")


def _exported_selection(browser, tmp_path) -> str | None:
    """Click the page's export button and return the downloaded ``selection.csv`` (None if none came in 30 s)."""
    downloads = tmp_path / "downloads"
    downloads.mkdir(exist_ok=True)
    browser.call("Browser.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
    browser.evaluate("document.getElementById('export').click(); 0")
    deadline = time.monotonic() + 30
    while not (downloads / "selection.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return (downloads / "selection.csv").read_text() if (downloads / "selection.csv").exists() else None


def _drag(browser, path, left=0, top=0):
    """Press at the first point, move through the others with the button down, release at the last."""
    (x, y), *rest = path
    browser.mouse("mousePressed", left + x, top + y, button="left", clickCount=1, buttons=1)
    for x, y in rest:
        browser.mouse("mouseMoved", left + x, top + y, button="left", buttons=1)
    browser.mouse("mouseReleased", left + x, top + y, button="left", clickCount=1)


@pytest.mark.parametrize("renderer", ["webgl", "canvas"])
@pytest.mark.slow
def test_lasso_selects_exactly_the_nodes_inside_and_exports_their_ids(tmp_path, browser, renderer):
    from scalemb.report.mappage import build_map_page

    page = tmp_path / "two.html"
    page.write_text(build_map_page(_two_clusters()))
    browser.open_map(page.as_uri() + f"#renderer={renderer}")
    assert browser.errors() == [] and browser.evaluate("scalembMap.renderer") == renderer
    left, top = browser.evaluate("(r => [r.left, r.top])(document.getElementById('map').getBoundingClientRect())")
    (bx, by), scale = browser.evaluate("[scalembMap.toScreen(10, 4), scalembMap.view.scale]")
    radius = scale * 1.0 + 12  # around cluster b (radius 1 in data units) and nothing of cluster a
    ring = [(bx + radius * np.cos(a), by + radius * np.sin(a)) for a in np.linspace(0, 2 * np.pi, 40)]
    browser.evaluate("document.getElementById('mode').value = 'lasso';"
                     "document.getElementById('mode').dispatchEvent(new Event('change')); 0")
    _drag(browser, ring, left, top)
    _until(browser, "scalembMap.selected().length")
    selected = browser.evaluate("scalembMap.selected()")
    assert selected == list(range(3000, 6000))  # exactly cluster b
    assert browser.evaluate("document.getElementById('selection').textContent") == "3000 selected"
    expected = "id\n" + "".join(f"{100_000 + k}\n" for k in range(3000))
    assert browser.evaluate("scalembMap.selectionCsv()") == expected
    assert _exported_selection(browser, tmp_path) == expected
    # a box in box mode: the same cluster
    browser.evaluate("document.getElementById('mode').value = 'box';"
                     "document.getElementById('mode').dispatchEvent(new Event('change'));"
                     "scalembMap.scatter.deselect(); 0")
    _drag(browser, [(bx - radius + t * 2 * radius, by - radius + t * 2 * radius) for t in np.linspace(0, 1, 12)],
          left, top)
    _until(browser, "scalembMap.selected().length")
    assert browser.evaluate("scalembMap.selected()") == list(range(3000, 6000))


@pytest.mark.slow
def test_hostile_string_ids_are_shown_as_text(tmp_path, browser):
    from scalemb.report.mappage import build_map_page

    hostile = ["<script>alert(1)</script>", 'quote " and \' and </script><!--', "amp &amp; <b>bold</b>",
               "line\u2028sep\u2029", "plain"]
    emb = np.random.default_rng(0).normal(size=(len(hostile), 2))
    result = EmbeddingResult(emb, np.array(hostile), 1.0, np.ones(2), "tsne", 2, 0, 1, 0)
    page = tmp_path / "hostile.html"
    text = build_map_page(result)
    assert text.count("</script>") == 3  # the data, the library and map.js: nothing in the data ends its element
    page.write_text(text, encoding="utf-8")
    browser.open_map(page.as_uri())
    assert browser.errors() == [] and browser.evaluate("document.scripts.length") == 3
    assert browser.evaluate("document.querySelectorAll('b').length") == 1  # only the title: no id became markup
    for k, name in enumerate(hostile):
        found = browser.evaluate(f"scalembMap.find({json.dumps(name)})")
        assert found == k
        info = browser.evaluate("document.getElementById('info').textContent")
        assert info.startswith("node " + name)
    assert browser.evaluate("document.querySelectorAll('#info b').length") == 1
    assert browser.evaluate("scalembMap.search('alrt', 3)") == [0]  # fuzzy: a subsequence
    assert browser.evaluate("scalembMap.search('plaim', 3)") == [4]  # fuzzy: one typing error


@pytest.mark.parametrize("renderer", ["webgl", "canvas"])
@pytest.mark.slow
def test_poincare_run_is_drawn_in_the_disk_with_its_geodesic_grid(tmp_path, browser, renderer):
    """A run whose model's geometry is the Poincaré ball: the page draws the unit circle and the geodesic grid
    (straight diameters through the centre, arcs elsewhere) around the points; a Euclidean run draws neither."""
    from scalemb.plot.layout import poincare_grid
    from scalemb.report.mappage import build_map_page

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(400, 2)) * 0.04 + [0.5, 0.3]
    page = tmp_path / "disk.html"
    page.write_text(build_map_page(EmbeddingResult(emb, np.arange(400), 1.0, np.ones(2), "cosne", 2, 0, 1, 0)))
    browser.open_map(page.as_uri() + f"#renderer={renderer}")
    assert browser.errors() == [] and browser.evaluate("scalembMap.renderer") == renderer
    _wait_frames(browser)
    left, top = browser.evaluate("(r => [r.left, r.top])(document.getElementById('map').getBoundingClientRect())")
    shot = browser.screenshot()
    ink = shot.min(axis=2) < 0.93

    def inked(x, y):  # any ink within 1 px of data point (x, y)
        u, v = browser.evaluate(f"scalembMap.toScreen({x}, {y})")
        r, c = int(round(top + v)), int(round(left + u))
        return bool(ink[r - 1:r + 2, c - 1:c + 2].any())

    angles = np.linspace(0, 2 * np.pi, 24, endpoint=False)
    assert all(inked(np.cos(a), np.sin(a)) for a in angles)  # the boundary
    assert all(inked(0.0, y) for y in (-0.8, -0.4, 0.6))  # the vertical diameter (no point there)
    arc = poincare_grid()[2]  # the geodesic crossing the x-axis 1 hyperbolic unit from the centre
    assert sum(inked(*arc[k]) for k in range(4, 61, 8)) >= 7
    assert not inked(-0.5, -0.5) and not inked(-0.75, 0.2)  # between the lines: blank
    flat = tmp_path / "flat.html"
    flat.write_text(build_map_page(EmbeddingResult(emb, np.arange(400), 1.0, np.ones(2), "tsne", 2, 0, 1, 0)))
    browser.open_map(flat.as_uri() + f"#renderer={renderer}")
    assert browser.evaluate("JSON.parse(document.getElementById('map-data').textContent).disk") is False


@pytest.fixture(scope="module")
def grqc_map(tmp_path_factory):
    """A short SNEST run of the bundled GrQc graph with its communities stored, and its map page."""
    from scalemb.report.mappage import build_map_page

    folder = tmp_path_factory.mktemp("grqc")
    run = folder / "grqc.zarr"
    scalemb.embed("grqc", model="snest", iterations=40, seed=1).save(run)
    assert run_cli("communities", run).returncode == 0
    page = folder / "map.html"
    page.write_text(build_map_page(run), encoding="utf-8")
    return run, page


@pytest.mark.slow
@pytest.mark.parametrize("renderer", ["webgl", "canvas"])
def test_grqc_map_frames_every_component_names_communities_and_searches(grqc_map, browser, renderer):
    from scalemb.plot.communities import community_labels, load_communities
    from scalemb.plot.mapdata import map_data

    run, page = grqc_map
    browser.open("about:blank")
    browser.open_map(page.as_uri() + f"#renderer={renderer}")
    assert browser.errors() == [] and browser.evaluate("scalembMap.renderer") == renderer
    assert browser.evaluate("scalembMap.n") == 5241
    # the first view holds every node, the 355 small components included, and the legend is beside the map
    lo_x, lo_y, hi_x, hi_y = browser.evaluate("""(() => { const m = scalembMap, d = JSON.parse(
        document.getElementById('map-data').textContent); let b = [Infinity, Infinity, -Infinity, -Infinity];
        const dec = e => new Float32Array(Uint8Array.from(atob(e.b64), c => c.charCodeAt(0)).buffer);
        const X = dec(d.x), Y = dec(d.y);
        for (let i = 0; i < m.n; i++) { const [u, v] = m.toScreen(X[i], Y[i]);
          b = [Math.min(b[0], u), Math.min(b[1], v), Math.max(b[2], u), Math.max(b[3], v)]; }
        return b; })()""")
    width, height = browser.evaluate("(r => [r.width, r.height])(document.getElementById('map')"
                                     ".getBoundingClientRect())")
    assert lo_x >= 0 and lo_y >= 0 and hi_x <= width and hi_y <= height
    legend, canvas = browser.evaluate("[document.getElementById('legend'), document.getElementById('map')].map("
                                      "e => (r => [r.left, r.top, r.right, r.bottom])(e.getBoundingClientRect()))")
    assert legend[2] > legend[0] and (legend[0] >= canvas[2] or legend[2] <= canvas[0])  # never over the points
    _wait_frames(browser)
    shot = browser.screenshot()  # in the screenshot: the box of the drawn points' pixels misses the legend's box
    c0, r0, c1, r1 = (int(round(v)) for v in canvas)
    rows, cols = np.nonzero(shot[r0:r1, c0:c1].min(axis=2) < 0.9)
    ink = (c0 + cols.min(), r0 + rows.min(), c0 + cols.max(), r0 + rows.max())
    assert rows.size > 1000 and (legend[0] > ink[2] or legend[2] < ink[0] or legend[1] > ink[3] or legend[3] < ink[1])
    # community labels: from the stored partition, named by the highest-degree members, never overlapping
    membership, _ = load_communities(run)
    data = map_data(EmbeddingResult.load(run))
    names = community_labels(data.xy, membership, data.degree, data.result.node_ids)["names"]
    labels = browser.evaluate("scalembMap.labels()")
    shown = [lab for lab in labels if lab["kind"] == "community"]
    assert len(shown) >= 5 and all(lab["text"] == names[lab["index"]] for lab in shown)
    assert shown[0]["index"] == 0  # the largest community is named first
    boxes = [lab["box"] for lab in labels]
    for i, (x, y, w, h) in enumerate(boxes):
        assert 0 <= x and 0 <= y and x + w <= width and y + h <= height
        for u, v, p, q in boxes[:i]:
            assert x >= u + p or u >= x + w or y >= v + q or v >= y + h
    # search by prefix: the shortest prefix unique to the highest-degree node finds and centres it
    ids = [str(v) for v in data.result.node_ids]
    top = int(np.argmax(data.degree))
    prefix = next(ids[top][:k] for k in range(1, len(ids[top]) + 1)
                  if sum(s.startswith(ids[top][:k]) for s in ids) == 1)
    assert browser.evaluate(f"scalembMap.find('{prefix}')") == top
    assert browser.evaluate("scalembMap.view.cx") == pytest.approx(float(data.xy[top, 0]), rel=1e-5, abs=1e-4)
    hits = browser.evaluate(f"scalembMap.search('{ids[top][:2]}', 10)")
    assert hits and all(ids[i].startswith(ids[top][:2]) for i in hits)
    browser.evaluate(f"document.getElementById('node').value = '{ids[top][:2]}';"
                     "document.getElementById('node').dispatchEvent(new Event('input')); 0")
    _until(browser, "document.querySelector('#hits li')")
    first = browser.evaluate("document.querySelector('#hits li').textContent")
    assert first.startswith(ids[hits[0]] + " ")
    # colouring switches (and the key with it); edges start off (their ink would hide the points), draw when on
    browser.evaluate("scalembMap.fit(JSON.parse(document.getElementById('map-data').textContent).home); 0")
    _wait_frames(browser)
    before = browser.screenshot()
    for key, title in [("degree", "degree (log scale)"), ("time", "time"), ("community", "community (")]:
        browser.evaluate(f"document.getElementById('colour').value = '{key}';"
                         "document.getElementById('colour').dispatchEvent(new Event('change')); 0")
        browser.evaluate("new Promise(r => setTimeout(r, 300))")
        assert browser.evaluate("document.querySelector('#legend .title').textContent").startswith(title)
        if key == "degree":
            assert np.abs(browser.screenshot() - before).max() > 0.3
    # edges: those of the visible region only (zoomed in on a node: fewer), none when switched off
    if not browser.evaluate("document.getElementById('edges').checked"):
        browser.evaluate("document.getElementById('edges').click(); 0")
    _wait_frames(browser)
    everywhere = browser.evaluate("scalembMap.edgesDrawn()")
    browser.evaluate(f"scalembMap.setView({float(data.xy[top, 0])}, {float(data.xy[top, 1])}, "
                     "8 * scalembMap.view.scale); 0")
    _wait_frames(browser)
    near = browser.evaluate("scalembMap.edgesDrawn()")
    # the page's own view size (whole CSS pixels; the canvas's box may be fractional)
    (ax, ay), (bx, by) = browser.evaluate("(([w, h]) => [scalembMap.toData(0, h), scalembMap.toData(w, 0)])"
                                          "(scalembMap.size())")
    xy = data.xy.astype(np.float32)  # as the page holds them
    inside = (xy[:, 0] >= ax) & (xy[:, 0] <= bx) & (xy[:, 1] >= ay) & (xy[:, 1] <= by)
    visible = int((inside[data.edges[:, 0]] | inside[data.edges[:, 1]]).sum())
    assert everywhere > 10000 and near == visible and 0 < near < everywhere
    browser.evaluate("document.getElementById('edges').click(); 0")
    _wait_frames(browser)
    assert browser.evaluate("scalembMap.edgesDrawn()") == 0
    frame = browser.evaluate(PAN_FRAME_MS)
    print(f"GrQc: {frame:.1f} ms per frame while panning")
    assert browser.errors() == []


def _nan_run(school_run, tmp_path):
    result = EmbeddingResult.load(school_run)
    emb = result.embedding.copy()
    emb[3, 0] = np.nan
    path = tmp_path / "nan.zarr"
    dataclasses.replace(result, embedding=emb).save(path)
    return path


def test_report_refuses_bad_input_and_writes_nothing(school_run, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("1 2\n2 3\n3 1\n")
    short = tmp_path / "short.npy"
    np.save(short, np.zeros(41))
    out, js = tmp_path / "r.html", tmp_path / "m.json"
    cases = [(["--input", other], str(other)), (["--labels", short], str(short)),
             ([], str(_nan_run(school_run, tmp_path)))]
    for extra, named in cases:
        run = school_run if extra else named
        proc = run_cli("report", run, *extra, "--out", out, "--json", js)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and named in proc.stderr, proc.stderr
        assert not out.exists() and not js.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left over
    out.write_text("mine")
    proc = run_cli("report", school_run, "--out", out)
    assert proc.returncode == 2 and "already exists" in proc.stderr and out.read_text() == "mine"


@pytest.mark.slow
def test_service_serves_metrics_report_and_map(tmp_path, browser):
    from tests.test_service import TOKEN, Service

    svc = Service(tmp_path)
    try:
        status, created = svc.json("POST", "/jobs", {"input": "school", "model": "snest", "iterations": 120})
        job = created["id"]
        status, early = svc.json("GET", f"/jobs/{job}")
        if early["state"] != "done":
            assert early.get("metrics") is None and svc.request("GET", f"/jobs/{job}/report")[0] == 409
        record = svc.wait(job)
        assert record["state"] == "done" and "metrics" in record, record
        record = svc.wait(job, timeout=300, predicate=lambda r: r["metrics"] is not None)  # computed after done
        assert {"kl", "np@deg", "jaccard@deg"} <= set(record["metrics"])
        assert record["metrics"]["kl"]["value"] == pytest.approx(record["kl"], abs=1e-9)
        assert svc.request("GET", f"/jobs/{job}/report", auth=False)[0] == 401
        status, page, headers = svc.request("GET", f"/jobs/{job}/report")
        assert status == 200 and headers["content-type"].startswith("text/html") and b"np@deg" in page
        assert svc.request("GET", "/jobs/nope/map")[0] == 404
        browser.call("Network.enable")
        browser.call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Bearer {TOKEN}"})
        browser.open(f"http://127.0.0.1:{svc.port}/jobs/{job}/report")
        assert browser.errors() == []
        assert browser.evaluate("Promise.all([...document.images].map(i => i.decode().then(() => i.naturalWidth)))")
        assert browser.evaluate("document.querySelector('a').getAttribute('href')") == f"/jobs/{job}/map"
        browser.open_map(f"http://127.0.0.1:{svc.port}/jobs/{job}/map")
        assert browser.errors() == [] and browser.evaluate("scalembMap.n") == 42
        assert browser.evaluate("scalembMap.find('41')") >= 0  # SCHOOL's second teacher
        assert (browser.screenshot().min(axis=2) < 0.9).mean() > 0.001
        # the selection export works on the served page: a box over the whole view, then the CSV download
        browser.evaluate("document.getElementById('all').click(); const v = scalembMap.view;"
                         "scalembMap.setView(v.cx, v.cy, 0.8 * v.scale);"  # every node well inside the view
                         "document.getElementById('mode').value = 'box';"
                         "document.getElementById('mode').dispatchEvent(new Event('change')); 0")
        _wait_frames(browser)
        left, top, width, height = browser.evaluate("(r => [r.left, r.top, r.width, r.height])(document"
                                                    ".getElementById('map').getBoundingClientRect())")
        _drag(browser, [(3 + t * (width - 6), 3 + t * (height - 6)) for t in np.linspace(0, 1, 12)], left, top)
        _until(browser, "scalembMap.selected().length")
        ids = EmbeddingResult.load(tmp_path / "jobs" / job / "run.zarr").node_ids
        expected = "id\n" + "".join(f"{v}\n" for v in ids.tolist())
        assert browser.evaluate("scalembMap.selectionCsv()") == expected  # every node, in row order
        assert _exported_selection(browser, tmp_path) == expected
        assert browser.errors() == []
    finally:
        browser.call("Browser.setDownloadBehavior", behavior="default")
        browser.call("Network.setExtraHTTPHeaders", headers={})
        svc.stop()


@pytest.mark.slow
def test_report_finds_the_affinity_from_provenance_or_says_it_cannot(tmp_path):
    from scalemb.report import build_report

    edges = tmp_path / "ring.txt"
    edges.write_text("".join(f"{i} {(i + 1) % 30}\n{i} {(i + 2) % 30}\n" for i in range(30)))
    run = tmp_path / "ring.zarr"
    scalemb.embed(str(edges), model="tsne", iterations=60).save(run)
    page, metrics = build_report(run)
    assert set(metrics) == {"kl", "np@deg", "jaccard@deg"} and str(edges) in page
    assert page.count("<img ") == 2 and 'alt="map by degree"' in page  # and the KL curve; no time for t-SNE
    edges.rename(tmp_path / "moved.txt")
    page, metrics = build_report(run)
    assert metrics == {} and "not found (pass --input)" in page and page.count("<img ") == 2
    assert 'alt="map"' in page and "map by degree" not in page
    page, metrics = build_report(run, affinity=str(tmp_path / "moved.txt"))
    assert "np@deg" in metrics
