"""The CTranslate2 generation backend (issue 33): the same API as :class:`repair.expansion.generation.HFGenerator`, on an
inference engine with prebuilt CPU wheels and int8 kernels.

Why: generation is most of a REPAIR iteration's wall, and on CPU a 1.5B decoder is memory-bound: every decoding
step reads all weights, 6 GB in fp32 through transformers, 1.5 GB as CTranslate2 int8. The engine also keeps a
shared prompt prefix (05's instructions, the chat template's header) as one static prompt whose state is
computed once per batch instead of once per prompt.

The model is converted once from the Hugging Face folder (the one :mod:`repair.model_packages` writes from the
verified GGUF, or any local folder) into ``<hf folder>.ct2-<quantization>-<sha12>`` beside it, keyed by the
source's sha256 (the GGUF's, recorded in ``repair_source.json``, else the weights' own) and, when a LoRA
adapter is merged in, the adapter's. The conversion is written to a temporary folder and renamed only when
complete, with a ``repair_ct2.json`` record of every file's size and sha256; a folder without that record, or
whose files do not match it, is refused, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from repair.data import file_sha256
from repair.expansion.local_llm import Prompt, load_generation_tokenizer
from repair.models import DEFAULT_MODEL, ModelError, resolve_model

logger = logging.getLogger(__name__)

RECORD = "repair_ct2.json"
# Weight quantizations a converted folder can hold; "float32" keeps transformers' numbers (tests compare tokens).
QUANTIZATIONS = ("int8", "float32")
DEFAULT_QUANTIZATION = "int8"


def _weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise ModelError(f"{folder}: no model weights (*.safetensors) to convert")
    return files


def source_sha256(hf_folder: Path) -> str:
    """What a conversion is keyed by: the GGUF's sha256 that ``repair_source.json`` records for a folder converted
    from a packaged GGUF (checked against the package table, so a folder from a mismatching GGUF is refused), else
    the sha256 of the weight files themselves."""
    record_file = hf_folder / "repair_source.json"
    if record_file.exists():
        try:
            record = json.loads(record_file.read_text())
        except ValueError as exc:
            raise ModelError(f"{record_file}: not JSON ({exc}); delete {hf_folder} to convert it again") from None
        alias, sha = record.get("alias"), record.get("sha256")
        if alias:
            from repair.model_packages import PACKAGED_MODELS

            expected = PACKAGED_MODELS[alias].sha256 if alias in PACKAGED_MODELS else None
            if expected and sha != expected:
                raise ModelError(f"{record_file}: field 'sha256' is {sha}, but the {alias} GGUF has sha256 "
                                 f"{expected}; refusing it (delete {hf_folder} to convert the right GGUF again)")
        if sha:
            return str(sha)
    digest = hashlib.sha256()
    for f in _weight_files(hf_folder):
        digest.update(file_sha256(f).encode())
    return digest.hexdigest()


def _adapter_sha256(adapter: str | os.PathLike) -> str:
    files = sorted(Path(adapter).glob("adapter_model.*")) + [Path(adapter) / "adapter_config.json"]
    digest = hashlib.sha256()
    for f in files:
        if f.exists():
            digest.update(file_sha256(f).encode())
    return digest.hexdigest()


def converted_folder(hf_folder: Path, quantization: str, key: str) -> Path:
    return hf_folder.parent / f"{hf_folder.name}.ct2-{quantization}-{key[:12]}"


def _file_record(folder: Path) -> dict[str, dict]:
    return {f.name: {"size": f.stat().st_size, "sha256": file_sha256(f)}
            for f in sorted(folder.iterdir()) if f.is_file() and f.name != RECORD}


def verify_converted(folder: Path) -> dict:
    """The folder's record after every file it lists matched its size and sha256; one clear ModelError else.
    (Hashing a 1.5 GB int8 model takes seconds; generation takes minutes.)"""
    record_file = folder / RECORD
    if not record_file.is_file():
        raise ModelError(f"{folder}: no {RECORD}, so not a finished conversion; delete the folder to convert again")
    try:
        record = json.loads(record_file.read_text())
        files = record["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{record_file}: unreadable record ({exc}); delete {folder} to convert again") from None
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            raise ModelError(f"{path}: missing from the converted model; delete {folder} to convert again")
        if path.stat().st_size != want["size"] or file_sha256(path) != want["sha256"]:
            raise ModelError(f"{path}: size or sha256 differs from {RECORD}; the converted model is corrupt, "
                             f"delete {folder} to convert again")
    return record


def _merged_source(hf_folder: Path, adapter: str, workdir: Path) -> Path:
    """An HF folder with the retriever's LoRA adapter merged into the decoder, as HFGenerator merges it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from repair.expansion.local_llm import merge_adapter

    model = merge_adapter(AutoModelForCausalLM.from_pretrained(hf_folder), adapter)
    out = workdir / "merged"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(hf_folder).save_pretrained(out)
    return out


def convert(hf_folder: str | os.PathLike, quantization: str = DEFAULT_QUANTIZATION, *,
            adapter: str | None = None) -> Path:
    """The CTranslate2 folder for ``hf_folder`` (+ ``adapter``) at ``quantization``, converted on first use.

    Written under a temporary name beside the target and renamed when complete, so a killed conversion leaves
    only a ``.tmp`` folder that no later run reads (it is removed by the next conversion of the same model). One
    process at a time converts a target (:func:`_conversion_lock`); another waits, then uses the finished folder.
    """
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    if quantization not in QUANTIZATIONS:
        raise ModelError(f"unknown CTranslate2 quantization {quantization!r}; expected one of {QUANTIZATIONS}")
    hf = Path(hf_folder)
    key = source_sha256(hf)
    if adapter:
        key = hashlib.sha256(f"{key}+{_adapter_sha256(adapter)}".encode()).hexdigest()
    target = converted_folder(hf, quantization, key)
    if target.exists():
        verify_converted(target)
        return target
    with _conversion_lock(target):
        if target.exists():  # another process converted it while this one waited
            verify_converted(target)
            return target
        # a killed conversion's leftovers: only a dead process's, since a live converter of this target holds the lock
        for stale in hf.parent.glob(f".{target.name}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=hf.parent))
        logger.info("converting %s%s to CTranslate2 %s in %s (one time)", hf, f" + {adapter}" if adapter else "",
                    quantization, target)
        try:
            source = _merged_source(hf, adapter, tmp) if adapter else hf
            out = tmp / "model"
            TransformersConverter(str(source), low_cpu_mem_usage=True).convert(str(out), quantization=quantization)
            (out / RECORD).write_text(json.dumps({
                "source": str(hf), "source_sha256": key, "adapter": adapter, "quantization": quantization,
                "ctranslate2": ctranslate2.__version__, "files": _file_record(out)}, indent=1))
            os.replace(out, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextmanager
def _conversion_lock(target: Path) -> Iterator[None]:
    """Hold ``.<target>.lock`` beside ``target`` (``fcntl.flock``, exclusive) while converting it, waiting for a
    holder (issue 44): two runs converting the same model at once each removed the other's temporary folder as a
    killed conversion's leftovers. The kernel drops a killed process's lock, so a leftover is still cleared by the
    next conversion. The lock file itself stays (empty; removing it would let a third process lock a new file)."""
    import fcntl

    lock_path = target.with_name(f".{target.name}.lock")
    with open(lock_path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process converting %s (lock %s)", target, lock_path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _common_prefix(seqs: list[list[str]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        tok = seqs[0][i]
        if any(s[i] != tok for s in seqs[1:]):
            return i
    return n


class CT2Generator:
    """A local causal LM run by CTranslate2, with :class:`HFGenerator`'s API and prompt formatting.

    ``compute_type`` is CTranslate2's: ``int8`` (int8 GEMMs, the default for an int8 folder) or ``float32``
    (a float32 folder computes what transformers computes; greedy tokens match, tested). The prompts of a call
    share their longest common token prefix as a cached static prompt; ``batch_size`` prompts run together.
    One difference at any precision: the repetition penalty counts generated tokens only (transformers' counts
    the prompt's too).
    """

    backend = "ct2"

    def __init__(self, model: str = DEFAULT_MODEL, adapter: str | None = None, *, device: str | None = None,
                 dtype: Any = None, batch_size: int = 8, chat_template: str = "auto",
                 trust_remote_code: bool = False, quantization: str = DEFAULT_QUANTIZATION,
                 compute_type: str | None = None, threads: int | None = None):
        import ctranslate2

        from repair.runtime import pick_device

        del dtype  # the converted folder's quantization decides the weights' type
        spec = resolve_model(model, pooling="eos", trust_remote_code=trust_remote_code)
        self.model_name, self.path, self.adapter = model, spec.path, adapter
        self.device = pick_device(device).type  # ctranslate2 takes "cpu" | "cuda"
        self.batch_size = max(1, int(batch_size))
        self.tokenizer, self.use_chat = load_generation_tokenizer(spec.path, model, chat_template, trust_remote_code)
        self.quantization = quantization
        self.folder = convert(spec.path, quantization, adapter=adapter)
        self.compute_type = compute_type or ("int8" if quantization == "int8" else "float32")
        self.threads = threads or int(os.environ.get("OMP_NUM_THREADS") or 0)
        self.generator = self._load()
        self.end_ids = self._end_ids(spec.path)

    def reload(self) -> None:
        """A fresh engine on the converted folder: a new worker thread (seeded by ``set_random_seed``) and an
        empty static-prompt cache (the bench times every configuration from cold)."""
        del self.generator
        self.generator = self._load()

    def _load(self):
        import ctranslate2

        return ctranslate2.Generator(str(self.folder), device=self.device, compute_type=self.compute_type,
                                     intra_threads=self.threads, inter_threads=1)

    def _end_ids(self, path: str) -> list[int]:
        """Stop where ``generate`` of transformers stops: the generation config's EOS ids (Qwen: <|im_end|> and
        <|endoftext|>), else the tokenizer's."""
        from transformers import GenerationConfig

        try:
            eos = GenerationConfig.from_pretrained(path).eos_token_id
        except OSError:
            eos = None
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        return [int(e) for e in eos] or [int(self.tokenizer.eos_token_id)]

    def describe(self) -> dict:
        return {"backend": self.backend, "model": self.model_name, "path": str(self.path), "adapter": self.adapter,
                "chat_template": self.use_chat, "converted": str(self.folder), "compute_type": self.compute_type}

    def format(self, prompt: Prompt) -> str:
        from repair.expansion.local_llm import format_prompt

        return format_prompt(self.tokenizer, self.use_chat, prompt)

    def generate(self, prompts: list[Prompt], *, n: int = 1, seed: int = 0, max_new_tokens: int = 40,
                 temperature: float = 0.6, top_p: float = 0.9, repetition_penalty: float = 1.2,
                 do_sample: bool = True) -> list[str]:
        """``n`` completions per prompt (grouped by prompt), decoded without the prompt and special tokens.

        A sampling call repeats exactly for a seed: CTranslate2 seeds a worker thread's random generator when
        that thread first samples, from ``set_random_seed``, so the model is reloaded (from the page cache, ~1 s
        for the 1.5B) on a fresh worker after setting ``seed``; its batches then sample in order.
        """
        import ctranslate2

        texts = [self.format(p) for p in prompts for _ in range(n)]
        chat_formatted = self.use_chat or any(isinstance(p, list) for p in prompts)
        ids = [self.tokenizer(t, add_special_tokens=not chat_formatted)["input_ids"] for t in texts]
        tokens = [self.tokenizer.convert_ids_to_tokens(x) for x in ids]
        sampling = ({"sampling_topk": 0, "sampling_topp": top_p, "sampling_temperature": temperature}
                    if do_sample else {"sampling_topk": 1})
        if do_sample:
            # the engine's seed is an unsigned 32-bit int; callers derive theirs from --seed (05: seed x 100003 +
            # round), which passes 2**32 for large seeds (issue 44). Below 2**32 the seed is unchanged.
            ctranslate2.set_random_seed(seed % 2**32)
            self.reload()
        # the prompts' longest common token prefix (the chat header, 05's instructions: 100 of ~130 tokens) is
        # computed once and cached; one token of every prompt stays out of it so each has a start token. The
        # engine sorts the rest by length into batches of batch_size, so few positions are decoded one by one.
        shared = min(_common_prefix(tokens), min(len(s) for s in tokens) - 1)
        results = self.generator.generate_batch(
            [s[shared:] for s in tokens], static_prompt=tokens[0][:shared] if shared > 0 else None,
            max_batch_size=self.batch_size, max_length=max_new_tokens, include_prompt_in_result=False,
            repetition_penalty=repetition_penalty, end_token=self.end_ids, beam_size=1, **sampling)
        outputs = [self.tokenizer.decode(r.sequences_ids[0], skip_special_tokens=True) for r in results]
        return [o.strip() for o in outputs]
