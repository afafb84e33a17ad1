"""repair.search's top-k fast path gives exactly the slow tie-exact path's result (scores and columns)."""

from __future__ import annotations

import numpy as np
import torch

from repair.search import _exact_chunk_topk, _tied_chunk_topk, exact_topk


def test_fast_path_equals_tie_exact_path_with_many_ties():
    rng = np.random.default_rng(3)
    for trial in range(20):
        rows, cols, k = int(rng.integers(1, 40)), int(rng.integers(2, 60)), int(rng.integers(1, 12))
        # few distinct values: ties inside the top-k and at the cut are common
        scores = torch.from_numpy(rng.integers(0, 4, size=(rows, cols)).astype(np.float32))
        fast_v, fast_i = _exact_chunk_topk(scores, k)
        slow_v, slow_i = _tied_chunk_topk(scores, k)
        assert torch.equal(fast_v, slow_v) and torch.equal(fast_i, slow_i), trial


def test_exact_topk_tie_rule_by_brute_force():
    rng = np.random.default_rng(5)
    q = rng.integers(-2, 3, size=(30, 4)).astype(np.float32)
    d = rng.integers(-2, 3, size=(70, 4)).astype(np.float32)
    scores, idx = exact_topk(q, d, 7, backend="torch", doc_chunk=16)
    full = q @ d.T
    for r in range(len(q)):
        expect = sorted(range(len(d)), key=lambda j: (-full[r, j], j))[:7]
        assert idx[r].tolist() == expect
        np.testing.assert_array_equal(scores[r], full[r, expect])
