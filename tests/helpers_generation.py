"""Tiny random-weight Qwen2 models (hidden 64, 2 layers) with SmolLM2's real tokenizer and chat template: the
encoder the retriever tests load (:func:`save_tiny_qwen2`, used by conftest) and a causal LM for generation tests."""

from __future__ import annotations

from pathlib import Path

import torch


def save_tiny_qwen2(folder: Path, model_class_name: str, *, seed: int = 0, pad_token: bool = True,
                    **config_extra) -> Path:
    """A random ``transformers.<model_class_name>`` (a Qwen2 class) saved with the SmolLM2 tokenizer; fp32."""
    import transformers
    from transformers import AutoTokenizer, Qwen2Config

    from repair.models import smollm2_folder

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    if not pad_token:
        tok.pad_token = None
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                         pad_token_id=tok.pad_token_id, **config_extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class_name)(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_tiny_causal(folder: Path, seed: int = 0) -> Path:
    return save_tiny_qwen2(folder, "Qwen2ForCausalLM", seed=seed, tie_word_embeddings=True)
