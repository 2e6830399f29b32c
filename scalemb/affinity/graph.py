"""Affinities from graphs."""
import numpy as np
import scipy.sparse as sp

from ..io.edges import Graph
from .affinity import Affinity


def _symmetric_weights(graph: Graph) -> sp.csr_matrix:
    n = graph.n_nodes
    rows = np.concatenate([graph.src, graph.dst])
    cols = np.concatenate([graph.dst, graph.src])
    vals = np.concatenate([graph.weight, graph.weight])
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


def coauthorship_affinity(graph: Graph) -> Affinity:
    """SNEST paper, sec. 5: ``p_ij ∝ C_ij (1/sum_j C_ij + 1/sum_i C_ij)``, normalised to sum 1.

    Each co-authorship count is divided by both authors' total counts, so prolific authors do not dominate.
    """
    weights = _symmetric_weights(graph)
    degree = np.asarray(weights.sum(axis=1)).ravel()
    C = weights.tocoo()
    vals = C.data * (1.0 / degree[C.row] + 1.0 / degree[C.col])
    P = sp.csr_matrix((vals, (C.row, C.col)), shape=C.shape)
    return Affinity(P, graph.node_ids, {"source": graph.source, "affinity": "coauthorship",
                                        "n_edges": graph.n_edges})


def normalized_affinity(graph: Graph) -> Affinity:
    """``P = C / sum C`` (symmetric weights, each undirected edge counted in both directions)."""
    return Affinity(_symmetric_weights(graph), graph.node_ids,
                    {"source": graph.source, "affinity": "normalized", "n_edges": graph.n_edges})
