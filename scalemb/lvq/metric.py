"""``liram``: the LiRaM LVQ metric learned from labels, as a registered affinity metric (``scalemb.methods``).

The affinity is ``supervised_affinity`` (kNN under the learned dissimilarity ``s``, distance ``sqrt(s)``); the
fitted LVQ model travels in the affinity's provenance (``lvq``), so new rows are compared with the stored
reference rows under the same metric (``neighbours_against``) when a run is placed into."""
import numpy as np

from ..methods import AffinityMetric
from .affinity import neighbours_against, supervised_affinity
from .estimator import LiRaMLVQ


def _affinity(X, labels=None, *, perplexity, n_neighbors, random_state=None, n_jobs=None, source=None, **options):
    return supervised_affinity(X, labels, perplexity=perplexity, n_neighbors=n_neighbors, n_jobs=n_jobs,
                               source=source, random_state=random_state, **options)


def _neighbours(stored, X_new, X_ref, k):
    """The ``k`` nearest reference rows of each new row under the run's fitted model ``stored``
    (``LiRaMLVQ.to_dict``); distances ``sqrt(s)`` as the run's affinities used."""
    if not stored:
        raise ValueError("a run with metric 'liram' but no stored LVQ model in its provenance")
    indices, s = neighbours_against(LiRaMLVQ.from_dict(stored), X_new, X_ref, k)
    return indices, np.sqrt(s)


def _check_options(options) -> None:
    if not isinstance(options, dict):
        raise ValueError(f"metric_params must be a dict of LiRaMLVQ settings, got {options!r}")
    unknown = sorted(set(options) - set(LiRaMLVQ().get_params()))
    if unknown:
        raise ValueError(f"metric_params: unknown LiRaMLVQ setting(s) {', '.join(unknown)}")


LIRAM = AffinityMetric("liram", "LiRaM LVQ: a dissimilarity learned from the labels", learns_from_labels=True,
                       affinity=_affinity, neighbours=_neighbours, provenance_key="lvq", check_options=_check_options,
                       fitted=lambda affinity: LiRaMLVQ.from_dict(affinity.provenance["lvq"]),
                       fitted_attribute="lvq_")
