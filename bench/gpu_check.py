#!/usr/bin/env python
"""One-call GPU check of REPAIR's CUDA paths; prints one JSON summary on stdout (progress goes to stderr).

Sections (each in its own subprocess, with its own timeout; a failed or timed-out section is reported with its
error text and the others still run):
  encode  encoder tokens/s and MFU in bf16 for a random-weight model shaped like Qwen2.5-0.5B (built from a
          config written below, no download), through ``Retriever.embed`` (the path every stage encodes with)
  train   LoRA training steps through ``repair.training.trainer.train`` (peft LoRA, GradCache mini-batches, gradient
          checkpointing, bf16 autocast) on the same model saved to a temp folder: tokens/s, peak GPU memory
  search  exact top-k of the same random vectors with ``repair.search.exact_topk`` on the GPU (torch, and
          faiss when importable) and on the CPU: whether the top-k ids agree (ties aside) and the speeds
  demo    ``DEMO=tiny DEVICE=cuda OUT_DIR=<tmp> bash run_repair.sh`` end to end: exit code, wall time, the
          metrics of its report.json

MFU = tokens/s x forward FLOPs per token / peak dense bf16 FLOP/s of the GPU, where forward FLOPs per token =
2 x (weights of the linear layers) + 4 x layers x seq_len x (heads x head_dim) (attention scores and weighted
sum at full sequence length, PaLM's convention; the embedding lookup is no matmul and an embedding model has
no LM head). Peak figures are NVIDIA's datasheet numbers without sparsity (``PEAK_BF16_DENSE_TFLOPS``); other
GPUs report MFU "unknown".

On a machine without CUDA it prints ``{"cuda": false, ...}`` after checking its arguments and exits 0.
Exit codes: 0 all sections ok (or dry run), 1 a section failed or timed out, 2 bad arguments.

    bash bench/gpu_check.sh                                  # everything, under 8 minutes
    bash bench/gpu_check.sh --skip demo,search --out gpu.json
    bash bench/gpu_check.sh --dry_run                        # argument checks and the plan only
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn, Sequence

ROOT = Path(__file__).resolve().parents[1]

logger = logging.getLogger("gpu_check")

SECTIONS = ("encode", "train", "search", "demo")
# shares of the time budget; time a section leaves unused passes on to the sections after it
SECTION_WEIGHTS = {"encode": 1.5, "train": 2.0, "search": 1.5, "demo": 5.0}
MIN_SECONDS_PER_SECTION = 30
CPU_ONLY_MESSAGE = ("no CUDA GPU visible (torch.cuda.is_available() is False): only the argument checks ran "
                    "(dry run); run bench/gpu_check.sh on a machine with a CUDA GPU")

# Qwen/Qwen2.5-0.5B's config.json (the values that fix the shapes and the kernels); 494,032,768 parameters.
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000.0,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, max_window_layers=24, hidden_act="silu",
                  use_sliding_window=False, attention_dropout=0.0, use_cache=False)

# Peak dense (no sparsity) bf16 tensor-core TFLOP/s from NVIDIA datasheets, matched against
# torch.cuda.get_device_name() in this order (more specific names first).
PEAK_BF16_DENSE_TFLOPS: list[tuple[str, float]] = [
    (r"\bGH200\b", 989.0), (r"\bH200 NVL\b", 835.0), (r"\bH200\b", 989.0),
    (r"\bH100 NVL\b", 835.0), (r"\bH100 PCIe\b", 756.0), (r"\bH100\b", 989.0),
    (r"\bA100\b", 312.0), (r"\bL40S\b", 362.0), (r"\bL40\b", 181.0), (r"\bL4\b", 121.0), (r"\bA10\b", 125.0),
    (r"\bRTX 4090\b", 165.0), (r"\bRTX A6000\b", 155.0),
]


# ---------------------------------------------------------------------------------------------- pure pieces
def peak_bf16_tflops(device_name: str) -> float | None:
    """Datasheet peak dense bf16 TFLOP/s of a GPU by its CUDA name; None when the table does not know it."""
    for pattern, tflops in PEAK_BF16_DENSE_TFLOPS:
        if re.search(pattern, device_name):
            return tflops
    return None


def forward_flops_per_token(matmul_params: int, n_layers: int, seq_len: int, attn_width: int) -> float:
    """Forward FLOPs per token: 2 per linear weight, plus 4 x seq_len x attn_width per layer for QK^T and AV."""
    return 2.0 * matmul_params + 4.0 * n_layers * seq_len * attn_width


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation (0..1); None when the GPU's peak is unknown."""
    if not peak_tflops:
        return None
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12)


def topk_agreement(ids_a, scores_a, ids_b, scores_b, tol: float = 1e-5) -> dict:
    """Compare two exact top-k results row by row (both sorted by score, descending).

    A row is ``identical`` when the id lists match. Otherwise, when the two score lists agree position by
    position within ``tol``, the difference is a swap among (near-)tied scores -- two summation orders of the
    same dot products -- and counts as ``tie_swaps``; any other row is a real disagreement. ``agree`` is true
    when no row really disagrees.
    """
    import numpy as np

    ids_a, ids_b = np.asarray(ids_a), np.asarray(ids_b)
    scores_a, scores_b = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_b, dtype=np.float64)
    if ids_a.shape != ids_b.shape or scores_a.shape != ids_a.shape or scores_b.shape != ids_b.shape:
        raise ValueError(f"top-k shapes differ: ids {ids_a.shape} vs {ids_b.shape}, "
                         f"scores {scores_a.shape} vs {scores_b.shape}")
    same_ids = (ids_a == ids_b).all(axis=1)
    score_gap = np.abs(scores_a - scores_b).max(axis=1) if ids_a.size else np.zeros(len(ids_a))
    tie_swaps = ~same_ids & (score_gap <= tol)
    different = ~same_ids & ~tie_swaps
    return {"rows": int(len(ids_a)), "identical": int(same_ids.sum()), "tie_swaps": int(tie_swaps.sum()),
            "different": int(different.sum()), "agree": bool(not different.any()),
            "max_abs_score_diff": float(score_gap.max()) if len(score_gap) else 0.0}


def score_error(queries, docs, ids, scores, rows: Sequence[int]) -> float:
    """Largest |reported score - q.d| over the given rows, recomputed in float64 (catches wrong ids)."""
    import numpy as np

    q = np.asarray(queries, dtype=np.float64)[list(rows)]
    d = np.asarray(docs)
    worst = 0.0
    for r, qv in zip(rows, q):
        exact = d[np.asarray(ids[r])].astype(np.float64) @ qv
        worst = max(worst, float(np.abs(exact - np.asarray(scores[r], dtype=np.float64)).max()))
    return worst


def section_timeouts(budget_s: float, sections: Sequence[str]) -> dict[str, float]:
    """Each section's share of the budget, before any time left over by earlier sections is passed on."""
    total = sum(SECTION_WEIGHTS[s] for s in sections)
    return {s: budget_s * SECTION_WEIGHTS[s] / total for s in sections}


# ---------------------------------------------------------------------------------------------- arguments
class ArgumentError(Exception):
    """A bad command-line value; main() prints it as one line and exits 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage block before its error; a checker reads one line instead."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"gpu_check: error: {message}\n")
        sys.exit(2)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog="gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry_run", action="store_true", help="check the arguments, print the plan, run nothing")
    p.add_argument("--skip", default="", help=f"comma-separated sections to leave out: {','.join(SECTIONS)}")
    p.add_argument("--out", default=None, help="also write the JSON summary to this file")
    p.add_argument("--timeout_s", type=float, default=450.0,
                   help="time budget of all sections together, seconds (default: %(default)s, so the whole "
                        "script stays under 8 minutes); each section gets a share, unused time passes on")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N (default: %(default)s)")
    p.add_argument("--seq_len", type=int, default=512, help="tokens per text for encode and train (default: 512)")
    p.add_argument("--encode_batch", type=int, default=64, help="texts per encoder forward (default: %(default)s)")
    p.add_argument("--encode_seconds", type=float, default=10.0, help="timed encoding time (default: %(default)s)")
    p.add_argument("--train_global_batch", type=int, default=64,
                   help="queries per optimizer step, each with a positive and a hard negative (default: 64)")
    p.add_argument("--train_mini_batch", type=int, default=16,
                   help="texts per GradCache forward; smaller than the batch so GradCache chunks (default: 16)")
    p.add_argument("--train_steps", type=int, default=3, help="optimizer steps; the first is warm-up (default: 3)")
    p.add_argument("--search_docs", type=int, default=200_000, help="random documents (default: %(default)s)")
    p.add_argument("--search_queries", type=int, default=1000, help="random queries (default: %(default)s)")
    p.add_argument("--search_dim", type=int, default=896, help="vector width (Qwen2.5-0.5B: 896)")
    p.add_argument("--k", type=int, default=100, help="top-k of the search check (default: %(default)s)")
    p.add_argument("--work_dir", default=None, help="folder for the model, logs and the demo run "
                                                    "(default: a temp folder, removed at the end)")
    p.add_argument("--keep_work", action="store_true", help="keep the default temp folder")
    # internal: one section in this process (the parent starts these)
    p.add_argument("--section", choices=SECTIONS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result_file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline_s", type=float, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    """Every check that needs no GPU; returns the sections to run. Raises ArgumentError naming the flag."""
    skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    unknown = [s for s in skip if s not in SECTIONS]
    if unknown:
        raise ArgumentError(f"--skip: unknown section(s) {','.join(unknown)} (sections: {','.join(SECTIONS)})")
    sections = [s for s in SECTIONS if s not in skip]
    if not sections:
        raise ArgumentError("--skip leaves no section to run")
    if not math.isfinite(args.timeout_s) or args.timeout_s < MIN_SECONDS_PER_SECTION * len(sections):
        raise ArgumentError(f"--timeout_s must be at least {MIN_SECONDS_PER_SECTION} s per section "
                            f"({MIN_SECONDS_PER_SECTION * len(sections)} for {len(sections)}), got {args.timeout_s}")
    if args.timeout_s > 3600:
        raise ArgumentError(f"--timeout_s must be at most 3600, got {args.timeout_s}")
    if not re.fullmatch(r"cuda(:\d+)?", args.device):
        raise ArgumentError(f"--device must be cuda or cuda:N, got {args.device!r}")
    positive = ["seq_len", "encode_batch", "train_global_batch", "train_mini_batch", "train_steps",
                "search_docs", "search_queries", "search_dim", "k"]
    for name in positive:
        if getattr(args, name) < 1:
            raise ArgumentError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.encode_seconds > 0:
        raise ArgumentError(f"--encode_seconds must be > 0, got {args.encode_seconds}")
    if not 8 <= args.seq_len <= QWEN25_05B["max_position_embeddings"]:
        raise ArgumentError(f"--seq_len must be in 8..{QWEN25_05B['max_position_embeddings']}, got {args.seq_len}")
    if args.train_mini_batch >= args.train_global_batch:
        raise ArgumentError(f"--train_mini_batch ({args.train_mini_batch}) must be smaller than "
                            f"--train_global_batch ({args.train_global_batch}) so that GradCache chunks the batch")
    if args.k > 2048 or args.k > args.search_docs:
        raise ArgumentError(f"--k must be <= 2048 (faiss GPU limit) and <= --search_docs, got {args.k}")
    if args.out:
        out = Path(args.out)
        if out.is_dir():
            raise ArgumentError(f"--out {args.out} is a folder; give a file name")
        if not out.resolve().parent.is_dir():
            raise ArgumentError(f"--out {args.out}: folder {out.resolve().parent} does not exist")
    if args.work_dir and Path(args.work_dir).exists() and not Path(args.work_dir).is_dir():
        raise ArgumentError(f"--work_dir {args.work_dir} exists and is not a folder")
    if "demo" in sections:
        for needed in (ROOT / "run_repair.sh", ROOT / "data" / "demo" / "scifact-tiny"):
            if not needed.exists():
                raise ArgumentError(f"the demo section needs {needed}, which is missing (or pass --skip demo)")
    return sections


def plan(args: argparse.Namespace, sections: list[str]) -> dict:
    return {"sections": {s: {"timeout_s_at_least": round(t, 1)}
                         for s, t in section_timeouts(args.timeout_s, sections).items()},
            "skipped": [s for s in SECTIONS if s not in sections], "budget_s": args.timeout_s,
            "settings": {k: getattr(args, k) for k in ("device", "seq_len", "encode_batch", "encode_seconds",
                                                       "train_global_batch", "train_mini_batch", "train_steps",
                                                       "search_docs", "search_queries", "search_dim", "k")}}


# ---------------------------------------------------------------------------------------------- model pieces
def qwen25_05b_config(**overrides):
    """Qwen2Config with Qwen2.5-0.5B's shapes (``overrides`` shrink it for CPU tests)."""
    from transformers import Qwen2Config

    return Qwen2Config(**{**QWEN25_05B, **overrides})


def local_tokenizer():
    """SmolLM2's BPE tokenizer from the offline model package (as tests/conftest.py pairs it with a random
    Qwen2): no download. Saved next to a qwen2 config, AutoTokenizer rebuilds it as a Qwen2Tokenizer, which a
    hand-made word-level tokenizer does not survive. Pads with EOS on the right, like Qwen2.5's."""
    from transformers import AutoTokenizer

    from repair.models import smollm2_folder

    return AutoTokenizer.from_pretrained(smollm2_folder())


def build_random_model(config, device: str, dtype):
    """Random-weight ``AutoModel`` built from the config directly on the device."""
    import torch
    from transformers import AutoModel

    with torch.device(device):
        model = AutoModel.from_config(config, dtype=dtype)
    return model.eval()


def matmul_params(model) -> int:
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


# ---------------------------------------------------------------------------------------------- sections
def section_encode(device: str, config, seq_len: int, batch: int, seconds: float) -> dict:
    """Tokens/s of ``Retriever.embed`` (bf16 weights, full-length rows) and the MFU that implies."""
    import torch

    from repair.encoding import Retriever

    model = build_random_model(config, device, torch.bfloat16)
    tokenizer = local_tokenizer()
    retriever = Retriever(model, tokenizer, pooling="eos", max_length=seq_len, device=device)
    gen = torch.Generator().manual_seed(0)
    eos, n_ids = tokenizer.eos_token_id, min(len(tokenizer), config.vocab_size)
    rows = [torch.randint(0, n_ids, (seq_len - 1,), generator=gen).tolist() + [eos] for _ in range(batch)]
    inputs = retriever.collate(rows)

    def forward() -> torch.Tensor:
        with torch.inference_mode():
            return retriever.embed(inputs)

    for _ in range(2):  # kernel selection, allocator
        forward()
    _sync(device)
    t0 = time.perf_counter()
    out = forward()
    _sync(device)
    one = time.perf_counter() - t0
    iters = max(3, int(seconds / max(one, 1e-6)))
    t0 = time.perf_counter()
    for _ in range(iters):
        out = forward()
    _sync(device)
    elapsed = time.perf_counter() - t0
    tokens_per_s = iters * batch * seq_len / elapsed
    flops = forward_flops_per_token(matmul_params(model), config.num_hidden_layers, seq_len,
                                    config.num_attention_heads * (config.hidden_size // config.num_attention_heads))
    name = _device_name(device)
    peak = peak_bf16_tflops(name) if device.startswith("cuda") else None
    value = mfu(tokens_per_s, flops, peak)
    return {"params": sum(p.numel() for p in model.parameters()), "matmul_params": matmul_params(model),
            "dtype": str(next(model.parameters()).dtype), "attn_implementation": model.config._attn_implementation,
            "skip_mask": retriever.skip_mask, "seq_len": seq_len, "batch": batch, "iters": iters,
            "seconds": round(elapsed, 3), "tokens_per_s": round(tokens_per_s, 1),
            "texts_per_s": round(iters * batch / elapsed, 1), "forward_flops_per_token": flops,
            "peak_bf16_tflops": peak, "mfu": round(value, 4) if value is not None else "unknown",
            "embedding_norm": round(float(out.norm(dim=-1).mean()), 4)}


def section_train(device: str, config, work: Path, seq_len: int, global_batch: int, mini_batch: int,
                  steps: int) -> dict:
    """``repair.training.trainer.train`` (LoRA, GradCache, gradient checkpointing on) on the random model saved to a folder."""
    import random

    import torch

    from repair.data import read_json, read_jsonl, write_jsonl
    from repair.training.trainer import train
    from repair.training.config import TrainConfig

    model_dir, out_dir = work / "train_model", work / "train_out"
    for folder in (model_dir, out_dir):
        if folder.exists():
            shutil.rmtree(folder)
    tokenizer = local_tokenizer()
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, more than the model's vocab {config.vocab_size}")
    model = build_random_model(config, device, torch.bfloat16)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    del model
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def text(n_words: int) -> str:  # passages of seq_len words: at least seq_len tokens, truncated to seq_len
        return " ".join("".join(rng.choices(letters, k=rng.randint(3, 8))) for _ in range(n_words))

    rows = [{"query": text(max(4, seq_len // 16)), "pos_document": text(seq_len), "d_neg": text(seq_len)}
            for _ in range(global_batch * steps)]
    triplets = work / "train_triplets.jsonl"
    write_jsonl(triplets, rows)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    cfg = TrainConfig(output_dir=str(out_dir), model=str(model_dir), triplets=[str(triplets)], max_length=seq_len,
                      global_batch_size=global_batch, mini_batch_size=mini_batch, max_steps=steps, epochs=1,
                      warmup_steps=0, save_steps=0, logging_steps=1, show_progress=False, device=device,
                      gradient_checkpointing="on", lr=1e-4)
    t0 = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - t0
    log = read_jsonl(out_dir / "train_log.jsonl")
    settings = read_json(out_dir / "training_args.json")
    timed = log[1:] or log  # step 1 pays for kernel selection and the allocator
    tokens, seconds = sum(r["tokens"] for r in timed), sum(r["seconds"] for r in timed)
    out = {"status_of_train": result["status"], "steps": len(log), "wall_s_incl_load": round(wall, 2),
           "tokens_per_step": [r["tokens"] for r in log], "seconds_per_step": [round(r["seconds"], 3) for r in log],
           "tokens_per_s": round(tokens / seconds, 1), "loss": [round(r["loss"], 4) for r in log],
           "grad_norm": [round(r["grad_norm"], 4) for r in log], "queries_per_step": global_batch,
           "documents_per_step": log[0]["documents"], "mini_batch": mini_batch,
           "gradcache_chunks_per_step": math.ceil(global_batch / mini_batch) + math.ceil(log[0]["documents"] / mini_batch),
           "gradient_checkpointing": settings["gradient_checkpointing"],
           "lora_targets": settings["lora_target_modules_used"], "seq_len": seq_len}
    if device.startswith("cuda"):
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 3)
    return out


def section_search(device: str, n_docs: int, n_queries: int, dim: int, k: int) -> dict:
    """Exact top-k on the GPU (torch; faiss if importable) vs torch on the CPU, on the same random vectors."""
    import numpy as np
    import torch

    from repair.search import exact_topk, faiss_available

    rng = np.random.default_rng(0)
    docs = rng.standard_normal((n_docs, dim), dtype=np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = rng.standard_normal((n_queries, dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    runs: dict[str, dict] = {"torch_gpu": {"backend": "torch", "device": device},
                             "torch_cpu": {"backend": "torch", "device": "cpu"}}
    faiss_note = "faiss not importable"
    if faiss_available():
        import faiss

        gpu = hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0
        faiss_note = "faiss with GPU support" if gpu else "faiss without GPU support (faiss-cpu): searched on the CPU"
        runs["faiss_gpu" if gpu else "faiss_cpu"] = {"backend": "faiss", "device": device}
    # warm-up (CUDA context, cuBLAS, faiss GPU resources) on a small slice, untimed
    for spec in runs.values():
        exact_topk(queries[:8], docs[:4096], min(k, 4096), **spec)
    results, seconds = {}, {}
    for name, spec in runs.items():
        t0 = time.perf_counter()
        results[name] = exact_topk(queries, docs, k, **spec)
        _sync(device)
        seconds[name] = time.perf_counter() - t0
    ref_scores, ref_ids = results["torch_cpu"]
    sample = list(range(0, n_queries, max(1, n_queries // 50)))
    out: dict[str, Any] = {"docs": n_docs, "queries": n_queries, "dim": dim, "k": k, "faiss": faiss_note,
                           "cpu_threads": torch.get_num_threads(), "reference": "torch_cpu", "backends": {}}
    for name, (scores, ids) in results.items():
        row = {"seconds": round(seconds[name], 3), "queries_per_s": round(n_queries / seconds[name], 1),
               "max_score_error_vs_float64": score_error(queries, docs, ids, scores, sample)}
        if name != "torch_cpu":
            row["vs_torch_cpu"] = topk_agreement(ids, scores, ref_ids, ref_scores)
        out["backends"][name] = row
    out["agree"] = all(r["vs_torch_cpu"]["agree"] for n, r in out["backends"].items() if n != "torch_cpu")
    out["speedup_torch_gpu_vs_cpu"] = round(seconds["torch_cpu"] / seconds["torch_gpu"], 2)
    return out


def section_demo(device: str, work: Path, deadline_s: float) -> dict:
    """``DEMO=tiny DEVICE=<device> bash run_repair.sh`` into a fresh folder; its exit code, time and metrics."""
    out_dir = work / "demo"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    log_path = work / "demo.log"
    env = dict(os.environ, DEMO="tiny", DEVICE=device, OUT_DIR=str(out_dir), PYTHON=sys.executable)
    for inherited in ("TRAIN_DATA", "PROFILE"):  # either would replace the tiny demo with something else
        env.pop(inherited, None)
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        code, timed_out = run_group(["bash", str(ROOT / "run_repair.sh")], log, deadline_s, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"exit_code": code, "seconds": round(wall, 1), "out_dir": str(out_dir)}
    if timed_out:
        out["error"] = f"run_repair.sh killed after {deadline_s:.0f} s (section deadline)"
    elif code != 0:
        out["error"] = f"run_repair.sh exited {code}"
    if "error" in out:
        out["log_tail"] = tail(log_path)
    report = out_dir / "report.json"
    if report.exists():
        data = json.loads(report.read_text(encoding="utf-8"))
        out["iterations"] = [{key: it.get(key) for key in ("iter", "eval", "generated", "verified", "kept",
                                                          "seconds") if key in it}
                             | {"train": {k: v for k, v in (it.get("train") or {}).items()
                                          if k in ("steps", "first_loss", "last_loss")}}
                             for it in data.get("iterations", [])]
    elif "error" not in out:
        out["error"] = f"run_repair.sh exited 0 but wrote no {report}"
    return out


# ---------------------------------------------------------------------------------------------- processes
def tail(path: Path, lines: int = 20, chars: int = 3000) -> str:
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])[-chars:]


def run_group(cmd: list[str], log, timeout_s: float, env: dict | None = None, cwd: Path | None = None
              ) -> tuple[int | None, bool]:
    """Run a command in its own process group (so its children die with it); (exit code, timed out)."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    try:
        return proc.wait(timeout=max(0.1, timeout_s)), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, True


def run_section_child(name: str, args: argparse.Namespace, work: Path, timeout_s: float) -> dict:
    """Run one section in a subprocess (own CUDA context and peak memory, hangs contained)."""
    result_file = work / f"{name}.result.json"
    log_path = work / f"{name}.log"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--result_file", str(result_file),
           "--deadline_s", str(max(5.0, timeout_s - 15.0)), "--work_dir", str(work), "--device", args.device,
           "--seq_len", str(args.seq_len), "--encode_batch", str(args.encode_batch),
           "--encode_seconds", str(args.encode_seconds), "--train_global_batch", str(args.train_global_batch),
           "--train_mini_batch", str(args.train_mini_batch), "--train_steps", str(args.train_steps),
           "--search_docs", str(args.search_docs), "--search_queries", str(args.search_queries),
           "--search_dim", str(args.search_dim), "--k", str(args.k)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        code, timed_out = run_group(cmd, log, timeout_s, env=env, cwd=ROOT)
    wall = round(time.perf_counter() - t0, 1)
    if timed_out:
        return {"status": "timeout", "error": f"section killed after {timeout_s:.1f} s (its timeout)",
                "wall_s": wall, "log_tail": tail(log_path)}
    if result_file.exists():
        result = json.loads(result_file.read_text(encoding="utf-8"))
        result["wall_s"] = wall
        return result
    return {"status": "error", "error": f"section process exited {code} without a result", "wall_s": wall,
            "log_tail": tail(log_path)}


def child_main(args: argparse.Namespace) -> None:
    """One section in this process: write {"status": ok|error, ...} to --result_file."""
    from repair.runtime import setup_logging

    setup_logging("WARNING")
    work = Path(args.work_dir)
    # the measuring sections name the GPU with its index (torch.cuda.set_device rejects a bare "cuda"); the
    # demo passes --device exactly as given, as a user's DEVICE=cuda does
    indexed = args.device if ":" in args.device else f"{args.device}:0"
    try:
        if args.section == "encode":
            result = section_encode(indexed, qwen25_05b_config(), args.seq_len, args.encode_batch,
                                    args.encode_seconds)
        elif args.section == "train":
            result = section_train(indexed, qwen25_05b_config(), work, args.seq_len, args.train_global_batch,
                                   args.train_mini_batch, args.train_steps)
        elif args.section == "search":
            result = section_search(indexed, args.search_docs, args.search_queries, args.search_dim, args.k)
        else:
            result = section_demo(args.device, work, args.deadline_s or 600.0)
        status = "error" if result.get("error") or result.get("agree") is False else "ok"
        if result.get("agree") is False:
            result["error"] = "top-k ids differ between GPU and CPU beyond ties"
        result = {"status": status, **result}
    except Exception as exc:  # reported in the summary; the parent carries on with the next section
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()[-3000:]}
    Path(args.result_file).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")


def device_info(device: str) -> dict:
    import torch

    props = torch.cuda.get_device_properties(device)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "bf16": torch.cuda.is_bf16_supported(),
            "peak_bf16_tflops": peak_bf16_tflops(props.name)}


def emit(summary: dict, out: str | None) -> None:
    text = json.dumps(summary, indent=1, default=str)
    print(text, flush=True)
    if out:
        Path(out).write_text(text + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.section:
        child_main(args)
        return 0
    try:
        sections = check_args(args)
    except ArgumentError as exc:
        sys.stderr.write(f"gpu_check: error: {exc}\n")
        return 2
    import torch

    if not torch.cuda.is_available():
        emit({"cuda": False, "dry_run": True, "message": CPU_ONLY_MESSAGE, "torch": torch.__version__,
              "plan": plan(args, sections)}, args.out)
        return 0
    index = int(args.device.split(":")[1]) if ":" in args.device else 0
    if index >= torch.cuda.device_count():
        sys.stderr.write(f"gpu_check: error: --device {args.device}: only {torch.cuda.device_count()} GPU(s)\n")
        return 2
    from repair.runtime import setup_logging

    setup_logging("INFO")
    info = device_info(args.device)
    if args.dry_run:
        emit({"cuda": True, "dry_run": True, "message": "argument checks passed; nothing run (--dry_run)",
              "device": info, "plan": plan(args, sections)}, args.out)
        return 0
    own_work = args.work_dir is None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="repair-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, dict] = {s: {"status": "skipped", "reason": "--skip"} for s in SECTIONS if s not in sections}
    try:
        for i, name in enumerate(sections):
            remaining = args.timeout_s - (time.perf_counter() - started)
            share = remaining * SECTION_WEIGHTS[name] / sum(SECTION_WEIGHTS[s] for s in sections[i:])
            if share < 10:
                results[name] = {"status": "skipped", "reason": f"time budget spent ({remaining:.0f} s left)"}
                continue
            logger.info("section %s: start (timeout %.0f s)", name, share)
            results[name] = {"timeout_s": round(share, 1), **run_section_child(name, args, work, share)}
            logger.info("section %s: %s in %.1f s", name, results[name]["status"], results[name]["wall_s"])
    finally:
        if own_work and not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    failed = [s for s in sections if results[s]["status"] != "ok"]
    summary = {"cuda": True, "dry_run": False, "ok": not failed, "failed": failed, "device": info,
               "wall_s": round(time.perf_counter() - started, 1), "budget_s": args.timeout_s,
               "work_dir": str(work) if (not own_work or args.keep_work) else None,
               "sections": {s: results[s] for s in SECTIONS}}
    emit(summary, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
