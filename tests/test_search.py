"""Exact search: equals brute force (ties -> lower index) for every backend, chunked or not."""

from __future__ import annotations

import numpy as np
import pytest

from repair.search import exact_topk


def brute_force(q, d, k):
    """Independent reference: full score matrix, lexsort by (-score, index)."""
    scores = q.astype(np.float64) @ d.astype(np.float64).T
    idx = np.stack([np.lexsort((np.arange(d.shape[0]), -row))[:k] for row in scores])
    return np.take_along_axis(scores, idx, 1), idx


def tied_data(seed=0, n_docs=300, n_q=40, dim=16):
    rng = np.random.default_rng(seed)
    # small-integer vectors: dot products are exact in float32, so ties are real ties for every backend
    d = rng.integers(-2, 3, size=(n_docs, dim)).astype(np.float32)
    d[150:160] = d[3]      # duplicate documents: identical scores at different indices
    d[250] = d[7]
    q = rng.integers(-2, 3, size=(n_q, dim)).astype(np.float32)
    return q, d


@pytest.mark.parametrize("backend", ["torch", "faiss"])
@pytest.mark.parametrize("k", [1, 5, 17, 300, 500])
@pytest.mark.parametrize("chunks", [(4096, 65536), (7, 33)])
def test_equals_brute_force_with_ties(backend, k, chunks):
    q, d = tied_data()
    ref_s, ref_i = brute_force(q, d, min(k, d.shape[0]))
    s, i = exact_topk(q, d, k, backend=backend, query_chunk=chunks[0], doc_chunk=chunks[1])
    assert i.shape == (q.shape[0], min(k, d.shape[0]))
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_allclose(s, ref_s, rtol=0, atol=1e-4)


def test_ties_go_to_lower_index_explicitly():
    d = np.array([[1.0, 0], [0, 1.0], [1.0, 0], [1.0, 0], [0.5, 0]], dtype=np.float32)
    q = np.array([[1.0, 0]], dtype=np.float32)
    for backend in ("torch", "faiss"):
        s, i = exact_topk(q, d, 2, backend=backend, doc_chunk=2)
        assert i.tolist() == [[0, 2]] and s.tolist() == [[1.0, 1.0]]


def test_random_float_data_chunked_equals_unchunked():
    rng = np.random.default_rng(3)
    d = rng.standard_normal((1000, 32)).astype(np.float32)
    q = rng.standard_normal((64, 32)).astype(np.float32)
    whole = exact_topk(q, d, 50, backend="torch")
    chunked = exact_topk(q, d, 50, backend="torch", query_chunk=9, doc_chunk=97)
    np.testing.assert_array_equal(whole[1], chunked[1])
    np.testing.assert_array_equal(whole[1], brute_force(q, d, 50)[1])
    np.testing.assert_array_equal(exact_topk(q, d, 50, backend="faiss")[1], whole[1])


def test_bad_shapes_and_backend():
    with pytest.raises(ValueError, match="same width"):
        exact_topk(np.zeros((2, 3)), np.zeros((4, 5)), 1)
    with pytest.raises(ValueError, match="unknown search backend"):
        exact_topk(np.zeros((2, 3)), np.zeros((4, 3)), 1, backend="annoy")
