"""Publishable trained folders: a Hugging Face model card, sentence-transformers files, and a publish copy.

Why: ``save_pretrained`` leaves peft's empty template card (every field "[More Information Needed]") whose
``base_model`` is a folder in the local model cache, and ``adapter_config.json`` names the same folder, so a
published adapter would point its readers at a path on someone else's disk. Here

- :func:`write_model_card` writes ``README.md`` in the Hub's format (YAML front matter: ``base_model``,
  ``library_name``, ``tags``, ``datasets``, ``model-index`` with metrics read from the run's eval files; a body
  with what was trained, the metrics, the reproducing command and a loading snippet). The trainer writes it when
  it saves; the driver's report step rewrites it once the evaluation files exist (:func:`refresh_run_cards`).
- The base is named so a reader can get it (:func:`repair.hub_files.base_origin`: a hub id, or for the offline
  aliases the upstream hub id plus the registry package and file the weights came from).
- :func:`finish_trained_folder` (the trainer's last step) also makes a fully fine-tuned mean-pooling encoder
  (MiniLM) a sentence-transformers model giving the project's vectors (:mod:`repair.hub_files`).
- :func:`publish` copies a folder for upload with ``adapter_config.json``'s ``base_model_name_or_path`` set to
  the hub id. The folder in the run keeps its local path, so the driver, :func:`repair.models.resolve_model` and
  ``PeftModel.from_pretrained`` keep loading it offline; only the copy that leaves the machine names the Hub.

Command line: ``python -m repair.driver.model_card write FOLDER [--eval EVAL_JSON]`` and
``python -m repair.driver.model_card publish FOLDER DEST [--hub_base ID]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repair.data import atomic_write, read_json, write_json
from repair.hub_files import ARGS_FILE, BaseOrigin, base_origin, json_record, write_sentence_transformers_config
from repair.models import ADAPTER_CONFIG, ModelError

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"
EVAL_FILE = "eval.json"
# what a publish copy leaves out: resumable state and TensorBoard events (large, and of no use to a reader)
NOT_PUBLISHED = ("checkpoints", "runs")
# the driver's trained folders, relative to an iteration folder: (step suffix, eval folder, role)
RUN_FOLDERS = {"adapter": ("10_train", "eval"), "control": ("10_control", "eval_control")}
OFFSHELF_EVAL = "eval_offshelf"  # WARM_START=1: the off-the-shelf model's evaluation (step iter0.eval_offshelf)
METRIC_RE = re.compile(r"^(ndcg|map|recall|mrr|precision)(@\d+)?$|^(spearman|pearson)$")


class CardError(ValueError):
    """A folder that cannot get a card (not a trained folder, unreadable training_args.json)."""


# ---------------------------------------------------------------------------------------------- reading a folder
def _read_args(folder: Path) -> dict:
    path = folder / ARGS_FILE
    if not path.is_file():
        raise CardError(f"{folder}: no {ARGS_FILE}: not a folder training/10_train_lora.py saved")
    try:
        args = read_json(path)
    except ValueError as exc:
        raise CardError(f"{path}: unreadable ({exc})") from None
    if not isinstance(args, dict):
        raise CardError(f"{path}: not a JSON object")
    return args


def folder_kind(folder: Path, args: dict) -> str:
    """``lora`` (a peft adapter), ``sentence-transformers`` (a full fine-tune with ST files) or ``transformers``."""
    if (folder / ADAPTER_CONFIG).exists():
        return "lora"
    if (folder / "modules.json").exists():
        return "sentence-transformers"
    return "transformers"


@dataclass(frozen=True)
class RunPlace:
    """Where a trained folder sits in a ``run_repair.sh`` run: ``iter<k>/adapter`` or ``iter<k>/control``."""

    run_dir: Path
    iteration: int
    role: str  # adapter | control
    step: str
    eval_file: Path
    start_eval_file: Path  # the model the run started from (off the shelf)

    @property
    def what(self) -> str:
        if self.role == "control":
            return (f"the plain control of iteration {self.iteration} (CONTROL=1): the same training as REPAIR's "
                    f"iteration {self.iteration} on T0's data alone")
        if self.iteration == 0:
            return "the warm start (WARM_START=1): plain fine-tuning on T0 alone, before REPAIR's iteration 1"
        return (f"REPAIR iteration {self.iteration}: trained on T0 plus the triplets of iterations 1..{self.iteration}"
                f", starting from the model this iteration diagnosed")


def run_place(folder: Path) -> RunPlace | None:
    """The folder's place in a driver run (None for a folder trained by hand)."""
    folder = Path(folder).resolve()
    it = folder.parent
    match = re.fullmatch(r"iter(\d+)", it.name)
    run_dir = it.parent
    if not match or folder.name not in RUN_FOLDERS or not (run_dir / "settings.json").is_file():
        return None
    k = int(match.group(1))
    suffix, eval_dir = RUN_FOLDERS[folder.name]
    step = f"iter{k}.{'10_warm_start' if k == 0 and folder.name == 'adapter' else suffix}"
    offshelf = run_dir / "iter0" / OFFSHELF_EVAL / EVAL_FILE
    start = offshelf if offshelf.exists() else run_dir / "iter0" / "eval" / EVAL_FILE
    return RunPlace(run_dir, k, folder.name, step, it / eval_dir / EVAL_FILE, start)



def _eval_rows(path: Path | None) -> list[dict]:
    if path is None or not path.is_file():
        return []
    report = json_record(path.parent, path.name)
    if not report:
        logger.warning("%s: not an evaluation file (unreadable or not a JSON object); the card has no metrics from "
                       "it", path)
    rows = report.get("results")
    return [r for r in rows if isinstance(r, dict) and r.get("headline") in r] if isinstance(rows, list) else []


def _metric_keys(row: dict) -> list[str]:
    """The headline first, then every other metric the row holds (eval_suite's rows: repair.evaluation.evaluate)."""
    head = row["headline"]
    return [head] + [k for k, v in row.items() if k != head and METRIC_RE.match(k) and isinstance(v, (int, float))]


def _metric_id(key: str) -> str:
    """``ndcg@10`` -> ``ndcg_at_10`` (the metric ids of the Hub's model-index, as MTEB writes them)."""
    return key.replace("@", "_at_")


def _metric_name(key: str) -> str:
    names = {"ndcg": "nDCG", "map": "MAP", "recall": "Recall", "mrr": "MRR", "spearman": "Spearman",
             "pearson": "Pearson"}
    head, _, at = key.partition("@")
    return names.get(head, head) + (f"@{at}" if at else "")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "–" if value is None else str(value)


# ---------------------------------------------------------------------------------------------- the card
def _stem(path: str) -> str:
    name = Path(str(path).split(" [")[0].rstrip("/")).name
    for suffix in (".jsonl", ".json", ".pt", ".tsv", ".gz"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


def _datasets(args: dict, settings: dict) -> list[str]:
    """Names of the data the model was trained on: T0's (the driver's TRAIN_DATA, else --train_data); the triplets
    files are derived from T0 and are described in the body."""
    sources = [settings["TRAIN_DATA"]] if settings.get("TRAIN_DATA") else list(args.get("train_data") or [])
    if not sources:
        sources = list(args.get("triplets") or [])
    out: list[str] = []
    for source in sources:
        stem = _stem(source)
        if stem and stem not in out:
            out.append(stem)
    return out


def _train_log(folder: Path) -> list[dict]:
    from repair.data import iter_jsonl

    path = folder / "train_log.jsonl"
    return list(iter_jsonl(path, skip_partial_last=True)) if path.is_file() else []


def _counts(place: RunPlace | None, settings: dict) -> list[list[str]]:
    """|T0|, |Q_conf|, |C_conf|, generated / verified / kept per iteration whose triplets this model saw, from the
    run report's own reader of the stage files."""
    if place is None or place.role == "control" or place.iteration == 0:
        return []
    from repair.evaluation.report import collect

    pct = settings.get("PCT") if isinstance(settings.get("PCT"), int) else 30
    rows = []
    for it in collect(place.run_dir, pct)["iterations"]:
        if 0 < it["iter"] <= place.iteration:
            rows.append([str(it["iter"]), *(_fmt(it.get(key)) for key in
                                            ("t0", "q_conf", "c_conf", "generated", "verified", "kept"))])
    return rows


def _snippet(kind: str, args: dict, hub_base: str | None) -> str:
    """Loading code a reader can run (no REPAIR needed): the project's encoder recipe (repair/encoding.py)."""
    base = hub_base or "<the base model: see 'Base model'>"
    max_length = int(args.get("max_length") or 512)
    fmt = args.get("text_format") or {}
    pooling = args.get("pooling", "eos")
    if kind == "sentence-transformers":
        return ("```python\nfrom sentence_transformers import SentenceTransformer\n\n"
                'model = SentenceTransformer("REPO")  # this folder, or its Hub id once uploaded\n'
                'q = model.encode(["Which protein does venetoclax inhibit?"])\n'
                'd = model.encode(["Venetoclax is a selective BCL-2 inhibitor."])\n'
                "print(model.similarity(q, d))  # cosine = dot product: the vectors are L2-normalised\n```\n")
    load = ('tok = AutoTokenizer.from_pretrained(REPO)\n'
            + (f'model = PeftModel.from_pretrained(AutoModel.from_pretrained("{base}"), REPO).eval()\n'
               if kind == "lora" else "model = AutoModel.from_pretrained(REPO).eval()\n"))
    imports = ("import torch, torch.nn.functional as F\nfrom transformers import AutoModel, AutoTokenizer\n"
               + ("from peft import PeftModel\n" if kind == "lora" else ""))
    if pooling == "mean":
        body = (f"@torch.no_grad()\ndef encode(texts, max_length={max_length}):\n"
                "    b = tok(texts, max_length=max_length, truncation=True, padding=True, return_tensors='pt')\n"
                "    h = model(input_ids=b['input_ids'], attention_mask=b['attention_mask']).last_hidden_state\n"
                "    m = b['attention_mask'].unsqueeze(-1).float()\n"
                "    return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)\n\n"
                'q = encode(["Which protein does venetoclax inhibit?"])\n'
                'd = encode(["Venetoclax is a selective BCL-2 inhibitor."])\n')
    else:
        query = str(fmt.get("query", "{instruction}\nQuery: {text}")).replace(
            "{instruction}", str(args.get("instruction_used") or "")).replace("{text}", "Which protein does "
                                                                                    "venetoclax inhibit?")
        passage = str(fmt.get("passage", "Represent this passage.\nPassage: {text}")).replace(
            "{text}", "Venetoclax is a selective BCL-2 inhibitor.")
        body = ("if tok.pad_token is None:\n    tok.pad_token, tok.padding_side = tok.eos_token, 'left'\n\n"
                "def last_token_pool(h, mask):\n    if mask[:, -1].sum() == mask.shape[0]:\n        return h[:, -1]\n"
                "    return h[torch.arange(h.shape[0]), mask.sum(1) - 1]\n\n"
                f"@torch.no_grad()\ndef encode(texts, max_length={max_length}):\n"
                "    b = tok(texts, max_length=max_length - 1, truncation=True, padding=False,\n"
                "            return_attention_mask=False, return_token_type_ids=False)\n"
                "    b['input_ids'] = [ids + [tok.eos_token_id] for ids in b['input_ids']]\n"
                "    b = tok.pad(b, padding=True, return_attention_mask=True, return_tensors='pt')\n"
                "    h = model(**b, use_cache=False).last_hidden_state\n"
                "    return F.normalize(last_token_pool(h, b['attention_mask']), dim=-1)\n\n"
                f"q = encode([{json.dumps(query)}])\nd = encode([{json.dumps(passage)}])\n")
    return (f"```python\n{imports}\nREPO = \"REPO\"  # this folder, or its Hub id once uploaded\n{load}\n{body}"
            "print(q @ d.T)\n```\n")


def card_text(folder: str | os.PathLike, *, eval_files: list[str | os.PathLike] | None = None,
              hub_base: str | None = None) -> str:
    """The model card of a trained folder (front matter + body), from the files of the folder and of its run."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from repair.driver.settings_table import SETTINGS
    from repair.tables import markdown_table

    folder = Path(folder)
    args = _read_args(folder)
    kind = folder_kind(folder, args)
    origin = base_origin(str(args.get("model_alias") or args.get("model") or ""),
                         str(args.get("base_model_name_or_path") or ""))
    hub = hub_base or origin.hub_id
    if hub_base and hub_base != origin.hub_id:
        origin = BaseOrigin(hub_base, f"`{origin.local}`, which the publisher names as `{hub_base}` (`--hub_base`)",
                            True, origin.local)
    place = run_place(folder)
    settings = (json_record(place.run_dir, "settings.json").get("settings") or {}) if place else {}
    evals = [Path(p) for p in eval_files or []] or ([place.eval_file] if place else [folder / EVAL_FILE])
    rows = [row for path in evals for row in _eval_rows(path)]
    start_rows = {(r["dataset"], r["headline"]): r for r in _eval_rows(place.start_eval_file)} if place else {}
    run_name = place.run_dir.name if place else folder.name
    model_name = (f"{run_name}-iter{place.iteration}-{place.role}" if place else folder.name)
    results = [EvalResult(task_type="sentence-similarity" if r.get("task") == "sts" else "retrieval",
                          dataset_type=str(r["dataset"]), dataset_name=str(r["dataset"]),
                          dataset_split=r.get("split") or None, metric_type=_metric_id(key),
                          metric_name=_metric_name(key), metric_value=float(r[key]))
               for r in rows for key in _metric_keys(r)]
    tags = ["repair", "dense-retrieval", "feature-extraction", "scientific-retrieval"]
    tags += {"lora": ["lora"], "sentence-transformers": ["sentence-transformers", "sentence-similarity"]}.get(kind, [])
    data = ModelCardData(
        base_model=hub, library_name={"lora": "peft"}.get(kind, kind), tags=tags,
        datasets=_datasets(args, settings) or None, model_name=model_name if results else None,
        eval_results=results or None,
        pipeline_tag="sentence-similarity" if kind == "sentence-transformers" else "feature-extraction")
    what = {"lora": f"a LoRA adapter (r {args.get('lora_r')}, alpha {args.get('lora_alpha')}, dropout "
                    f"{args.get('lora_dropout')}, on {', '.join(args.get('lora_target_modules_used') or [])})",
            "sentence-transformers": "a full fine-tune, saved as a sentence-transformers model",
            "transformers": "a full fine-tune"}[kind]
    parts = [f"# {model_name}: a REPAIR retriever ({kind})", "",
             f"{what[0].upper()}{what[1:]} of {f'`{hub}`' if hub else 'a local base model'}, trained with "
             f"contrastive InfoNCE by REPAIR (`training/10_train_lora.py`): "
             + (place.what if place else "a training run by hand") + ".", "",
             "## Base model", "",
             f"- Hub id: `{hub}`" if hub else "- Hub id: none known",
             f"- The weights this run trained on came from {origin.via}."]
    if hub and not origin.exact and not hub_base:
        parts.append(f"- They are not bit-identical to `{hub}`'s own weights: the adapter loads on them (same "
                     f"architecture and tokenizer), but the metrics below were measured on the weights named above; "
                     f"load those to reproduce them exactly.")
    log = _train_log(folder)
    losses = [r["loss"] for r in log if isinstance(r.get("loss"), (int, float))]
    facts = [["training", what],
             ["pooling", f"{args.get('pooling')} (then L2-normalised; score = dot product)"],
             ["max_length", str(args.get("max_length"))],
             ["query format", f"`{json.dumps((args.get('text_format') or {}).get('query'))}`, instruction "
                              f"`{json.dumps(args.get('instruction_used'))}`"],
             ["passage format", f"`{json.dumps((args.get('text_format') or {}).get('passage'))}`"],
             ["training examples", str(args.get("examples"))],
             ["optimizer steps", f"{args.get('end_step', args.get('total_steps'))} of a {args.get('total_steps')}-step "
                                 f"schedule" + (f", continued from step {args['continued_from_step']}"
                                                if args.get("continued_from_step") else "")],
             ["batch / lr / temperature", f"{args.get('global_batch_size')} / {args.get('lr')} / "
                                          f"{args.get('temperature')}"],
             ["InfoNCE loss first → last step", f"{_fmt(losses[0])} → {_fmt(losses[-1])}" if losses else "–"],
             ["seed", str(args.get("seed"))]]
    for source in args.get("data_sources") or []:
        facts.append(["data: " + _stem(source.get("name", "")), f"{source.get('kept')} examples "
                      f"({source.get('negatives')} hard negatives, {source.get('generated')} generated)"])
    parts += ["", "## What was trained", "", markdown_table(["", "value"], facts), ""]
    counts = _counts(place, settings)
    if counts:
        parts += ["REPAIR's iterations whose triplets this model was trained on (|T0| = training queries, |Q_conf| = "
                  "confused queries diagnosed, kept = tuples that became training triplets):", "",
                  markdown_table(["iteration", "|T0|", "|Q_conf|", "|C_conf|", "generated", "verified", "kept"],
                                 counts), ""]
    if settings:
        shown = [[s.name, f"`{settings[s.name]}`"] for s in SETTINGS if s.result and s.name in settings
                 and settings[s.name] not in ("", None)]
        parts += ["<details><summary>REPAIR settings of the run (result-changing ones, from its settings.json)"
                  "</summary>", "", markdown_table(["setting", "value"], shown), "", "</details>", ""]
    parts += ["## Evaluation", ""]
    if rows:
        header = ["dataset", "split", "metric", "this model"] + (["off-the-shelf base"] if start_rows else [])
        table = []
        for r in rows:
            start = start_rows.get((r["dataset"], r["headline"]), {})
            for key in _metric_keys(r):
                table.append([str(r["dataset"]), str(r.get("split") or "–"), _metric_name(key), _fmt(r[key])]
                             + ([_fmt(start.get(key))] if start_rows else []))
        parts += [markdown_table(header, table), "",
                  f"Read from {', '.join(f'`{os.path.relpath(p, place.run_dir) if place else p.name}`' for p in evals)}"
                  " (eval/eval_suite.py); scale: fraction unless the file says percent.", ""]
    else:
        parts += ["Not evaluated yet: `python eval/eval_suite.py --model BASE --adapter FOLDER --data ... --output "
                  "FOLDER/eval.json`, then `python -m repair.driver.model_card write FOLDER` puts the numbers here.", ""]
    command = ""
    if place and (place.run_dir / "logs" / f"{place.step}.cmd").is_file():
        command = (place.run_dir / "logs" / f"{place.step}.cmd").read_text(encoding="utf-8").strip()
    command = command or str(args.get("command") or "")
    parts += ["## Reproduce", ""]
    if command:
        parts += [f"The command that trained it{f' (driver step `{place.step}`)' if place else ''}:", "",
                  "```bash", command, "```", ""]
    if place:
        parts += ["The whole run: `run_repair.sh` with the settings above as environment variables (every step's "
                  "command is in the run's `logs/<step>.cmd`).", ""]
    parts += ["## Load", "", _snippet(kind, args, hub),
              "With this project: `Retriever.load(BASE, adapter=REPO)` (LoRA) or `Retriever.load(REPO)` "
              "(`repair/encoding.py`) gives the same vectors.", "",
              "## Files", "",
              f"`{ARGS_FILE}` (every training flag and what it resolved to), `train_log.jsonl` (one line per "
              "optimizer step)" + {"lora": f", `{ADAPTER_CONFIG}` + `adapter_model.safetensors` (peft)",
                                   "sentence-transformers": ", `config.json` + `model.safetensors` (transformers), "
                                   "`modules.json`, `sentence_bert_config.json`, `1_Pooling/`, `2_Normalize/` "
                                   "(sentence-transformers)",
                                   "transformers": ", `config.json` + `model.safetensors`"}[kind]
              + ", the tokenizer files.", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(parts)).content


def write_model_card(folder: str | os.PathLike, *, eval_files: list[str | os.PathLike] | None = None,
                     hub_base: str | None = None) -> Path:
    """Write (or rewrite) ``README.md`` of a trained folder atomically; returns its path."""
    path = Path(folder) / CARD_FILE
    text = card_text(folder, eval_files=eval_files, hub_base=hub_base)
    atomic_write(path, lambda fh: fh.write(text))
    return path


def refresh_run_cards(run_dir: str | os.PathLike) -> list[Path]:
    """Rewrite the card of every trained folder of a driver run (``iter<k>/adapter``, ``iter<k>/control``) with the
    run's evaluation files as they are now: the report step calls this after the evaluations. A folder whose card
    cannot be written is named in a warning; the report and the other cards go on."""
    written = []
    for it in sorted(Path(run_dir).glob("iter*")):
        for name in RUN_FOLDERS:
            folder = it / name
            if (folder / ARGS_FILE).is_file():
                try:
                    written.append(write_model_card(folder))
                except CardError as exc:
                    logger.warning("no model card for %s: %s", folder, exc)
    return written


def finish_trained_folder(folder: str | os.PathLike) -> None:
    """What the trainer adds to a saved folder, read from its files (so a run killed after saving completes the
    folder when resumed): the sentence-transformers files of a fully fine-tuned mean-pooling encoder, then the card
    (which replaces peft's template)."""
    folder = Path(folder)
    args = _read_args(folder)
    if args.get("full_finetune") and args.get("pooling") == "mean" and not (folder / "modules.json").exists():
        hidden = read_json(folder / "config.json").get("hidden_size")
        write_sentence_transformers_config(folder, int(hidden), int(args["max_length"]))
    write_model_card(folder)


# ---------------------------------------------------------------------------------------------- publishing
def publish(folder: str | os.PathLike, dest: str | os.PathLike, hub_base: str | None = None) -> Path:
    """Copy a trained folder into ``dest`` for upload: without checkpoints/ and TensorBoard events, with the base's
    hub id in ``adapter_config.json`` and in the card. The run's own folder is left as it is (its config keeps the
    local path, so offline loading and the driver keep working). Refuses when no hub id is known."""
    folder, dest = Path(folder), Path(dest)
    args = _read_args(folder)
    origin = base_origin(str(args.get("model_alias") or args.get("model") or ""),
                         str(args.get("base_model_name_or_path") or ""))
    hub = hub_base or origin.hub_id
    if not hub:
        raise CardError(f"{folder}: its base model ({origin.local}) names no Hugging Face hub id; pass --hub_base ID")
    if dest.exists() and any(dest.iterdir()):
        raise CardError(f"{dest}: exists and is not empty; give a new folder")
    tmp = dest.with_name(f".{dest.name}.publishing")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp, ignore=lambda d, names: [n for n in names if Path(d) == folder
                                                            and n in NOT_PUBLISHED])
    config = tmp / ADAPTER_CONFIG
    if config.exists():
        data = read_json(config)
        data["base_model_name_or_path"] = hub
        write_json(config, data, indent=2)
    text = card_text(folder, hub_base=hub_base)
    atomic_write(tmp / CARD_FILE, lambda fh: fh.write(text))
    if dest.exists():
        dest.rmdir()
    os.replace(tmp, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    from repair.runtime import setup_logging

    p = argparse.ArgumentParser(prog="python -m repair.driver.model_card", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    w = sub.add_parser("write", help="write or refresh README.md (the model card) of a trained folder")
    w.add_argument("folder", help="a folder training/10_train_lora.py saved (iter<k>/adapter, --output_dir, ...)")
    w.add_argument("--eval", action="append", default=[], metavar="EVAL_JSON",
                   help="eval/eval_suite.py --output file(s) to read metrics from (default: the run's own, else "
                        "FOLDER/eval.json)")
    w.add_argument("--hub_base", default=None, help="the base model's Hugging Face hub id, when it is a local folder")
    u = sub.add_parser("publish", help="copy a trained folder for upload, its base named by hub id")
    u.add_argument("folder", help="the trained folder")
    u.add_argument("dest", help="a new folder to upload (hf upload USER/REPO DEST)")
    u.add_argument("--hub_base", default=None, help="the base model's hub id (default: known for the aliases and "
                                                    "for hub ids given as --model)")
    args = p.parse_args(argv)
    setup_logging("INFO")
    try:
        if args.action == "write":
            print(write_model_card(args.folder, eval_files=args.eval or None, hub_base=args.hub_base))
        else:
            print(publish(args.folder, args.dest, args.hub_base))
    except (CardError, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
