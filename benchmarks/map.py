"""Issue 32 measurements: the map page (``scalemb.report.mappage``) in headless Chromium.

Per run (``--runs a.zarr,b.zarr``): the page's build time (communities stored with the run are read; else detected,
timed apart), its size and bytes per point; then for each of ``--renderers`` (the page's own choice: WebGL, or its
canvas-2-D scatter on software WebGL; and WebGL forced), in the tests' headless Chromium
(``tests/test_report.py``'s ``Browser``; the WebGL renderer string recorded): the time from navigation to the
first drawn frame (``document.body.dataset.readyMs``: ``performance.now()`` when the first frame is drawn and the
page is ready) and the mean frame time while panning by 5 px per frame and while zooming by 5 % per frame (each
step waits for the next drawn frame; ``PAN_FRAME_MS``), ``--rounds`` rounds, median.  ``--shots DIR`` saves a
screenshot of each page's first view.  ``--canvas-pages`` measures pages of the previous canvas-2-D map (built by
an older scalemb) for comparison: the mean of 5 synchronous ``scalembMap.draw()`` calls.

``python benchmarks/map.py --runs grqc.zarr,c1e5.zarr,c1e6.zarr --out benchmarks/results/maps.md --shots
benchmarks/results``
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine_description  # noqa: E402
from tests.test_report import PAN_FRAME_MS, Browser  # noqa: E402

ZOOM_FRAME_MS = PAN_FRAME_MS.replace("m.setView(m.view.cx + 5 / m.view.scale, m.view.cy, m.view.scale)",
                                     "m.setView(m.view.cx, m.view.cy, m.view.scale * 1.05)")
RENDERER = ("(() => { const g = document.createElement('canvas').getContext('webgl'); if (!g) return 'no WebGL';"
            " const e = g.getExtension('WEBGL_debug_renderer_info');"
            " return g.getParameter(e ? e.UNMASKED_RENDERER_WEBGL : g.RENDERER); })()")


def build_page(run: str, out: Path) -> dict:
    from scalemb.metrics.evaluate import load_run
    from scalemb.plot.communities import detect_communities, load_communities
    from scalemb.plot.mapdata import map_data, run_affinity
    from scalemb.report.mappage import _per_node_np, map_html, map_payload

    t0 = time.perf_counter()
    result, name = load_run(run)
    aff = run_affinity(result)
    data = map_data(result, affinity=aff)
    t1 = time.perf_counter()
    communities = load_communities(run)
    stored = communities is not None
    if communities is None and aff is not None:
        communities = detect_communities(aff.P)
    t2 = time.perf_counter()
    text = map_html(map_payload(data, _per_node_np(result, aff), communities), f"scalemb map: {name}")
    out.write_text(text, encoding="utf-8")
    t3 = time.perf_counter()
    return {"n": data.n_points, "edges": 0 if data.edges is None else int(data.edges.shape[0]),
            "communities": None if communities is None else int(communities[1]["count"]),
            "community_s": t2 - t1, "stored": stored, "build_s": (t1 - t0) + (t3 - t2), "bytes": out.stat().st_size}


def measure(browser, page: Path, rounds: int, shot, renderer: str) -> dict:
    ready, pan, zoom = [], [], []
    for _ in range(rounds):
        browser.open("about:blank")  # a new document each round (a changed #hash alone would not load one)
        browser.open_map(page.as_uri() + ("" if renderer == "auto" else f"#renderer={renderer}"), timeout=600)
        assert browser.errors() == [], browser.errors()
        ready.append(float(browser.evaluate("document.body.dataset.readyMs")))
        if shot is not None and not pan:
            import matplotlib.pyplot as plt

            plt.imsave(shot, browser.screenshot())
        pan.append(browser.evaluate(PAN_FRAME_MS))
        zoom.append(browser.evaluate(ZOOM_FRAME_MS))
    return {"ready_ms": statistics.median(ready), "pan_ms": statistics.median(pan),
            "zoom_ms": statistics.median(zoom), "renderer": browser.evaluate("scalembMap.renderer")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", required=True, help="comma-separated result stores")
    parser.add_argument("--canvas-pages", default="", help="comma-separated pages of the canvas-2-D map")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--renderers", default="auto,webgl",
                        help="the page's renderer choice(s): auto (the page's), webgl, canvas")
    parser.add_argument("--shots", default=None, help="directory for screenshots (map_<run>.png)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        browser = Browser(os.path.join(tmp, "chromium"))
        try:
            renderer = browser.evaluate(RENDERER)
            for run in args.runs.split(","):
                page = Path(tmp) / (Path(run).stem + ".html")
                built = build_page(run, page)
                for k, choice in enumerate(args.renderers.split(",")):
                    shot = None if args.shots is None or k else Path(args.shots) / f"map_{Path(run).stem}.png"
                    row = {"run": run, **built, **measure(browser, page, args.rounds, shot, choice)}
                    if choice != "auto" and any(r["run"] == run and r["renderer"] == row["renderer"] for r in rows):
                        continue  # the page's own choice already measured it
                    rows.append(row)
                    print(row, flush=True)
            canvas = []
            for page in filter(None, args.canvas_pages.split(",")):
                browser.open(Path(page).resolve().as_uri())
                frame = browser.evaluate("(() => { const t = performance.now(); for (let k = 0; k < 5; k++) "
                                         "scalembMap.draw(); return (performance.now() - t) / 5; })()")
                canvas.append((page, browser.evaluate("scalembMap.n"), frame, Path(page).stat().st_size))
                print(canvas[-1], flush=True)
        finally:
            browser.close()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    lines = ["# The WebGL map page in headless Chromium (issue 32)", "", machine_description(), "",
             f"`{uname}`, nproc {os.cpu_count()}, load: `{uptime}`", "",
             f"Chromium: `{subprocess.run(['chromium', '--version'], capture_output=True, text=True).stdout.strip()}`"
             f", WebGL renderer: `{renderer}` (software GL: no GPU on this machine)", "",
             "| run | points | edges | communities | page MB | bytes/point | build s | renderer | first frame s |"
             " pan ms/frame | zoom ms/frame |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        com = "-" if r["communities"] is None else f"{r['communities']}" + (" (stored)" if r["stored"] else "")
        lines.append(f"| {Path(r['run']).name} | {r['n']} | {r['edges']} | {com} | {r['bytes'] / 1e6:.2f} | "
                     f"{r['bytes'] / r['n']:.0f} | {r['build_s']:.1f} | {r['renderer']} | "
                     f"{r['ready_ms'] / 1e3:.2f} | {r['pan_ms']:.0f} | {r['zoom_ms']:.0f} |")
    if canvas:
        lines += ["", "The previous canvas-2-D page (points written into an ImageData buffer) on the same machine:", "",
                  "| page | points | page MB | ms per synchronous draw() |", "|---|---:|---:|---:|"]
        lines += [f"| {Path(p).name} | {n} | {size / 1e6:.2f} | {ms:.0f} |" for p, n, ms, size in canvas]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
