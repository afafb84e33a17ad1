"""Contrastive objectives of the trainer (DESIGN 5 step 10), on embeddings only, so they are testable by hand.

- InfoNCE is REPAIR's Eq. 8: for query i, the softmax of s(q_i, d)/tau over every candidate document
  of the (global) batch -- its positive, its own hard negative(s) and every other query's positive and hard
  negatives -- with the positive as the target. Candidates that are *also* positives of query i (the same
  text, or another known positive of that query) are masked out (:func:`masked_logits`), never counted as negatives.
- :func:`qem_entropy` is CausalNeg's Query-View Entropy Maximisation (Sec. 3.3): the entropy of
  softmax(s(q, d-)/tau_ent) over each query's own negatives (mined and generated), maximised with weight
  lambda; its gradient flows only through the generated negatives' embeddings (query and mined detached).
- :func:`contrastive_objective` combines them: L = L_InfoNCE - lambda * H (Sec. 3.3, "L_total"), and
  reports the diagnostics the CausalNeg analysis reads (mean similarities, per-source softmax weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class BatchTargets:
    """Which document is what for each query of a global batch (indices into the batch's document list).

    pos_index[i]   -- the positive document of query i;
    mask[i, j]     -- True when document j may not be a negative of query i (it is a positive of i, but not
                      the one at pos_index[i]);
    neg_owner[m], neg_index[m], neg_generated[m] -- hard negative m belongs to query neg_owner[m], sits at
                      document neg_index[m], and was written by an LLM (True) or mined from a corpus (False).
    """

    pos_index: torch.Tensor
    mask: torch.Tensor
    neg_owner: torch.Tensor
    neg_index: torch.Tensor
    neg_generated: torch.Tensor

    def to(self, device: torch.device | str) -> "BatchTargets":
        return BatchTargets(*(t.to(device) for t in (self.pos_index, self.mask, self.neg_owner, self.neg_index,
                                                      self.neg_generated)))


def masked_logits(scores: torch.Tensor, mask: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """scores / tau with masked candidates set to -inf (they vanish from the softmax denominator)."""
    logits = scores / temperature
    if mask is not None:
        logits = logits.masked_fill(mask, float("-inf"))
    return logits


def _padded_negatives(owner: torch.Tensor, n_queries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group negatives by owner: a [B, K] matrix of negative ids (slot -> row of neg_*), and its validity mask."""
    counts = torch.bincount(owner, minlength=n_queries)
    width = int(counts.max()) if owner.numel() else 0
    slots = torch.full((n_queries, max(width, 1)), -1, dtype=torch.long, device=owner.device)
    order = torch.argsort(owner, stable=True)
    sorted_owner = owner[order]
    starts = torch.cumsum(counts, 0) - counts
    rank_in_group = torch.arange(owner.numel(), device=owner.device) - starts[sorted_owner]
    slots[sorted_owner, rank_in_group] = order
    return slots, slots >= 0


def qem_entropy(q: torch.Tensor, d: torch.Tensor, neg_owner: torch.Tensor, neg_index: torch.Tensor,
                neg_generated: torch.Tensor, tau_ent: float) -> tuple[torch.Tensor, int]:
    """Mean entropy H(p) of p = softmax(s(q, d-)/tau_ent) over each query's own negatives (CausalNeg Eq. QEM).

    The query embedding and the mined negatives are detached; only generated negatives carry gradient
    ("selective gradient propagation", Sec. 3.3). Only queries with at least one generated negative and at
    least two negatives take part (with one negative the entropy is the constant 0, and without a generated
    one there is nothing to move). Returns (mean entropy, number of queries averaged); (0, 0) if none.
    """
    if neg_owner.numel() == 0:
        return q.new_zeros(()), 0
    q_det = q.detach()
    gen = neg_generated.to(torch.bool)
    neg_vecs = d[neg_index]
    neg_vecs = torch.where(gen.unsqueeze(1), neg_vecs, neg_vecs.detach())
    sims = (q_det[neg_owner] * neg_vecs).sum(-1)  # s(q, d-) for every negative, [M]
    slots, valid = _padded_negatives(neg_owner, q.shape[0])
    logits = sims[slots.clamp(min=0)] / tau_ent
    logits = logits.masked_fill(~valid, float("-inf"))
    has_gen = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    has_gen[neg_owner[gen]] = True
    active = has_gen & (valid.sum(1) >= 2)
    if not bool(active.any()):
        return q.new_zeros(()), 0
    logp = torch.log_softmax(logits[active], dim=-1)
    p = logp.exp()
    entropy = -(p * logp.masked_fill(~valid[active], 0.0)).sum(-1)
    return entropy.mean(), int(active.sum())


def contrastive_objective(q: torch.Tensor, d: torch.Tensor, targets: BatchTargets, temperature: float,
                          qem_lambda: float = 0.0, qem_tau: float = 0.1) -> tuple[torch.Tensor, dict]:
    """L = InfoNCE (Eq. 8) - qem_lambda * H_QEM, plus the step's diagnostics (floats) for logging.

    InfoNCE is the mean over queries of -log softmax(s(q_i, .)/tau)[pos_i] over all unmasked documents; q: [B, H],
    d: [N, H], L2-normalised, so the dot product is the cosine of the paper's s(q, d).
    """
    scores = q @ d.T
    logits = masked_logits(scores, targets.mask, temperature)
    loss_nce = F.cross_entropy(logits, targets.pos_index)
    loss = loss_nce
    entropy, n_qem = q.new_zeros(()), 0
    if qem_lambda > 0:
        entropy, n_qem = qem_entropy(q, d, targets.neg_owner, targets.neg_index, targets.neg_generated, qem_tau)
        if n_qem:
            loss = loss_nce - qem_lambda * entropy
    stats = {"loss": float(loss.detach()), "infonce": float(loss_nce.detach()),
             "qem_entropy": float(entropy.detach()), "qem_queries": n_qem}
    stats.update(similarity_stats(scores.detach(), logits.detach(), targets))
    return loss, stats


@torch.no_grad()
def similarity_stats(scores: torch.Tensor, logits: torch.Tensor, targets: BatchTargets) -> dict:
    """Mean similarities and mean per-negative softmax weight by kind: mined / generated hard negatives and
    in-batch negatives (the per-negative gradient weight CausalNeg tracks in Sec. 4.3)."""
    n_q, n_d = scores.shape
    rows = torch.arange(n_q, device=scores.device)
    probs = torch.softmax(logits, dim=-1)
    pos = torch.zeros_like(targets.mask)
    pos[rows, targets.pos_index] = True
    own = torch.zeros_like(targets.mask)
    own[targets.neg_owner, targets.neg_index] = True
    own &= ~targets.mask
    in_batch = ~(targets.mask | pos | own)
    negatives = ~(targets.mask | pos)

    def mean(values: torch.Tensor) -> float | None:
        return float(values.mean()) if values.numel() else None

    out = {"pos_sim": mean(scores[rows, targets.pos_index]), "neg_sim": mean(scores[negatives]),
           "hard_neg_sim": mean(scores[own]), "in_batch_sim": mean(scores[in_batch]),
           "weight_pos": mean(probs[rows, targets.pos_index]), "weight_in_batch": mean(probs[in_batch])}
    keep = ~targets.mask[targets.neg_owner, targets.neg_index]
    neg_probs = probs[targets.neg_owner, targets.neg_index]
    neg_scores = scores[targets.neg_owner, targets.neg_index]
    for name, flag in (("mined", False), ("generated", True)):
        sel = keep & (targets.neg_generated.to(torch.bool) == flag)
        out[f"weight_{name}"] = mean(neg_probs[sel])
        out[f"sim_{name}"] = mean(neg_scores[sel])
        out[f"n_{name}"] = int(sel.sum())
    return out
