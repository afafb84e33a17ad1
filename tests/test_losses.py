"""InfoNCE (Eq. 8), duplicate masking and CausalNeg's QEM on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from repair.training.losses import BatchTargets, contrastive_objective, qem_entropy


def _scores_as_vectors(scores):
    """q = unit vectors e_i and d_j = column j of the score matrix, so q @ d.T == scores exactly."""
    s = torch.tensor(scores, dtype=torch.float64)
    return torch.eye(s.shape[0], dtype=torch.float64), s.T.clone()


def _infonce_only(pos_index, n_docs, mask=None) -> BatchTargets:
    """Targets without hard negatives: with qem_lambda = 0 the objective is InfoNCE alone (Eq. 8)."""
    none = torch.zeros(0, dtype=torch.long)
    mask = torch.zeros(len(pos_index), n_docs, dtype=torch.bool) if mask is None else mask
    return BatchTargets(pos_index=torch.tensor(pos_index), mask=mask, neg_owner=none, neg_index=none,
                        neg_generated=torch.zeros(0, dtype=torch.bool))


def infonce(q, d, targets, temperature):
    loss, stats = contrastive_objective(q, d, targets, temperature)
    assert stats["infonce"] == pytest.approx(float(loss), abs=1e-12) and stats["qem_queries"] == 0
    return loss


def test_info_nce_hand_computed_2x3():
    q, d = _scores_as_vectors([[0.5, 0.1, -0.2], [0.3, 0.9, 0.0]])
    loss = infonce(q, d, _infonce_only([0, 1], 3), temperature=0.1)
    l1 = -math.log(math.exp(5) / (math.exp(5) + math.exp(1) + math.exp(-2)))
    l2 = -math.log(math.exp(9) / (math.exp(3) + math.exp(9) + math.exp(0)))
    assert float(loss) == pytest.approx((l1 + l2) / 2, abs=1e-12)


def test_info_nce_masked_duplicate_is_not_a_negative():
    q, d = _scores_as_vectors([[0.5, 0.1, 0.7], [0.3, 0.9, 0.0]])
    mask = torch.tensor([[False, False, True], [False, False, False]])  # doc 2 is another positive of query 0
    loss = infonce(q, d, _infonce_only([0, 1], 3, mask), temperature=0.1)
    l1 = -math.log(math.exp(5) / (math.exp(5) + math.exp(1)))
    l2 = -math.log(math.exp(9) / (math.exp(3) + math.exp(9) + math.exp(0)))
    assert float(loss) == pytest.approx((l1 + l2) / 2, abs=1e-12)
    unmasked = infonce(q, d, _infonce_only([0, 1], 3), temperature=0.1)
    assert float(unmasked) > float(loss) + 0.5  # without the mask the twin (0.7 > 0.5) would dominate


def _qem_inputs():
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(1, 4, dtype=torch.float64), dim=-1).requires_grad_()
    mined1 = torch.randn(1, 4, dtype=torch.float64, requires_grad=True)
    mined2 = torch.randn(1, 4, dtype=torch.float64, requires_grad=True)
    gen = torch.randn(1, 4, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(1, 4, dtype=torch.float64, requires_grad=True)
    return q, pos, mined1, mined2, gen


def test_qem_value_and_gradient_reach_only_generated_negatives():
    q, pos, mined1, mined2, gen = _qem_inputs()
    d = torch.cat([pos, mined1, mined2, gen])
    owner, index = torch.tensor([0, 0, 0]), torch.tensor([1, 2, 3])
    generated = torch.tensor([False, False, True])
    tau = 0.1
    entropy, n = qem_entropy(q, d, owner, index, generated, tau)
    assert n == 1
    z = [float(q[0].detach() @ v[0].detach()) / tau for v in (mined1, mined2, gen)]
    m = max(z)
    p = [math.exp(v - m) for v in z]
    p = [v / sum(p) for v in p]
    h = -sum(v * math.log(v) for v in p)
    assert float(entropy) == pytest.approx(h, abs=1e-10)

    entropy.backward()
    for leaf in (q, pos, mined1, mined2):  # detached from the entropy graph: no gradient at all
        assert leaf.grad is None or torch.count_nonzero(leaf.grad) == 0
    # dH/dz_k = -p_k (log p_k + H); z_k = q . gen / tau  =>  dH/dgen = -p_k (log p_k + H) / tau * q
    expected = -p[2] * (math.log(p[2]) + h) / tau * q.detach()
    torch.testing.assert_close(gen.grad, expected, atol=1e-10, rtol=1e-8)
    assert torch.count_nonzero(gen.grad) > 0


def test_qem_skips_queries_without_generated_or_single_negative():
    q = torch.eye(3, 4, dtype=torch.float64)
    d = torch.randn(6, 4, dtype=torch.float64)
    # query 0: two mined only; query 1: one generated only; query 2: mined + generated (the only one counted)
    owner, index = torch.tensor([0, 0, 1, 2, 2]), torch.tensor([1, 2, 3, 4, 5])
    generated = torch.tensor([False, False, True, False, True])
    entropy, n = qem_entropy(q, d, owner, index, generated, 0.1)
    assert n == 1
    z = torch.stack([q[2] @ d[4], q[2] @ d[5]]) / 0.1
    p = torch.softmax(z, 0)
    assert float(entropy) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-10)


def test_objective_is_infonce_minus_lambda_entropy_and_query_gradient_is_infonce_only():
    q, pos, mined1, mined2, gen = _qem_inputs()
    other = torch.randn(1, 4, dtype=torch.float64)
    q2 = torch.nn.functional.normalize(torch.randn(1, 4, dtype=torch.float64), dim=-1)
    qs = torch.cat([q, q2])
    d = torch.cat([pos, other, mined1, mined2, gen])
    targets = BatchTargets(pos_index=torch.tensor([0, 1]), mask=torch.zeros(2, 5, dtype=torch.bool),
                           neg_owner=torch.tensor([0, 0, 0]), neg_index=torch.tensor([2, 3, 4]),
                           neg_generated=torch.tensor([False, False, True]))
    loss, stats = contrastive_objective(qs, d, targets, temperature=0.05, qem_lambda=0.1, qem_tau=0.1)
    plain = _infonce_only([0, 1], 5)
    nce = infonce(qs, d, plain, 0.05)
    ent, _ = qem_entropy(qs, d, targets.neg_owner, targets.neg_index, targets.neg_generated, 0.1)
    assert float(loss) == pytest.approx(float(nce) - 0.1 * float(ent), abs=1e-12)
    assert stats["infonce"] == pytest.approx(float(nce)) and stats["qem_queries"] == 1
    (g_total,) = torch.autograd.grad(loss, q)
    (g_nce,) = torch.autograd.grad(infonce(qs, d, plain, 0.05), q)
    torch.testing.assert_close(g_total, g_nce)  # QEM never moves the query (Sec. 3.3)
    (g_mined_total,) = torch.autograd.grad(contrastive_objective(qs, d, targets, 0.05, 0.1, 0.1)[0], mined1)
    (g_mined_nce,) = torch.autograd.grad(infonce(qs, d, plain, 0.05), mined1)
    torch.testing.assert_close(g_mined_total, g_mined_nce)  # nor the mined negatives


def test_similarity_stats_per_source_weights():
    q, d = _scores_as_vectors([[0.5, 0.1, 0.2, 0.4], [0.3, 0.9, 0.0, 0.1]])
    targets = BatchTargets(pos_index=torch.tensor([0, 1]), mask=torch.zeros(2, 4, dtype=torch.bool),
                           neg_owner=torch.tensor([0, 0]), neg_index=torch.tensor([2, 3]),
                           neg_generated=torch.tensor([False, True]))
    _, stats = contrastive_objective(q, d, targets, temperature=0.1)
    p0 = torch.softmax(torch.tensor([5.0, 1.0, 2.0, 4.0], dtype=torch.float64), 0)
    p1 = torch.softmax(torch.tensor([3.0, 9.0, 0.0, 1.0], dtype=torch.float64), 0)
    assert stats["weight_mined"] == pytest.approx(float(p0[2]))
    assert stats["weight_generated"] == pytest.approx(float(p0[3]))
    # in-batch negatives: query 0's doc 1; query 1's docs 0, 2, 3 (others' positive and hard negatives)
    assert stats["weight_in_batch"] == pytest.approx(float((p0[1] + p1[0] + p1[2] + p1[3]) / 4))
    assert stats["pos_sim"] == pytest.approx(0.7) and stats["hard_neg_sim"] == pytest.approx(0.3)
    assert stats["n_mined"] == 1 and stats["n_generated"] == 1
