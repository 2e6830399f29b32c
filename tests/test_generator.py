"""Synthetic co-authorship generator: reproducibility, size, file format, ingestibility."""
import gzip

import numpy as np
import pytest

from scalemb.affinity import AffinityStore, coauthorship_affinity
from scalemb.affinity.ingest import ingest_edge_list
from scalemb.io.coauthor_generator import _format_edges, generate_coauthor_edges, write_coauthor_edge_list
from scalemb.io.edgelist import read_edge_list


def _edges(n, seed=0, **kwargs):
    batches = list(generate_coauthor_edges(n, seed=seed, **kwargs))
    return np.concatenate([s for s, _ in batches]), np.concatenate([d for _, d in batches])


def test_same_seed_same_stream_whatever_the_batch_size():
    src, dst = _edges(20_000, seed=5)
    batches = list(generate_coauthor_edges(20_000, seed=5, batch_edges=999))
    assert {s.size for s, _ in batches[:-1]} == {999} and 0 < batches[-1][0].size <= 999
    assert np.array_equal(np.concatenate([s for s, _ in batches]), src)
    assert np.array_equal(np.concatenate([d for _, d in batches]), dst)
    other_src, _ = _edges(20_000, seed=6)
    assert other_src.size != src.size or not np.array_equal(other_src, src)


@pytest.mark.parametrize("n,edges_per_author", [(20_000, 4.0), (3_000, 10.0)])
def test_sizes_in_expected_range(n, edges_per_author):
    src, dst = _edges(n, edges_per_author=edges_per_author)
    assert src.dtype == np.int64 and dst.dtype == np.int64
    assert abs(src.size / (edges_per_author * n) - 1) < 0.05
    assert np.all(src != dst) and src.min() >= 0 and max(src.max(), dst.max()) < n
    nodes = np.unique(np.concatenate([src, dst])).size
    assert 0.5 * n < nodes <= n
    degree = np.bincount(np.concatenate([src, dst]), minlength=n)
    assert degree.max() > 20 * np.median(degree[degree > 0])  # heavy-tailed activity


def test_format_edges_matches_str():
    src = np.array([0, 9, 10, 99, 100, 999, 5])
    dst = np.array([999, 100, 99, 10, 9, 0, 5])
    expected = "".join(f"{a}\t{b}\n" for a, b in zip(src, dst)).encode()
    assert _format_edges(src, dst, 3) == expected


def test_written_file_plain_and_gz(tmp_path):
    plain = write_coauthor_edge_list(tmp_path / "g.txt", 1000, seed=2, batch_edges=300)
    zipped = write_coauthor_edge_list(tmp_path / "g.txt.gz", 1000, seed=2)
    text = plain.read_text()
    assert gzip.decompress(zipped.read_bytes()).decode() == text
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert len(header) == 3 and "n_authors=1000 seed=2 edges_per_author=4.0" in header[1]
    src, dst = _edges(1000, seed=2)
    body = "".join(f"{a}\t{b}\n" for a, b in zip(src, dst))
    assert text == "\n".join(header) + "\n" + body
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.txt", "g.txt.gz"]  # no temporary leftovers
    with pytest.raises(ValueError):
        write_coauthor_edge_list(tmp_path / "bad.txt", 1)
    assert not (tmp_path / "bad.txt").exists()


def test_generated_graph_is_ingestible(tmp_path):
    path = write_coauthor_edge_list(tmp_path / "g.txt.gz", 5000, seed=1)
    out = ingest_edge_list(path, tmp_path / "g.zarr", chunk_lines=4000)
    loaded = AffinityStore(out).to_affinity()
    expected = coauthorship_affinity(read_edge_list(path))
    assert np.array_equal(loaded.node_ids, expected.node_ids)
    assert abs(loaded.P - expected.P).max() <= 1e-13 * expected.P.data.max()
