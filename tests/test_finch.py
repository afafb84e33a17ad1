"""FINCH: first neighbours (exact, chunked), partitions on hand-built neighbour graphs, equality with finch-clust."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from repair.diagnosis.finch import canonical_labels, cluster_means, components, finch, first_neighbours


def unit(deg: float) -> list[float]:
    return [np.cos(np.deg2rad(deg)), np.sin(np.deg2rad(deg))]


def test_first_partition_hand_built_graph():
    # angles 0,10,25 | 90,95,180: nn = 1,0,1 | 4,3,4 (180 deg is 85 deg from 95, 90 from 90) -> two clusters
    x = np.array([unit(a) for a in (0, 10, 25, 90, 95, 180)], dtype=np.float32)
    nn, sim = first_neighbours(x)
    assert nn.tolist() == [1, 0, 1, 4, 3, 4]
    assert sim[5] == pytest.approx(np.cos(np.deg2rad(85)), abs=1e-6)
    assert components(nn).tolist() == [0, 0, 0, 1, 1, 1]
    assert [p.tolist() for p in finch(x, levels=None)] == [[0, 0, 0, 1, 1, 1]]  # 2 clusters: FINCH stops


def test_undirected_chain_is_one_cluster():
    # 0,20,35,45 deg: 0->1, 1->2, 2->3, 3->2: only 2-3 is mutual, yet the undirected graph joins all four;
    # 120,125 deg form their own pair
    x = np.array([unit(a) for a in (0, 20, 35, 45, 120, 125)], dtype=np.float32)
    nn, _ = first_neighbours(x)
    assert nn.tolist() == [1, 2, 3, 2, 5, 4]
    assert components(nn).tolist() == [0, 0, 0, 0, 1, 1]


def test_ties_go_to_the_lower_index_in_every_chunking():
    a, b = unit(0), unit(50)
    x = np.array([b, a, a, a], dtype=np.float32)  # three identical rows 1,2,3
    for chunk, doc_chunk in [(4096, 65536), (1, 1), (2, 3), (3, 2)]:
        nn, _ = first_neighbours(x, chunk=chunk, doc_chunk=doc_chunk)
        assert nn.tolist() == [1, 2, 1, 1], (chunk, doc_chunk)


def test_first_neighbours_match_brute_force():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(203, 12)).astype(np.float32)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = xn @ xn.T
    np.fill_diagonal(s, -np.inf)
    want = s.argmax(axis=1)
    for chunk, doc_chunk in [(4096, 65536), (17, 29), (64, 7)]:
        nn, sim = first_neighbours(x, chunk=chunk, doc_chunk=doc_chunk)
        assert (nn == want).all()
        assert np.allclose(sim, s[np.arange(203), want], atol=1e-6)


def test_single_and_empty():
    assert finch(np.zeros((0, 3), dtype=np.float32))[0].tolist() == []
    assert finch(np.ones((1, 3), dtype=np.float32))[0].tolist() == [0]


def test_helpers():
    assert canonical_labels(np.array([5, 5, 2, 9, 2])).tolist() == [0, 0, 1, 2, 1]
    means = cluster_means(np.array([[1.0, 0], [3.0, 2], [0, 4.0]], dtype=np.float32), np.array([0, 0, 1]))
    assert means.tolist() == [[2.0, 1.0], [0.0, 4.0]]


def _finch_clust(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from finch import FINCH
    c, num_clust, _ = FINCH(x, distance="cosine", verbose=False, ann_threshold=len(x) + 1)
    return [canonical_labels(c[:, j]) for j in range(c.shape[1])], list(num_clust)


@pytest.mark.parametrize("seed,blobs", [(0, 0), (1, 0), (2, 12), (3, 40)])
def test_equal_to_finch_clust(seed, blobs):
    """Every partition of FINCH-clust's hierarchy (exact 1-NN regime) equals ours, up to label names."""
    rng = np.random.default_rng(seed)
    n, d = 600, 24
    if blobs:
        centres = rng.normal(size=(blobs, d))
        x = centres[rng.integers(0, blobs, n)] + 0.6 * rng.normal(size=(n, d))
    else:
        x = rng.normal(size=(n, d))
    x = x.astype(np.float32)
    theirs, counts = _finch_clust(x)
    ours = finch(x, levels=None, chunk=97, doc_chunk=211)
    assert [int(p.max()) + 1 for p in ours] == counts
    assert len(ours) >= 2
    for mine, ref in zip(ours, theirs):
        assert (mine == ref).all()
    assert [p.tolist() for p in finch(x, levels=2)] == [p.tolist() for p in ours[:2]]
