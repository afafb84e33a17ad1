"""Shared fixtures: a tiny random-weight Qwen2 model with a real tokenizer (SmolLM2's BPE), built once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests use local folders only; never wait on the hub
torch.set_num_threads(min(2, torch.get_num_threads()))

from tests.helpers_generation import save_tiny_qwen2  # noqa: E402  (after ROOT is on sys.path)


def build_tiny_qwen2(folder: Path, seed: int = 0, pad_token: bool = True) -> Path:
    """Random Qwen2 encoder (hidden 64, 2 layers) saved with the SmolLM2 tokenizer; fp32 on CPU."""
    return save_tiny_qwen2(folder, "Qwen2Model", seed=seed, pad_token=pad_token, use_cache=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Tiny Qwen2 whose tokenizer has a pad token (= EOS): right padding."""
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="session")
def tiny_model_dir_nopad(tmp_path_factory) -> Path:
    """Tiny Qwen2 whose tokenizer has no pad token: the contract pads with EOS on the left."""
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2_nopad"), pad_token=False)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Many small ops: on a shared 2-core machine one thread is much faster than two spinning OpenMP threads.
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
