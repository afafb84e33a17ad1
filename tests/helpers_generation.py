"""A tiny random-weight causal LM (Qwen2ForCausalLM, hidden 64, 2 layers) with SmolLM2's real tokenizer and
chat template, for generation tests."""

from __future__ import annotations

from pathlib import Path

import torch


def build_tiny_causal(folder: Path, seed: int = 0) -> Path:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from repair.models import smollm2_folder

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
