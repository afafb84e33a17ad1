"""The CausalNeg step as one resumable run: the paper's configurations (Sec. 4.1 "Baselines") and, for each item,
one triplet line with its corpus (or input) negatives first and its generated negatives after, appended a chunk at
a time, with the stats JSON rewritten after every chunk.

Separate from generation because it owns the output file: which items are augmented (the ratio), resume, reuse of
an earlier run's generations (``--generated_from``), the line's fields and the file's totals.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from repair.data import (GENERATED, MINED, DataError, JsonlAppender, iter_appended_jsonl, iter_jsonl, read_json,
                         write_json)
from repair.text import word_key
from repair.differentiation.causalneg.generate import GeneratedNegative, GenerationSettings, GenerationStats, generate_negatives
from repair.differentiation.causalneg.inputs import CorpusNegative, CorpusNegatives, NegItem

METHODS = ("none", "vanilla", "cot")
MINED_FROM = ("auto", "input", "bm25", "random", "none")


# ---------------------------------------------------------------------------------------------- configurations
@dataclass(frozen=True)
class NegativeConfig:
    """One row of the paper's comparison (Sec. 4.1 "Baselines"): where the negatives come from, how many, and the
    trainer flags that go with them (QEM only for CausalNeg; every hard negative of a line is used)."""

    name: str
    mined_from: str        # MINED_FROM: auto = the input's hard negatives when it has them, else BM25
    num_mined: int
    method: str            # METHODS
    k: int                 # generated negatives per augmented query
    qem_lambda: float      # trainer --qem_lambda (the trainer's own default is 0: plain InfoNCE)
    description: str

    def trainer_flags(self, qem_tau: float = 0.1) -> list[str]:
        """The ``training/10_train_lora.py`` flags this configuration needs."""
        flags = ["--num_hard_negatives", "-1", "--qem_lambda", f"{self.qem_lambda:g}"]
        if self.qem_lambda > 0:
            flags += ["--qem_tau", f"{qem_tau:g}"]
        return flags


CONFIGS: dict[str, NegativeConfig] = {c.name: c for c in (
    NegativeConfig("random", "random", 15, "none", 0, 0.0, "15 corpus documents sampled uniformly, positives removed"),
    NegativeConfig("mined", "auto", 15, "none", 0, 0.0, "15 BM25-mined negatives (positives excluded)"),
    NegativeConfig("vanilla", "none", 0, "vanilla", 3, 0.0, "3 vanilla (SyNeg-style single prompt) generated only"),
    NegativeConfig("cot", "none", 0, "cot", 3, 0.0, "3 CoT-guided counterfactual negatives only"),
    NegativeConfig("mixture", "auto", 15, "vanilla", 3, 0.0, "naive mixture (SyNeg): 15 mined + 3 vanilla, no QEM"),
    NegativeConfig("causalneg", "auto", 15, "cot", 3, 0.1, "CausalNeg: 15 mined + 3 CoT, trained with QEM"),
)}


# ---------------------------------------------------------------------------------------------- records
def augmented_keys(items: Sequence[NegItem], ratio: float, seed: int) -> set[str]:
    """The round(ratio * N) items that get generated negatives (Sec. 4.5 "augmentation ratio"): a seeded sample of
    the sorted keys, so the choice does not depend on file order or on how often a run was resumed."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"--ratio must be in [0, 1], got {ratio}")
    keys = sorted(item.key for item in items)
    n = int(math.floor(ratio * len(keys) + 0.5))
    return set(random.Random(f"{seed}:ratio").sample(keys, n))


def build_record(item: NegItem, config: NegativeConfig, corpus_negs: Sequence[CorpusNegative] | None,
                 generated: Sequence[GeneratedNegative] | None, *, num_mined: int, k: int,
                 augmented: bool) -> dict:
    """One output line: the item's fields, corpus (or input) negatives best first, then generated ones in chain
    order, with parallel scores / sources / traces, ``d_neg`` = the first negative."""
    negs, scores, sources, traces = [], [], [], []
    if corpus_negs is None:  # the input's own negatives
        for text, score, source, trace in list(zip(item.negatives, item.scores, item.sources, item.traces))[:num_mined]:
            negs.append(text)
            scores.append(score)
            sources.append(source)
            traces.append(trace)
    else:
        for c in corpus_negs:
            negs.append(c.text)
            scores.append(c.score)
            sources.append(MINED)
            traces.append({"method": c.method, "doc_id": c.doc_id, **({"rank": c.rank} if c.rank else {})})
    seen = {word_key(t) for t in negs} | {word_key(p) for p in item.positives}
    n_gen = 0
    for g in generated or []:
        key = word_key(g.text)
        if key in seen:
            continue
        seen.add(key)
        negs.append(g.text)
        scores.append(None)
        sources.append(GENERATED)
        traces.append(g.trace)
        n_gen += 1
    rec = {"id": item.id, "key": item.key, "query": item.query, "pos_document": item.positive,
           "hard_negatives": negs, "hard_negative_scores": scores, "d_neg": negs[0] if negs else None,
           "negative_sources": sources, "negative_traces": traces, **item.extra,
           "negatives_config": config.name,
           "generation": {"method": config.method if augmented else "none", "requested": k if augmented else 0,
                          "written": n_gen}}
    return rec


@dataclass
class RunSummary:
    items: int = 0
    skipped_done: int = 0
    written: int = 0
    augmented: int = 0
    corpus_negatives: int = 0
    generated_negatives: int = 0
    reused_generated: int = 0
    fewer_corpus_negatives: int = 0  # items that got fewer than num_mined corpus negatives

    def as_dict(self) -> dict:
        return asdict(self)


def done_keys(path: str | os.PathLike) -> set[str]:
    """Keys of the records already in an output file (a partial last line is ignored: the appender cuts it)."""
    return {rec["key"] for rec in iter_appended_jsonl(path) if rec.get("key")}


def load_generated(path: str | os.PathLike, method: str) -> dict[str, list[GeneratedNegative]]:
    """The generated negatives of an earlier output of this step, by item key (``--generated_from``): lets the
    mixture reuse the vanilla run's generations and causalneg the cot run's, so configurations share texts."""
    out: dict[str, list[GeneratedNegative]] = {}
    for lineno, rec in iter_jsonl(path, {"key": str, "hard_negatives": list[str]},
                                  {"negative_sources": list[str], "negative_traces": list}, with_lineno=True):
        sources = rec.get("negative_sources") or [MINED] * len(rec["hard_negatives"])
        traces = rec.get("negative_traces") or [None] * len(rec["hard_negatives"])
        gens = []
        for text, source, trace in zip(rec["hard_negatives"], sources, traces):
            if source != GENERATED:
                continue
            got = (trace or {}).get("method") if isinstance(trace, dict) else None
            if got != method:
                raise DataError(f"{path}:{lineno}: a generated negative was made by method {got!r}, but this "
                                f"configuration needs {method!r}")
            gens.append(GeneratedNegative(text, trace))
        if rec.get("generation", {}).get("method", method) != "none" or gens:
            out[rec["key"]] = gens
    return out


# the stats file's fields that decide an output line (besides the item): a resumed file must keep them (issue 44)
RESUME_FIELDS = ("config", "mined_from", "num_mined", "method", "ratio", "settings", "generated_from", "input", "split",
                 "corpus", "generator")
GENERATOR_FIELDS = ("backend", "model", "adapter")  # of a generator's describe(): which model writes


def _resume_view(stats: dict) -> dict[str, object]:
    """:data:`RESUME_FIELDS` of a stats record, flat (``settings.k``, ``generator.model``), as JSON holds them."""
    out: dict[str, object] = {}
    for name in RESUME_FIELDS:
        value = stats.get(name)
        if name == "config" and isinstance(value, dict):
            value = value.get("name")
        if name == "generator" and isinstance(value, dict):
            value = {k: value.get(k) for k in GENERATOR_FIELDS}
        if isinstance(value, dict):
            out.update({f"{name}.{k}": v for k, v in value.items()})
        elif name in stats:
            out[name] = value
    return json.loads(json.dumps(out, default=str))


def resume_conflicts(stats_path: Path, now: dict) -> list[str]:
    """What a ``--resume`` would change: each field of :data:`RESUME_FIELDS` whose value in the file's stats JSON
    (rewritten after every chunk) differs from ``now``, as ``ratio: the file was made with 1.0, now 0.5``. Why: a
    resume under other settings appended lines made another way to the old ones, silently (issue 44). Fields an
    older stats file lacks are not compared; without a stats file (killed before its first chunk) nothing is."""
    if not stats_path.is_file():
        return []
    try:
        recorded = read_json(stats_path)
    except ValueError as exc:
        raise DataError(f"{stats_path}: unreadable ({exc}); delete it and the output to start over") from None
    old, new = _resume_view(recorded if isinstance(recorded, dict) else {}), _resume_view(now)
    return [f"{key}: the file was made with {old[key]!r}, now {value!r}" for key, value in new.items()
            if key in old and old[key] != value]


def run_negatives(items: Sequence[NegItem], out_path: str | os.PathLike, config: NegativeConfig, *,
                  generator=None, corpus: CorpusNegatives | None = None, mined_from: str | None = None,
                  num_mined: int | None = None, method: str | None = None, ratio: float = 1.0,
                  settings: GenerationSettings | None = None, generated_from: str | os.PathLike | None = None,
                  chunk_size: int = 8, resume: bool = False, stats_path: str | os.PathLike | None = None,
                  progress: bool = True, run_info: dict | None = None) -> dict:
    """Write one triplet line per item to ``out_path`` (appended, one complete line at a time).

    ``mined_from`` / ``num_mined`` / ``method`` / ``settings.k`` override the configuration's values. Items are
    processed in chunks holding ``chunk_size`` augmented items (one batched generator call per stage and attempt);
    a chunk's lines are appended when it is done, so a kill loses at most one chunk. ``resume`` skips keys already written;
    without it an existing non-empty output is an error. The stats JSON (``<out>.stats.json``) is rewritten
    after every chunk.
    """
    settings = settings or GenerationSettings(k=config.k)
    mined_from = mined_from or config.mined_from
    num_mined = config.num_mined if num_mined is None else num_mined
    method = method or config.method
    if mined_from not in MINED_FROM or method not in METHODS:
        raise ValueError(f"mined_from must be one of {MINED_FROM} and method one of {METHODS}")
    if mined_from == "auto":
        mined_from = "input" if any(item.negatives for item in items) else ("bm25" if num_mined > 0 else "none")
    if mined_from in ("bm25", "random") and num_mined > 0 and corpus is None:
        raise ValueError(f"{config.name}: {mined_from} negatives need a corpus (--corpus)")
    out_path = Path(out_path)
    stats_path = Path(stats_path) if stats_path else out_path.with_name(out_path.name + ".stats.json")
    if out_path.exists() and out_path.stat().st_size > 0 and not resume:
        raise FileExistsError(f"{out_path} exists; pass --resume to continue it or choose another output")
    if resume and out_path.exists() and out_path.stat().st_size > 0:
        conflicts = resume_conflicts(stats_path, {
            "config": config.name, "mined_from": mined_from, "num_mined": num_mined, "method": method, "ratio": ratio,
            "settings": asdict(settings), "generated_from": str(generated_from or "") or None, **(run_info or {})})
        if conflicts:
            raise ValueError(f"{out_path}: cannot --resume a file made with other settings ({'; '.join(conflicts)}); "
                             "rerun with its settings or choose another --output_jsonl")
    done = done_keys(out_path) if resume else set()
    aug = augmented_keys(items, ratio, settings.seed) if method != "none" else set()
    if aug and generator is None and generated_from is None:
        raise ValueError(f"{config.name}: method {method} needs a generator (or --generated_from)")
    reused = load_generated(generated_from, method) if (generated_from and method != "none") else None
    style_pool = [(f"pos:{it.key}", it.positive) for it in items] if corpus is None else []
    summary = RunSummary(items=len(items))
    gstats = GenerationStats()
    todo = [item for item in items if item.key not in done]
    summary.skipped_done = len(items) - len(todo)

    def write_stats(final: bool) -> None:
        write_json(stats_path, {"out_jsonl": str(out_path), "config": asdict(config), "mined_from": mined_from,
                                "num_mined": num_mined, "method": method, "ratio": ratio,
                                "settings": asdict(settings), "generated_from": str(generated_from or "") or None,
                                "trainer_flags": config.trainer_flags(), "finished": final,
                                "this_run": {**summary.as_dict(), "generation": gstats.as_dict()},
                                "file": file_summary(out_path), **(run_info or {})})

    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc=f"negatives[{config.name}]", unit="query")
    rng_random = lambda item: random.Random(f"{settings.seed}:{item.key}:random")  # noqa: E731
    with JsonlAppender(out_path) as sink:
        for chunk in _chunks(todo, aug, max(1, chunk_size)):
            gen_items = [it for it in chunk if it.key in aug]
            generated: dict[str, list[GeneratedNegative]] = {}
            if gen_items and reused is not None:
                missing = [it for it in gen_items if it.key not in reused]
                if missing:
                    raise DataError(f"{generated_from}: no generated negatives for item {missing[0].id!r} "
                                    f"(key {missing[0].key}); run that configuration on the same input and ratio")
                generated = {it.key: reused[it.key][:settings.k] for it in gen_items}
                summary.reused_generated += sum(len(v) for v in generated.values())
            elif gen_items:
                generated = generate_negatives(generator, gen_items, method, settings, gstats, corpus, style_pool)
            for item in chunk:
                corpus_negs = None
                if mined_from == "bm25":
                    corpus_negs = corpus.bm25(item, num_mined)
                elif mined_from == "random":
                    corpus_negs = corpus.random(item, num_mined, rng_random(item))
                elif mined_from == "none":
                    corpus_negs = []
                rec = build_record(item, config, corpus_negs, generated.get(item.key), num_mined=num_mined,
                                   k=settings.k, augmented=item.key in aug)
                n_corpus = len(rec["hard_negatives"]) - rec["generation"]["written"]
                summary.corpus_negatives += n_corpus
                summary.fewer_corpus_negatives += int(mined_from != "none" and n_corpus < num_mined)
                summary.generated_negatives += rec["generation"]["written"]
                summary.augmented += int(item.key in aug)
                sink.append(rec)
                summary.written += 1
            if bar is not None:
                bar.update(len(chunk))
            write_stats(final=False)
    if bar is not None:
        bar.close()
    write_stats(final=True)
    return {"out_jsonl": str(out_path), "stats_json": str(stats_path), "config": config.name,
            "mined_from": mined_from, "num_mined": num_mined, "method": method, "ratio": ratio,
            **summary.as_dict(), "generation": gstats.as_dict(), "file": file_summary(out_path),
            "trainer_flags": config.trainer_flags()}


def _chunks(items: Sequence[NegItem], augmented: set[str], size: int) -> Iterable[list[NegItem]]:
    """Consecutive runs of items holding ``size`` augmented items each (plus the cheap others between them), so
    every generator call gets a full batch whatever the ratio; without augmentation, runs of ``size`` items."""
    chunk: list[NegItem] = []
    n_aug = 0
    for item in items:
        chunk.append(item)
        n_aug += item.key in augmented
        if (n_aug if augmented else len(chunk)) >= size:
            yield chunk
            chunk, n_aug = [], 0
    if chunk:
        yield chunk


def file_summary(path: str | os.PathLike) -> dict:
    """Totals over a whole output file (all runs): lines, negatives by source, generation outcome."""
    out = Counter()
    perturbations: Counter = Counter()
    for rec in iter_appended_jsonl(path):
        out["lines"] += 1
        for s, t in zip(rec.get("negative_sources") or [], rec.get("negative_traces") or []):
            out[f"{s}_negatives"] += 1
            if s == GENERATED and isinstance(t, dict) and t.get("perturbation"):
                perturbations[t["perturbation"]] += 1
        gen = rec.get("generation") or {}
        out["generation_requested"] += gen.get("requested", 0)
        out["generation_written"] += gen.get("written", 0)
    return {**dict(out), "perturbations": dict(perturbations)}
