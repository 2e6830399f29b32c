"""The interactive map page: one self-contained HTML file, a WebGL scatter (regl-scatterplot; a canvas-2-D scatter
where WebGL is a software rasteriser and the map is large) that pans and zooms at 1e6 points, with search, lasso /
box selection and CSV export of the selected ids.

The page carries its data as typed arrays (little-endian, base64) in a JSON script element: display positions
(float32, the packed layout of ``scalemb.plot.layout``), node ids (int32 when they fit, else float64: exact up to
2^53; string ids as a JSON list ``id_names``), and per node the degree, each time coordinate, NP@deg (graph
neighbours among its deg(i) most similar nodes / deg(i), the per-node term of
``scalemb.metrics.neighbourhood_preservation``; up to ``EXACT_MAX_ROWS`` nodes), label, component and community
(with each community's name and label anchor, coloured ``PALETTE[k % 20]`` as in ``scalemb plot``); edges as
uint32 pairs (at most ``MAX_MAP_EDGES``, a seeded sample above).  A Poincaré-ball run (``disk``) carries the
disk's geodesic grid (``scalemb.plot.layout.poincare_grid``) as polylines, drawn faintly with the boundary
circle under the labels.  ``home`` frames the largest component (robust frame) together with the strip of packed
small components, so the first view shows every component.  The script is ``vendor/regl-scatterplot.min.js`` (built by
``scalemb/report/js``: ``npm ci && npm run build``) followed by ``map.js``, both inlined; the page loads nothing.
About 30 bytes per node: 1e6 nodes make a ~40 MB page.
"""
import base64
import html
import json
import os
from importlib import resources

import numpy as np

from ..errors import ScalembError
from ..io.nodeids import is_string_ids
from ..plot.communities import PALETTE, community_labels, detect_communities, load_communities
from ..plot.layout import poincare_grid
from ..metrics import EXACT_MAX_ROWS, node_preservation
from ..metrics.evaluate import load_run, read_labels
from ..plot.mapdata import map_data, run_affinity

MAX_MAP_EDGES = 200_000


def _array(values, dtype: str) -> dict:
    array = np.ascontiguousarray(values, dtype={"f32": "<f4", "f64": "<f8", "i32": "<i4", "u32": "<u4",
                                                "u16": "<u2", "u8": "u1"}[dtype])
    return {"dtype": dtype, "b64": base64.b64encode(array.tobytes()).decode("ascii")}


def _per_node_np(result, affinity):
    """NP@deg per node (NaN without edges), or ``None`` without an affinity or above ``EXACT_MAX_ROWS`` nodes."""

    if affinity is None or result.embedding.shape[0] > EXACT_MAX_ROWS:
        return None
    return node_preservation(affinity.P, result.embedding, result.model, result.space_dims)


HOME_MAX_ZOOM_OUT = 3.0  # the first view shows the small components only if the largest stays this large


def home_frame(data) -> list:
    """``[x0, x1, y0, y1]`` of the first view: the largest component's robust frame joined with the bounding box of
    the other (packed) components, so none is outside it; when that join is more than ``HOME_MAX_ZOOM_OUT`` times
    wider or taller than the largest component's frame (thousands of small components beside a compact giant),
    the largest component's frame alone (the "all" button shows the rest)."""
    x0, x1, y0, y1 = data.frame
    others = data.component != 0
    if others.any() and not data.ball:
        lo, hi = data.xy[others].min(axis=0), data.xy[others].max(axis=0)
        pad = 0.02 * max(hi[0] - lo[0], hi[1] - lo[1], x1 - x0, y1 - y0)
        u0, u1 = min(x0, lo[0] - pad), max(x1, hi[0] + pad)
        v0, v1 = min(y0, lo[1] - pad), max(y1, hi[1] + pad)
        if max((u1 - u0) / max(x1 - x0, 1e-12), (v1 - v0) / max(y1 - y0, 1e-12)) <= HOME_MAX_ZOOM_OUT:
            x0, x1, y0, y1 = u0, u1, v0, v1
    return [float(x0), float(x1), float(y0), float(y1)]


def map_payload(data, per_node_np=None, communities=None) -> dict:
    """The page's JSON data from ``scalemb.plot.mapdata.MapData``; ``communities``: ``(membership, info)`` of
    ``scalemb.plot.communities``."""
    result = data.result
    ids = np.asarray(result.node_ids)
    strings = is_string_ids(ids)
    fits = strings or ids.size == 0 or (ids.min() >= -2**31 and ids.max() < 2**31)
    payload = {"n": data.n_points, "x": _array(data.xy[:, 0], "f32"), "y": _array(data.xy[:, 1], "f32"),
               "ids": None if strings else _array(ids, "i32" if fits else "f64"),
               "id_names": ids.tolist() if strings else None, "frame": [float(v) for v in data.frame],
               "values": {}, "component": _array(data.component, "u32"), "n_components": int(data.sizes.size),
               "component_sizes": [int(s) for s in data.sizes], "model": result.model,
               "title": f"{result.model}, N = {data.n_points}", "palette": [list(c) for c in PALETTE],
               "disk": bool(data.ball)}
    payload["home"] = home_frame(data)
    if data.ball and result.space_dims == 2:  # the Poincaré disk's geodesic grid
        payload["grid"] = [np.round(line, 5).ravel().tolist() for line in poincare_grid()]
    if data.degree is not None:
        payload["values"]["degree"] = _array(data.degree, "u32")
    for k in range(result.time_dims):
        name = "time" if result.time_dims == 1 else f"time {k + 1}"
        payload["values"][name] = _array(result.embedding[:, result.space_dims + k], "f32")
    if per_node_np is not None:
        payload["values"]["np"] = _array(per_node_np, "f32")
    if data.classes is not None:
        names, codes = np.unique(data.classes, return_inverse=True)
        payload["classes"] = _array(codes, "u32")
        payload["class_names"] = [str(v) for v in names]
    if communities is not None:
        membership, info = communities
        payload["community"] = _array(membership, "u32")
        payload["communities"] = {**community_labels(data.xy, membership, data.degree, ids),
                                  "method": info.get("method", "?")}
    if data.edges is not None and data.edges.shape[0]:
        edges = data.edges
        if edges.shape[0] > MAX_MAP_EDGES:
            edges = edges[np.sort(np.random.default_rng(0).choice(edges.shape[0], MAX_MAP_EDGES, replace=False))]
        payload["edges"] = _array(edges.ravel(), "u32")
        payload["edges_drawn"] = int(edges.shape[0])
        payload["edges_total"] = int(data.edges.shape[0])
    return payload


STYLE = """html,body{margin:0;height:100%;font-family:system-ui,sans-serif;font-size:13px;color:#222}
body{display:flex;flex-direction:column}#bar{display:flex;gap:.8em;align-items:center;padding:.4em .8em;
border-bottom:1px solid #ddd;flex-wrap:wrap}#main{flex:1;min-height:0;display:flex}
#wrap{position:relative;flex:1;min-width:0}#map,#overlay{position:absolute;inset:0;width:100%;height:100%}
#map{touch-action:none}#overlay{pointer-events:none}
#tip{position:absolute;display:none;background:rgba(255,255,255,.95);border:1px solid #999;padding:.3em .5em;
pointer-events:none;font-size:12px;z-index:2;max-width:320px;overflow-wrap:anywhere}
#side{width:230px;flex:none;border-left:1px solid #ddd;padding:.5em .7em;overflow:auto;overflow-wrap:anywhere}
#side>div{margin-bottom:.8em}#legend .title{font-weight:600;margin-bottom:.2em}.bar{height:10px;margin:3px 0}
.ends{display:flex;justify-content:space-between}.sw{display:inline-block;width:10px;height:10px;margin-right:5px}
#search{position:relative}#hits{position:absolute;left:0;top:100%;margin:2px 0 0;padding:0;list-style:none;z-index:3;
background:#fff;border:1px solid #bbb;min-width:18em;max-height:60vh;overflow:auto}#hits:empty{display:none}
#hits li{padding:.2em .5em;cursor:pointer;white-space:nowrap}#hits li:hover{background:#e8f0fb}"""

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(payload) -> str:
    """``payload`` as JSON safe inside a ``<script>`` element: ``<``, ``>``, ``&``, U+2028 and U+2029 written as
    ``\\u`` escapes (JSON.parse reads them back unchanged; no ``</script>`` or ``<!--`` can end the element)."""
    text = json.dumps(payload, separators=(",", ":"))
    return "".join(_JSON_ESCAPES.get(c, c) for c in text) if any(c in text for c in _JSON_ESCAPES) else text


def _inline_script(name: str) -> str:
    text = resources.files("scalemb.report").joinpath(name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "<!--" in text:
        raise RuntimeError(f"scalemb/report/{name} holds '</script' or '<!--' and cannot be inlined")
    return text


def map_html(payload: dict, title: str) -> str:
    """The self-contained page (the vendored regl-scatterplot bundle and ``map.js`` inlined)."""
    library = _inline_script("vendor/regl-scatterplot.min.js")
    script = _inline_script("map.js")
    keys = ((["community"] if "community" in payload else []) + [k for k in payload["values"] if k.startswith("time")]
            + (["label"] if "classes" in payload else [])
            + [k for k in ("degree", "np") if k in payload["values"]]
            + (["component"] if payload["n_components"] > 1 else []) + ["none"])
    options = "".join(f"<option value='{html.escape(k)}'>{html.escape('NP@deg' if k == 'np' else k)}</option>"
                      for k in keys)
    edges = "<input type=checkbox id=edges hidden>"
    if "edges" in payload:
        note = (f" ({payload['edges_drawn']} of {payload['edges_total']})"
                if payload["edges_drawn"] < payload["edges_total"] else "")
        edges = f"<label title='edges of the visible region'><input type=checkbox id=edges> edges{note}</label>"
    return "\n".join([
        "<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>", '<link rel=icon href="data:,">',
        '<meta name=viewport content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<div id=bar><b>{html.escape(title)}</b>", f"<label>colour <select id=colour>{options}</select></label>",
        edges, "<label><input type=checkbox id=labels-on checked> labels</label>",
        "<form id=find><span id=search><input id=node placeholder='find a node (id, prefix, name)' size=24 "
        "autocomplete=off><ul id=hits></ul></span> <button>find</button></form>",
        "<label title='drag: pan (shift+drag: lasso) · lasso / box: drag to select'>mouse <select id=mode>"
        "<option value=pan>pan</option><option value=lasso>lasso</option><option value=box>box</option>"
        "</select></label>",
        "<button id=reset title='frame every component'>reset</button>",
        "<button id=all title='show every node'>all</button>",
        "<span style='color:#666'>wheel / pinch: zoom · hover: node · double-click: clear selection</span></div>",
        "<div id=main><div id=wrap><canvas id=map></canvas><canvas id=overlay></canvas><div id=tip></div></div>",
        "<div id=side><div id=legend></div>",
        "<div><label><input type=checkbox id=legend-on checked> colour key</label></div>",
        "<div><span id=selection>none selected</span> <button id=export disabled>download CSV</button></div>",
        "<div id=info></div></div></div>",
        f'<script id=map-data type="application/json">{script_json(payload)}</script>',
        f"<script>{library}</script>", f"<script>{script}</script>", "</body></html>"])


def run_communities(run, result, affinity) -> tuple | None:
    """The communities stored with ``run`` (a path), else detected on the run's affinity graph (a kNN graph for
    features), else ``None``."""

    stored = load_communities(run) if isinstance(run, (str, os.PathLike)) else None
    if stored is not None:
        if stored[0].shape != (result.embedding.shape[0],):
            raise ScalembError(f"{run}: its communities have {stored[0].size} nodes, the run "
                               f"{result.embedding.shape[0]} (rerun scalemb communities --overwrite)")
        return stored
    if affinity is None:
        return None
    return detect_communities(affinity.P)


def build_map_page(run, affinity=None, labels=None, title=None) -> str:
    """The interactive map page of a finished run (path or ``EmbeddingResult``); ``affinity`` as in
    ``scalemb.report.build_report`` (default: found from the run's provenance), ``labels`` one per node.
    Communities: stored with the run, else detected on its graph (``run_communities``)."""

    result, run_name = load_run(run)
    classes = None if labels is None else read_labels(labels, result.embedding.shape[0])
    aff = run_affinity(result, "auto" if affinity is None else affinity)
    data = map_data(result, affinity=aff, classes=classes)
    dims = f"R^{result.space_dims}" + (f",{result.time_dims}" if result.time_dims else "")
    if data.ball:
        dims = "the Poincaré disk" if result.space_dims == 2 else f"the Poincaré ball B^{result.space_dims}"
    return map_html(map_payload(data, _per_node_np(result, aff), run_communities(run, result, aff)),
                    title or f"scalemb map: {run_name} ({result.model} in {dims}, N = {data.n_points})")
