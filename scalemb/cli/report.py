"""``scalemb report RUN.zarr [--input P.zarr|EDGES] [--labels y.npy] --out report.html [--json m.json]
[--map map.html]``: a self-contained HTML report of a finished run (metrics, maps, KL curve) and, with ``--map``,
the interactive map page.  Nothing is written when an input is bad."""
from .metrics import add_run_arguments
from ..errors import ScalembError
from ..io.atomic import check_output_path
from ..metrics.evaluate import load_run
from ..plot.communities import ARRAY, detect_communities, store_communities
from ..plot.mapdata import run_affinity
from ..report import write_report
from ..report.mappage import build_map_page
from ..report.page import write_text_atomic


def add_parser(commands):
    rep = commands.add_parser("report", help="write an HTML report of a finished run (metrics, maps, KL curve)",
                              description="A self-contained HTML page (PNG figures embedded): the run, its quality "
                                          "metrics, the map coloured by time (snest), label and degree, the KL "
                                          "curve and, for snest, time against degree.  The run's affinity is "
                                          "found from its provenance unless --input is given.")
    add_run_arguments(rep)
    rep.add_argument("--labels", default=None, help="labels (.npy, or text with one per line): colour and 1-NN error")
    rep.add_argument("--out", required=True, help="the HTML report")
    rep.add_argument("--json", default=None, metavar="PATH", help="also write the metrics as JSON")
    rep.add_argument("--map", default=None, metavar="PATH",
                     help="also write the interactive map page (pan, zoom, hover, find a node; linked from the report)")
    rep.add_argument("--node-labels", type=int, default=12, help="node ids labelled on each map (default 12)")
    rep.add_argument("--sample", type=int, default=None,
                     help="rows per metric (default: all up to 100000 points, else 10000)")
    rep.add_argument("--threads", type=int, default=None)
    rep.add_argument("--overwrite", action="store_true")
    rep.add_argument("--quiet", action="store_true")
    return rep


def run(args) -> int:
    import os

    map_page = None
    if args.map is not None:
        check_output_path(args.map, args.overwrite, kind="scalemb-file")
        map_page = build_map_page(args.run, affinity=args.input, labels=args.labels)
    href = None if args.map is None else os.path.relpath(os.path.abspath(args.map),
                                                         os.path.dirname(os.path.abspath(args.out)))
    metrics = write_report(args.run, args.out, args.json, overwrite=args.overwrite, affinity=args.input,
                           labels=args.labels, n_labels=args.node_labels, sample=args.sample, n_threads=args.threads,
                           map_href=href)
    if map_page is not None:
        write_text_atomic(args.map, map_page, marked=True)
    if not args.quiet:
        print(f"wrote {args.out}" + (f", {args.json}" if args.json else "") + (f", {args.map}" if args.map else "")
              + f" ({len(metrics)} metrics)")
    return 0


def add_communities_parser(commands):
    com = commands.add_parser("communities", help="detect a finished run's communities and store them with it",
                              description="Communities of the run's graph (its affinity): Leiden (leidenalg, the "
                                          "'communities' extra) or else Louvain (networkx), maximising modularity; "
                                          "stored in the run as the array 'communities' (0 = largest) and used by "
                                          "the map page to colour and name regions.")
    add_run_arguments(com)
    com.add_argument("--method", choices=("auto", "leiden", "louvain"), default="auto",
                     help="auto: Leiden when leidenalg is installed, else Louvain")
    com.add_argument("--resolution", type=float, default=1.0, help="modularity resolution (default 1; larger: "
                                                                    "more, smaller communities)")
    com.add_argument("--seed", type=int, default=0)
    com.add_argument("--overwrite", action="store_true", help="replace communities stored before")
    com.add_argument("--quiet", action="store_true")
    return com


def run_communities(args) -> int:
    from pathlib import Path

    import numpy as np

    result, _ = load_run(args.run)
    if (Path(args.run) / ARRAY).exists() and not args.overwrite:
        raise ScalembError(f"{Path(args.run) / ARRAY} already exists (pass --overwrite to replace it)")
    aff = run_affinity(result, "auto" if args.input is None else args.input)
    if aff is None:
        raise ScalembError(f"{args.run}: the run's input was not found from its provenance (pass --input)")
    membership, info = detect_communities(aff.P, resolution=args.resolution, seed=args.seed, method=args.method)
    path = store_communities(args.run, membership, info, result.embedding.shape[0], overwrite=args.overwrite)
    if not args.quiet:
        sizes = np.bincount(membership)
        print(f"wrote {path}: {info['count']} communities ({info['method']}, modularity {info['modularity']:.4f}); "
              f"largest {', '.join(str(s) for s in sizes[:5])}")
    return 0
