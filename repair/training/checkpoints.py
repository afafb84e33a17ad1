"""The trainer's checkpoints and the record of a run (DESIGN 5 step 10): what ``checkpoints/step-N`` holds
(trainable weights, optimizer, scheduler, every rank's RNG, the step and the settings a resume must keep), how it is
written (a temp folder renamed last, so a half-written one never has the name), how a run resumes or continues
another run's schedule from one, and when a folder holds a finished run (:func:`training_finished`, which
orchestrators ask).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from repair.data import load_torch_file, read_json, write_json
from repair.encoding import Retriever
from repair.runtime import set_seed
from repair.training.config import CONTINUE_KEYS, RESUME_KEYS, RUNTIME_KEYS, TrainConfig

logger = logging.getLogger(__name__)

CHECKPOINTS, TRAIN_LOG, ARGS_FILE = "checkpoints", "train_log.jsonl", "training_args.json"


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """What the optimizer steps and a checkpoint saves (LoRA: the adapter's weights only)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _rng_snapshot(device: torch.device) -> dict:
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python": [py_state[0], list(py_state[1]), py_state[2]]}


def _restore_rng(snap: dict, device: torch.device) -> None:
    torch.set_rng_state(snap["torch"])
    if snap.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(snap["cuda"], device)
    n = snap["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = snap["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (``state.json`` present), oldest first. Half-written ones never get this name."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [d for d in root.glob("step-*") if (d / "state.json").exists()]
    return sorted(found, key=lambda d: int(d.name.split("-")[1]))


def barrier(world: int) -> None:
    """Wait for every rank (no-op in a one-process run)."""
    if world > 1:
        torch.distributed.barrier()


def save_checkpoint(output_dir: Path, step: int, retriever: Retriever, optimizer, scheduler, cfg: TrainConfig,
                    rank: int, world: int) -> Path:
    """Write ``checkpoints/step-N`` atomically: into a temp folder (every rank adds its RNG state), renamed last."""
    root = output_dir / CHECKPOINTS
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}"
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier(world)
    torch.save(_rng_snapshot(retriever.device), tmp / f"rng-rank{rank}.pt")
    barrier(world)
    if rank == 0:
        model = retriever.model
        torch.save({n: p.detach().cpu() for n, p in trainable_parameters(model)}, tmp / "trainable.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if not cfg.full_finetune:  # a checkpoint is also a loadable adapter (small), for mid-run evaluation
            model.save_pretrained(tmp)
            retriever.tokenizer.save_pretrained(tmp)
        write_json(tmp / "state.json", {"step": step, "world_size": world, "time": time.time(),
                                        "settings": {k: getattr(cfg, k) for k in RESUME_KEYS}})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in list_checkpoints(output_dir)[:-cfg.save_total_limit] if cfg.save_total_limit > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(world)
    return final


def load_checkpoint(ckpt: Path, retriever: Retriever, optimizer, scheduler, cfg: TrainConfig, rank: int) -> int:
    """Restore weights, optimizer, scheduler and this rank's RNG; return the step to continue from."""
    saved = read_json(ckpt / "state.json").get("settings", {})
    changed = {k: (saved.get(k), getattr(cfg, k)) for k in RESUME_KEYS if k in saved and saved[k] != getattr(cfg, k)}
    if changed:
        detail = "; ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"{ckpt}: cannot resume with different settings ({detail}); use a new --output_dir")
    return _restore_state(ckpt, retriever, optimizer, scheduler, cfg, rank)


def continue_schedule(source: Path, settings: dict, retriever: Retriever, optimizer, scheduler, cfg: TrainConfig,
                      rank: int) -> int:
    """--continue_from: start where another run of the same schedule ended (its last checkpoint: weights, AdamW
    moments, LR schedule, RNG, step), with this run's data. Why: a plain run trained for 2N steps and a run that stops
    at step N, is diagnosed, and goes on with REPAIR's tuples added then share their first N steps exactly, so the
    plain run is the exact control and no learning-rate warmup is repeated (a second schedule restarts the warmup
    and the optimizer). The other run's settings must agree on :data:`CONTINUE_KEYS`; its data may differ."""
    ckpts = list_checkpoints(source)
    if not training_finished(source) or not ckpts:
        raise ValueError(f"--continue_from {source}: not a finished training run with a checkpoint (train it with "
                         f"--last_step, or to its end, first)")
    theirs = read_json(source / ARGS_FILE)
    changed = {k: (theirs.get(k), settings.get(k)) for k in CONTINUE_KEYS if theirs.get(k) != settings.get(k)}
    if changed:
        detail = "; ".join(f"{k}: {source} has {a!r}, this run {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"--continue_from: the schedules differ ({detail}); a continued run needs the same "
                         f"--max_steps, batch, learning rate, warmup, seed and model shape")
    return _restore_state(ckpts[-1], retriever, optimizer, scheduler, cfg, rank)


def _restore_state(ckpt: Path, retriever: Retriever, optimizer, scheduler, cfg: TrainConfig, rank: int) -> int:
    state = read_json(ckpt / "state.json")
    weights = load_torch_file(ckpt / "trainable.pt")
    params = dict(trainable_parameters(retriever.model))
    if set(weights) != set(params):
        raise ValueError(f"{ckpt}/trainable.pt does not hold this model's trainable parameters")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name].to(p.device, p.dtype))
    optimizer.load_state_dict(load_torch_file(ckpt / "optimizer.pt", map_location=retriever.device))
    scheduler.load_state_dict(load_torch_file(ckpt / "scheduler.pt"))
    rng_file = ckpt / f"rng-rank{rank}.pt"
    if rng_file.exists():
        _restore_rng(load_torch_file(rng_file), retriever.device)
    else:
        logger.warning("%s: no RNG state for rank %d (world size changed?); dropout streams restart", ckpt, rank)
        set_seed(cfg.seed + rank + int(state["step"]))
    return int(state["step"])


def training_finished(output_dir: str | os.PathLike) -> bool:
    """A finished run: the saved model or adapter and its arguments with the result, which
    :func:`repair.training.trainer.save_final` writes last (a run killed while saving is not finished: ``--resume``
    saves it again). Orchestrators ask this."""
    output_dir = Path(output_dir)
    saved = (output_dir / "adapter_config.json").exists() or (output_dir / "config.json").exists()
    try:
        result = read_json(output_dir / ARGS_FILE).get("result") if saved else None
    except (OSError, ValueError, AttributeError):  # missing, or not a JSON object
        return False
    return isinstance(result, dict) and result.get("status") == "finished"


def resume_conflicts(cfg: TrainConfig, output_dir: Path) -> list[str]:
    """What a ``--resume`` of ``output_dir`` would change: each field of :class:`TrainConfig` outside
    :data:`RUNTIME_KEYS` whose value in the folder's ``training_args.json`` (written when a run starts, rewritten
    with the result when it ends) differs from ``cfg``'s, as ``lr: the folder was trained with 0.0001, now 0.0005``.
    Fields an older record lacks are not compared. Why: a resume (or a finished folder returned as it is) under
    other settings would hand back weights the new settings did not make (issue 44: FORCE=1 with a new LR kept the
    old adapter)."""
    path = output_dir / ARGS_FILE
    if not path.is_file():
        return []
    try:
        recorded = read_json(path)
    except ValueError as exc:
        raise ValueError(f"{path}: unreadable ({exc}); --overwrite_output_dir starts the run over") from None
    if not isinstance(recorded, dict):
        raise ValueError(f"{path}: not a JSON object; --overwrite_output_dir starts the run over")
    now = json.loads(json.dumps(asdict(cfg)))  # as the record holds it (lists, floats)
    return [f"{key}: the folder was trained with {recorded[key]!r}, now {value!r}" for key, value in now.items()
            if key not in RUNTIME_KEYS and key in recorded and recorded[key] != value
            and not (key == "pooling" and value is None)]  # the record holds the pooling "auto" resolved to
