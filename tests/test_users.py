"""What users of scikit-learn, openTSNE and umap expect (issue 35): ``Embedder()`` is 2-D t-SNE while the CLI keeps
SNEST; the known names on CoSNE, ElasticEmbedding and Eigenmap; callable metrics; ``transform`` of new graph
nodes (edge list in either column order, or a networkx graph)."""
import warnings

import networkx as nx
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline

import scalemb
from scalemb.params import DEFAULTS, ESTIMATOR_DEFAULTS


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:300].astype(np.float64), y[:300]


# ---------------------------------------------------------------------------------------- defaults

def test_embedder_defaults_to_2d_tsne_while_the_cli_and_service_keep_snest(digits):
    from scalemb.cli.main import build_parser

    assert scalemb.Embedder().get_params()["model"] == "tsne" == ESTIMATOR_DEFAULTS["model"]
    assert DEFAULTS["model"] == "snest"  # the run's (CLI, service, scalemb.embed) default
    assert build_parser().parse_args(["embed", "x.txt"]).model == "snest"
    from scalemb.service.requests import JobRequest

    assert JobRequest.model_fields["model"].default == "snest"
    X, _ = digits
    Y = scalemb.Embedder(max_iter=30).fit_transform(X)
    assert Y.shape == (len(X), 2)
    est = scalemb.Embedder(max_iter=30).fit(X)
    assert est.result_.model == "tsne" and est.result_.time_dims == 0
    assert scalemb.SNEST().get_params()["model"] == "snest"  # the presets keep their models


# ---------------------------------------------------------------------------------------- presets

@pytest.mark.parametrize("cls,model", [(scalemb.CoSNE, "cosne"), (scalemb.ElasticEmbedding, "ee")])
def test_cosne_and_elastic_embedding_take_the_known_names(digits, cls, model):
    from sklearn.base import clone

    X, y = digits
    est = cls(n_components=2, random_state=3, max_iter=40, verbose=False)
    assert clone(est).get_params()["model"] == model
    Y = est.fit_transform(X[:240])
    assert Y.shape == (240, 2) and est.result_.model == model and est.n_iter_ <= 40
    again = cls(n_components=2, random_state=3, max_iter=40).fit_transform(X[:240])
    assert np.array_equal(Y, again)
    placed = est.transform(X[240:])
    assert placed.shape == (60, 2) and np.all(np.isfinite(placed))
    assert list(est.get_feature_names_out()) == [f"{cls.__name__.lower()}0", f"{cls.__name__.lower()}1"]


@pytest.mark.parametrize("name,value", [("n_components", 0), ("n_components", "two"), ("random_state", -1),
                                        ("max_iter", 0), ("verbose", "yes")])
@pytest.mark.parametrize("cls", [scalemb.CoSNE, scalemb.ElasticEmbedding])
def test_presets_refuse_bad_values_in_one_line_naming_the_parameter(digits, cls, name, value):
    X, _ = digits
    with pytest.raises(ValueError) as info:
        cls(**{name: value}).fit(X[:50])
    message = str(info.value)
    assert message.startswith(f"{name}: ") and "\n" not in message, message


def test_eigenmap_takes_the_known_names_and_the_old_ones_warn():
    from sklearn.base import clone

    est = scalemb.Eigenmap(n_components=2, random_state=4, n_jobs=1, max_iter=500, verbose=False)
    assert clone(est).get_params()["random_state"] == 4
    Y = est.fit_transform("school")
    assert Y.shape[1] == 2 and est.result_.seed == 4
    with pytest.warns(FutureWarning, match="seed is a deprecated alias of random_state"):
        old = scalemb.Eigenmap(n_components=2, seed=4, n_jobs=1, max_iter=500).fit_transform("school")
    assert np.array_equal(Y, old)
    with pytest.warns(FutureWarning, match="quiet is a deprecated alias of verbose"):
        scalemb.Eigenmap(n_components=2, quiet=True, max_iter=500).fit("school")
    with pytest.raises(ValueError, match="seed and random_state are one setting"):
        scalemb.Eigenmap(seed=1, random_state=2).fit("school")


@pytest.mark.parametrize("name,value", [("n_components", 0), ("random_state", -3), ("n_jobs", 0),
                                        ("verbose", "loud"), ("max_iter", 0), ("method", "qr"), ("tol", 2.0),
                                        ("workers", 0)])
def test_eigenmap_refuses_bad_values_in_one_line_naming_the_parameter(name, value):
    with pytest.raises(ValueError) as info:
        scalemb.Eigenmap(**{name: value}).fit("school")
    message = str(info.value)
    assert message.startswith(f"{name}: ") and "\n" not in message, message


# ---------------------------------------------------------------------------------------- callable metrics

def _l1(u, v):
    return float(np.abs(u - v).sum())


def test_callable_metric_gives_the_named_metrics_embedding_and_transforms(digits):
    """A callable computing the L1 distance gives the same kNN, hence the same map, as metric='manhattan';
    transform places new rows with it, in a Pipeline."""
    X, y = digits
    named = scalemb.TSNE(metric="manhattan", max_iter=60, random_state=1).fit(X[:240])
    given = scalemb.TSNE(metric=_l1, max_iter=60, random_state=1).fit(X[:240])
    assert np.allclose(named.embedding_, given.embedding_, rtol=0, atol=1e-8)
    assert given.result_.provenance["metric"] == "callable:_l1"
    # maps equal to ~1e-13 place equally to ~1e-7 (the placement's exaggerated phase amplifies the difference)
    assert np.allclose(named.transform(X[240:]), given.transform(X[240:]), rtol=0, atol=1e-6)
    pipe = make_pipeline(scalemb.TSNE(metric=_l1, max_iter=60, random_state=1), KNeighborsClassifier(5))
    assert pipe.fit(X[:240], y[:240]).score(X[240:], y[240:]) > 0.7


@pytest.mark.parametrize("metric,words", [
    (lambda u: 0.0, "fails on two feature rows (TypeError"),
    (lambda u, v: -1.0, "must return a finite distance >= 0, got -1.0"),
    (lambda u, v: float("nan"), "must return a finite distance >= 0, got nan"),
    (lambda u, v: "far", "fails on two feature rows (ValueError"),
    (lambda u, v: _l1(u, v) if 3.0 not in (u[0], v[0]) else 1 / 0, "fails (ZeroDivisionError"),  # on row 5
    (lambda u, v: _l1(u, v) if 3.0 not in (u[0], v[0]) else np.inf, "returned inf for rows "),
])
def test_bad_callable_metric_is_one_line_naming_metric(digits, metric, words):
    X, _ = digits
    X = X.copy()
    X[5, 0] = 3.0  # the last cases fail on row 5 only: found during the kNN, not on the first two rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ValueError) as info:
            scalemb.TSNE(metric=metric, max_iter=5).fit(X[:40])
    message = str(info.value)
    assert message.startswith("metric: ") and words in message and "\n" not in message, message


def test_callable_metric_needs_features():
    with pytest.raises(ValueError, match="^metric: a callable metric needs a dense feature array"):
        scalemb.TSNE(metric=_l1).fit("school")
    with pytest.raises(ValueError, match="^metric: a callable metric needs a dense feature array"):
        scalemb.TSNE(metric=_l1).fit(nx.path_graph(5))


# ---------------------------------------------------------------------------------------- graph transform

@pytest.fixture(scope="module")
def split_graph():
    """An unweighted graph of ~100 nodes and its part without 6 held-out nodes (each keeps an edge to it)."""
    G = nx.connected_watts_strogatz_graph(120, 6, 0.2, seed=1)
    new = [3, 17, 40, 66, 90, 111]
    old = G.subgraph([n for n in G if n not in new]).copy()
    assert nx.is_connected(old) and all(any(m in old for m in G[n]) for n in new)
    return G, old, new


def test_graph_transform_from_networkx_and_from_an_edge_list_in_either_order(tmp_path, split_graph):
    G, old, new = split_graph
    est = scalemb.TSNE(max_iter=150, random_state=2).fit(old)
    fitted = est.embedding_.copy()
    from_graph = est.transform(G)  # the grown graph itself: its old-old edges are the fitted graph's
    assert from_graph.shape == (len(new), 2) and list(est.transform_node_ids_) == sorted(new)
    assert np.array_equal(est.embedding_, fitted)  # the fitted map is untouched
    lines = [(u, v) for u, v in G.edges() if u in new or v in new]
    path = tmp_path / "new.txt"
    path.write_text("".join(f"{v} {u}\n" if i % 2 else f"{u} {v}\n" for i, (u, v) in enumerate(lines)))
    from_file = est.transform(str(path))
    assert np.allclose(from_graph, from_file, rtol=0, atol=1e-10)
    only_new = nx.Graph(lines)  # just the new nodes' edges
    assert np.allclose(est.transform(only_new), from_graph, rtol=0, atol=1e-10)
    # each placed node lands nearer its graph neighbours than the map's typical distance
    coords = dict(zip(est.node_ids_, fitted))
    for node, y in zip(est.transform_node_ids_, from_graph):
        near = np.mean([np.linalg.norm(y - coords[m]) for m in G[node] if m in coords])
        assert near < np.mean(np.linalg.norm(fitted - y, axis=1)), node


def test_graph_transform_on_string_ids_and_a_dataset_fit(tmp_path, split_graph):
    G, old, new = split_graph
    names = {n: f"author-{n}" for n in G}
    est = scalemb.TSNE(max_iter=60).fit(nx.relabel_nodes(old, names))
    placed = est.transform(nx.relabel_nodes(G, names))
    assert placed.shape == (len(new), 2) and list(est.transform_node_ids_) == sorted(names[n] for n in new)
    school = scalemb.TSNE(max_iter=60).fit("school")
    ids = school.node_ids_
    path = tmp_path / "school_new.txt"
    path.write_text(f"{ids[0]} 999001\n999001 {ids[1]}\n999002 {ids[2]}\n")
    assert school.transform(str(path)).shape == (2, 2)


def test_graph_transform_bad_input_one_clear_error_nothing_changed(tmp_path, split_graph):
    from sklearn.exceptions import NotFittedError

    from scalemb.errors import InputError

    G, old, new = split_graph
    with pytest.raises(NotFittedError):
        scalemb.TSNE().transform(G)
    est = scalemb.TSNE(max_iter=60).fit(old)
    before = est.embedding_.copy()
    u, v = next(iter(old.edges()))
    path = tmp_path / "old_edge.txt"
    path.write_text(f"{u} {v}\n")
    with pytest.raises(InputError, match="joins two nodes of the stored map"):
        est.transform(str(path))
    with pytest.raises(InputError, match="no edge with a new node"):
        est.transform(old)
    lonely = G.copy()
    lonely.add_node(5000)
    with pytest.raises(InputError, match="new nodes have no edge"):
        est.transform(lonely)
    with pytest.raises(ValueError, match="fitted to a graph: transform takes the new nodes' edges"):
        est.transform(np.zeros((3, 4)))
    strings = nx.relabel_nodes(G, {n: f"a{n}" for n in G})
    with pytest.raises(InputError, match="strings but the stored map's are integers"):
        est.transform(strings)
    assert np.array_equal(est.embedding_, before)


def test_kernel_eigenmap_takes_random_state_and_seed_warns():
    X = np.random.default_rng(0).standard_normal((200, 4))
    Y = scalemb.KernelEigenmap(2, n_centres=16, random_state=5).fit_transform(X)
    with pytest.warns(FutureWarning, match="seed is a deprecated alias of random_state"):
        old = scalemb.KernelEigenmap(2, n_centres=16, seed=5).fit_transform(X)
    assert np.array_equal(Y, old)
    with pytest.raises(ValueError, match="^random_state: must be an integer >= 0"):
        scalemb.KernelEigenmap(2, n_centres=16, random_state=-1).fit(X)
