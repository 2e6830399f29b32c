"""Initial coordinates: random (unchanged), spectral, pca, from a file; bad files exit 2 writing nothing."""
import numpy as np
import pytest

import scalemb
from scalemb.affinity import knn_affinity
from scalemb.cli.main import main
from scalemb.engine import LocalExecutor
from scalemb.init import JITTER, SCALE, Initializer, random_coords
from scalemb.models import get_model


@pytest.fixture(scope="module")
def executor(school_affinity):
    with LocalExecutor(school_affinity, get_model("snest"), 2, 1) as ex:
        yield ex


def test_random_start_is_the_reference_codes(executor):
    rng = np.random.default_rng([7, 0])
    expected = np.concatenate([rng.standard_normal((2, 42)) * 1e-4, rng.standard_normal((1, 42)) * 1e-5])
    got = Initializer("random", executor, 2, 1).coords(np.random.default_rng([7, 0]))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(random_coords(42, 2, 1, np.random.default_rng([7, 0])), expected)


def test_spectral_scaling_time_columns_and_reproducibility(executor):
    init = Initializer("spectral", executor, 2, 1)
    a = init.coords(np.random.default_rng([0, 0]))
    b = Initializer("spectral", executor, 2, 1).coords(np.random.default_rng([0, 0]))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 42)
    assert abs(a[0].std() - SCALE) < 5 * JITTER  # openTSNE: first coordinate std 1e-4
    assert abs(a[:2].mean(axis=1)).max() < 5 * JITTER
    assert 2e-6 < a[2].std() < 5e-5  # time: the random start's 1e-5 N(0, 1)
    # another restart: the same layout, other jitter and time
    c = init.coords(np.random.default_rng([0, 1]))
    assert 0 < np.abs(c[:2] - a[:2]).max() < 10 * JITTER
    # the two classes of SCHOOL separate along the first eigenvector
    classes = np.arange(42) // 21
    assert np.sign(a[0][classes == 0]).tolist().count(np.sign(a[0][0])) == 21


def test_spectral_start_embeds_and_small_components_start_random():
    # two components: a ring of 30 and a pair; the pair is not reached by the 2 bottom eigenvectors
    import scipy.sparse as sp

    from scalemb.affinity import Affinity

    rows = list(range(30)) + [30]
    cols = list(np.roll(np.arange(30), 1)) + [31]
    W = sp.csr_matrix((np.ones(31), (rows, cols)), shape=(32, 32))
    W = W + W.T
    affinity = Affinity(W / W.sum(), np.arange(32))
    with LocalExecutor(affinity, get_model("tsne"), 2, 0) as ex:
        coords = Initializer("spectral", ex, 2, 0).coords(np.random.default_rng(0))
    assert np.all(np.isfinite(coords))
    assert abs(coords[0, 30] - coords[0, 31]) > 10 * JITTER  # random, not both at the eigenvectors' 0
    result = scalemb.embed(affinity, model="tsne", iterations=20, init="spectral")
    assert np.isfinite(result.kl)


def test_pca_from_a_knn_store_and_file_init(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 5)) * [5, 2, 1, 1, 1]
    np.save(tmp_path / "X.npy", X)
    store = tmp_path / "P.zarr"
    assert main(["affinity", str(tmp_path / "X.npy"), "--knn", "10", "--perplexity", "3", "--out", str(store),
                 "--quiet"]) == 0
    result = scalemb.embed(str(store), model="tsne", iterations=5, init="pca")
    assert result.embedding.shape == (120, 2)
    with LocalExecutor(knn_affinity(X, perplexity=3, n_neighbors=10), get_model("tsne"), 2, 0) as ex:
        provenance = {"method": "knn", "source": str(tmp_path / "X.npy")}
        start = Initializer("pca", ex, 2, 0, provenance).coords(np.random.default_rng(0))
    assert abs(start[0].std() - SCALE) < 5 * JITTER
    assert abs(np.corrcoef(start[0], X[:, 0])[0, 1]) > 0.99
    # a previous map as the start: used as given
    given = rng.standard_normal((120, 2))
    np.save(tmp_path / "start.npy", given)
    with LocalExecutor(knn_affinity(X, perplexity=3, n_neighbors=10), get_model("tsne"), 2, 0) as ex:
        start = Initializer(str(tmp_path / "start.npy"), ex, 2, 0).coords(np.random.default_rng(0))
    np.testing.assert_array_equal(start, given.T)


@pytest.mark.parametrize("array, message", [(np.zeros((42, 3)), "shape (42, 2)"),
                                            (np.zeros((41, 2)), "shape (42, 2)"),
                                            (np.array([[np.nan, 0.0]] * 42), "NaN")])
def test_bad_init_file_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, array, message):
    np.save(tmp_path / "init.npy", array)
    out = tmp_path / "run.zarr"
    code = main(["embed", "school", "--model", "tsne", "--init", str(tmp_path / "init.npy"), "--out", str(out),
                 "--iterations", "3", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "init.npy" in err and message in err
    assert not out.exists()


def test_bad_init_names(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["embed", "school", "--init", "nope", "--out", str(tmp_path / "r.zarr")])
    assert exc.value.code == 2
    with pytest.raises(ValueError, match="init: must be one of"):
        scalemb.embed("school", model="tsne", iterations=2, init="nope")
    code = main(["embed", "school", "--model", "tsne", "--init", "pca", "--out", str(tmp_path / "r.zarr"), "--quiet"])
    assert code == 2 and "feature input" in capsys.readouterr().err
    assert not (tmp_path / "r.zarr").exists()
