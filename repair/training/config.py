"""The trainer's settings: :class:`TrainConfig`, where every training default is written once.

Apart from :mod:`repair.training.trainer` because it needs no torch: ``training/10_train_lora.py`` builds its flags from these
defaults, and the driver's settings table (:mod:`repair.driver.settings_table`) reads its Training defaults from here, so the
two cannot drift apart (they did: QEM's lambda was 0 in one and 0.1 in the other).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from repair.models import DEFAULT_MODEL

# CausalNeg's Query-View Entropy weight (its paper's best value): the driver sets it for NEGATIVES=causalneg. The
# trainer's own default is 0, REPAIR's plain InfoNCE (Eq. 8); QEM acts only on queries with generated negatives.
CAUSALNEG_QEM_LAMBDA = 0.1

# settings that fix the data order and the schedule: a resumed run must use the same ones
RESUME_KEYS = ("model", "init_adapter", "train_data", "split", "all_positives", "triplets", "num_hard_negatives",
               "max_examples", "global_batch_size", "epochs", "max_steps", "seed", "full_finetune", "lora_r",
               "lora_alpha", "lora_target_modules", "max_length", "instruction", "pooling", "last_step",
               "continue_from")
# settings a run that continues another run's schedule (--continue_from) must share with it: the schedule, the
# optimizer and the model's shape. The data may differ (that is the point), and so may the model's path: a
# continued run loads the very weights the other run ended with.
CONTINUE_KEYS = ("global_batch_size", "seed", "full_finetune", "lora_r", "lora_alpha", "lora_target_modules",
                 "max_length", "instruction", "pooling", "lr", "weight_decay", "max_grad_norm", "temperature",
                 "total_steps", "warmup_steps_used")
BASE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# fields that do not change the trained weights: where files go, how often to log or save, memory (mini-batches
# give the same gradients), the device, the progress bar. A resumed run may change these; every other field of
# TrainConfig is compared with the run it resumes (:func:`repair.training.checkpoints.resume_conflicts`, issue 44).
RUNTIME_KEYS = frozenset({"output_dir", "resume", "overwrite_output_dir", "save_steps", "save_total_limit",
                          "logging_steps", "logging_dir", "device", "show_progress", "command", "stop_after_steps",
                          "mini_batch_size", "gradient_checkpointing", "trust_remote_code"})


def epoch_steps(examples: int, global_batch_size: int, epochs: int = 1) -> int:
    """Optimizer steps of ``epochs`` passes over ``examples`` (the last batch of an epoch may be short). One
    definition for the trainer's schedule, the driver's ``ITER_STEPS=t0`` budget and the quality study's default
    ``--steps``, so "2 epochs of T0" is the same number everywhere."""
    return epochs * math.ceil(examples / global_batch_size)


@dataclass
class TrainConfig:
    """Every setting of a run (the CLI flags of ``training/10_train_lora.py``; defaults are the paper's)."""

    output_dir: str
    model: str = DEFAULT_MODEL
    init_adapter: str | None = None
    train_data: list[str] = field(default_factory=list)
    split: str = "train"
    all_positives: bool = False
    triplets: list[str] = field(default_factory=list)
    num_hard_negatives: int = 1
    max_examples: int | None = None
    instruction: str | None = None
    pooling: str | None = None
    max_length: int = 512
    epochs: int = 2
    max_steps: int = -1
    global_batch_size: int = 256
    mini_batch_size: int = 32
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    warmup_steps: int = -1
    max_grad_norm: float = 1.0
    temperature: float = 0.02
    qem_lambda: float = 0.0
    qem_tau: float = 0.1
    full_finetune: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] | None = None
    init_lora_weights: bool = True
    save_steps: int = 500
    save_total_limit: int = 2
    logging_steps: int = 10
    logging_dir: str | None = None
    seed: int = 42
    device: str | None = None
    base_dtype: str = "auto"
    gradient_checkpointing: str = "auto"
    trust_remote_code: bool = False
    resume: bool = False
    overwrite_output_dir: bool = False
    stop_after_steps: int | None = None
    # one schedule over several runs (issue 16, lever 4): this run ends at step last_step of its schedule (a finished
    # run, saved there), and a later run with continue_from = this folder goes on from that step with its own data
    last_step: int = -1
    continue_from: str | None = None
    show_progress: bool = True
    command: str | None = None  # the command line that started the run: the model card's "Reproduce" section

    def validate(self) -> None:
        if self.global_batch_size < 1 or self.mini_batch_size < 1:
            raise ValueError("--global_batch_size and --mini_batch_size must be >= 1")
        if self.temperature <= 0 or self.qem_tau <= 0:
            raise ValueError("--temperature and --qem_tau must be > 0")
        if self.epochs < 1 and self.max_steps <= 0:
            raise ValueError("--epochs must be >= 1 (or give --max_steps)")
        if self.base_dtype not in BASE_DTYPES:
            raise ValueError(f"--base_dtype must be auto|float32|bfloat16|float16, got {self.base_dtype!r}")
        if self.gradient_checkpointing not in ("auto", "on", "off"):
            raise ValueError("--gradient_checkpointing must be auto|on|off")
        if self.full_finetune and self.init_adapter:
            raise ValueError("--full_finetune and --init_adapter exclude each other (a full model is its own base)")
        if self.last_step == 0 or self.last_step < -1:
            raise ValueError(f"--last_step must be >= 1 (or -1: the schedule's end), got {self.last_step}")

    def base_dtype_on(self, device_type: str) -> str:
        """The base weights' dtype name: fp32 on CPU. On CUDA a frozen LoRA backbone is held in bf16 (adapters stay
        fp32, autocast bf16); full fine-tuning keeps fp32 master weights under bf16 autocast."""
        if self.base_dtype != "auto":
            return self.base_dtype
        return "bfloat16" if device_type == "cuda" and not self.full_finetune else "float32"
