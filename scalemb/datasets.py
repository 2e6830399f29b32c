"""Built-in datasets: GrQc (bundled) and the SNEST paper's SCHOOL toy graph."""
from importlib import resources

import numpy as np

from .affinity import Affinity, coauthorship_affinity, normalized_affinity
from .io.edges import graph_from_edges
from .io.edgelist import read_edge_list

DATASETS = ("grqc", "school")


def grqc_path():
    """Path of the bundled SNAP ca-GrQc edge list (gzipped; Leskovec et al., arXiv gr-qc 1993-2003)."""
    return resources.files("scalemb") / "data" / "ca-GrQc.txt.gz"


def grqc() -> Affinity:
    """GrQc co-authorship affinity: N = 5241 authors, 14484 edges, 355 components."""
    affinity = coauthorship_affinity(read_edge_list(grqc_path()))
    affinity.provenance.update(dataset="grqc", source="bundled:ca-GrQc.txt.gz")
    return affinity


def school_edges():
    """SCHOOL: two classes of 20 students on a ring (links at ring distance 1 and 2), each student
    linked to the class teacher, the two teachers linked.  Students of class c are ``21c .. 21c+19``,
    the teacher is ``21c + 20``; N = 42, 121 edges."""
    src, dst = [], []
    for c in range(2):
        base, teacher = 21 * c, 21 * c + 20
        for k in range(20):
            for step in (1, 2):
                src.append(base + k)
                dst.append(base + (k + step) % 20)
            src.append(base + k)
            dst.append(teacher)
    src.append(20)
    dst.append(41)
    return np.array(src), np.array(dst)


def school() -> Affinity:
    """SCHOOL toy graph of the SNEST paper with ``P = C / sum C``."""
    src, dst = school_edges()
    graph = graph_from_edges(src, dst, np.ones(src.size), source="builtin:school")
    affinity = normalized_affinity(graph)
    affinity.provenance.update(dataset="school")
    return affinity


def dataset_graph(name: str):
    """The graph (``scalemb.io.edges.Graph``) of a built-in dataset by name (one of ``DATASETS``)."""
    if name == "grqc":
        return read_edge_list(grqc_path())
    src, dst = school_edges()
    return graph_from_edges(src, dst, np.ones(src.size), source="builtin:school")


def recorded_graph(provenance: dict) -> tuple:
    """Where a graph run's edges are read again, from its provenance: ``("dataset", name)`` for a built-in
    dataset, else ``("edge list", source)`` (the file it was read from; None when nothing was recorded)."""
    if provenance.get("dataset") in DATASETS:
        return "dataset", provenance["dataset"]
    return "edge list", provenance.get("source")


def load_dataset(name: str) -> Affinity:
    """Affinity of a built-in dataset by name (one of ``DATASETS``)."""
    if name == "grqc":
        return grqc()
    if name == "school":
        return school()
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
