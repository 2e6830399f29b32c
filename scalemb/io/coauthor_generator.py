"""Reproducible synthetic co-authorship graphs, streamed in edge batches or written as a SNAP edge list.

Model.  Authors ``0..N-1`` are split at random into communities of Pareto sizes (minimum 5, tail index 1.5);
each author has a lognormal activity weight (sigma 1).  Each paper picks a community with probability
proportional to its total activity and a team of ``1 + Poisson(2)`` authors (mean 3), each drawn with
replacement proportionally to activity from the community, or, with probability 0.1, from the whole
population.  A paper emits one ``a b`` line per pair of team members with ``a != b`` (a pair drawn twice in
one paper, or again in a later paper, is emitted again).  The number of papers makes the expected number of
lines ``edges_per_author * N`` (the probability that a pair repeats one author is computed exactly).

Reproducibility.  The stream depends only on ``(n_authors, seed, edges_per_author)``: the setup and every
block of ``_PAPERS_PER_BLOCK`` papers draw from their own generator, ``default_rng(SeedSequence(seed,
spawn_key=...))``, and ``batch_edges`` only regroups the stream.  Memory is O(N + batch_edges).
"""
import gzip
import os
import uuid
from pathlib import Path

import numpy as np

from .._version import __version__

_MIN_COMMUNITY = 5
_COMMUNITY_TAIL = 1.5
_ACTIVITY_SIGMA = 1.0
_EXTRA_AUTHORS = 2.0  # team size is 1 + Poisson(_EXTRA_AUTHORS)
_OUTSIDE = 0.1  # probability that a team member is drawn from the whole population
_PAPERS_PER_BLOCK = 1 << 15


def _communities(rng, n):
    """Community ends (exclusive, in author-position order) with Pareto sizes summing to ``n``."""
    sizes = np.floor(_MIN_COMMUNITY * (1 + rng.pareto(_COMMUNITY_TAIL, size=n // _MIN_COMMUNITY + 1)))
    ends = np.minimum(np.cumsum(sizes.astype(np.int64)), n)
    return ends[:int(np.searchsorted(ends, n)) + 1]


def _distinct_pair_probability(activity, ends):
    """Probability that two members of one paper are different authors."""
    total = activity.sum()
    starts = np.concatenate([[0], ends[:-1]])
    comm_total = np.add.reduceat(activity, starts)
    comm_square = np.add.reduceat(activity ** 2, starts)
    inside = 1 - _OUTSIDE
    same = (inside ** 2 * comm_square / comm_total ** 2 + 2 * inside * _OUTSIDE * comm_square / (comm_total * total)
            + _OUTSIDE ** 2 * comm_square.sum() / total ** 2)
    return 1.0 - float(np.sum(comm_total / total * same))


def _paper_edges(rng, n_papers, cum, ends, authors):
    """Edges (src, dst) of ``n_papers`` papers drawn with ``rng``; ``cum`` is the cumulative activity in
    author-position order, ``ends`` the community ends, ``authors[p]`` the author at position ``p``."""
    total = cum[-1]
    community = np.minimum(np.searchsorted(cum[ends - 1], rng.random(n_papers) * total, side="right"),
                           ends.size - 1)
    team = 1 + rng.poisson(_EXTRA_AUTHORS, n_papers)
    member_comm = np.repeat(community, team)
    n_members = member_comm.size
    outside = rng.random(n_members) < _OUTSIDE
    first_pos = np.concatenate([[0], ends[:-1]])[member_comm]
    lo = np.where(outside, 0.0, np.where(first_pos > 0, cum[first_pos - 1], 0.0))
    hi = np.where(outside, total, cum[ends[member_comm] - 1])
    last_pos = np.where(outside, cum.size - 1, ends[member_comm] - 1)
    draw = lo + rng.random(n_members) * (hi - lo)
    order = np.argsort(draw)  # sorted queries walk ``cum`` in order: far fewer cache misses for large N
    pos = np.empty(n_members, dtype=np.int64)
    pos[order] = np.searchsorted(cum, draw[order], side="right")
    pos = np.minimum(pos, last_pos)
    member = authors[pos]
    # member k pairs with the later members k+1 .. (end of its paper) - 1
    paper_end = np.repeat(np.cumsum(team), team)
    later = paper_end - np.arange(n_members) - 1
    first = np.repeat(np.arange(n_members), later)
    group_start = np.cumsum(later) - later
    second = first + 1 + np.arange(first.size) - np.repeat(group_start, later)
    src, dst = member[first], member[second]
    keep = src != dst
    return src[keep], dst[keep]


def generate_coauthor_edges(n_authors: int, seed: int = 0, edges_per_author: float = 4.0,
                            batch_edges: int = 1_000_000):
    """Iterator of ``(src, dst)`` int64 arrays of ``batch_edges`` edge lines each (the last may be shorter) of the
    synthetic co-authorship graph on authors ``0..n_authors-1`` (model in the module docstring).

    The concatenated stream is identical for the same ``(n_authors, seed, edges_per_author)`` whatever
    ``batch_edges`` is.
    """
    n = int(n_authors)
    if n < 2:
        raise ValueError(f"n_authors must be at least 2, got {n_authors}")
    if edges_per_author <= 0 or batch_edges < 1:
        raise ValueError("edges_per_author and batch_edges must be positive")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    ends = _communities(rng, n)
    authors = rng.permutation(n).astype(np.int64)
    activity = rng.lognormal(0.0, _ACTIVITY_SIGMA, n)
    lines_per_paper = (_EXTRA_AUTHORS + _EXTRA_AUTHORS ** 2 / 2) * _distinct_pair_probability(activity, ends)
    n_papers = max(1, round(edges_per_author * n / lines_per_paper))
    return _batches(seed, n_papers, np.cumsum(activity), ends, authors, int(batch_edges))


def _batches(seed, n_papers, cum, ends, authors, batch_edges):
    """The edge stream of ``n_papers`` papers regrouped into batches of ``batch_edges`` lines."""
    pending, n_pending = [], 0
    for block, first_paper in enumerate(range(0, n_papers, _PAPERS_PER_BLOCK)):
        block_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, block)))
        edges = _paper_edges(block_rng, min(_PAPERS_PER_BLOCK, n_papers - first_paper), cum, ends, authors)
        pending.append(edges)
        n_pending += edges[0].size
        if n_pending >= batch_edges:
            src = np.concatenate([s for s, _ in pending])
            dst = np.concatenate([d for _, d in pending])
            n_full = src.size - src.size % batch_edges
            for k in range(0, n_full, batch_edges):
                yield src[k:k + batch_edges], dst[k:k + batch_edges]
            pending, n_pending = [(src[n_full:], dst[n_full:])], src.size - n_full
    if n_pending:
        yield np.concatenate([s for s, _ in pending]), np.concatenate([d for _, d in pending])


def _format_edges(src: np.ndarray, dst: np.ndarray, width: int) -> bytes:
    """``src\\tdst\\n`` lines as ASCII bytes for ids of at most ``width`` decimal digits (vectorised)."""
    line = np.empty((src.size, 2 * width + 2), dtype=np.uint8)
    keep = np.ones(line.shape, dtype=bool)
    significant = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    significant[-1] = 0  # the last digit is kept even for 0
    for offset, values in ((0, src), (width + 1, dst)):
        keep[:, offset:offset + width] = values[:, None] >= significant
        rest = values.copy()
        for col in range(offset + width - 1, offset - 1, -1):
            line[:, col] = rest % 10 + 48
            rest //= 10
    line[:, width] = ord("\t")
    line[:, -1] = ord("\n")
    return line[keep].tobytes()


def write_coauthor_edge_list(path, n_authors: int, seed: int = 0, edges_per_author: float = 4.0,
                             batch_edges: int = 1_000_000) -> Path:
    """Write the ``generate_coauthor_edges`` stream as a SNAP edge list (``#`` header with the parameters,
    then ``src<TAB>dst`` lines), gzipped if ``path`` ends with ``.gz``; atomic (temporary sibling, then
    ``os.replace``).  Returns ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    width = len(str(max(int(n_authors) - 1, 0)))
    header = (f"# Synthetic co-authorship graph (scalemb {__version__}, scalemb.io.coauthor_generator)\n"
              f"# n_authors={n_authors} seed={seed} edges_per_author={edges_per_author}\n"
              "# FromNodeId\tToNodeId\n")
    try:
        with (gzip.open(tmp, "wb", compresslevel=6) if path.suffix == ".gz" else open(tmp, "wb")) as handle:
            handle.write(header.encode("ascii"))
            for src, dst in generate_coauthor_edges(n_authors, seed, edges_per_author, batch_edges):
                handle.write(_format_edges(src, dst, width))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
