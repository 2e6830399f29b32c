"""``scalemb metrics RUN.zarr [--input P.zarr|EDGES] [--features X] [--labels y.npy] [--json]``: the quality
metrics of a finished run (``scalemb.metrics.evaluate_run``) as a table or JSON on stdout.  Writes nothing."""
import json
from ..embedding import GRAPH_AFFINITIES
from ..metrics import evaluate_run, metrics_table, to_json


def _positive_int(text):
    value = int(text)
    if value < 2:
        raise ValueError(f"must be >= 2, got {value}")
    return value


def add_run_arguments(parser) -> None:
    """The finished run and its input, as ``scalemb metrics`` and ``scalemb report`` take them."""
    parser.add_argument("run", help="a finished result store (scalemb embed --out)")
    parser.add_argument("--input", default=None,
                        help="the run's affinity store, edge list or dataset name (default: from the run's "
                             "provenance)")


def add_parser(commands):
    met = commands.add_parser("metrics", help="quality metrics of a finished run (KL, NP@deg, trustworthiness, ...)",
                              description="KL under the run's model and neighbourhood preservation (NP@deg, "
                                          "Jaccard) for its affinity; trustworthiness, continuity, kNN precision "
                                          "and the co-ranking AUC for features; 1-NN error for labels.  Exact up "
                                          "to 1e5 points, sampled rows (with standard errors) above.")
    add_run_arguments(met)
    met.add_argument("--graph-affinity", choices=GRAPH_AFFINITIES, default="coauthorship",
                     help="how an edge list --input becomes P (default coauthorship)")
    met.add_argument("--features", default=None, help="input features (.npy, .csv, Zarr array): trustworthiness etc.")
    met.add_argument("--labels", default=None, help="labels (.npy, or text with one per line): 1-NN error")
    met.add_argument("--k", type=_positive_int, default=10, help="neighbourhood size of the feature metrics")
    met.add_argument("--k-max", type=_positive_int, default=50, help="largest K of the co-ranking curve's AUC")
    met.add_argument("--sample", type=_positive_int, default=None,
                     help="rows per metric (default: all up to 100000 points, else 10000)")
    met.add_argument("--seed", type=int, default=0, help="seed of the row sample")
    met.add_argument("--threads", type=int, default=None)
    met.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")
    met.add_argument("--quiet", action="store_true")
    return met


def run(args) -> int:
    metrics = evaluate_run(args.run, affinity=args.input, X=args.features, labels=args.labels, sample=args.sample,
                           seed=args.seed, k=args.k, k_max=args.k_max, graph_affinity=args.graph_affinity,
                           n_threads=args.threads)
    print(json.dumps(to_json(metrics), indent=2) if args.json else metrics_table(metrics))
    return 0
