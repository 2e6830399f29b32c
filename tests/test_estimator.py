"""scalemb.Embedder as a scikit-learn estimator: the inputs users hold, callbacks, continuing a fitted run."""
import inspect

import anndata
import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

import scalemb
from scalemb.affinity.knn import knn_graph
from scalemb.datasets import school_edges
from scalemb.errors import InputError
from scalemb.params import ESTIMATOR_NAMES

# checks check_estimator skips, with the reason (anything else failing fails this test)
SKIPPED_CHECKS = {
    "check_array_api_input": "needs SCIPY_ARRAY_API set and an array-API namespace; scalemb computes in NumPy",
}


def _features(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(size=(n // 2, 4)), rng.normal(size=(n - n // 2, 4)) + 5])


def _school_adjacency():
    src, dst = school_edges()
    n = int(max(src.max(), dst.max())) + 1
    A = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    return A.maximum(A.T)


# checks that fail by design, with the reason (check_estimator reports them as xfail; any other failure fails)
EXPECTED_FAILURES = {
    "check_methods_subset_invariance": "transform places the rows of one call jointly (the whole map's KL couples "
                                       "the new rows), so a row's place depends on the rows placed with it",
    "check_methods_sample_order_invariance": "the joint placement's descent sums over the new rows in their order",
}


def test_check_estimator_passes_or_skips_with_a_reason():
    results = check_estimator(scalemb.TSNE(max_iter=20, optimizer="dbd"), on_fail=None,
                              expected_failed_checks=EXPECTED_FAILURES)
    bad = {r["check_name"]: repr(r["exception"]) for r in results if r["status"] == "failed"}
    assert not bad
    skipped = {r["check_name"] for r in results if r["status"] == "skipped"}
    assert skipped <= set(SKIPPED_CHECKS), skipped - set(SKIPPED_CHECKS)
    assert sum(r["status"] == "passed" for r in results) > 30


def test_init_only_stores_and_is_keyword_only():
    signature = inspect.signature(scalemb.Embedder.__init__)
    assert tuple(signature.parameters)[1:] == ESTIMATOR_NAMES
    assert all(p.kind is p.KEYWORD_ONLY for name, p in signature.parameters.items() if name != "self")
    est = scalemb.Embedder(model="nonsense", perplexity=-1)  # nothing is checked before fit
    assert est.get_params()["model"] == "nonsense"
    with pytest.raises(ValueError, match="nonsense"):
        est.fit(_features())
    with pytest.raises(TypeError, match="unexpected"):
        scalemb.Embedder(perplexty=5)
    assert scalemb.SNE().model == "sne" and scalemb.TSNE().model == "tsne" and scalemb.SNEST().model == "snest"
    assert clone(scalemb.TSNE(max_iter=7)).get_params() == scalemb.TSNE(max_iter=7).get_params()
    with pytest.raises(TypeError, match="graph_affinity"):
        scalemb.TSNE(max_iter=5).fit("school", "normalized")  # the old positional form is refused, not ignored


def test_seed_is_an_alias_of_random_state_and_pipeline_works():
    X = _features()
    a = scalemb.TSNE(max_iter=40, seed=3).fit_transform(X)
    b = scalemb.TSNE(max_iter=40, random_state=3).fit_transform(X)
    c = scalemb.TSNE(max_iter=40, random_state=4).fit_transform(X)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    est = scalemb.TSNE(max_iter=40).set_params(random_state=3)
    pipe = make_pipeline(StandardScaler(), est)
    Y = pipe.fit_transform(X, np.arange(len(X)) % 2)  # y is ignored
    assert Y.shape == (len(X), 2) and np.all(np.isfinite(Y))
    assert pipe[-1].n_features_in_ == 4


def test_scikit_learn_names_and_their_deprecated_run_field_aliases():
    """n_components, max_iter, early_exaggeration, verbose are the estimator's names of the table's space_dims,
    iterations, exaggeration and (inverted) quiet; the old names still work, with a FutureWarning."""
    X = _features()
    new = scalemb.TSNE(n_components=3, max_iter=25, early_exaggeration=6.0, optimizer="dbd", verbose=False)
    assert clone(new).get_params() == new.get_params()
    Y = new.fit_transform(X)
    assert Y.shape == (len(X), 3)
    primary = {"space_dims": "n_components", "iterations": "max_iter", "exaggeration": "early_exaggeration",
               "quiet": "verbose"}
    for old, value in (("space_dims", 3), ("iterations", 25), ("exaggeration", 6.0), ("quiet", True)):
        settings = dict(n_components=3, max_iter=25, early_exaggeration=6.0, optimizer="dbd")
        settings.pop(primary[old], None)
        with pytest.warns(FutureWarning, match=f"^{old} is a deprecated alias of {primary[old]}; use {primary[old]}$"):
            assert np.array_equal(scalemb.TSNE(**settings, **{old: value}).fit_transform(X), Y)
    with pytest.raises(ValueError, match="^iterations and max_iter are one setting; give max_iter only$"):
        scalemb.TSNE(iterations=5, max_iter=7).fit(X)


@pytest.mark.parametrize("name, value, message", [
    ("n_components", 0, "n_components: must be an integer >= 1 and <= 16, got 0"),
    ("n_components", 2.5, "n_components: must be an integer >= 1 and <= 16, got 2.5"),
    ("max_iter", 0, "max_iter: must be an integer >= 1 and <= 1000000, got 0"),
    ("early_exaggeration", -1.0, "early_exaggeration: must be a number > 0, got -1.0"),
    ("early_exaggeration", "big", "early_exaggeration: must be a number > 0, got 'big'"),
    ("verbose", "yes", "verbose: must be true or false, got 'yes'"),
    ("quiet", 2, "quiet: must be true or false, got 2"),
])
def test_bad_values_of_the_scikit_learn_names(name, value, message):
    est = scalemb.TSNE(**{"max_iter": 5, name: value})
    with pytest.raises(ValueError) as refused:
        est.fit(_features())
    assert str(refused.value) == message
    assert not hasattr(est, "embedding_")


def test_graph_inputs_agree_sparse_networkx_edge_list(tmp_path):
    A = _school_adjacency()
    est = dict(model="tsne", max_iter=30, graph_affinity="normalized")
    from_sparse = scalemb.Embedder(**est).fit(A)
    src, dst = school_edges()
    path = tmp_path / "school.txt"
    path.write_text("".join(f"{a} {b}\n" for a, b in zip(src, dst)))
    from_path = scalemb.Embedder(**est).fit(str(path))
    assert np.array_equal(from_sparse.embedding_, from_path.embedding_)
    names = [f"student-{k}" for k in range(A.shape[0])]
    G = nx.relabel_nodes(nx.from_scipy_sparse_array(A), dict(enumerate(names)))
    from_graph = scalemb.Embedder(**est).fit(G)
    assert list(from_graph.node_ids_) == names
    assert np.array_equal(from_graph.embedding_, from_sparse.embedding_)


def test_precomputed_p_and_knn_pair_and_features():
    X = _features()
    est = dict(model="tsne", max_iter=30, perplexity=10)
    from_features = scalemb.Embedder(**est).fit(X)
    indices, distances = knn_graph(X, 30)
    from_pair = scalemb.Embedder(**est).fit((indices, distances))
    # the same P up to rounding (the pair goes through affinity_from_distances)
    np.testing.assert_allclose(from_pair.embedding_, from_features.embedding_, rtol=1e-6)
    # umap's precomputed_knn includes each point as its own first neighbour
    with_self = (np.hstack([np.arange(len(X))[:, None], indices[:, :-1]]),
                 np.hstack([np.zeros((len(X), 1)), distances[:, :-1]]))
    assert scalemb.Embedder(**est).fit(with_self).embedding_.shape == (len(X), 2)
    P = scalemb.load_affinity("school").P
    a = scalemb.Embedder(model="tsne", max_iter=30, affinity="precomputed").fit(P).embedding_
    b = scalemb.Embedder(model="tsne", max_iter=30).fit("school").embedding_
    assert np.array_equal(a, b)


def test_anndata_graph_or_features_result_in_obsm():
    X = _features()
    adata = anndata.AnnData(X)
    Y = scalemb.TSNE(max_iter=30, perplexity=10).fit_transform(adata)
    assert np.array_equal(adata.obsm["X_scalemb"], Y)
    A = _school_adjacency()
    graph = anndata.AnnData(np.zeros((A.shape[0], 1)))
    graph.obsp["connectivities"] = A
    est = scalemb.TSNE(max_iter=30).fit(graph)
    assert np.array_equal(graph.obsm["X_scalemb"], est.embedding_)
    assert np.array_equal(est.embedding_, scalemb.TSNE(max_iter=30).fit(A).embedding_)


@pytest.mark.parametrize("bad,match", [
    (sp.random(10, 8, density=0.5, format="csr"), "square"),
    ((np.zeros((10, 3), dtype=int), np.zeros((10, 4))), "one shape"),
    ((np.full((10, 3), 11), np.ones((10, 3))), "indices"),
    ((np.zeros((10, 3), dtype=int), np.full((10, 3), np.nan)), "finite"),
])
def test_bad_inputs_one_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        scalemb.TSNE(max_iter=5).fit(bad)


def test_networkx_node_ids_follow_the_edge_list_rules():
    """Integer nodes give int64 ids; mixed integer and string nodes, other node types and names equal but for
    case are refused with one error naming them, as the edge-list reader refuses them."""
    est = scalemb.TSNE(max_iter=5).fit(nx.Graph([(3, 1), (1, 2), (2, 3)]))
    assert est.node_ids_.dtype == np.int64 and list(est.node_ids_) == [3, 1, 2]
    for graph, match in ((nx.Graph([(1, "a"), ("a", "b"), ("b", 1)]), r"all integers or all strings.*'int', 'str'"),
                         (nx.Graph([((0, 1), (1, 2)), ((1, 2), (2, 3)), ((2, 3), (0, 1))]), "'tuple'"),
                         (nx.Graph([("Bob", "alice"), ("bob", "alice"), ("alice", "carol")]),
                          "'Bob' and 'bob' differ only in case")):
        with pytest.raises(InputError, match=f"networkx graph: .*{match}"):
            scalemb.TSNE(max_iter=5).fit(graph)


def test_bad_anndata_and_isolated_nodes_write_nothing():
    adata = anndata.AnnData(obs={"a": np.arange(5)})  # no X, no graph
    with pytest.raises(ValueError, match="neither"):
        scalemb.TSNE(max_iter=5).fit(adata)
    assert "X_scalemb" not in adata.obsm
    A = _school_adjacency().tolil()
    A[0, :] = 0
    A[:, 0] = 0
    graph = anndata.AnnData(np.zeros((A.shape[0], 1)))
    graph.obsp["connectivities"] = A.tocsr()
    with pytest.raises(InputError, match="no edge"):
        scalemb.TSNE(max_iter=5).fit(graph)
    assert "X_scalemb" not in graph.obsm


@pytest.mark.parametrize("optimizer", ["dbd", "sd"])
def test_callbacks_see_the_embedding_and_can_stop(optimizer):
    seen = []

    def watch(iteration, kl, embedding):
        seen.append((iteration, kl, embedding.copy()))
        return iteration >= 10

    est = scalemb.TSNE(max_iter=100, optimizer=optimizer, callbacks=[watch], callbacks_every_iters=5).fit("school")
    assert [s[0] for s in seen] == [0, 5, 10]
    assert est.result_.iterations == 10 and len(est.kl_history_) == 11
    assert est.kl_divergence_ == est.kl_ == est.kl_history_[-1]  # scikit-learn's TSNE name too
    assert np.array_equal(seen[-1][2], est.embedding_) and seen[-1][1] == est.kl_history_[-1]


@pytest.mark.parametrize("optimizer", ["dbd", "sd"])
def test_optimize_continues_as_one_longer_run(optimizer):
    whole = scalemb.SNEST(max_iter=50, optimizer=optimizer).fit("school")
    part = scalemb.SNEST(max_iter=30, optimizer=optimizer).fit("school")
    part.optimize(20)
    assert np.array_equal(part.kl_history_, whole.kl_history_)
    assert np.array_equal(part.embedding_, whole.embedding_)
    part.optimize(5, tol=0.0)
    assert len(part.kl_history_) == 56 and part.result_.iterations == 55
    assert part.kl_divergence_ == part.kl_history_[-1]


def _digits(n=500):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X[:n], y[:n]


def test_transform_in_a_pipeline_places_held_out_digits():
    """TSNE as a Pipeline step before a classifier: fit embeds the training rows, predict/score place the held-out
    rows into the fitted map (transform); 10-NN accuracy far above chance (0.1), transform deterministic."""
    import pandas as pd
    from sklearn.neighbors import KNeighborsClassifier

    X, y = _digits()
    train, test = slice(0, 400), slice(400, 500)
    pipe = make_pipeline(scalemb.TSNE(max_iter=300, random_state=0), KNeighborsClassifier()).fit(X[train], y[train])
    assert pipe.score(X[test], y[test]) > 0.8
    est = pipe[0]
    fitted = est.embedding_.copy()
    a, b = est.transform(X[test]), est.transform(X[test])
    assert a.shape == (100, 2) and np.all(np.isfinite(a)) and np.array_equal(a, b)
    assert np.array_equal(est.embedding_, fitted)  # the fitted map stays as it was
    assert list(est.get_feature_names_out()) == ["tsne0", "tsne1"]
    frame = est.set_output(transform="pandas").transform(X[test])
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["tsne0", "tsne1"]
    assert np.array_equal(frame.to_numpy(), a)


def test_transform_refuses_unfitted_wrong_width_and_graph_maps():
    from sklearn.exceptions import NotFittedError

    X = _features()
    with pytest.raises(NotFittedError):
        scalemb.TSNE().transform(X)
    with pytest.raises(NotFittedError):
        scalemb.TSNE().get_feature_names_out()
    est = scalemb.TSNE(max_iter=30).fit(X)
    before = (est.embedding_.copy(), est.result_)
    with pytest.raises(ValueError) as refused:
        est.transform(X[:5, :3])
    assert str(refused.value) == "X has 3 features, but TSNE is expecting 4 features as input."
    assert np.array_equal(est.embedding_, before[0]) and est.result_ is before[1]
    graph = scalemb.TSNE(max_iter=5).fit(_school_adjacency())
    with pytest.raises(ValueError, match="^TSNE was fitted to a graph: transform takes the new nodes' edges, an "
                                         "edge-list path or a networkx graph, got ndarray"):
        graph.transform(X)
    P = _school_adjacency()
    affinity = scalemb.TSNE(max_iter=5, affinity="precomputed").fit(P / P.sum())
    with pytest.raises(ValueError, match="^TSNE.transform places new feature rows into a map fitted to a feature "
                                         "array, or new nodes into a map fitted to a graph; this one was fitted to "
                                         "an affinity"):
        affinity.transform(X)
    assert list(scalemb.SNEST(max_iter=5).fit(X).get_feature_names_out()) == ["snest0", "snest1", "snest2"]


def test_init_pca_of_a_feature_array_starts_along_the_principal_components():
    """init='pca' of an in-memory feature array: the PCA scores, first column std 1e-4 (openTSNE's scaling), as
    for a feature file; after one iteration the map still lies along them."""
    from sklearn.decomposition import PCA

    X, _ = _digits(300)
    est = scalemb.TSNE(init="pca", max_iter=1, optimizer="dbd", learning_rate=1.0, exaggeration_iterations=0)
    Y = est.fit_transform(X)
    scores = PCA(2).fit_transform(X)
    for k in range(2):
        assert abs(np.corrcoef(Y[:, k], scores[:, k])[0, 1]) > 0.99
    assert 0.5e-4 < Y[:, 0].std() < 2e-4
    with pytest.raises(Exception, match="init 'pca' needs feature input"):
        scalemb.TSNE(init="pca", max_iter=5).fit(_school_adjacency())


def test_metric_precomputed_takes_a_square_distance_matrix():
    from sklearn.manifold import trustworthiness
    from sklearn.metrics import pairwise_distances

    X, _ = _digits(300)
    D = pairwise_distances(X)
    est = scalemb.TSNE(metric="precomputed", max_iter=200).fit(D)
    assert est.embedding_.shape == (300, 2) and trustworthiness(X, est.embedding_, n_neighbors=10) > 0.95
    with pytest.raises(ValueError, match=r"^metric='precomputed' needs a square distance matrix, got shape"):
        scalemb.TSNE(metric="precomputed").fit(D[:, :10])
    with pytest.raises(ValueError, match="^metric='precomputed': distances must be non-negative$"):
        scalemb.TSNE(metric="precomputed").fit(D - 1.0)
    with pytest.raises(ValueError, match="distances or with metric='liram'$"):
        est.transform(D[:5])
