"""``client=``: a run on the Dask cluster a user already has (issue 30, part 4; issue 35, part 4).

The estimators, ``Embedder`` and ``scalemb.embed`` take a running ``distributed.Client`` (or True: the one active
in this process), run on its workers, give the in-process result bit for bit, and leave the client open."""
import numpy as np
import pytest

import scalemb
from scalemb.io.coauthor_generator import write_coauthor_edge_list


@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    return write_coauthor_edge_list(tmp_path_factory.mktemp("client") / "edges.txt", 600, seed=5)


@pytest.mark.slow
def test_estimator_embedder_and_embed_run_on_the_users_client(edges, dask_cluster):
    client = dask_cluster.client
    local = scalemb.TSNE(max_iter=30, random_state=1).fit(edges)
    remote = scalemb.TSNE(max_iter=30, random_state=1, client=client).fit(edges)
    assert remote.result_.provenance["executor"] == "dask"
    assert remote.result_.provenance["scheduler"] == client.scheduler.address
    assert np.array_equal(local.embedding_, remote.embedding_)
    assert client.status == "running"  # used, not closed
    by_embed = scalemb.embed(edges, model="tsne", iterations=30, seed=1, client=client)
    assert np.array_equal(by_embed.embedding, local.embedding_)
    runner = scalemb.Embedder(model="tsne", max_iter=30, random_state=1, client=True)  # the active client
    assert np.array_equal(runner.fit(edges).embedding_, local.embedding_)
    assert client.status == "running"


@pytest.mark.slow
def test_a_bad_client_is_refused_naming_the_parameter(edges, dask_cluster):
    with pytest.raises(ValueError, match=r"^client: must be a distributed.Client or True"):
        scalemb.TSNE(max_iter=5, client="tcp://nowhere:1").fit(edges)
    with pytest.raises(ValueError, match=r"^client: give a Dask client, a scheduler address or a number of workers"):
        scalemb.embed(edges, model="tsne", iterations=5, workers=2, client=dask_cluster.client)
