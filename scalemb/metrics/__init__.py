"""Quality metrics of embeddings: KL under a model, neighbourhood preservation for graphs, trustworthiness,
continuity, kNN precision and the co-ranking curve for features, 1-NN error for labels (``quality``), and a
stored run evaluated with all that apply (``evaluate_run``)."""
from .base import DEFAULT_SAMPLE, EXACT_MAX_ROWS, Metric, metrics_table, to_json
from .evaluate import evaluate_run
from .kl import kl
from .quality import (CorankingCurve, continuity, coranking_curve, feature_metrics, graph_metrics, knn_precision,
                      neighbourhood_preservation, node_preservation, one_nn_error, trustworthiness)

__all__ = ["CorankingCurve", "DEFAULT_SAMPLE", "EXACT_MAX_ROWS", "Metric", "continuity", "coranking_curve",
           "evaluate_run", "feature_metrics", "graph_metrics", "kl", "knn_precision", "metrics_table",
           "neighbourhood_preservation", "node_preservation", "one_nn_error", "to_json", "trustworthiness"]
