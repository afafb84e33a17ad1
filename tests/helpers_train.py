"""Shared pieces of the trainer tests: a small synthetic data set, a LoRA retriever on the tiny model, a
brute-force full-batch reference, and the worker of the two-process (gloo) DDP test."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega carbon nitrogen oxygen silicon iron copper zinc gold").split()


def synthetic_pairs(n: int, seed: int = 0) -> list[dict]:
    """Queries of 3 words; each positive repeats its query's words among 4 others (learnable by a tiny model)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = rng.sample(WORDS, 3)
        rows.append({"query": " ".join(words), "positive": " ".join(rng.sample(WORDS, 2) + words + rng.sample(WORDS, 2))})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@torch.no_grad()
def mean_loss(retriever, data, cfg, batch_size: int) -> float:
    """The training objective (InfoNCE + QEM) over ``data`` in eval mode (no dropout), in fixed consecutive batches:
    a yardstick independent of the shuffled training order (the trainer itself never needs it)."""
    from repair.training.losses import contrastive_objective
    from repair.training.data import build_layout

    retriever.model.eval()
    total, count = 0.0, 0
    for start in range(0, len(data), batch_size):
        layout = build_layout(data.examples[start:start + batch_size], data.positives_of)
        q = retriever.embed(retriever.collate(retriever.tokenize(retriever.format(layout.queries, "query",
                                                                                  cfg.instruction))))
        d = retriever.embed(retriever.collate(retriever.tokenize(retriever.format(layout.documents, "passage"))))
        loss, _ = contrastive_objective(q, d, layout.targets.to(q.device), cfg.temperature, cfg.qem_lambda,
                                        cfg.qem_tau)
        total += float(loss) * layout.n_queries
        count += layout.n_queries
    return total / max(1, count)


def mixed_examples():
    """Six examples with uneven numbers of mined / generated negatives and one duplicated positive."""
    from repair.training.data import TrainExample

    rows = synthetic_pairs(6, seed=3)
    ex = [TrainExample(r["query"], r["positive"]) for r in rows]
    ex[0] = TrainExample(ex[0].query, ex[0].positive, ("iron zinc gold", "carbon tau"), ("mined", "generated"))
    ex[2] = TrainExample(ex[2].query, ex[2].positive, ("phi chi psi omega",), ("generated",))
    ex[3] = TrainExample(ex[3].query, ex[0].positive, ("alpha", "beta gamma", "delta"), ("mined", "mined", "generated"))
    return ex


def lora_retriever(model_dir: str | Path, dropout: float = 0.0, checkpointing: str = "off", seed: int = 0):
    """A LoRA retriever on the tiny model with random (non-zero) A and B, so every LoRA weight gets gradient."""
    from repair.runtime import set_seed
    from repair.training.trainer import build_retriever
    from repair.training.config import TrainConfig

    set_seed(seed)
    cfg = TrainConfig(output_dir="unused", model=str(model_dir), lora_dropout=dropout, init_lora_weights=False,
                      max_length=64, gradient_checkpointing=checkpointing, lora_r=4, lora_alpha=8)
    retriever, _ = build_retriever(cfg, torch.device("cpu"))
    return retriever


def lora_grads(retriever) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in retriever.model.named_parameters()
            if p.requires_grad and p.grad is not None}


def objective(layout, temperature=0.05, qem_lambda=0.1, qem_tau=0.1):
    from repair.training.losses import contrastive_objective

    return lambda q, d: contrastive_objective(q, d, layout.targets, temperature, qem_lambda, qem_tau)


def ddp_worker(rank: int, world: int, init_file: str, model_dir: str, out_dir: str) -> None:
    """One rank of the DDP test: its share of the global batch, all-gathered negatives, summed gradients."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        from repair.training.gradcache import allreduce_gradients, contrastive_step
        from repair.training.data import build_layout

        examples = mixed_examples()[:5]  # 5 queries over 2 ranks: 3 + 2, uneven documents too
        positives_of = {}
        for e in examples:
            positives_of.setdefault(e.query, set()).add(e.positive)
        positives_of = {k: frozenset(v) for k, v in positives_of.items()}
        retriever = lora_retriever(model_dir)
        layout = build_layout(examples, positives_of, world)
        results = {}
        for mini in (2, 64):  # gradient caching, and the one-chunk shortcut
            retriever.model.zero_grad(set_to_none=True)
            stats = contrastive_step(retriever, layout, objective(layout), mini_batch_size=mini, rank=rank,
                                     world=world)
            params = [p for p in retriever.model.parameters() if p.requires_grad]
            allreduce_gradients(params, world)
            results[mini] = {"loss": torch.tensor(stats["loss"]), "grads": lora_grads(retriever)}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()
