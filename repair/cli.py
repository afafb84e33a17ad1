"""Command-line pieces every script shares: the one entry point (:func:`run_script`: a user error ends in one
``error:`` line on stderr and exit status 2, the traceback only with ``--debug``), the one group of retriever flags
(:func:`add_retriever_args`, the trainer's included) and the retriever they describe, and the one set of numeric
flag types (:class:`Range`: ``positive_int``, ``probability``, ``seed_int``, ...) whose limits the driver's settings
table states too.

This module imports no torch at import time: the API stages (06) use :func:`run_script` and start in a fraction of
a second.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

from repair.models import DEFAULT_MODEL
from repair.runtime import cache_dir_flag, cache_root
from repair.text import char_cap_help

if TYPE_CHECKING:
    from repair.encoding import Retriever

DEBUG_FLAG = "--debug"
DEBUG_ENV = "REPAIR_DEBUG"
# Exceptions that report bad input or a bad setting, not a bug: "module: class name". Checked through sys.modules
# so that this module imports none of them (an exception of a module never imported cannot have been raised).
USER_ERROR_CLASSES = (
    ("repair.records", "DataError"),               # malformed input file (names file, line, field)
    ("repair.diagnosis.margins", "RunMismatchError"),      # a stage's input comes from another run / percentile
    ("repair.expansion.sources.http", "SourceError"),        # an external service refused (bad key, quota)
    ("repair.models", "ModelError"),               # a model name that resolves to nothing
)


# ------------------------------------------------------------------------------------------ numeric flag types
# Issue 44: every number a user gives is finite and bounded. A count ends up in numpy/torch int64 arithmetic, a tensor
# size or the driver's bash arithmetic (int64): capped at int32's maximum, the product of two counts still fits int64
# (VALID_FACTOR x |T0|). A seed feeds numpy's legacy seeding and CTranslate2's engine seed, both unsigned 32-bit
# (torch takes up to 2**64 - 1). Unbounded, TOP_K=99999999999999999999 passed and 08 died in an OverflowError, and
# a huge --seed killed 05 after it had created its output files; a NaN compares false with everything, so
# --fn_pct nan switched 08's false-negative guard off without a word.
COUNT_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1


def _shown(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """The values a number may take: an integer or a finite float, within [low, high] (``low_open`` /
    ``high_open`` exclude an end; None = no bound). As an argparse ``type`` a bad value ends in argparse's one
    ``error: argument --flag: ...`` line and exit status 2; the driver's settings table checks with it too."""

    integer: bool
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def describe(self) -> str:
        """``in 1..100``, ``in (0, 1]``, ``>= 0`` or ``''`` (any finite number)."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            if self.integer:
                return f"in {_shown(lo)}..{_shown(hi)}"
            return (f"in {'(' if self.low_open else '['}{_shown(lo)}, {_shown(hi)}"
                    f"{')' if self.high_open else ']'}")
        if lo is not None:
            return f"{'>' if self.low_open else '>='} {_shown(lo)}"
        if hi is not None:
            return f"{'<' if self.high_open else '<='} {_shown(hi)}"
        return ""

    def parse(self, text: str) -> int | float:
        """``text`` as a number in range; ValueError saying what it must be otherwise."""
        try:
            number: int | float = int(text) if self.integer else float(text)
        except (TypeError, ValueError):
            raise ValueError(f"must be {'an integer' if self.integer else 'a number'}, got {text!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"must be a finite number, got {text!r}")
        lo, hi = self.low, self.high
        if ((lo is not None and (number <= lo if self.low_open else number < lo))
                or (hi is not None and (number >= hi if self.high_open else number > hi))):
            raise ValueError(f"must be {self.describe()}, got {text}")
        return number

    def __call__(self, text: str) -> int | float:
        try:
            return self.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def bounded_int(low: int, high: int = COUNT_MAX) -> Range:
    """An integer in low..high (a count: at most :data:`COUNT_MAX`)."""
    return Range(True, low, high)


def finite_float(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False) -> Range:
    """A finite float, optionally bounded (``low_open``: > low instead of >= low)."""
    return Range(False, low, high, low_open, high_open)


positive_int = bounded_int(1)          # counts, sizes, lengths (>= 1)
non_negative_int = bounded_int(0)      # counts where 0 means none / off
percentile = bounded_int(1, 100)       # --pct: the bottom percentile of margins
seed_int = bounded_int(0, SEED_MAX)    # --seed
probability = finite_float(0, 1)       # a share or a probability, [0, 1]
positive_share = finite_float(0, 1, low_open=True)  # (0, 1]: top_p, 08's --fn_pct
share_below_one = finite_float(0, 1, high_open=True)  # [0, 1): a warmup share, a dropout rate
positive_float = finite_float(0, low_open=True)  # a rate, temperature, timeout (> 0)
non_negative_float = finite_float(0)   # a weight or a pause that may be 0
any_float = finite_float()             # finite, either sign (a score margin)


CACHE_HELP = "embedding cache folder (default: $REPAIR_CACHE/embeddings); 'none' disables it"


def add_retriever_args(parser: argparse.ArgumentParser, default_model: str = DEFAULT_MODEL, *,
                       default_max_length: int = 512, encoding: bool = True,
                       cache_help: str = CACHE_HELP) -> argparse._ArgumentGroup:
    """The retriever flags, one group ``model`` in every script: ``--model`` (alias ``--model_path``),
    ``--pooling``, ``--max_length``, ``--trust_remote_code``; for a script that encodes (``encoding``) also
    ``--adapter``, ``--batch_size``, ``--device``, ``--cache_dir`` (``cache_help`` says where its cache goes). The
    trainer passes ``encoding=False`` and adds its own flags (``--init_adapter``, LoRA) to the returned group."""
    g = parser.add_argument_group("model")
    g.add_argument("--model", "--model_path", dest="model", default=default_model,
                   help="base model: HF id, local folder, or alias smollm2-135m (EOS pooling, instruction format) "
                        "| minilm (mean pooling, plain text); a LoRA adapter folder given here is loaded on its base "
                        "model, the one its adapter_config.json names (default: %(default)s)")
    if encoding:
        g.add_argument("--adapter", default=None, help="LoRA adapter folder to apply on the base model")
    g.add_argument("--max_length", type=positive_int, default=default_max_length,
                   help=f"max tokens per text incl. EOS; {char_cap_help()} (default: %(default)s)")
    if encoding:
        g.add_argument("--batch_size", type=positive_int, default=32,
                       help="texts per forward pass (default: %(default)s)")
    g.add_argument("--pooling", default=None, choices=["eos", "mean"],
                   help="override the model's pooling profile (default: eos for decoders, mean for encoders)")
    if encoding:
        g.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
        g.add_argument("--cache_dir", default=None, help=cache_help)
    g.add_argument("--trust_remote_code", action="store_true", help="allow model code from the model folder/hub")
    return g


def embedding_cache_dir(value: str | None) -> Path | None:
    """``--cache_dir``: None -> ``$REPAIR_CACHE/embeddings``, 'none' -> no cache, else the folder given."""
    return cache_dir_flag(value, cache_root() / "embeddings")


def load_retriever(args: argparse.Namespace) -> Retriever:
    """The retriever the model flags describe (an adapter folder given as ``--model`` loads on its base)."""
    from repair.encoding import Retriever

    return Retriever.load(args.model, args.adapter, pooling=args.pooling, max_length=args.max_length,
                          device=args.device, cache_dir=embedding_cache_dir(args.cache_dir),
                          trust_remote_code=args.trust_remote_code, batch_size=args.batch_size)


def model_fields(retriever: Retriever) -> dict:
    """What a result file says about the model that produced it: the base and adapter it was loaded from."""
    spec = retriever.spec
    return {"model": spec.name, "adapter": spec.adapter, "pooling": retriever.pooling,
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
