"""Margins (Eq. 1), thresholds and Q_conf on a constructed embedding set with hand-computed values.

Queries are the identity rows and document j is column j of a chosen score matrix S, so s(q_i, d_j) = S[i, j]
exactly (multiples of 1/8 are exact in float32). Expected values below are worked out by hand from S.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repair.diagnosis import margins as dg
from repair.data import DataError

S = np.array([
    # d0     d1     d2     d3     d4
    [0.875, 0.500, 0.625, 0.125, 0.250],  # q0: pos .875, top3 [0,2,1] -> max_neg d2 .625 -> +0.25
    [0.750, 0.500, 0.250, 0.750, 0.125],  # q1: pos .5, top3 [0,3,1] (tie .75 -> lower index) -> d0 -> -0.25
    [0.125, 0.250, 0.375, 0.500, 0.625],  # q2: pos .375, top3 [4,3,2] -> d4 .625 -> -0.25
    [0.000, 0.875, 0.750, 0.125, 0.625],  # q3: pos .125 not in top3 [1,2,4] -> top-1 d1 .875 -> -0.75
    [0.250, 0.250, 0.250, 0.250, 1.000],  # q4: pos 1.0, top3 [4,0,1] -> d0 .25 -> +0.75
], dtype=np.float32)
Q = np.eye(5, dtype=np.float32)
D = S.T.copy()  # Q[i] . D[j] = S[i, j]


def test_margins_hand_computed():
    res = dg.compute_margins(Q, D, top_k=3, backend="torch")
    assert res.topk_indices.tolist() == [[0, 2, 1], [0, 3, 1], [4, 3, 2], [1, 2, 4], [4, 0, 1]]
    assert res.pos_score.tolist() == [0.875, 0.5, 0.375, 0.125, 1.0]
    assert res.top1_index.tolist() == [0, 0, 4, 1, 4]
    assert res.max_neg_index.tolist() == [2, 0, 4, 1, 0]
    assert res.max_neg_score.tolist() == [0.625, 0.75, 0.625, 0.875, 0.25]
    assert res.margin.tolist() == [0.25, -0.25, -0.25, -0.75, 0.75]
    assert res.fallback_rows == 0


def test_twins_are_never_negatives():
    # d2 duplicates d0's passage: rows 0 and 2 are each other's positives
    twins = [[2], [], [0], [], []]
    res = dg.compute_margins(Q, D, top_k=3, twins=twins, backend="torch")
    assert res.max_neg_index.tolist() == [1, 0, 4, 1, 0]   # q0 skips d0 (itself) and d2 (twin) -> d1 .5
    assert res.margin.tolist() == [0.375, -0.25, -0.25, -0.75, 0.75]


def test_row_whose_top_k_is_all_positives_is_searched_deeper():
    twins = [[], [], [], [], [0]]                  # q4's top-2 = [d4, d0]: both positives
    res = dg.compute_margins(Q, D, top_k=2, twins=twins, backend="torch")
    assert res.fallback_rows == 1
    assert res.max_neg_index[4] == 1 and res.max_neg_score[4] == 0.25   # next hit d1 (tie .25 -> lower index)
    assert res.margin[4] == 0.75


def test_no_negative_at_all_is_an_error():
    with pytest.raises(DataError, match="every passage"):
        dg.compute_margins(Q[:2, :2], D[:2, :2], top_k=2, twins=[[1], [0]], backend="torch")


@pytest.mark.parametrize("pct,threshold,confused", [
    (20, -0.35, [3]),            # sorted [-.75,-.25,-.25,.25,.75]; 0.2*4 = 0.8 -> -.75 + .8*.5
    (30, -0.25, [1, 2, 3]),      # 1.2 -> -.25 exactly: both tied -.25 queries are in (60% > 30%)
    (60, -0.05, [1, 2, 3]),      # 2.4 -> -.25 + .4*.5
    (80, 0.35, [0, 1, 2, 3]),    # 3.2 -> .25 + .2*.5
    (100, 0.75, [0, 1, 2, 3, 4]),
])
def test_thresholds_and_qconf_with_ties(pct, threshold, confused):
    margins = np.array([0.25, -0.25, -0.25, -0.75, 0.75], dtype=np.float32)
    thr = dg.percentile_thresholds(margins, [pct])[pct]
    assert thr == pytest.approx(threshold, abs=1e-12)
    assert dg.select_confused(margins, thr).tolist() == confused


def test_thresholds_match_torch_quantile():
    rng = np.random.default_rng(0)
    m = rng.normal(size=1001).astype(np.float32)
    got = dg.percentile_thresholds(m, [5, 30, 40])
    for p, thr in got.items():
        assert thr == pytest.approx(float(torch.quantile(torch.from_numpy(m).double(), p / 100)), abs=1e-12)


def test_percentile_out_of_range():
    with pytest.raises(ValueError):
        dg.percentile_thresholds(np.zeros(3), [0])


def test_margin_records_fields_and_values():
    res = dg.compute_margins(Q, D, top_k=3, twins=[[2], [], [0], [], []], backend="torch")
    rec = list(dg.margin_records(res, [f"q{i}" for i in range(5)], [3, 0], twins=[[2], [], [0], [], []]))
    assert set(rec[0]) == set(dg.MARGIN_FIELDS) | set(dg.MARGIN_OPTIONAL)
    assert rec[0] == {"i": 3, "query": "q3", "pos_doc_index": 3, "pos_score_cos": 0.125, "top1_doc_index_cos": 1,
                      "top1_score_cos": 0.875, "max_neg_doc_index_cos": 1, "max_neg_score_cos": 0.875,
                      "margin_cos": -0.75, "topk_doc_indices_cos": [1, 2, 4],
                      "topk_scores_cos": [0.875, 0.75, 0.625], "positive_doc_indices": [3]}
    assert rec[1]["positive_doc_indices"] == [0, 2] and rec[1]["margin_cos"] == 0.375


def test_unit_vectors_cosine_margin():
    # 2-D unit vectors: q0 at 0 deg, d0 at 60 deg (cos .5), d1 at 0 deg (cos 1) -> margin -0.5;
    # q1 at 90 deg: d1 cos 0, d0 cos .866 -> pos d1 = 0, max_neg d0 -> -0.866
    ang = np.deg2rad
    q = np.array([[1, 0], [0, 1]], dtype=np.float32)
    d = np.array([[np.cos(ang(60)), np.sin(ang(60))], [1, 0]], dtype=np.float32)
    res = dg.compute_margins(q, d, top_k=2, backend="torch")
    assert res.margin[0] == pytest.approx(-0.5, abs=1e-6)
    assert res.margin[1] == pytest.approx(-np.sqrt(3) / 2, abs=1e-6)


def test_normalise_fp16_rows_are_unit():
    x = torch.randn(7, 5) * 10
    n = dg.normalise_fp16(x, chunk=3)
    assert n.dtype == torch.float16
    assert torch.allclose(n.float().norm(dim=1), torch.ones(7), atol=2e-3)
