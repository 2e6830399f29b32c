"""Communities (``scalemb.plot.communities``, ``scalemb communities``): a planted partition is recovered by Leiden
and Louvain, stored with the run without touching it, and named by its highest-degree members."""
import numpy as np
import pytest
import scipy.sparse as sp

import scalemb
from scalemb.embedding import EmbeddingResult
from scalemb.plot.communities import community_labels, detect_communities, load_communities

from .cli_runner import run_cli


def planted(groups=(60, 45, 30), p_in=0.3, p_out=0.004, seed=0):
    """A planted-partition graph: edges inside a group with probability p_in, between groups p_out."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(groups)), groups)
    n = truth.size
    prob = np.where(truth[:, None] == truth[None, :], p_in, p_out)
    upper = np.triu(rng.random((n, n)) < prob, k=1)
    rows, cols = np.nonzero(upper)
    A = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)).tocsr()
    return A + A.T, truth


@pytest.mark.parametrize("method", ["leiden", "louvain"])
def test_planted_partition_is_recovered_and_ranked_by_size(method):
    if method == "leiden":
        pytest.importorskip("leidenalg")
    A, truth = planted()
    membership, info = detect_communities(A, seed=3, method=method)
    assert info["method"] == method and info["count"] == 3 and info["modularity"] > 0.5
    assert np.array_equal(membership, truth)  # the groups exactly, numbered by decreasing size
    again, _ = detect_communities(A, seed=3, method=method)
    assert np.array_equal(again, membership)  # seeded: reproducible


def test_names_are_the_highest_degree_members_and_anchors_lie_on_members():
    A, truth = planted()
    degree = np.diff(A.indptr)
    ids = np.array([f"author {i}" for i in range(truth.size)])
    xy = np.random.default_rng(1).normal(size=(truth.size, 2)) + 10 * truth[:, None]
    labels = community_labels(xy, truth, degree, ids, members=2)
    for c in range(3):
        members = np.flatnonzero(truth == c)
        top = members[np.lexsort((members, -degree[members]))][:2]
        assert labels["names"][c] == " · ".join(ids[top])
        assert labels["sizes"][c] == members.size
        assert np.min(np.hypot(xy[members, 0] - labels["x"][c], xy[members, 1] - labels["y"][c])) == 0


def test_cli_stores_communities_with_the_run_and_refuses_to_replace_them(tmp_path):
    A, truth = planted()
    edges = tmp_path / "planted.txt"
    upper = sp.triu(A, k=1).tocoo()
    edges.write_text("".join(f"{1000 + a} {1000 + b}\n" for a, b in zip(upper.row, upper.col)))
    run = tmp_path / "run.zarr"
    scalemb.embed(str(edges), model="tsne", iterations=30, seed=0).save(run)
    before = EmbeddingResult.load(run)
    proc = run_cli("communities", run, "--method", "louvain", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    membership, info = load_communities(run)
    by_id = dict(zip(before.node_ids.tolist(), membership.tolist()))
    found = np.array([by_id[1000 + i] for i in range(truth.size)])
    assert np.array_equal(found, truth) and info["method"] == "louvain"
    after = EmbeddingResult.load(run)  # the run itself is untouched (its content hash still holds)
    assert np.array_equal(after.embedding, before.embedding)
    proc = run_cli("communities", run)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "already exists" in proc.stderr
    assert np.array_equal(load_communities(run)[0], membership)
    assert not [p for p in run.iterdir() if p.name.startswith(".communities")]  # no temporary left over
    proc = run_cli("communities", run, "--overwrite", "--resolution", "0")
    assert proc.returncode == 2 and "--resolution" in proc.stderr
