#!/usr/bin/env python
"""Seconds per optimizer step and peak memory of one gradient-cached contrastive training step:
our trainer (repair.training.trainer, GradCache) vs sentence-transformers' CachedMultipleNegativesRankingLoss, on the same
model (LoRA r16/alpha32 on every projection), the same (query, positive) pairs, the same text formats, global
batch and mini batch, AdamW. Each side runs in its own subprocess so peak RSS is its own.

Example (about 15-30 min on 2 CPU cores):
  python bench/train_step.py --model smollm2-135m --data ../shared/data/scifact --steps 2 \\
      --global_batch_size 64 --mini_batch_size 8 --max_length 128
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from repair.models import DEFAULT_MODEL


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="base model (alias, folder or HF id)")
    p.add_argument("--data", required=True, help="BEIR folder whose --split pairs are the training data")
    p.add_argument("--split", default="train", help="qrels split (default: %(default)s)")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps timed per side (default: %(default)s)")
    p.add_argument("--global_batch_size", type=int, default=64, help="queries per step (default: %(default)s)")
    p.add_argument("--mini_batch_size", type=int, default=8, help="texts per forward pass (default: %(default)s)")
    p.add_argument("--max_length", type=int, default=128, help="max tokens per text (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.02, help="InfoNCE temperature; ST scale = 1/T")
    p.add_argument("--threads", type=int, default=2, help="torch threads in each subprocess (default: %(default)s)")
    p.add_argument("--which", choices=["both", "ours", "st"], default="both", help=argparse.SUPPRESS)
    p.add_argument("--output", default=None, help="also write the results JSON here")
    return p.parse_args(argv)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _pairs(args) -> tuple[list[str], list[str]]:
    from repair.data import load_seed

    seed = load_seed(args.data, args.split)
    n = args.steps * args.global_batch_size
    if len(seed) < n:
        raise SystemExit(f"{args.data}: only {len(seed)} pairs, need {n}")
    return seed.queries[:n], seed.passages[:n]


def run_ours(args) -> dict:
    from repair.data import read_jsonl, write_jsonl
    from repair.training.trainer import train
    from repair.training.config import TrainConfig

    queries, passages = _pairs(args)
    with tempfile.TemporaryDirectory() as tmp:
        pairs = Path(tmp) / "pairs.jsonl"
        write_jsonl(pairs, [{"query": q, "positive": p} for q, p in zip(queries, passages)])
        cfg = TrainConfig(output_dir=str(Path(tmp) / "out"), model=args.model, train_data=[str(pairs)],
                          max_length=args.max_length, global_batch_size=args.global_batch_size,
                          mini_batch_size=args.mini_batch_size, temperature=args.temperature, epochs=1,
                          save_steps=0, show_progress=False, device="cpu", logging_steps=1)
        train(cfg)
        log = read_jsonl(Path(cfg.output_dir) / "train_log.jsonl")
    return {"seconds": [r["seconds"] for r in log], "cpu_seconds": [r["cpu_seconds"] for r in log],
            "loss": [r["loss"] for r in log]}


def run_st(args) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    from repair.encoding import Retriever
    from repair.models import resolve_model
    from repair.runtime import set_seed
    from repair.training.trainer import DECODER_LORA_TARGETS, ENCODER_LORA_TARGETS
    from repair.training.data import epoch_order

    set_seed(42)
    spec = resolve_model(args.model)
    transformer = Transformer(spec.path, max_seq_length=args.max_length)
    dim = transformer.auto_model.config.hidden_size
    pooling = Pooling(dim, pooling_mode="lasttoken" if spec.pooling == "eos" else "mean")
    targets = list(DECODER_LORA_TARGETS if spec.pooling == "eos" else ENCODER_LORA_TARGETS)
    # peft directly (ST's add_adapter goes through transformers' integration, which wants a newer peft)
    transformer.auto_model = get_peft_model(transformer.auto_model, LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.05, target_modules=targets))
    model = SentenceTransformer(modules=[transformer, pooling], device="cpu")
    model.train()
    # the same formatted texts our retriever embeds (instruction templates), so both sides see equal lengths
    fmt = Retriever(transformer.auto_model, transformer.tokenizer, pooling=spec.pooling, max_length=args.max_length)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    loss_fn = CachedMultipleNegativesRankingLoss(model, scale=1.0 / args.temperature,
                                                mini_batch_size=args.mini_batch_size)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-5, weight_decay=0.01)
    queries, passages = _pairs(args)
    order = epoch_order(len(queries), 42, 0)  # the batches our trainer visits (seed 42, epoch 0)
    seconds, cpu_seconds, losses = [], [], []
    for step in range(args.steps):
        rows = order[step * args.global_batch_size:(step + 1) * args.global_batch_size]
        features = [model.tokenize(fmt.format([queries[i] for i in rows], "query")),
                    model.tokenize(fmt.format([passages[i] for i in rows], "passage"))]
        t0, cpu0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        seconds.append(time.perf_counter() - t0)
        cpu_seconds.append(time.process_time() - cpu0)
        losses.append(float(loss.detach()))
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "loss": losses, "trainable_params": n_trainable}


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from repair.runtime import setup_logging

    setup_logging("WARNING")
    result = run_ours(args) if args.which == "ours" else run_st(args)
    result.update({"which": args.which, "peak_rss_mb": _rss_mb()})
    print("RESULT " + json.dumps(result), flush=True)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.which != "both":
        child(args)
        return {}
    results = {}
    base = [sys.executable, str(Path(__file__).resolve())] + [a for a in (argv or sys.argv[1:])]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    for which in ("ours", "st"):
        proc = subprocess.run(base + ["--which", which], capture_output=True, text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            raise SystemExit(f"{which} failed:\n{proc.stderr[-3000:]}")
        results[which] = json.loads(line[len("RESULT "):])
    names = {"ours": "repair (GradCache)", "st": "sentence-transformers CachedMNRL"}
    print(f"model {args.model}, global batch {args.global_batch_size}, mini batch {args.mini_batch_size}, "
          f"max_length {args.max_length}, {args.steps} steps, {args.threads} threads")
    print(f"{'trainer':34s} {'s/step (mean)':>14s} {'s/step (each)':>22s} {'CPU s/step':>11s} {'peak RSS MB':>12s}")
    for which, res in results.items():
        mean = sum(res["seconds"]) / len(res["seconds"])
        cpu = sum(res["cpu_seconds"]) / len(res["cpu_seconds"])
        each = ", ".join(f"{s:.1f}" for s in res["seconds"])
        print(f"{names[which]:34s} {mean:14.1f} {each:>22s} {cpu:11.1f} {res['peak_rss_mb']:12.0f}")
    out = {"settings": {k: v for k, v in vars(args).items() if k not in ("which", "output")}, "results": results}
    if args.output:
        from repair.data import write_json

        write_json(args.output, out)
    return out


if __name__ == "__main__":
    main()
