"""Process-level helpers: logging, seeding, device and dtype choice, cache locations, the torch.distributed group."""

from __future__ import annotations

import logging
import os
import random
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # torch is imported where it is used: scripts that never touch a model (the API
    import torch  # stages, 06) start in a fraction of a second instead of paying torch's import time

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | int = "INFO") -> None:
    """Configure root logging once for a script (the library itself only creates loggers)."""
    if isinstance(level, str):
        level = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt="%H:%M:%S")
    quiet_transformers()


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (all devices) so sampling and shuffles repeat."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def pick_device(device: str | None = None) -> torch.device:
    """`None`/"auto" -> cuda when available, else cpu. Under torchrun, the local rank's GPU."""
    import torch

    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    chosen = torch.device(device)
    if chosen.type == "cuda" and chosen.index is None:
        # "cuda" means this process's GPU: torch.cuda.set_device (the trainer) refuses a device without an index
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return chosen


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA; fp32 on CPU, where bf16 matmuls are ~5x slower on AVX2 machines (DESIGN 8)."""
    import torch

    return torch.bfloat16 if device.type == "cuda" else torch.float32


def cache_root() -> Path:
    """Root of REPAIR's on-disk caches: $REPAIR_CACHE, else ~/.cache/repair."""
    root = os.environ.get("REPAIR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "repair")
    return Path(root)


def cache_dir_flag(value: str | os.PathLike | None, default: Path) -> Path | None:
    """A ``--cache_dir`` value: unset or "" -> ``default``, "none" (any case) -> no cache, else that folder.

    Every script's cache flag goes through here, so "none" never becomes a folder named ``none``.
    """
    if value is None or str(value) == "":
        return Path(default)
    if str(value).lower() == "none":
        return None
    return Path(value)


def dist_info() -> tuple[int, int]:
    """(rank, world_size) of an initialised torch.distributed group, else (0, 1)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


@contextmanager
def process_group(device: str | None = None) -> Iterator[bool]:
    """Inside the block this process is in the torch.distributed group its environment describes (torchrun, or
    the workers step 7 spawns); yields whether it joined here.

    Joins only when WORLD_SIZE > 1 and no group is initialised yet, and then leaves the group on exit; a group
    someone else started is left alone. Backend: NCCL when CUDA is available and ``device`` is unset or a CUDA
    device (this rank's GPU, LOCAL_RANK, is selected first), else gloo (CPU workers, tests). One rule for step 7
    and the trainer, so both pick the same backend for the same flags.
    """
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    joined = world > 1 and not torch.distributed.is_initialized()
    if joined:
        use_nccl = torch.cuda.is_available() and (not device or str(device).startswith("cuda"))
        if use_nccl:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.distributed.init_process_group(backend="nccl" if use_nccl else "gloo")
    try:
        yield joined
    finally:
        if joined:
            torch.distributed.destroy_process_group()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (for MASTER_PORT of spawned workers, or a local server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def quiet_transformers() -> None:
    """Silence transformers' per-load progress bars and info chatter in scripts (our tqdm bars stay), and peft's
    FutureWarning on every adapter load (it reads transformers' deprecated ``is_gradient_checkpointing``)."""
    import warnings

    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_warning()
    except ImportError:  # pragma: no cover
        pass
