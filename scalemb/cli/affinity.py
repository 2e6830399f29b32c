"""``scalemb affinity INPUT --out P.zarr``: an affinity store from an edge list (graph mode, streamed) or a feature
file (``--knn K``: perplexity-calibrated kNN affinities under ``--metric``, a plain distance or a registered
metric, ``scalemb.methods``; a metric learned from ``--labels``: ``scalemb.cli.lvq``)."""
from ..methods import affinity_metric, label_metric_names
from .lvq import learned_affinity
from ..affinity.ingest import ingest_edge_list
from ..affinity.knn import knn_affinity, read_features
from ..affinity.ordering import check_point_order
from ..affinity.store import AffinityStore, write_affinity_store
from ..io.atomic import check_output_path
from ..io.storage import local_input, output_target


def run(args) -> int:
    """``scalemb affinity``; an object-storage INPUT is read from its local copy, an object-storage --out is
    written locally and published once complete (``scalemb.io.storage``)."""

    check_output_path(args.out, args.overwrite, (args.input,))
    shown_out = args.out
    args.input = local_input(args.input)
    with output_target(args.out, args.overwrite) as args.out:
        return _write_affinity(args, shown_out)


def _write_affinity(args, shown_out) -> int:
    check_point_order(args.point_order)  # a missing partitioner fails here, before any work
    metric = affinity_metric(args.metric)  # a registered metric (scalemb.methods), None for a plain distance
    if args.labels or args.metric in label_metric_names():
        learned_affinity(args, metric)
    elif args.knn and metric is not None:  # e.g. points in the Poincaré ball (CO-SNE's input similarities)

        affinity = metric.affinity(read_features(args.input), perplexity=args.perplexity, n_neighbors=args.knn,
                                   random_state=args.seed, n_jobs=args.threads, source=args.input)
        write_affinity_store(args.out, affinity, n_partitions=args.partitions, overwrite=args.overwrite,
                             point_order=args.point_order)
    elif args.knn:
        affinity = knn_affinity(read_features(args.input), perplexity=args.perplexity, n_neighbors=args.knn,
                                metric=args.metric, method="uniform" if args.uniform else "gaussian",
                                random_state=args.seed, n_jobs=args.threads, source=args.input)
        write_affinity_store(args.out, affinity, n_partitions=args.partitions, overwrite=args.overwrite,
                             point_order=args.point_order)
    else:
        ingest_edge_list(args.input, args.out, affinity=args.graph_affinity, n_partitions=args.partitions,
                         overwrite=args.overwrite, point_order=args.point_order)

    store = AffinityStore(args.out)
    halo = store.halo
    print(f"wrote {shown_out}: N={store.n_points}, nnz={store.nnz}, {len(store.partitions) - 1} partitions, point "
          f"order {args.point_order}, halos {halo.sum() / store.n_points:.3f} N in all, largest "
          f"{halo.max() / store.n_points:.3f} N")
    return 0
