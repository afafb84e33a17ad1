#!/usr/bin/env python
"""Stage 10: contrastive (InfoNCE, Eq. 8) LoRA training of the retriever on T0 + REPAIR/CausalNeg triplets.

Defaults are the paper's (App. A.2): LoRA r 16 / alpha 32 / dropout 0.05 on every attention and MLP projection,
AdamW lr 2e-5, 2 epochs, max length 512, global batch 256 (gradient-cached: --mini_batch_size sets memory),
gradient checkpointing (CPU included), bf16 on CUDA.
Multi-GPU: torchrun --nproc_per_node N training/10_train_lora.py ...

Examples:
  python training/10_train_lora.py --model smollm2-135m --train_data seed.pt \\
      --triplets 'run/iter1/final_train_data.bottom_30pct.jsonl' --output_dir run/iter1/adapter
  python training/10_train_lora.py --model minilm --full_finetune --train_data ../shared/data/scifact \\
      --split train --max_length 256 --temperature 0.05 --global_batch_size 32 --mini_batch_size 32 \\
      --output_dir out/minilm-scifact
The output folder loads with peft exactly as the README shows (AutoTokenizer / PeftModel.from_pretrained).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path


from repair.cli import (add_retriever_args, bounded_int, non_negative_float, non_negative_int, positive_float,
                        positive_int, run_script, seed_int, share_below_one)
from repair.driver.model_card import finish_trained_folder
from repair.runtime import process_group, setup_logging
from repair.training.trainer import train
from repair.training.config import BASE_DTYPES, CAUSALNEG_QEM_LAMBDA, TrainConfig

D = TrainConfig.__dataclass_fields__


def _default(name: str):
    return D[name].default


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = add_retriever_args(p, _default("model"), default_max_length=_default("max_length"), encoding=False)
    g.add_argument("--init_adapter", default=None,
                   help="LoRA adapter folder to continue training from (the previous REPAIR iteration's adapter)")
    g.add_argument("--full_finetune", action="store_true",
                   help="train every weight instead of a LoRA adapter; saves a full model folder")
    g.add_argument("--lora_r", type=positive_int, default=_default("lora_r"), help="LoRA rank (default: %(default)s)")
    g.add_argument("--lora_alpha", type=positive_int, default=_default("lora_alpha"),
                   help="LoRA alpha (default: %(default)s)")
    g.add_argument("--lora_dropout", type=share_below_one, default=_default("lora_dropout"),
                   help="LoRA dropout (default: %(default)s)")
    g.add_argument("--lora_target_modules", default=None,
                   help="comma-separated module names; default: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                        "down_proj for decoders, query,key,value,dense for BERT-like encoders")
    g.add_argument("--instruction", default=None,
                   help="query instruction (default: the retriever's generic one for decoders, none for encoders)")
    g = p.add_argument_group("data")
    g.add_argument("--train_data", action="append", default=[],
                   help="T0 pairs: a .pt, a JSONL {query, positive} or a BEIR folder (with --split); repeatable")
    g.add_argument("--split", default=_default("split"), help="qrels split of BEIR --train_data (default: %(default)s)")
    g.add_argument("--all_positives", action="store_true",
                   help="BEIR --train_data: one row per (query, positive) pair instead of one per query")
    g.add_argument("--triplets", action="append", default=[],
                   help="triplet JSONL (final_train_data*.jsonl: query, pos_document, d_neg/hard_negatives[, "
                        "negative_sources]); a path or a quoted glob; repeatable")
    g.add_argument("--num_hard_negatives", type=bounded_int(-1), default=_default("num_hard_negatives"),
                   help="hard negatives per triplet: 1 = d_neg (paper), N = first N of hard_negatives, -1 = all, "
                        "0 = none (default: %(default)s)")
    g.add_argument("--max_examples", type=positive_int, default=None, help="use only the first N examples (quick runs)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=non_negative_int, default=_default("epochs"), help="epochs (default: %(default)s)")
    g.add_argument("--max_steps", type=bounded_int(-1), default=_default("max_steps"),
                   help="stop after this many optimizer steps (overrides --epochs when > 0)")
    g.add_argument("--global_batch_size", type=positive_int, default=_default("global_batch_size"),
                   help="queries per optimizer step over all devices (default: %(default)s)")
    g.add_argument("--mini_batch_size", type=positive_int, default=_default("mini_batch_size"),
                   help="texts per forward pass in gradient caching: sets memory, not the result "
                        "(default: %(default)s)")
    g.add_argument("--lr", type=non_negative_float, default=_default("lr"),
                   help="AdamW learning rate (default: %(default)s)")
    g.add_argument("--weight_decay", type=non_negative_float, default=_default("weight_decay"),
                   help="AdamW weight decay, not applied to biases/norms (default: %(default)s)")
    g.add_argument("--warmup_ratio", type=share_below_one, default=_default("warmup_ratio"),
                   help="linear warmup over this fraction of the steps (default: %(default)s)")
    g.add_argument("--warmup_steps", type=bounded_int(-1), default=_default("warmup_steps"),
                   help="linear warmup steps; overrides --warmup_ratio when >= 0")
    g.add_argument("--max_grad_norm", type=non_negative_float, default=_default("max_grad_norm"),
                   help="gradient clipping norm; 0 disables (default: %(default)s)")
    g.add_argument("--temperature", type=positive_float, default=_default("temperature"),
                   help="InfoNCE temperature tau (default: %(default)s)")
    g.add_argument("--qem_lambda", type=non_negative_float, default=_default("qem_lambda"),
                   help="CausalNeg QEM entropy weight; acts only on queries with generated negatives; 0 disables; "
                        f"CausalNeg's value is {CAUSALNEG_QEM_LAMBDA} (default: %(default)s, REPAIR's plain InfoNCE)")
    g.add_argument("--qem_tau", type=positive_float, default=_default("qem_tau"),
                   help="QEM entropy temperature tau_ent (default: %(default)s)")
    g.add_argument("--seed", type=seed_int, default=_default("seed"), help="seed of init, dropout and data order")
    g = p.add_argument_group("runtime")
    g.add_argument("--output_dir", required=True, help="folder for the adapter, checkpoints/ and train_log.jsonl")
    g.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output_dir")
    g.add_argument("--overwrite_output_dir", action="store_true", help="delete an earlier run in --output_dir")
    g.add_argument("--save_steps", type=non_negative_int, default=_default("save_steps"),
                   help="checkpoint every N optimizer steps, 0 = only at the end (default: %(default)s)")
    g.add_argument("--save_total_limit", type=non_negative_int, default=_default("save_total_limit"),
                   help="keep only the newest N checkpoints, 0 = all (default: %(default)s)")
    g.add_argument("--last_step", type=bounded_int(-1), default=_default("last_step"),
                   help="end this run at step N of its schedule (--max_steps / --epochs set the schedule's length) "
                        "and save the model there as a finished run; -1 = the schedule's end (default: %(default)s)")
    g.add_argument("--continue_from", default=None, metavar="RUN_DIR",
                   help="go on from where another finished run of the same schedule ended (its weights, optimizer, "
                        "LR schedule, RNG and step; e.g. one trained with --last_step) on this run's data, to "
                        "--last_step; same --max_steps, batch, lr, warmup, seed and model shape required")
    g.add_argument("--stop_after_steps", type=positive_int, default=None,
                   help="leave after N steps of this invocation with a checkpoint (for time-limited jobs; "
                        "continue with --resume)")
    g.add_argument("--logging_steps", type=positive_int, default=_default("logging_steps"),
                   help="log a line every N steps (default: %(default)s); train_log.jsonl gets every step")
    g.add_argument("--logging_dir", default=None, help="TensorBoard folder (default: <output_dir>/runs)")
    g.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    g.add_argument("--base_dtype", default=_default("base_dtype"), choices=BASE_DTYPES,
                   help="dtype of the frozen base weights; auto = bf16 on CUDA for LoRA, else fp32")
    g.add_argument("--gradient_checkpointing", default=_default("gradient_checkpointing"),
                   choices=["auto", "on", "off"],
                   help="activation checkpointing in the graph pass: one extra forward for a fraction of the "
                        "activation memory, same gradients; auto = on where the model supports it, CPU included "
                        "(default: %(default)s)")
    g.add_argument("--no_progress", action="store_true", help="no tqdm bar")
    g.add_argument("--log_level", default="INFO")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {k: v for k, v in vars(args).items() if k in D}
    if args.lora_target_modules:
        values["lora_target_modules"] = [m.strip() for m in args.lora_target_modules.split(",") if m.strip()]
    values["show_progress"] = not args.no_progress
    return TrainConfig(**values)


def command_line(argv: list[str] | None) -> str:
    """This run's command as a reader reruns it from the repository root (the model card's "Reproduce")."""
    script = Path(__file__).resolve()
    return shlex.join(["python", os.path.relpath(script, script.parents[1]),
                       *(sys.argv[1:] if argv is None else argv)])


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.command = command_line(argv)
    # Large CPU tensors page-aligned + transparent huge pages: glibc then reuses the memory freed between the
    # layers of the graph pass instead of growing the heap (the CPU demo's peak: 6.7 GB -> 3.0 GB, same step
    # time; docs/training.md "Memory"). PyTorch reads this once, at the process's first CPU allocation, which
    # has not happened yet here; THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    setup_logging(args.log_level)
    with process_group(args.device):  # torchrun: join the group (NCCL on GPUs, gloo on CPU), leave it after
        result = train(config_from_args(args))
    if int(os.environ.get("RANK", "0")) == 0:
        # the model card (+ a full fine-tune's sentence-transformers files), read from the saved folder's files; also
        # when the run had already finished, so a run killed after saving and before its card completes the folder
        finish_trained_folder(args.output_dir)
        print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    run_script(main)
