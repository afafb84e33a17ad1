"""What every local generation engine shares (transformers' :class:`~repair.expansion.generation.HFGenerator` and
CTranslate2's :class:`~repair.expansion.ct2_generation.CT2Generator`): the prompt type, the tokenizer set up for
left-padded generation, a prompt rendered through the chat template, and a retriever's LoRA adapter merged into the
causal LM. Apart from :mod:`repair.expansion.generation` so the engines import it, not each other (the backend
factory there picks the engine: one direction, no cycle).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Union

logger = logging.getLogger(__name__)

Prompt = Union[str, list[dict]]


def _adapter_targets_inner_model(adapter: str | os.PathLike) -> bool:
    """True when the adapter was saved on a bare decoder (``AutoModel``: keys ``base_model.model.layers.*``),
    as REPAIR's retriever adapters are; False for one saved on a causal LM (``base_model.model.model.*``)."""
    from safetensors import safe_open

    path = Path(adapter) / "adapter_model.safetensors"
    if not path.exists():
        return True
    with safe_open(str(path), framework="pt") as fh:
        keys = list(fh.keys())
    return not any(k.startswith("base_model.model.model.") for k in keys)


def merge_adapter(model, adapter: str):
    """``model`` (a causal LM) with the LoRA ``adapter`` merged in: into the inner decoder when the adapter was
    saved on one (REPAIR's retriever adapters), else onto the causal LM itself."""
    from peft import PeftModel

    from repair.models import check_adapter_weights

    check_adapter_weights(adapter)  # a pickled adapter holding code: one line naming the file
    if _adapter_targets_inner_model(adapter):
        inner = model.get_decoder()
        merged = PeftModel.from_pretrained(inner, adapter).merge_and_unload()
        model.set_decoder(merged)
    else:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    logger.info("merged LoRA adapter %s into the generator", adapter)
    return model


def load_generation_tokenizer(path: str, model_name: str, chat_template: str = "auto",
                              trust_remote_code: bool = False):
    """(tokenizer, use_chat) as every local backend needs them: left padding, a pad token, and whether prompts
    are wrapped in the chat template (``auto``: when the tokenizer has one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"  # decoder-only generation continues from the last real token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "on" and not has_template:
        raise ValueError(f"{model_name}: the tokenizer has no chat template (use chat_template='off')")
    return tokenizer, (has_template if chat_template == "auto" else chat_template == "on")


def format_prompt(tokenizer, use_chat: bool, prompt: Prompt) -> str:
    """The exact text fed to a local model: the chat template applied, or the raw completion prompt."""
    if isinstance(prompt, list):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat messages given but the tokenizer has no chat template")
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    if use_chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt
