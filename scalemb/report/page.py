"""The run report: one self-contained HTML page (PNG figures embedded as data URIs, no external resource).

Sections: the run (model, dimensions, N, KL, iterations, time, input); the quality metrics of
``scalemb.metrics.evaluate_run`` (value, standard error or "exact", rows); the map coloured by time (SNEST), by
label (with labels) and by degree (with the run's affinity), each drawn as ``scalemb.plot`` draws readable maps;
the KL curve; for SNEST the time coordinate against the degree.  Every input is read and checked, and every figure
drawn, before anything is written; the page and the JSON are written atomically (temporary sibling, rename).
"""
import base64
import html
import itertools
import json
import os
from pathlib import Path

import numpy as np

from ..models.registry import objective_of
from ..io.atomic import atomic_file, check_output_path
from ..metrics import evaluate_run, to_json
from ..metrics.evaluate import load_run, read_labels
from ..plot.communities import load_communities
from ..plot.figure import draw_kl, figure_png, map_figure, new_figure
from ..plot.mapdata import map_data, run_affinity


def _png_uri(fig, dpi: int = 100) -> str:
    return "data:image/png;base64," + base64.b64encode(figure_png(fig, dpi=dpi)).decode("ascii")


def _kl_figure(result):
    fig = new_figure((6.5, 3.6))
    draw_kl(fig.add_subplot(), result)
    return fig


def _time_degree_figure(result, degree):
    """Time 1 against the degree (log axis), with the median |time 1| per degree bin (the sign is arbitrary)."""

    t = result.embedding[:, result.space_dims]
    fig = new_figure((6.5, 3.8))
    ax = fig.add_subplot()
    jitter = np.exp(np.random.default_rng(0).uniform(-0.12, 0.12, degree.size))  # separate equal integer degrees
    ax.scatter(np.maximum(degree, 1) * jitter, t, s=4, alpha=0.35, linewidths=0, color="tab:blue")
    ax.set_xscale("log")
    edges = np.unique(np.round(np.geomspace(1, max(2, degree.max()) + 1, 16)).astype(int))
    centres, medians = [], []
    for lo, hi in itertools.pairwise(edges):
        members = (degree >= lo) & (degree < hi)
        if members.any():
            centres.append(np.sqrt(lo * max(lo, hi - 1)))
            medians.append(float(np.median(np.abs(t[members]))))
    ax.plot(centres, medians, color="tab:red", marker="o", linewidth=1.5, label="median |time 1| per degree bin")
    ax.axhline(0, color="0.5", linewidth=0.8)
    ax.set_xlabel("degree")
    ax.set_ylabel("time 1")
    ax.set_title("SNEST time coordinate against degree")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def _figures(data, labels: int):
    """``[(title, caption, data URI)]`` of the report's figures."""

    result = data.result
    figures = []
    colours = [c for c, ok in (("community", data.communities is not None), ("time", result.time_dims >= 1),
                               ("label", data.classes is not None),
                               ("degree", data.degree is not None)) if ok] or ["none"]
    captions = {"community": "colour: the communities stored with the run (the map page's colours); the largest "
                             "named by their best-connected members",
                "time": "colour: time 1 (diverging, centred at 0); marker area grows with |time|; the nodes of "
                        "largest |time| labelled",
                "label": "colour: label", "degree": "colour: degree (log scale); the highest-degree nodes labelled",
                "none": "positions only"}
    for colour in colours:
        fig = map_figure(data, labels=labels, colour=colour, kl_panel=False, figsize=(11.0, 6.2))
        figures.append((f"map by {colour}" if colour != "none" else "map", captions[colour], _png_uri(fig)))
    label = objective_of(result).label
    figures.append((f"{label} per iteration", f"final {label} {result.kl:.4f}", _png_uri(_kl_figure(result))))
    if result.time_dims >= 1 and data.degree is not None:
        caption = "each dot a node (degrees jittered); red: median |time 1| per degree bin (the sign is arbitrary)"
        figures.append(("time against degree", caption, _png_uri(_time_degree_figure(result, data.degree))))
    return figures


def _metric_rows(metrics: dict) -> str:
    rows = []
    for key, metric in metrics.items():
        error = "exact" if metric.stderr is None else f"± {metric.stderr:.2g}"
        rows.append(f"<tr><td>{html.escape(str(key))}</td><td class=num>{metric.value:.4f}</td>"
                    f"<td class=num>{html.escape(error)}</td><td class=num>{metric.n_rows}</td></tr>")
    return "\n".join(rows)


STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1150px;
color:#222;padding:0 1em}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .8em;border-bottom:1px solid #eee;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}figure{margin:1em 0}img{max-width:100%;height:auto;
border:1px solid #eee}figcaption{color:#555;font-size:.9em}.note{color:#666;font-size:.9em}"""


def report_html(result, metrics: dict, figures: list, run_name: str, input_name: str | None,
                map_href: str | None = None) -> str:
    """The page from its parts (see the module docstring)."""
    dims = f"R^{result.space_dims}" + (f",{result.time_dims}" if result.time_dims else "")
    summary = [("model", f"{result.model} in {dims}"), ("nodes", str(result.embedding.shape[0])),
               (objective_of(result).label, f"{result.kl:.4f}"), ("iterations", str(result.iterations)),
               ("wall time", f"{result.wall_time:.1f} s"), ("seed", str(result.seed)),
               ("input", input_name or "not found (pass --input)")]
    parts = ["<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>",
             '<meta name=viewport content="width=device-width, initial-scale=1">',
             '<link rel=icon href="data:,">',
             f"<title>scalemb report: {html.escape(run_name)}</title><style>{STYLE}</style></head><body>",
             f"<h1>scalemb report: {html.escape(run_name)}</h1>", "<h2>Run</h2><table>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary]
    parts.append("</table>")
    if map_href:
        parts.append(f'<p><a href="{html.escape(map_href)}">interactive map</a> (pan, zoom, hover, find a node)</p>')
    parts.append("<h2>Quality metrics</h2>")
    if metrics:
        parts.append("<table id=metrics><tr><th>metric</th><th>value</th><th>± stderr</th><th>rows</th></tr>")
        parts.append(_metric_rows(metrics))
        parts.append("</table><p class=note>np@deg: mean over nodes of |graph neighbours ∩ the deg(i) nodes most "
                     "similar in the embedding (the model's own kernel order)| / deg(i); jaccard@deg its Jaccard "
                     "variant; exact over all rows, or a uniform row sample with its standard error.</p>")
    else:
        parts.append("<p class=note>no metric: the run's input was not found (pass --input or --labels)</p>")
    parts.append("<p class=note>Maps are display only: components are packed by size (each keeps its own "
                 "layout) and the main panel is framed on the largest component; the overview shows all nodes."
                 "</p>")
    for title, caption, uri in figures:
        parts.append(f"<h2>{html.escape(title)}</h2><figure><img src=\"{uri}\" alt=\"{html.escape(title)}\">"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_text_atomic(path, text: str, marked: bool = False) -> Path:
    """Write ``text`` to a temporary next to ``path``, then rename it into place (``scalemb.io.atomic.atomic_file``;
    ``marked``: with the sidecar by which ``--overwrite`` recognises it as scalemb's)."""

    path = Path(path)
    with atomic_file(path, marked=marked) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def build_report(run, affinity=None, labels=None, *, n_labels: int = 12, sample=None, seed: int = 0,
                 n_threads=None, map_href=None) -> tuple:
    """``(html, metrics)`` of a finished run: everything read, checked and drawn in memory.

    ``run``: a result store path or an ``EmbeddingResult``; ``affinity``: an ``Affinity``, store, edge list or
    dataset name (default: found from the run's provenance); ``labels``: array or file (one per node).  Bad input
    raises ``scalemb.errors.InputError`` naming the file (node ids that differ, labels of the wrong length,
    non-finite coordinates)."""

    result, run_name = load_run(run)
    classes = None if labels is None else read_labels(labels, result.embedding.shape[0])
    aff = run_affinity(result, "auto" if affinity is None else affinity)
    if affinity is not None:
        input_name = str(affinity)
    else:
        input_name = None if aff is None else _provenance_name(result.provenance)
    metrics = {}
    if aff is not None or classes is not None:
        metrics = evaluate_run(result, affinity=aff, labels=classes, sample=sample, seed=seed, n_threads=n_threads)
    stored = load_communities(run) if isinstance(run, (str, os.PathLike)) else None
    data = map_data(result, affinity=aff, classes=classes, communities=stored)
    page = report_html(result, metrics, _figures(data, n_labels), run_name, input_name, map_href)
    return page, metrics


def _provenance_name(provenance: dict) -> str:
    for key in ("store", "dataset", "source"):
        if provenance.get(key):
            return f"{provenance[key]} (from the run's provenance)"
    return "from the run's provenance"


def write_report(run, out, json_out=None, overwrite: bool = False, **kwargs) -> dict:
    """Build the report (``build_report``) and write it to ``out`` (and the metrics as JSON to ``json_out``);
    nothing is written when any input is bad."""

    targets = [check_output_path(out, overwrite, kind="scalemb-file")] + \
        ([] if json_out is None else [check_output_path(json_out, overwrite, kind="scalemb-file")])
    page, metrics = build_report(run, **kwargs)
    if json_out is not None:
        write_text_atomic(targets[1], json.dumps(to_json(metrics), indent=2) + "\n", marked=True)
    write_text_atomic(targets[0], page, marked=True)
    return metrics

