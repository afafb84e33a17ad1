"""The REPAIR trainer (DESIGN 5 step 10; paper App. A.2): LoRA (or full) contrastive fine-tuning of a retriever.

One optimizer step = one global batch of examples, embedded by the foundation :class:`Retriever` (the very
code path inference uses), with the InfoNCE loss of Eq. 8 (+ CausalNeg's QEM) over all documents of the
batch, gradient-cached (:mod:`repair.training.gradcache`) so the global batch (256 in the paper) fits one device, and
spread over ``torchrun`` ranks with all-gathered negatives. AdamW, linear warmup + decay, gradient clipping.

Everything needed to continue is checkpointed (:mod:`repair.training.checkpoints`: trainable weights, optimizer,
scheduler, RNG, step); the data order of an epoch is a pure function of (seed, epoch), so the step number alone
says where to continue and a resumed run ends with the weights an uninterrupted run would have. The final folder is
a ``save_pretrained`` adapter (or full model) + tokenizer + ``training_args.json`` + ``train_log.jsonl`` (+ the
script's model card).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from repair.data import JsonlAppender, iter_appended_jsonl, read_json, write_json, write_jsonl
from repair.encoding import Retriever
from repair.training.gradcache import allreduce_gradients, contrastive_step
from repair.training.losses import contrastive_objective
from repair.models import ENCODER_MODEL_TYPES, ModelSpec
from repair.runtime import dist_info, pick_device, set_seed
from repair.training.checkpoints import (ARGS_FILE, CHECKPOINTS, TRAIN_LOG, barrier, continue_schedule,
                                         list_checkpoints, load_checkpoint, resume_conflicts, save_checkpoint,
                                         trainable_parameters, training_finished)
from repair.training.config import TrainConfig, epoch_steps
from repair.training.data import TrainingData, build_layout, epoch_order, load_training_data, stats_table

logger = logging.getLogger(__name__)

DECODER_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ENCODER_LORA_TARGETS = ("query", "key", "value", "dense")


# ---------------------------------------------------------------------------------------------- model
def lora_targets(model: torch.nn.Module, requested: Sequence[str] | None) -> list[str]:
    """LoRA target module names: the requested ones, else every attention + MLP projection of the
    architecture (decoder: q,k,v,o,gate,up,down; BERT-like encoder: query,key,value,dense) present in it."""
    present = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    if requested:
        missing = [t for t in requested if t not in present]
        if missing:
            raise ValueError(f"--lora_target_modules {missing} match no linear layer of this model "
                             f"(its linear layers: {sorted(present)})")
        return list(requested)
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    wanted = ENCODER_LORA_TARGETS if model_type in ENCODER_MODEL_TYPES else DECODER_LORA_TARGETS
    targets = [t for t in wanted if t in present]
    if not targets:
        raise ValueError(f"no default LoRA targets found in model type {model_type!r} (linear layers: "
                         f"{sorted(present)}); pass --lora_target_modules")
    return targets


def build_retriever(cfg: TrainConfig, device: torch.device) -> tuple[Retriever, ModelSpec]:
    """The inference door, :meth:`Retriever.load` with ``trainable=True`` (so pooling, text formats and an
    ``--init_adapter`` load exactly as they do for inference), plus what only a training run adds: a fresh LoRA (or
    every weight trainable), activation checkpointing, and the base path recorded in the adapter's config."""
    from peft import LoraConfig, get_peft_model

    retriever = Retriever.load(cfg.model, cfg.init_adapter, pooling=cfg.pooling, max_length=cfg.max_length,
                               device=device, dtype=getattr(torch, cfg.base_dtype_on(device.type)),
                               trust_remote_code=cfg.trust_remote_code, trainable=True)
    spec = retriever.spec
    model = base = retriever.model
    if cfg.full_finetune:
        if spec.adapter:
            raise ValueError(f"--full_finetune: {spec.adapter} is a LoRA adapter folder (a full model is its own base)")
        model.requires_grad_(True)
    else:
        if spec.adapter:  # --init_adapter (or an adapter folder given as --model), trainable
            base = model.get_base_model()
        else:  # LoRA weights are initialised on the CPU generator (peft), wherever the base lives
            lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                              target_modules=lora_targets(base, cfg.lora_target_modules), bias="none",
                              init_lora_weights=cfg.init_lora_weights, base_model_name_or_path=spec.path)
            model = retriever.model = get_peft_model(base, lora).to(device)
        model.peft_config["default"].base_model_name_or_path = spec.path
    if uses_activation_checkpointing(cfg, base):
        enable_activation_checkpointing(base)
    model.train()
    return retriever, spec


def uses_activation_checkpointing(cfg: TrainConfig, model: torch.nn.Module) -> bool:
    """Whether the graph pass recomputes activations (``auto``: on, CPU included, when the model supports it).

    Without it, autograd keeps every layer's activations of a whole mini-batch until the backward pass: in
    the CPU demo (SmolLM2-135M + LoRA, 16 queries + ~24 documents, 128 tokens) 7.5 GB of its 12 GB peak, far
    beyond the 0.5 GB of weights. With it, only each layer's input is kept (0.25 GB) and one layer at a time
    is recomputed in backward: one extra forward pass, the same gradients bit for bit (non-reentrant
    checkpointing replays the dropout RNG). docs/training.md ("Memory") has the measurements.
    """
    if cfg.gradient_checkpointing == "off":
        return False
    if getattr(model, "supports_gradient_checkpointing", False):
        return True
    if cfg.gradient_checkpointing == "on":
        raise ValueError(f"--gradient_checkpointing on: {type(model).__name__} does not support gradient "
                         f"checkpointing; use auto or off")
    logger.info("%s does not support gradient checkpointing: activations are kept for the backward pass",
                type(model).__name__)
    return False


def enable_activation_checkpointing(model) -> None:
    """Recompute activations in backward (App. A.2: gradient checkpointing); non-reentrant, so a frozen
    embedding layer needs no input-grad hack. transformers >= 5 renamed the method."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def build_optimizer(named: list[tuple[str, torch.nn.Parameter]], cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (App. A.2); biases and normalisation weights are not decayed (the usual BERT/HF practice)."""
    decay = [p for n, p in named if p.ndim >= 2 and "norm" not in n.lower()]
    no_decay = [p for n, p in named if not (p.ndim >= 2 and "norm" not in n.lower())]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)


def linear_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup from 0 to lr over ``warmup`` steps, then linear decay to 0 at ``total`` (transformers'
    schedule, so runs compare with sentence-transformers / HF Trainer runs that use the same flags)."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, warmup, total)


# ---------------------------------------------------------------------------------------------- the output folder
def _trim_log(path: Path, step: int) -> None:
    """Drop log lines of steps after the checkpoint (a killed run may have logged past it)."""
    if path.exists():
        write_jsonl(path, [row for row in iter_appended_jsonl(path) if row.get("step", 0) <= step])


def _check_output_dir(cfg: TrainConfig, output_dir: Path) -> bool:
    """Whether the folder holds an earlier run; refuse to mix runs unless --resume or --overwrite_output_dir."""
    busy = bool(training_finished(output_dir) or list_checkpoints(output_dir) or (output_dir / TRAIN_LOG).exists())
    if busy and not (cfg.resume or cfg.overwrite_output_dir):
        raise FileExistsError(f"{output_dir} already holds a run; pass --resume to continue it or "
                              f"--overwrite_output_dir to start over")
    return busy


def _clear_output_dir(output_dir: Path) -> None:
    for name in (CHECKPOINTS, TRAIN_LOG, ARGS_FILE, "runs", "adapter_config.json", "adapter_model.safetensors",
                 "config.json", "model.safetensors", "README.md", "modules.json"):
        target = output_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


# ---------------------------------------------------------------------------------------------- loop
def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def run_settings(cfg: TrainConfig, spec: ModelSpec, retriever: Retriever, data: TrainingData, world: int,
                 total_steps: int, warmup: int, lora_modules: list[str] | None) -> dict:
    """training_args.json: the flags, what they resolved to, and the data that was read."""
    import peft
    import transformers

    out = asdict(cfg)
    out.update({
        "model_alias": spec.name, "base_model_name_or_path": spec.path, "pooling": retriever.pooling,
        "text_format": retriever.text_format.__dict__,
        "instruction_used": retriever.text_format.instruction if cfg.instruction is None else cfg.instruction,
        "padding_side": retriever.padding_side, "lora_target_modules_used": lora_modules, "world_size": world,
        "total_steps": total_steps, "warmup_steps_used": warmup, "examples": len(data),
        "data_sources": [asdict(s) for s in data.sources],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
    })
    return out


def optimizer_step(retriever: Retriever, layout, cfg: TrainConfig, optimizer, scheduler,
                   params: list[torch.nn.Parameter], rank: int, world: int, autocast: torch.dtype | None) -> dict:
    """One optimizer step on one global batch: gradient-cached forward/backward, cross-rank gradient sum,
    clipping, AdamW, schedule. Returns the step's statistics (lr is the one the step used)."""
    targets = layout.targets.to(retriever.device)
    t0, cpu0 = time.perf_counter(), time.process_time()
    optimizer.zero_grad(set_to_none=True)
    stats = contrastive_step(
        retriever, layout,
        lambda q, d: contrastive_objective(q, d, targets, cfg.temperature, cfg.qem_lambda, cfg.qem_tau),
        mini_batch_size=cfg.mini_batch_size, instruction=cfg.instruction, rank=rank, world=world,
        autocast_dtype=autocast)
    allreduce_gradients(params, world)
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    return {"lr": lr, "grad_norm": float(norm), **stats, "queries": layout.n_queries,
            "documents": len(layout.documents), "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - cpu0}


class StepLog:
    """Rank 0's record of every step: ``train_log.jsonl`` (one line per step), TensorBoard scalars, and a
    stdout line every ``logging_steps``. On resume, lines logged after the checkpoint are dropped first."""

    def __init__(self, output_dir: Path, cfg: TrainConfig, start_step: int):
        path = output_dir / TRAIN_LOG
        if start_step:
            _trim_log(path, start_step)
        elif path.exists():
            path.unlink()
        self.every = max(1, cfg.logging_steps)
        self.appender = JsonlAppender(path, fsync=False)
        self.writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(cfg.logging_dir or str(output_dir / "runs"),
                                        purge_step=start_step + 1 if start_step else None)
        except ImportError:  # tensorboard is in requirements.txt; keep training if a user removed it
            logger.warning("tensorboard is not installed: logging to stdout and %s only", TRAIN_LOG)

    def write(self, row: dict, total_steps: int) -> None:
        step = row["step"]
        self.appender.append(row)
        if self.writer is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"train/{key}", value, step)
        if step % self.every == 0 or step == total_steps:
            logger.info("step %d/%d loss %s lr %.3g gnorm %s pos %s neg %s w[mined] %s w[gen] %s w[in-batch] %s "
                        "%.2fs", step, total_steps, _fmt(row["loss"]), row["lr"], _fmt(row["grad_norm"]),
                        _fmt(row["pos_sim"]), _fmt(row["neg_sim"]), _fmt(row["weight_mined"]),
                        _fmt(row["weight_generated"]), _fmt(row["weight_in_batch"]), row["seconds"])

    def close(self) -> None:
        self.appender.close()
        if self.writer is not None:
            self.writer.close()


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns a summary. Works in one process or under an initialised
    torch.distributed group (``torchrun``), where every rank calls it with the same config."""
    cfg.validate()
    rank, world = dist_info()
    output_dir = Path(cfg.output_dir)
    conflicts = resume_conflicts(cfg, output_dir) if cfg.resume and not cfg.overwrite_output_dir else []
    if conflicts:  # before "already finished": a finished folder made with other settings is not this run's result
        raise ValueError(f"{output_dir}: cannot --resume a run made with other settings ({'; '.join(conflicts)}); "
                         "rerun with its settings, or start over with --overwrite_output_dir or a new --output_dir")
    if cfg.resume and not cfg.overwrite_output_dir and training_finished(output_dir):
        logger.info("%s: training already finished; nothing to resume", output_dir)
        return {**read_json(output_dir / ARGS_FILE).get("result", {}), "status": "already_finished"}
    busy = _check_output_dir(cfg, output_dir)  # every rank checks, so every rank raises alike
    barrier(world)
    if rank == 0:
        if busy and cfg.overwrite_output_dir:
            _clear_output_dir(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
    barrier(world)
    device = pick_device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    set_seed(cfg.seed)
    data = load_training_data(cfg.train_data, cfg.triplets, split=cfg.split, all_positives=cfg.all_positives,
                              num_hard_negatives=cfg.num_hard_negatives, max_examples=cfg.max_examples)
    if rank == 0:
        logger.info("training data:\n%s", stats_table(data))
    retriever, spec = build_retriever(cfg, device)
    set_seed(cfg.seed + rank)  # identical weights on every rank above; own dropout stream per rank from here
    named = trainable_parameters(retriever.model)
    params = [p for _, p in named]
    if world > 1:
        for p in params:
            torch.distributed.broadcast(p.data, src=0)
    lora_modules = None if cfg.full_finetune else sorted(retriever.model.peft_config["default"].target_modules)
    optimizer = build_optimizer(named, cfg)
    steps_per_epoch = epoch_steps(len(data), cfg.global_batch_size)
    total_steps = cfg.max_steps if cfg.max_steps > 0 else epoch_steps(len(data), cfg.global_batch_size, cfg.epochs)
    warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else math.ceil(cfg.warmup_ratio * total_steps)
    scheduler = linear_schedule(optimizer, warmup, total_steps)
    end_step = total_steps if cfg.last_step < 0 else cfg.last_step
    if end_step > total_steps:
        raise ValueError(f"--last_step {cfg.last_step} is past the end of the schedule ({total_steps} steps)")
    settings = run_settings(cfg, spec, retriever, data, world, total_steps, warmup, lora_modules)
    settings["end_step"] = end_step

    step = 0
    ckpts = list_checkpoints(output_dir) if cfg.resume else []
    if ckpts:
        step = load_checkpoint(ckpts[-1], retriever, optimizer, scheduler, cfg, rank)
        logger.info("resumed from %s (step %d of %d)", ckpts[-1], step, end_step)
    elif cfg.continue_from:
        step = continue_schedule(Path(cfg.continue_from), settings, retriever, optimizer, scheduler, cfg, rank)
        if step >= end_step:
            raise ValueError(f"--continue_from {cfg.continue_from} ended at step {step}: nothing left before step "
                             f"{end_step} (raise --last_step or --max_steps)")
        logger.info("continuing %s's schedule from step %d to step %d of %d on this run's data",
                    cfg.continue_from, step, end_step, total_steps)
    elif cfg.resume:
        logger.info("--resume: no checkpoint in %s, starting from step 0", output_dir)
    if cfg.continue_from:  # where this run's own steps begin (also after a resume of it)
        source_ckpts = list_checkpoints(cfg.continue_from)
        settings["continued_from_step"] = read_json(source_ckpts[-1] / "state.json")["step"] if source_ckpts else None
    step_log = StepLog(output_dir, cfg, step) if rank == 0 else None
    if rank == 0:
        write_json(output_dir / ARGS_FILE, settings)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    bar = tqdm(total=end_step, initial=step, desc="train", unit="step",
               disable=rank != 0 or not cfg.show_progress, mininterval=1.0)
    stopped_early = False
    steps_this_run = 0
    last: dict = {}
    order, order_epoch = None, -1
    try:
        while step < end_step:
            epoch, b = divmod(step, steps_per_epoch)
            if epoch != order_epoch:
                order, order_epoch = epoch_order(len(data), cfg.seed, epoch), epoch
            batch = [data.examples[i] for i in order[b * cfg.global_batch_size:(b + 1) * cfg.global_batch_size]]
            last = optimizer_step(retriever, build_layout(batch, data.positives_of, world), cfg, optimizer,
                                  scheduler, params, rank, world, autocast)
            step += 1
            steps_this_run += 1
            last = {"step": step, "epoch": epoch + (b + 1) / steps_per_epoch, **last}
            if step_log is not None:
                step_log.write(last, end_step)
                bar.update(1)
                bar.set_postfix(loss=f"{last['loss']:.4f}", lr=f"{last['lr']:.2e}")
            stop_now = cfg.stop_after_steps is not None and steps_this_run >= cfg.stop_after_steps and step < end_step
            if (cfg.save_steps > 0 and step % cfg.save_steps == 0 and step < end_step) or stop_now:
                save_checkpoint(output_dir, step, retriever, optimizer, scheduler, cfg, rank, world)
            if stop_now:
                stopped_early = True
                logger.info("stopping after %d steps as asked (--stop_after_steps); continue with --resume", step)
                break
    finally:
        bar.close()
        if step_log is not None:
            step_log.close()

    result = {"status": "stopped" if stopped_early else "finished", "step": step, "total_steps": total_steps,
              "last_loss": last.get("loss"), "output_dir": str(output_dir)}
    if not stopped_early:
        save_checkpoint(output_dir, step, retriever, optimizer, scheduler, cfg, rank, world)
        if rank == 0:
            save_final(output_dir, retriever, {**settings, "result": result})
        barrier(world)
    return result


def save_final(output_dir: Path, retriever: Retriever, settings: dict) -> None:
    """``save_pretrained`` adapter (or full model) + tokenizer + training_args.json, loadable as in the README.
    training_args.json with the result goes last: it is what marks the folder finished (:func:`training_finished`)."""
    retriever.model.save_pretrained(output_dir)
    retriever.tokenizer.save_pretrained(output_dir)
    write_json(output_dir / ARGS_FILE, settings)
    logger.info("saved %s to %s", "model" if settings.get("full_finetune") else "adapter", output_dir)
