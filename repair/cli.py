"""Command-line pieces every script shares: the one entry point (:func:`run_script`: a user error ends in one
``error:`` line on stderr and exit status 2, the traceback only with ``--debug``), the model flags and the
retriever they describe.

This module imports no torch at import time: the API stages (06) use :func:`run_script` and start in a fraction of
a second.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

from .runtime import cache_dir_flag, cache_root

if TYPE_CHECKING:
    from .encoding import Retriever

DEBUG_FLAG = "--debug"
DEBUG_ENV = "REPAIR_DEBUG"
# Exceptions that report bad input or a bad setting, not a bug: "module: class name". Checked through sys.modules
# so that this module imports none of them (an exception of a module never imported cannot have been raised).
USER_ERROR_CLASSES = (
    ("repair.data", "DataError"),                  # malformed input file (names file, line, field)
    ("repair.diagnosis", "RunMismatchError"),      # a stage's input comes from another run / percentile
    ("repair.sources.http", "SourceError"),        # an external service refused (bad key, quota)
    ("repair.models", "ModelError"),               # a model name that resolves to nothing
)


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
    """``--cache_dir``: None -> ``$REPAIR_CACHE/embeddings``, 'none' -> no cache, else the folder given."""
    return cache_dir_flag(value, cache_root() / "embeddings")


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
    from .encoding import Retriever

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


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` reports bad input or a bad setting (shown as one line) rather than a bug (traceback).

    ``OSError`` covers missing/unreadable files and folders; ``ValueError`` covers bad values and
    ``DataError``/``json.JSONDecodeError``; the project's own error classes are :data:`USER_ERROR_CLASSES`.
    """
    if isinstance(exc, (OSError, ValueError)):
        return True
    for module_name, class_name in USER_ERROR_CLASSES:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(exc, getattr(module, class_name)):
            return True
    return False


def one_line(message: str) -> str:
    """A message on one line (some libraries raise paragraphs); the first words stay first."""
    return " ".join(message.split())


def debug_requested(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """(debug?, argv without ``--debug``): the flag is taken out before the script's own parser sees it."""
    rest = [a for a in argv if a != DEBUG_FLAG]
    return len(rest) != len(argv) or os.environ.get(DEBUG_ENV, "") not in ("", "0"), rest


def run_script(main: Callable[[list[str]], object], argv: Sequence[str] | None = None) -> NoReturn:
    """The entry point of every script: ``run_script(main)`` under ``if __name__ == "__main__"``.

    A user error (:func:`is_user_error`) ends with ``error: <message>`` on stderr, one line, exit status 2; the
    traceback is printed as well with ``--debug`` (any script, anywhere on its command line) or
    ``REPAIR_DEBUG=1``. A ``SystemExit("text")`` from any layer gets the same treatment. Other exceptions are
    bugs: their traceback is always shown. ``main`` returning an int exits with it (06's 2 on a fatal source
    error), anything else with 0.
    """
    debug, args = debug_requested(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        result = main(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):  # raise SystemExit("message"): Python would print it and exit 1
            if debug:
                traceback.print_exc()
            message = exc.code.removeprefix("error: ")
            fail(one_line(message) or "stopped")
        raise
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        fail("interrupted", code=130)
    except Exception as exc:  # noqa: BLE001 - sorted into user errors (one line) and bugs (re-raised)
        if not is_user_error(exc):
            raise
        if debug:
            traceback.print_exc()
        fail(one_line(str(exc)) or type(exc).__name__)
    raise SystemExit(result if isinstance(result, int) and not isinstance(result, bool) else 0)
