"""scverse-style tools: ``scalemb.tl.tsne(adata, ...)`` and friends, as ``scanpy.tl.tsne`` / ``scanpy.tl.umap``.

Each reads the AnnData the way scanpy's tools do and writes its map back into it:

* ``neighbors_key`` given: the kNN graph scanpy's ``pp.neighbors`` stored (``adata.uns[neighbors_key]``
  names its ``distances`` in ``.obsp``); each row's stored distances are that cell's neighbours and P is
  calibrated on them to the perplexity (``affinity.knn.affinity_from_distances``): no second neighbour search.
* otherwise the representation ``use_rep`` (a key of ``.obsm``, or ``"X"``), by default ``X_pca`` when it
  exists and ``.X`` has more than 50 variables (scanpy's rule), else ``.X``; ``n_pcs`` keeps its first columns.
  A sparse ``.X`` stays sparse: its exact kNN distances come from scikit-learn's ``NearestNeighbors``, which
  works on CSR rows, instead of densifying a cells x genes matrix.

The map goes to ``adata.obsm[key_added]`` (``X_tsne``, ``X_sne``, ``X_snest``) and the settings to
``adata.uns[<tool>] = {"params": {...}}``, as scanpy records its own; ``copy=True`` returns a new AnnData.
"""
import numpy as np
import scipy.sparse as sp

from .affinity.knn import PERPLEXITY, affinity_from_distances, default_neighbours
from .estimator import SNE, SNEST, TSNE
from .run.inputs import fitting_perplexity

PCA_VARIABLES = 50  # scanpy's rule: above this many variables a stored X_pca is the default representation


def _representation(adata, use_rep, n_pcs):
    """The feature matrix of the cells and the name of where it came from (scanpy's ``_choose_representation``)."""
    if use_rep is None:
        use_rep = "X_pca" if "X_pca" in adata.obsm and adata.n_vars > PCA_VARIABLES else "X"
    if use_rep == "X":
        X = adata.X
    elif use_rep in adata.obsm:
        X = adata.obsm[use_rep]
    else:
        raise ValueError(f"use_rep={use_rep!r}: not 'X' nor a key of adata.obsm ({', '.join(adata.obsm) or 'none'})")
    if X is None:
        raise ValueError("the AnnData has no .X: give use_rep (a key of adata.obsm) or neighbors_key")
    if n_pcs is not None:
        if not isinstance(n_pcs, (int, np.integer)) or not 1 <= n_pcs <= X.shape[1]:
            raise ValueError(f"n_pcs must be an integer in 1..{X.shape[1]} (the columns of {use_rep}), got {n_pcs!r}")
        X = X[:, :n_pcs]
    return X, use_rep


def _neighbour_distances(adata, neighbors_key):
    """The stored kNN distance graph of ``pp.neighbors(key_added=neighbors_key)`` (CSR, one row per cell)."""
    if neighbors_key not in adata.uns:
        raise ValueError(f"neighbors_key={neighbors_key!r}: no adata.uns[{neighbors_key!r}] (run sc.pp.neighbors "
                         f"with key_added={neighbors_key!r}, or leave neighbors_key out)")
    key = adata.uns[neighbors_key].get("distances_key", "distances")
    if key not in adata.obsp:
        raise ValueError(f"neighbors_key={neighbors_key!r}: adata.obsp has no {key!r}")
    return sp.csr_matrix(adata.obsp[key])


def _sparse_knn_distances(X, n_neighbors: int, metric: str, n_jobs):
    """Exact kNN distances of sparse rows (CSR), without densifying them."""
    from sklearn.neighbors import NearestNeighbors

    search = NearestNeighbors(n_neighbors=n_neighbors, metric=metric, n_jobs=n_jobs).fit(X)
    return search.kneighbors_graph(mode="distance")


def _tool(estimator_class, name, key, adata, use_rep, neighbors_key, n_pcs, perplexity, n_neighbors, metric,
          key_added, copy, settings):
    if copy:
        adata = adata.copy()
    key_added = key_added or key
    estimator = estimator_class(perplexity=perplexity, metric=metric, **settings)
    n_jobs = settings.get("n_jobs")
    if neighbors_key is not None:
        D = _neighbour_distances(adata, neighbors_key)
        neighbours = int(np.diff(D.indptr).min()) if D.shape[0] else 0
        source = f"adata.obsp[{neighbors_key!r}]"
    else:
        X, use_rep = _representation(adata, use_rep, n_pcs)
        D = None
        if sp.issparse(X):
            neighbours = default_neighbours(X.shape[0], perplexity, n_neighbors)
            D = _sparse_knn_distances(sp.csr_matrix(X), neighbours, metric, n_jobs)
            source = f"adata.{'X' if use_rep == 'X' else f'obsm[{use_rep!r}]'} (sparse)"
    if D is not None:
        if neighbours < 2:
            raise ValueError(f"{source}: every cell needs at least 2 neighbours, some have {neighbours}")
        affinity = affinity_from_distances(D, fitting_perplexity(perplexity, neighbours), n_jobs=n_jobs,
                                           source=source)
        estimator.fit(affinity)
    else:
        estimator.set_params(n_neighbors=n_neighbors).fit(np.asarray(X, dtype=np.float64))
    adata.obsm[key_added] = np.asarray(estimator.embedding_)
    params = {"perplexity": float(perplexity), "metric": metric, "use_rep": use_rep, "n_pcs": n_pcs,
              "neighbors_key": neighbors_key, "n_neighbors": n_neighbors,
              "kl": float(estimator.kl_), "iterations": int(len(estimator.kl_history_)),
              **{k: v for k, v in settings.items() if isinstance(v, (int, float, str, bool)) or v is None}}
    adata.uns[name] = {"params": params}
    return adata if copy else None


def _make(estimator_class, name):
    key = f"X_{name}"

    def tool(adata, use_rep=None, neighbors_key=None, n_pcs=None, perplexity=PERPLEXITY, n_neighbors=None,
             metric="euclidean", key_added=None, copy=False, **settings):
        return _tool(estimator_class, name, key, adata, use_rep, neighbors_key, n_pcs, perplexity, n_neighbors,
                     metric, key_added, copy, settings)

    tool.__name__ = name
    tool.__qualname__ = name
    tool.__doc__ = (f"{estimator_class.__name__} of an AnnData's cells into ``adata.obsm[key_added or {key!r}]``, "
                    f"settings in ``adata.uns[{name!r}]['params']`` (the module docstring says which data is read). "
                    f"Other keyword arguments are ``scalemb.{estimator_class.__name__}``'s (``random_state``, "
                    "``n_jobs``, ``max_iter`` ...).  ``copy``: return a new AnnData instead of writing into this "
                    "one (which then returns None).")
    return tool


tsne = _make(TSNE, "tsne")
sne = _make(SNE, "sne")
snest = _make(SNEST, "snest")

__all__ = ["sne", "snest", "tsne"]
