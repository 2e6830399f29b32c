"""The interactive map page: one self-contained HTML file, a canvas scatter that pans and zooms at 1e6 points.

The page carries its data as typed arrays (little-endian, base64) in a JSON script element: display positions
(float32, the packed layout of ``scalemb.plot.layout``), node ids (int32 when they fit, else float64: exact up to
2^53; string ids as a JSON list ``id_names``), and per node the degree, time 1, NP@deg (graph neighbours among its
deg(i) most similar nodes / deg(i), the per-node term of ``scalemb.metrics.neighbourhood_preservation``; up to
``EXACT_MAX_ROWS`` nodes), label and component; edges as uint32 pairs (at most ``MAX_MAP_EDGES``, a seeded sample
above). ``map.js`` draws the points into an ImageData buffer (one 32-bit store per pixel, no per-point canvas call)
over one translucent path of edges, keeps a uniform grid of the points for hover, and finds a node by id. About 30
bytes per node: 1e6 nodes make a ~40 MB page.
"""
import base64
import html
import json
from importlib import resources

import numpy as np

from ..io.nodeids import is_string_ids

MAX_MAP_EDGES = 200_000


def _array(values, dtype: str) -> dict:
    array = np.ascontiguousarray(values, dtype={"f32": "<f4", "f64": "<f8", "i32": "<i4", "u32": "<u4",
                                                "u16": "<u2", "u8": "u1"}[dtype])
    return {"dtype": dtype, "b64": base64.b64encode(array.tobytes()).decode("ascii")}


def _per_node_np(result, affinity):
    """NP@deg per node (NaN without edges), or ``None`` without an affinity or above ``EXACT_MAX_ROWS`` nodes."""
    from ..metrics import EXACT_MAX_ROWS, node_preservation

    if affinity is None or result.embedding.shape[0] > EXACT_MAX_ROWS:
        return None
    return node_preservation(affinity.P, result.embedding, result.model, result.space_dims)


def map_payload(data, per_node_np=None) -> dict:
    """The page's JSON data from ``scalemb.plot.figure.MapData``."""
    result = data.result
    ids = np.asarray(result.node_ids)
    strings = is_string_ids(ids)
    fits = strings or ids.size == 0 or (ids.min() >= -2**31 and ids.max() < 2**31)
    payload = {"n": data.n_points, "x": _array(data.xy[:, 0], "f32"), "y": _array(data.xy[:, 1], "f32"),
               "ids": None if strings else _array(ids, "i32" if fits else "f64"),
               "id_names": ids.tolist() if strings else None, "frame": [float(v) for v in data.frame],
               "values": {}, "component": _array(data.component, "u32"), "n_components": int(data.sizes.size),
               "component_sizes": [int(s) for s in data.sizes], "model": result.model,
               "title": f"{result.model}, N = {data.n_points}"}
    if data.degree is not None:
        payload["values"]["degree"] = _array(data.degree, "u32")
    if result.time_dims >= 1:
        payload["values"]["time"] = _array(result.embedding[:, result.space_dims], "f32")
    if per_node_np is not None:
        payload["values"]["np"] = _array(per_node_np, "f32")
    if data.classes is not None:
        names, codes = np.unique(data.classes, return_inverse=True)
        payload["classes"] = _array(codes, "u32")
        payload["class_names"] = [str(v) for v in names]
    if data.edges is not None and data.edges.shape[0]:
        edges = data.edges
        if edges.shape[0] > MAX_MAP_EDGES:
            edges = edges[np.sort(np.random.default_rng(0).choice(edges.shape[0], MAX_MAP_EDGES, replace=False))]
        payload["edges"] = _array(edges.ravel(), "u32")
        payload["edges_drawn"] = int(edges.shape[0])
        payload["edges_total"] = int(data.edges.shape[0])
    return payload


STYLE = """html,body{margin:0;height:100%;font-family:system-ui,sans-serif;font-size:13px;color:#222}
body{display:flex;flex-direction:column}#bar{display:flex;gap:1em;align-items:center;padding:.4em .8em;
border-bottom:1px solid #ddd;flex-wrap:wrap}#wrap{position:relative;flex:1;min-height:0}
#map{position:absolute;inset:0;width:100%;height:100%;cursor:grab;touch-action:none}
#tip{position:absolute;display:none;background:rgba(255,255,255,.95);border:1px solid #999;padding:.3em .5em;
pointer-events:none;font-size:12px;z-index:2}#legend{position:absolute;right:10px;top:10px;
background:rgba(255,255,255,.9);padding:.4em .6em;min-width:160px;z-index:1}#legend:empty{display:none}
.bar{height:10px;margin:3px 0}.sw{display:inline-block;width:10px;height:10px;margin-right:5px}
#info{position:absolute;left:10px;bottom:10px;background:rgba(255,255,255,.9);padding:.3em .5em;z-index:1}
#info:empty{display:none}"""


# JSON inside an HTML <script> element: '<' '>' '&' as \u escapes (inside a script element "<!--" followed by
# "<script" makes the HTML parser skip the closing "</script>", and "</script" ends the element), and U+2028 /
# U+2029 (line terminators in older JavaScript); JSON.parse reads the escapes back as the characters.
_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028",
                   0x2029: "\\u2029"}


def script_json(value) -> str:
    """``value`` as compact JSON text that can be embedded as is in an HTML ``<script>`` element."""
    return json.dumps(value, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


def map_html(payload: dict, title: str) -> str:
    """The self-contained page (``map.js`` inlined)."""
    script = resources.files("scalemb.report").joinpath("map.js").read_text(encoding="utf-8")
    keys = [k for k, ok in (("time", "time" in payload["values"]), ("label", "classes" in payload),
                            ("degree", "degree" in payload["values"]),
                            ("component", payload["n_components"] > 1), ("none", True)) if ok]
    options = "".join(f"<option value={k}>{k}</option>" for k in keys)
    edges = ""
    if "edges" in payload:
        note = (f" ({payload['edges_drawn']} of {payload['edges_total']})"
                if payload["edges_drawn"] < payload["edges_total"] else "")
        edges = f"<label><input type=checkbox id=edges checked> edges{note}</label>"
    else:
        edges = "<input type=checkbox id=edges hidden>"
    data = script_json(payload)
    return "\n".join([
        "<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>", '<link rel=icon href="data:,">',
        '<meta name=viewport content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<div id=bar><b>{html.escape(title)}</b>", f"<label>colour <select id=colour>{options}</select></label>",
        edges, "<label><input type=checkbox id=legend-on checked> colour key</label>",
        "<form id=find><input id=node placeholder='node id' size=10> <button>find</button></form>",
        "<button id=reset title='frame the largest component'>reset</button>",
        "<button id=all title='show every node'>all</button>",
        "<span style='color:#666'>drag: pan · wheel: zoom · hover: node</span></div>",
        "<div id=wrap><canvas id=map></canvas><div id=tip></div><div id=legend></div><div id=info></div></div>",
        f'<script id=map-data type="application/json">{data}</script>',
        f"<script>{script}</script>", "</body></html>"])


def build_map_page(run, affinity=None, labels=None, title=None) -> str:
    """The interactive map page of a finished run (path or ``EmbeddingResult``); ``affinity`` as in
    ``scalemb.report.build_report`` (default: found from the run's provenance), ``labels`` one per node."""
    from ..metrics.evaluate import load_run, read_labels
    from ..plot.figure import map_data, run_affinity

    result, run_name = load_run(run)
    classes = None if labels is None else read_labels(labels, result.embedding.shape[0])
    aff = run_affinity(result, "auto" if affinity is None else affinity)
    data = map_data(result, affinity=aff, classes=classes)
    dims = f"R^{result.space_dims}" + (f",{result.time_dims}" if result.time_dims else "")
    return map_html(map_payload(data, _per_node_np(result, aff)),
                    title or f"scalemb map: {run_name} ({result.model} in {dims}, N = {data.n_points})")
