"""Metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from repair.metrics import evaluate_run, run_from_topk, spearman


def test_ndcg_map_recall_mrr_by_hand():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}, "q3": {"z": 1}}
    run = {
        "q1": {"a": 0.9, "x": 0.5},             # relevant at rank 1
        "q2": {"x": 0.9, "b": 0.8, "y": 0.7, "c": 0.6},  # relevant at ranks 2 and 4
        "q3": {"x": 0.9, "y": 0.8},             # relevant never retrieved
    }
    m = evaluate_run(qrels, run, ndcg_at=(10,), map_at=(10,), recall_at=(1, 10), mrr_at=(10, 1))
    # q1: DCG 1/log2(2)=1, IDCG 1 -> 1.0
    # q2: DCG 1/log2(3) + 1/log2(5); IDCG 1 + 1/log2(3)
    q2 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert m["ndcg@10"] == pytest.approx((1.0 + q2 + 0.0) / 3, abs=1e-6)
    # AP: q1 1; q2 (1/2 + 2/4)/2 = 0.5; q3 0
    assert m["map@10"] == pytest.approx((1 + 0.5 + 0) / 3, abs=1e-6)
    assert m["recall@1"] == pytest.approx((1 + 0 + 0) / 3)
    assert m["recall@10"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["mrr@10"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert m["mrr@1"] == pytest.approx(1 / 3)


def test_query_missing_from_run_scores_zero():
    m = evaluate_run({"q1": {"a": 1}, "q2": {"b": 1}}, {"q1": {"a": 1.0}})
    assert m["ndcg@10"] == pytest.approx(0.5)


def test_identical_ids_never_count():
    run = run_from_topk(["q1"], ["q1", "d2"], [[0.99, 0.5]], [[0, 1]], ignore_identical_ids=True)
    assert run == {"q1": {"d2": 0.5}}


def test_spearman_by_hand():
    # ranks gold 1..5, predicted reversed on the last two: d = (0,0,0,1,-1), rho = 1 - 6*2/(5*24) = 0.9
    assert spearman([1, 2, 3, 4, 5], [10, 20, 30, 50, 40]) == pytest.approx(0.9)


def test_paired_randomization_p_separates_a_consistent_gain_from_noise():
    """Two-sided sign-flip test: 12 claims all +0.1 can only be matched by all-same signs (2 of 4,096 patterns);
    differences that cancel give p 1; the p of a set is the same on every call (seeded); none is refused."""
    from repair.metrics import paired_randomization_p

    consistent = paired_randomization_p([0.1] * 12, draws=20000)
    assert consistent < 0.005 and consistent == paired_randomization_p([0.1] * 12, draws=20000)
    assert paired_randomization_p([0.2, -0.2, 0.1, -0.1]) == 1.0
    with pytest.raises(ValueError, match="no differences"):
        paired_randomization_p([])
