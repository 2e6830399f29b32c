"""Command line: ``scalemb embed [INPUT] --model snest --space 2 --time 1 --out run.zarr``."""
import argparse
import logging
import os
import signal
import sys
import threading

from .. import progress
from .._version import __version__
from ..affinity.ordering import STORE_POINT_ORDERS
from ..datasets import DATASETS
from ..affinity.knn import PERPLEXITY
from ..engine.distributed import SchedulerLostError
from ..errors import ScalembError
from ..store.checkpoint import DEFAULT_EVERY as DEFAULT_CHECKPOINT_EVERY, RunInterrupted, interruption_note
from ..params import GRAPH_AFFINITIES, PARAMS
from ..methods import method_names, method_of
from . import cont as continue_cli, export as export_cli
from . import affinity as affinity_cli
from .lvq import add_arguments as add_liram_arguments
from . import metrics as metrics_command
from . import report as report_command
from . import transform as transform_cli
from ..io import storage
from ..io.atomic import check_output_path
from ..io.coauthor_generator import write_coauthor_edge_list
from ..io.storage import check_prefix, is_url
from ..plot import save_plot
from ..run.resume import resume

EXIT_USAGE = 2
EXIT_DIVERGED = 3
EXIT_CLUSTER_LOST = 4
EXIT_INTERRUPTED = 75  # stopped by SIGINT/SIGTERM after writing a checkpoint (EX_TEMPFAIL: resume later)


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _learning_rate(text):
    if text == "auto":
        return text
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 or 'auto', got {text}")
    return value


def _bounded(kind, low, high, low_open=False, name=None):
    """An argparse type: ``kind(text)`` within [low, high] (``(low, high]`` with ``low_open``); NaN refused."""
    def parse(text):
        try:
            value = kind(float(text)) if kind is int and text.lower().count("e") else kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (low < value if low_open else low <= value) or not value <= high:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"must be in {bracket}{low:g}, {high:g}], got {text}")
        return value
    parse.__name__ = name or kind.__name__
    return parse


_FINITE = 1e300


class _Settings(argparse.Action):
    """``--model-param NAME=VALUE`` (repeatable) gathered into one dict."""

    def __call__(self, parser, namespace, values, option_string=None):
        name, value = values
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), name: value})


def _row_type(param, extra_choices=()):
    """The argparse type of a table row: ``Param.parse`` (its one check; the message without the flag, which
    argparse puts in front); ``extra_choices``: more values this command takes (e.g. the eigenmap methods)."""
    def parse(text):
        if text in extra_choices:
            return text
        try:
            return param.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    parse.__name__ = param.name
    return parse


def add_param_arguments(parser, names, groups=None, extra_choices=None) -> None:
    """``parser``'s flags for the ``scalemb.params.PARAMS`` rows ``names``, generated from the rows (flag,
    default, help, choices, type, bounds; ``Param.parse`` checks a value), as the service's job fields are.
    ``groups``: ``{name: argparse group}`` to add a row's flag to; ``extra_choices``: ``{name: values}``."""

    groups, extra_choices = groups or {}, extra_choices or {}
    for p in (row for row in PARAMS if row.name in names):
        target = groups.get(p.name, parser)
        help_text = f"{p.help} (default {p.outer_default})"
        if p.type is bool:
            target.add_argument(p.cli, action="store_true", dest=p.name, help=help_text)
            continue
        options = {"default": p.outer_default, "help": help_text, "dest": p.name,
                   "metavar": p.cli.lstrip("-").upper().replace("-", "_")}
        if p.name == "model_params":
            options.update(type=_model_param, action=_Settings, metavar="NAME=VALUE")
        else:
            options["type"] = _row_type(p, extra_choices.get(p.name, ()))
            if p.choices is not None:
                options["metavar"] = "{" + ",".join(list(p.choices) + list(extra_choices.get(p.name, ()))) + "}"
        target.add_argument(p.cli, **options)


def _model_param(text: str) -> tuple:
    """``NAME=VALUE`` -> (name, value): an int, else a float, else the string."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    for kind in (int, float):
        try:
            return name.strip(), kind(value)
        except ValueError:
            pass
    return name.strip(), value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalemb", description="SNE-family embeddings of large graphs.")
    parser.add_argument("--version", action="version", version=f"scalemb {__version__}")
    parser.add_argument("--s3-endpoint", metavar="URL", default=None,
                        help="endpoint of the S3-compatible object store that s3:// inputs and outputs name "
                             "(default: $AWS_ENDPOINT_URL, else AWS); credentials from the standard AWS variables")
    commands = parser.add_subparsers(dest="command", required=True)

    emb = commands.add_parser("embed", help="embed a graph and write a Zarr result group",
                              description="Embed a graph (SNAP edge list, optionally .gz) or a built-in "
                                          f"dataset ({', '.join(DATASETS)}); no INPUT embeds the bundled GrQc.")
    emb.add_argument("input", nargs="?", default=None,
                     help="edge list path, feature matrix (.npy, .csv, .tsv: kNN affinities, see --affinity), "
                          "affinity store (scalemb affinity ...), or a built-in dataset name "
                          f"({', '.join(DATASETS)}); default grqc")
    emb.add_argument("--out", default="embedding.zarr", help="output Zarr group (default embedding.zarr)")
    emb.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    where = emb.add_mutually_exclusive_group()
    add_param_arguments(emb, [p.name for p in PARAMS if p.cli], groups={"scheduler": where, "workers": where},
                        extra_choices={"model": method_names()})
    emb.add_argument("--checkpoint-every", type=_non_negative_int, default=DEFAULT_CHECKPOINT_EVERY, metavar="K",
                     help=f"write a checkpoint into --out every K iterations (default {DEFAULT_CHECKPOINT_EVERY}; 0: "
                          "only on SIGINT/SIGTERM); continue an interrupted run with: scalemb resume OUT")
    add_method_arguments(emb)

    res = commands.add_parser("resume", help="continue a checkpointed (interrupted) embed run",
                              description="Continue the run checkpointed in RUN (an embed --out store) with its "
                                          "stored settings; the result replaces the checkpoints in RUN.")
    res.add_argument("run", help="the embed --out store of the interrupted run")
    res.add_argument("--iterations", type=_positive_int, default=None,
                     help="new maximum iterations per restart (default: the run's)")
    res.add_argument("--scheduler", metavar="ADDRESS",
                     help="the Dask scheduler to resume on (required for a run that used one: the address stored "
                          "in the checkpoint is never connected to unconfirmed)")
    res.add_argument("--in-process", action="store_true",
                     help="resume a run that used a Dask cluster in this process (the same result, bit for bit)")
    res.add_argument("--quiet", action="store_true", help="no progress output")

    transform_cli.add_parser(commands)

    aff = commands.add_parser("affinity", help="build an affinity store (Zarr) from an edge list or features",
                              description="Graph mode streams an edge list (SNAP text or CSV, optionally .gz) "
                                          "into the store out of core; kNN mode reads features (.npy, .csv, Zarr "
                                          "array) and calibrates a Gaussian per row to the perplexity.")
    aff.add_argument("input", help="edge list (--graph) or feature file (--knn)")
    aff.add_argument("--out", required=True, help="output affinity store (Zarr group)")
    mode = aff.add_mutually_exclusive_group()
    mode.add_argument("--graph", action="store_true", help="INPUT is an edge list (default)")
    mode.add_argument("--knn", type=_positive_int, metavar="K", help="INPUT holds features; use K neighbours")
    aff.add_argument("--graph-affinity", choices=GRAPH_AFFINITIES, default="coauthorship")
    aff.add_argument("--perplexity", type=_bounded(float, 0, _FINITE, low_open=True), default=PERPLEXITY,
                     help=f"kNN: target perplexity (default {PERPLEXITY:g})")
    aff.add_argument("--uniform", action="store_true", help="kNN: p_j|i = 1/K instead of a perplexity Gaussian")
    aff.add_argument("--metric", default="euclidean",
                     help="kNN: distance (pynndescent metric names; poincare: points in the unit ball, hyperbolic "
                          "distance, stores their norms as CO-SNE's target radii; or liram: learned from --labels)")
    aff.add_argument("--partitions", type=_positive_int, default=None,
                     help="row partitions balanced by nnz (default: the data-determined layout of equal row ranges "
                     "that every run without a store uses)")
    aff.add_argument("--point-order", choices=STORE_POINT_ORDERS, default="given",
                     help="number the points as given (default); in reverse Cuthill-McKee order (rcm); or so that "
                          "a graph partitioner's parts (METIS, needs pymetis: pip install 'scalemb[partition]') are "
                          "the store's partitions, which keeps the rows each partition's worker needs from others "
                          "(its halo) small (partition); node ids follow the order")
    aff.add_argument("--seed", type=int, default=0)
    aff.add_argument("--threads", type=_positive_int, default=None)
    aff.add_argument("--overwrite", action="store_true")
    aff.add_argument("--quiet", action="store_true")
    add_liram_arguments(aff)

    gen = commands.add_parser("generate", help="generate synthetic inputs")
    gen.add_argument("kind", choices=("coauthor",), help="coauthor: community-structured co-authorship graph")
    gen.add_argument("--authors", type=_bounded(int, 1, 10 ** 9), required=True)
    gen.add_argument("--out", required=True, help="edge list path (.gz to compress)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--edges-per-author", type=_bounded(float, 0, 1000, low_open=True), default=4.0)
    gen.add_argument("--overwrite", action="store_true")
    gen.add_argument("--quiet", action="store_true")

    plo = commands.add_parser("plot", help="draw an embedding result (layout and KL history) to an image",
                              description="Space coordinates as positions (Poincaré runs in the disk with its "
                                          "geodesic grid); colour by the communities stored with the run (the "
                                          "map page's colours and names), else with time (snest) colour = time "
                                          "(diverging, centred at 0), marker size ~ |time|, the nodes of largest "
                                          "|time| labelled; from 1e5 points a density raster; a KL-vs-iteration "
                                          "panel.")
    plo.add_argument("run", help="a finished result store (scalemb embed --out)")
    plo.add_argument("--out", required=True, help="image file; format from the suffix (png, pdf, svg)")
    plo.add_argument("--labels", type=_non_negative_int, default=10,
                     help="label this many communities (colour community) or nodes of largest |time| or degree "
                          "(default 10)")
    plo.add_argument("--colour", choices=("auto", "community", "time", "label", "degree", "none"), default="auto",
                     help="auto: community when stored with the run (scalemb communities), else time (snest), "
                          "else degree; from 1e5 points a density raster")
    plo.add_argument("--density-engine", choices=("auto", "numpy", "datashader"), default="auto",
                     help="what draws the density raster (the same counts): numpy or datashader (the plot "
                          "extra); auto: numpy (faster per process, see scalemb.plot.density)")
    plo.add_argument("--dpi", type=_bounded(int, 10, 1200), default=110)
    plo.add_argument("--title", default=None)
    plo.add_argument("--overwrite", action="store_true")
    plo.add_argument("--quiet", action="store_true")

    srv = commands.add_parser("serve", help="run the embedding job service (HTTP JSON API)",
                              description="Serve POST/GET/DELETE /jobs, results and plots; jobs and their "
                                          "outputs live under --data-root. The bearer token is read from "
                                          "$SCALEMB_TOKEN or --token-file.")
    srv.add_argument("--data-root", required=True, help="directory holding inputs, uploads, jobs and the job "
                                                        "database; every input path is confined to it")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=_positive_int, default=8000)
    srv.add_argument("--scheduler", metavar="ADDRESS", help="run jobs on the Dask cluster at ADDRESS")
    srv.add_argument("--token-file", help="file holding the bearer token (else $SCALEMB_TOKEN)")
    srv.add_argument("--insecure-no-auth", action="store_true", help="serve without authentication (loopback "
                                                                     "--host only, unless also --allow-remote-no-auth)")
    srv.add_argument("--allow-remote-no-auth", action="store_true",
                     help="with --insecure-no-auth: also on a non-loopback --host (anyone who reaches it runs jobs)")
    srv.add_argument("--max-queue", type=_positive_int, default=64, help="queued jobs before 429 (default 64)")
    srv.add_argument("--max-running", type=_positive_int, default=2, help="jobs run at once (default 2)")
    srv.add_argument("--checkpoint-every", type=_positive_int, default=DEFAULT_CHECKPOINT_EVERY, metavar="K",
                     help=f"checkpoint running jobs every K iterations (default {DEFAULT_CHECKPOINT_EVERY})")
    srv.add_argument("--threads", type=_positive_int, default=None, help="threads per in-process job")
    srv.add_argument("--store-ttl-hours", type=_bounded(float, 0, _FINITE), default=24.0,
                     help="with --scheduler: delete DATA_ROOT/stores entries unused this long (default 24)")
    srv.add_argument("--max-upload-mb", type=_positive_int, default=256, help="upload size limit (default 256)")
    srv.add_argument("--database", metavar="URL", default=None,
                     help="job database: sqlite:///PATH (default DATA_ROOT/jobs.sqlite3; one service) or "
                          "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (replicas sharing the data root; needs "
                          "'scalemb[postgres]'); also $SCALEMB_DATABASE")
    srv.add_argument("--retention-hours", type=_bounded(float, 0, _FINITE, low_open=True), default=None, metavar="H",
                     help="delete finished jobs (records, files, unshared snapshots) H hours after they end "
                          "(default: kept until DELETE /jobs/ID)")
    srv.add_argument("--lease-seconds", type=_bounded(float, 1, 3600), default=None, metavar="S",
                     help="a running job is leased to its service for S seconds, renewed every S/10; a replica "
                          "takes over a job whose lease ran out (its service died or lost the database; default 30)")
    srv.add_argument("--storage", metavar="URL", default=None,
                     help="object-storage prefix (s3://BUCKET/PREFIX; needs 'scalemb[s3]'): jobs may read inputs "
                          "under it (\"input\": \"s3://BUCKET/PREFIX/...\") and done jobs' results are published "
                          "at URL/jobs/ID/run.zarr; also $SCALEMB_STORAGE.  Endpoint: --s3-endpoint")
    srv.add_argument("--quiet", action="store_true")
    export_cli.add_parser(commands)
    continue_cli.add_parser(commands)
    metrics_command.add_parser(commands)
    report_command.add_parser(commands)
    report_command.add_communities_parser(commands)
    return parser


def _refuse_existing(path, overwrite: bool, inputs=(), kind: str = "directory"):
    """Refuse an output that exists without --overwrite, that scalemb did not write, or that is an input."""

    check_output_path(path, overwrite, inputs, kind)


def _generate(args) -> int:
    _refuse_existing(args.out, args.overwrite, kind="file")
    write_coauthor_edge_list(args.out, args.authors, seed=args.seed, edges_per_author=args.edges_per_author)
    print(f"wrote {args.out}")
    return 0


def _plot(args) -> int:
    _refuse_existing(args.out, args.overwrite, (args.run,), kind="file")
    save_plot(args.run, args.out, dpi=args.dpi, labels=args.labels, title=args.title, colour=args.colour,
              engine=args.density_engine)
    print(f"wrote {args.out}")
    return 0


def _serve(args) -> int:
    import os
    from pathlib import Path

    try:
        from ..service import ServiceConfig, serve
    except ImportError as exc:
        raise ScalembError(f"the service needs its extra: pip install 'scalemb[service]' ({exc})") from None
    token = os.environ.get("SCALEMB_TOKEN") or None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip() or None
        except OSError as exc:
            raise ScalembError(f"{args.token_file}: cannot read the token file ({exc.strerror})") from None
    if token is None and not args.insecure_no_auth:
        raise ScalembError("no bearer token: set SCALEMB_TOKEN or pass --token-file (or --insecure-no-auth)")
    if args.insecure_no_auth and not args.allow_remote_no_auth and not _is_loopback(args.host):
        raise ScalembError(f"--insecure-no-auth with --host {args.host} (not loopback) would serve anyone without "
                           "a token; add --allow-remote-no-auth to confirm")
    root = Path(args.data_root)
    if not root.is_dir():
        raise ScalembError(f"{root}: data root is not a directory")
    storage = args.storage or os.environ.get("SCALEMB_STORAGE") or None
    if storage is not None:
        storage = check_prefix(storage)  # a bad URL, a missing bucket, no credentials: refused before serving
    config = ServiceConfig(data_root=root, token=None if args.insecure_no_auth else token,
                           scheduler=args.scheduler, max_queue=args.max_queue, max_running=args.max_running,
                           checkpoint_every=args.checkpoint_every, n_threads=args.threads,
                           max_upload_bytes=args.max_upload_mb * 1024 * 1024, store_ttl_hours=args.store_ttl_hours,
                           database=args.database or os.environ.get("SCALEMB_DATABASE") or None,
                           retention_hours=args.retention_hours, storage=storage,
                           **({} if args.lease_seconds is None else {"lease_seconds": args.lease_seconds}))
    serve(config, host=args.host, port=args.port)
    return 0


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_method_arguments(emb) -> None:
    """The embed parser's flags for the registered methods' own settings (``scalemb.methods.Method.params``)."""
    for name in method_names():
        for p in method_of(name).params:
            emb.add_argument(p.cli, type=p.type, default=p.default, choices=p.choices, help=p.help, dest=p.name)


def _embed(args) -> int:
    """``scalemb embed``: the method of ``--model`` (``scalemb.methods.method_of``) fits ``INPUT`` to ``--out``."""
    method = method_of(args.model)
    values = {p.name: getattr(args, p.name) for p in PARAMS if p.cli}
    values.update({p.name: getattr(args, p.name) for p in method.params})
    result = method.fit(args.input, values, out=args.out, overwrite=args.overwrite,
                        checkpoint_every=args.checkpoint_every, front="cli", quiet=args.quiet)
    return _report(args.out, result)


def _report(out, result) -> int:
    dims = f"R^{result.space_dims}" + (f",{result.time_dims}" if result.time_dims else "")
    print(f"wrote {out}: {result.model} {dims}, N={len(result.node_ids)}, "
          f"{method_of(result.model).describe(result)}, {result.wall_time:.1f} s")
    return 0


def _resume(args) -> int:
    return _report(args.run, resume(args.run, iterations=args.iterations, quiet=args.quiet,
                                    scheduler=args.scheduler, in_process=args.in_process))


def _raise_interrupt(signum, frame):
    """Unwind like Ctrl-C, and remember that a signal came: a KeyboardInterrupt raised inside a C extension can
    surface as another exception (numba compiling through llvmlite's ctypes turns it into an AttributeError), and
    ``main`` must still report an interruption, not that exception; one swallowed inside a C callback ends the
    running phase at its end (``progress.note_signal``)."""
    progress.note_signal(signum)
    raise KeyboardInterrupt


def _dispatch(args) -> int:
    """Run the command; an exception raised after SIGINT/SIGTERM arrived is reported as the interruption."""
    try:
        return {"embed": _embed, "resume": _resume, "affinity": affinity_cli.run, "generate": _generate,
                "plot": _plot, "serve": _serve, "export": export_cli.run, "continue": continue_cli.run,
                "metrics": metrics_command.run, "report": report_command.run,
                "communities": report_command.run_communities,
                "transform": transform_cli.run_transform}[args.command](args)
    except RunInterrupted:
        raise
    except Exception as exc:
        if progress.SIGNALS:
            raise KeyboardInterrupt from exc
        raise


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("affinity", "generate", "plot", "export", "report", "metrics", "transform", "continue"):
        # SIGTERM unwinds like Ctrl-C: temporaries removed (embed/resume checkpoint instead; serve has its own)
        signal.signal(signal.SIGTERM, _raise_interrupt)
    progress.SIGNALS.clear()
    if args.command != "serve" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _raise_interrupt)  # Ctrl-C as before, remembered (the service has its own)
    if args.s3_endpoint:
        storage.configure(args.s3_endpoint)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s scalemb %(message)s", stream=sys.stderr)
    try:
        return _dispatch(args)
    except RunInterrupted as exc:
        out = getattr(args, "out", None)
        print(f"scalemb: interrupted; nothing published at {out}" if is_url(out) else f"scalemb: {exc}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except SchedulerLostError as exc:
        print(f"scalemb: error: {exc}", file=sys.stderr)
        return EXIT_CLUSTER_LOST
    except (ScalembError, ValueError) as exc:
        print(f"scalemb: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # e.g. a read-only or full output directory
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"scalemb: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except FloatingPointError as exc:
        print(f"scalemb: error: optimisation diverged: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        _report_interruption(args)
        return 130


def entry() -> None:
    """The ``scalemb`` command: ``main()``'s status as the process's exit status.  After a stop that abandoned a
    solver set-up still running on its thread (a long sparse LU: ``engine.factor.setups_running``), the streams
    are flushed and the process leaves at once (``os._exit``): the checkpoint is written and closed, and
    finishing the set-up would only delay the exit, while the interpreter's finalisation with that thread's
    SuperLU blocks alive fails and turns the status (75: resume later) into 120."""
    code = main()
    factor = sys.modules.get("scalemb.engine.factor")  # only a run that factorised has factor threads
    if factor is not None and factor.setups_running():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _report_interruption(args) -> None:
    """The line after Ctrl-C / SIGTERM: where an embed or resume run's checkpoint is, else that nothing was
    written (nothing published, for an object-storage output)."""

    if args.command not in ("embed", "resume"):
        print("scalemb: interrupted; nothing written", file=sys.stderr)
        return

    out = args.out if args.command == "embed" else args.run
    if is_url(out):
        print(f"scalemb: interrupted; nothing published at {out}", file=sys.stderr)
    else:
        print(f"scalemb: {interruption_note(out, started_before=args.command == 'resume')}", file=sys.stderr)


if __name__ == "__main__":
    entry()
