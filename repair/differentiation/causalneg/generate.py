"""CausalNeg's generator calls for one chunk of items: stage 2 (which requirement gets which perturbation), then the
batched, seeded and retried calls of stage 1 and stage 3 (``cot``) or of the single vanilla prompt, each output
validated by :mod:`.parsing` and traced.

Separate from the pipeline because it is the only part that talks to a generator: the pipeline decides which items
are augmented and writes lines; this module turns items into generated documents and counts every outcome.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from repair.text import word_key
from repair.differentiation.causalneg.inputs import CorpusNegatives, NegItem
from repair.differentiation.causalneg.parsing import clean_passage, parse_requirements
from repair.differentiation.causalneg.prompts import COT_WRITE_ID, PERTURBATIONS, VANILLA_ID, build_decompose_prompt, build_vanilla_prompt, build_write_prompt

logger = logging.getLogger(__name__)

POSITIONS = ("front", "back", "random")


# ---------------------------------------------------------------------------------------------- stage 2
def plan_perturbations(requirements: Sequence[dict], k: int, position: str = "front",
                       rng: random.Random | None = None) -> list[dict]:
    """Stage 2 (Sec. 3.2): choose ``k`` (requirement, perturbation) pairs along the requirement chain.

    ``position`` picks the requirements: ``front`` (the chain's first nodes: the paper's default), ``back`` (its
    last: fine-grained constraints, App. D's best) or ``random``. With fewer than ``k`` requirements the chain is
    walked again and each requirement gets a different perturbation (multiple strategies per requirement). A
    requirement's first use takes the type the model suggested for it, if any; otherwise (and on later uses) the
    type that is least used so far in this item, so the ``k`` negatives cover the three types (diversity, Sec. 3.2).
    Returns ``[{"requirement", "requirement_index", "perturbation", "perturbation_from"}]``.
    """
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    n = len(requirements)
    if n == 0 or k <= 0:
        return []
    if position == "front":
        order = list(range(n))
    elif position == "back":
        order = list(range(n - 1, -1, -1))
    else:
        order = list(range(n))
        (rng or random.Random(0)).shuffle(order)
    types = list(PERTURBATIONS)
    picks = [order[slot % n] for slot in range(k)]
    kinds: list[tuple[str, str] | None] = [None] * k
    used_types: Counter = Counter()
    used_pairs: set[tuple[int, str]] = set()
    for slot, idx in enumerate(picks):  # first pass: a requirement's first use takes the model's suggestion
        suggested = requirements[idx].get("perturbation")
        if slot < n and suggested in PERTURBATIONS:
            kinds[slot] = (suggested, "model")
            used_types[suggested] += 1
            used_pairs.add((idx, suggested))
    for slot, idx in enumerate(picks):  # second pass: the least used type not yet tried on this requirement
        if kinds[slot] is None:
            free = [t for t in types if (idx, t) not in used_pairs] or types
            kind = min(free, key=lambda t: (used_types[t], types.index(t)))
            kinds[slot] = (kind, "rotation")
            used_types[kind] += 1
            used_pairs.add((idx, kind))
    plan = [{"requirement": requirements[idx]["requirement"], "requirement_index": idx, "perturbation": kind,
             "perturbation_from": origin} for idx, (kind, origin) in zip(picks, kinds)]
    if position == "back":  # keep the chain order in the output
        plan.sort(key=lambda p: (p["requirement_index"], types.index(p["perturbation"])))
    return plan


# ---------------------------------------------------------------------------------------------- generation
@dataclass
class GenerationSettings:
    """How the generator is asked (sampling follows the expansion step's defaults, with longer outputs)."""

    k: int = 3
    num_requirements: int | None = None   # stage 1 K (default: max(k, 3))
    position: str = "front"
    max_retries: int = 2
    style_refs: int = 2
    target_words: int = 120
    min_words: int = 20
    max_doc_chars: int = 1200
    max_ref_chars: int = 500
    decompose_tokens: int = 200
    write_tokens: int = 220
    temperature: float = 0.7
    top_p: float = 0.9
    repetition_penalty: float = 1.1
    seed: int = 42

    @property
    def requirements_k(self) -> int:
        return self.num_requirements or max(self.k, 3)


@dataclass
class GenerationStats:
    """Counts of one run (written to the stats JSON): calls, accepted outputs and rejections by reason."""

    calls: Counter = field(default_factory=Counter)            # stage -> generator outputs requested
    ok: Counter = field(default_factory=Counter)               # stage -> accepted outputs
    rejected: dict = field(default_factory=lambda: defaultdict(Counter))  # stage -> reason -> n
    items_failed_decompose: int = 0       # stage 1 malformed after every retry: no CoT negative for the item
    negatives_requested: int = 0
    negatives_written: int = 0
    negatives_failed: int = 0             # malformed after every retry

    def as_dict(self) -> dict:
        return {"calls": dict(self.calls), "ok": dict(self.ok),
                "rejected": {s: dict(c) for s, c in self.rejected.items()},
                "items_failed_decompose": self.items_failed_decompose,
                "negatives_requested": self.negatives_requested, "negatives_written": self.negatives_written,
                "negatives_failed": self.negatives_failed}


@dataclass
class _Task:
    owner: str                         # item key
    prompt: str
    stage: str                         # "decompose" | "write" | "vanilla"
    parse: Callable[[str], tuple[Any, str]]
    max_new_tokens: int
    meta: dict = field(default_factory=dict)
    result: Any = None
    attempts: int = 0


def _call_seed(settings: GenerationSettings, tasks: Sequence[_Task], attempt: int) -> int:
    digest = hashlib.sha1(f"{settings.seed}:{tasks[0].stage}:{tasks[0].owner}:{attempt}".encode()).hexdigest()
    return int(digest[:8], 16)


def _run_tasks(generator, tasks: list[_Task], settings: GenerationSettings, stats: GenerationStats) -> None:
    """Generate one output per task, validate it, and retry the rejected ones up to ``max_retries`` times
    (a new seed each attempt). Tasks of one stage are sent as one batched call per attempt."""
    for attempt in range(settings.max_retries + 1):
        todo = [t for t in tasks if t.result is None]
        if not todo:
            return
        by_tokens: dict[int, list[_Task]] = defaultdict(list)
        for t in todo:
            by_tokens[t.max_new_tokens].append(t)
        for max_new, group in by_tokens.items():
            outputs = generator.generate([t.prompt for t in group], n=1, seed=_call_seed(settings, group, attempt),
                                         max_new_tokens=max_new, temperature=settings.temperature,
                                         top_p=settings.top_p, repetition_penalty=settings.repetition_penalty)
            for task, raw in zip(group, outputs):
                task.attempts += 1
                stats.calls[task.stage] += 1
                value, reason = task.parse(raw)
                if value is None:
                    stats.rejected[task.stage][reason] += 1
                    logger.debug("%s %s rejected (%s): %r", task.stage, task.owner, reason, raw[:200])
                else:
                    stats.ok[task.stage] += 1
                    task.result = value


@dataclass
class GeneratedNegative:
    text: str
    trace: dict


def generate_negatives(generator, items: Sequence[NegItem], method: str, settings: GenerationSettings,
                       stats: GenerationStats, style_source: CorpusNegatives | None = None,
                       style_pool: Sequence[tuple[str, str]] = ()) -> dict[str, list[GeneratedNegative]]:
    """``settings.k`` generated negatives per item (fewer when outputs stay malformed), keyed by item key.

    ``cot``: stage 1 (one decomposition per item) -> stage 2 (:func:`plan_perturbations`) -> stage 3 (one write
    per planned perturbation, with ``settings.style_refs`` style references from ``style_source`` or, without a
    corpus, from ``style_pool``: (id, text) pairs such as other items' positives). ``vanilla``: ``k`` samples of
    the single SyNeg-style prompt. All items' calls of one stage go to the generator as one batch.
    """
    if method not in ("vanilla", "cot"):
        raise ValueError(f"method must be vanilla or cot, got {method!r}")
    out: dict[str, list[GeneratedNegative]] = {item.key: [] for item in items}
    taken: dict[str, set[str]] = {item.key: set() for item in items}
    stats.negatives_requested += settings.k * len(items)
    by_key = {item.key: item for item in items}
    if method == "vanilla":
        tasks = []
        for item in items:
            prompt = build_vanilla_prompt(item.query, item.positive, settings.target_words, settings.max_doc_chars)
            for j in range(settings.k):
                tasks.append(_Task(item.key, prompt, "vanilla", _passage_parser(item, taken, settings),
                                   settings.write_tokens, {"slot": j}))
        _run_tasks(generator, tasks, settings, stats)
        for t in tasks:
            if t.result is not None:
                out[t.owner].append(GeneratedNegative(t.result, {
                    "method": "vanilla", "requirement": None, "perturbation": None, "position": None,
                    "prompt_id": VANILLA_ID, "attempts": t.attempts}))
    else:
        k_req = settings.requirements_k
        decompose = [_Task(item.key, build_decompose_prompt(item.query, item.positive, k_req, settings.max_doc_chars),
                           "decompose", lambda raw, q=item.query: _unwrap(parse_requirements(raw, q, k_req)),
                           settings.decompose_tokens) for item in items]
        _run_tasks(generator, decompose, settings, stats)
        writes = []
        for task in decompose:
            item = by_key[task.owner]
            if task.result is None:
                stats.items_failed_decompose += 1
                continue
            rng = random.Random(f"{settings.seed}:{item.key}:plan")
            plan = plan_perturbations(task.result, settings.k, settings.position, rng)
            srng = random.Random(f"{settings.seed}:{item.key}:style")
            for step in plan:
                refs = _style_refs(item, settings.style_refs, srng, style_source, style_pool)
                prompt = build_write_prompt(item.query, item.positive, step["requirement"], step["perturbation"],
                                            [t for _, t in refs], settings.target_words, settings.max_doc_chars,
                                            settings.max_ref_chars)
                writes.append(_Task(item.key, prompt, "write", _passage_parser(item, taken, settings),
                                    settings.write_tokens, {**step, "n_requirements": len(task.result),
                                                            "style_refs": [i for i, _ in refs],
                                                            "decompose_attempts": task.attempts}))
        _run_tasks(generator, writes, settings, stats)
        for t in writes:
            if t.result is not None:
                trace = {"method": "cot", "requirement": t.meta["requirement"],
                         "requirement_index": t.meta["requirement_index"], "n_requirements": t.meta["n_requirements"],
                         "perturbation": t.meta["perturbation"], "perturbation_from": t.meta["perturbation_from"],
                         "position": settings.position, "style_refs": t.meta["style_refs"],
                         "prompt_id": COT_WRITE_ID, "attempts": t.attempts,
                         "decompose_attempts": t.meta["decompose_attempts"]}
                out[t.owner].append(GeneratedNegative(t.result, trace))
    written = sum(len(v) for v in out.values())
    stats.negatives_written += written
    stats.negatives_failed += settings.k * len(items) - written
    return out


def _unwrap(parsed: tuple[list[dict], str]) -> tuple[list[dict] | None, str]:
    reqs, reason = parsed
    return (reqs or None), reason


def _passage_parser(item: NegItem, taken: dict[str, set[str]], settings: GenerationSettings):
    """Validate one generated document against the item's positives and the item's negatives accepted so far
    (``taken``: normalised texts, updated on acceptance, so two samples of one batch cannot both be kept)."""

    def parse(raw: str) -> tuple[str | None, str]:
        text, reason = clean_passage(raw, item.positive, settings.min_words, others=item.positives)
        if text is not None:
            key = word_key(text)
            if key in taken[item.key]:
                return None, "duplicate"
            taken[item.key].add(key)
        return text, reason

    return parse


def _style_refs(item: NegItem, n: int, rng: random.Random, source: CorpusNegatives | None,
                pool: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    if n <= 0:
        return []
    if source is not None:
        return source.style_references(item, n, rng)
    banned = {word_key(p) for p in item.positives}
    candidates = [ref for ref in pool if word_key(ref[1]) not in banned]
    return rng.sample(candidates, min(n, len(candidates)))
