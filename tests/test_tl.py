"""``scalemb.tl``: scverse-style tools on scanpy's own small data set (``pbmc68k_reduced``, 700 cells, shipped
inside the scanpy package: nothing is downloaded), read and written the way ``scanpy.tl.tsne`` does."""
import numpy as np
import pytest
import scipy.sparse as sp

sc = pytest.importorskip("scanpy", reason="pip install -e '.[scverse]' (or '.[test]')")

import scalemb.tl as tl  # noqa: E402


@pytest.fixture
def adata():
    return sc.datasets.pbmc68k_reduced()


def _label_agreement(Y, labels, k=10):
    """Fraction of each cell's k nearest map neighbours sharing its label (mean over cells)."""
    from sklearn.neighbors import NearestNeighbors

    idx = NearestNeighbors(n_neighbors=k + 1).fit(Y).kneighbors(Y, return_distance=False)[:, 1:]
    labels = np.asarray(labels)
    return float(np.mean(labels[idx] == labels[:, None]))


@pytest.mark.slow
def test_tsne_on_scanpys_neighbours_and_on_its_pca(adata):
    tl.tsne(adata, neighbors_key="neighbors", random_state=0, max_iter=300)
    Y = adata.obsm["X_tsne"]
    assert Y.shape == (700, 2) and np.all(np.isfinite(Y))
    params = adata.uns["tsne"]["params"]
    assert params["neighbors_key"] == "neighbors" and params["perplexity"] == 30 and params["random_state"] == 0
    assert _label_agreement(Y, adata.obs["louvain"]) > 0.8  # the clusters scanpy found stay together
    other = sc.datasets.pbmc68k_reduced()
    tl.tsne(other, random_state=0, max_iter=300, key_added="X_mine")  # 765 genes > 50: X_pca by default
    assert other.uns["tsne"]["params"]["use_rep"] == "X_pca" and "X_tsne" not in other.obsm
    assert _label_agreement(other.obsm["X_mine"], other.obs["louvain"]) > 0.8
    again = sc.datasets.pbmc68k_reduced()
    tl.tsne(again, random_state=0, max_iter=300, key_added="X_mine")
    np.testing.assert_array_equal(again.obsm["X_mine"], other.obsm["X_mine"])  # reproducible


@pytest.mark.slow
def test_sparse_x_stays_sparse_and_copy_leaves_the_input(adata):
    adata.X = sp.csr_matrix(np.maximum(adata.X, 0))
    before = adata.X.copy()
    out = tl.snest(adata, use_rep="X", perplexity=10, random_state=1, max_iter=100, copy=True)
    assert out is not adata and out.obsm["X_snest"].shape == (700, 3)  # SNEST: R^{2,1}
    assert "X_snest" not in adata.obsm and sp.issparse(adata.X) and (adata.X != before).nnz == 0
    assert out.uns["snest"]["params"]["use_rep"] == "X"


def test_bad_keys_and_settings_are_one_line_errors(adata):
    for kwargs, message in (({"use_rep": "X_nope"}, "use_rep='X_nope': not 'X' nor a key of adata.obsm"),
                            ({"neighbors_key": "nope"}, "neighbors_key='nope': no adata.uns['nope']"),
                            ({"use_rep": "X_pca", "n_pcs": 0}, "n_pcs must be an integer in 1..50"),
                            ({"use_rep": "X_pca", "n_pcs": 2.5}, "n_pcs must be an integer")):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")) as err:
            tl.tsne(adata, **kwargs)
        assert "\n" not in str(err.value)
    assert "X_tsne" not in adata.obsm and "tsne" not in adata.uns  # nothing written
