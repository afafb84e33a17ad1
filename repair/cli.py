"""Command-line pieces every script that loads a retriever shares: the model flags, the retriever they
describe, and a clean exit on a user error (message on stderr, no traceback)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from .encoding import Retriever
from .runtime import cache_root


def add_retriever_args(parser: argparse.ArgumentParser, default_model: str = "smollm2-135m") -> None:
    """``--model`` (alias ``--model_path``), ``--adapter``, ``--max_length``, ``--batch_size``, ``--pooling``,
    ``--device``, ``--cache_dir``, ``--trust_remote_code``."""
    g = parser.add_argument_group("model")
    g.add_argument("--model", "--model_path", dest="model", default=default_model,
                   help="base model: HF id, local folder, or alias smollm2-135m (EOS pooling, instruction format) "
                        "| minilm (mean pooling, plain text); a LoRA adapter folder given here is read as --adapter "
                        "on its base model (default: %(default)s)")
    g.add_argument("--adapter", default=None, help="LoRA adapter folder to apply on the base model")
    g.add_argument("--max_length", type=int, default=512, help="max tokens per text incl. EOS (default: %(default)s)")
    g.add_argument("--batch_size", type=int, default=32, help="texts per forward pass (default: %(default)s)")
    g.add_argument("--pooling", default=None, choices=["eos", "mean"],
                   help="override the model's pooling profile (default: eos for decoders, mean for encoders)")
    g.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    g.add_argument("--cache_dir", default=None,
                   help="embedding cache folder (default: $REPAIR_CACHE/embeddings); 'none' disables it")
    g.add_argument("--trust_remote_code", action="store_true", help="allow model code from the model folder/hub")


def embedding_cache_dir(value: str | None) -> Path | None:
    """``--cache_dir``: None -> the default cache, 'none' -> no cache, else the folder given."""
    if value is None or value == "":
        return cache_root() / "embeddings"
    if value.lower() == "none":
        return None
    return Path(value)


def split_adapter(model: str, adapter: str | None) -> tuple[str, str | None]:
    """Accept an adapter folder passed as the model (REPAIR's eval_mesh.py did: it read the base model from
    ``adapter_config.json``); returns (base model, adapter)."""
    folder = Path(model)
    if adapter is None and (folder / "adapter_config.json").exists():
        import json

        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base:
            fail(f"{folder / 'adapter_config.json'}: field 'base_model_name_or_path' is missing; pass --model BASE "
                 f"--adapter {folder}")
        return base, str(folder)
    return model, adapter


def load_retriever(args: argparse.Namespace) -> Retriever:
    """The retriever the model flags describe."""
    model, adapter = split_adapter(args.model, args.adapter)
    args.model, args.adapter = model, adapter
    return Retriever.load(model, adapter, pooling=args.pooling, max_length=args.max_length, device=args.device,
                          cache_dir=embedding_cache_dir(args.cache_dir), trust_remote_code=args.trust_remote_code,
                          batch_size=args.batch_size)


def model_fields(args: argparse.Namespace, retriever: Retriever) -> dict:
    """What a result file says about the model that produced it."""
    return {"model": args.model, "adapter": args.adapter, "pooling": retriever.pooling,
            "max_length": retriever.max_length, "fingerprint": retriever.fingerprint()}


def fail(message: str, code: int = 2) -> NoReturn:
    """Exit on a user error with one clear line on stderr (no traceback)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)
