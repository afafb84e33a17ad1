"""CausalNeg hard negatives (second source document, Sec. 3.2 and 4.1) and the paper's baselines, as one pipeline.

For each (q, d+) the pipeline writes one triplet line (SCHEMAS.md ``final_train_data`` schema) whose hard negatives
come from up to two places:

- **corpus negatives** (``negative_sources`` "mined"): BM25-mined (``bm25s`` through
  :class:`repair.sources.local_corpus.LocalCorpus`, positives excluded; the paper's 15 per query), uniformly random
  corpus documents (the "Random" baseline), or the input's own hard negatives (REPAIR's 08/09 output);
- **generated negatives** (``negative_sources`` "generated"), written by a generator of :mod:`repair.generation`
  (local HF model or OpenAI-compatible server), either
  - ``cot``: the three-stage CoT-guided counterfactual perturbation of Sec. 3.2 -- stage 1 decomposes *why* d+
    satisfies q into K falsifiable requirements (Eq. 2: relevance as a conjunction), stage 2 picks one
    perturbation per requirement (entity substitution, requirement drift, constraint violation), stage 3 writes
    one negative per perturbation in the corpus' style, given style references sampled from the corpus; or
  - ``vanilla``: a SyNeg-style single prompt (the paper's "vanilla generation" baseline, Sec. 2.1).

Every generated negative keeps a trace (method, requirement, perturbation type, chain position, style references)
in ``negative_traces``. Malformed generator outputs are retried, then counted; a weak model (SmolLM2-135M) mostly
produces such outputs and the pipeline survives it. Records are appended one at a time (resumable).

The paper's baselines are rows of :data:`CONFIGS` (Sec. 4.1): random, mined, vanilla, cot, mixture (SyNeg:
15 mined + 3 vanilla) and causalneg (15 mined + 3 CoT, trained with QEM).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .data import DataError, JsonlAppender, iter_jsonl, load_seed, write_json

logger = logging.getLogger(__name__)

GENERATED, MINED = "generated", "mined"
METHODS = ("none", "vanilla", "cot")
MINED_FROM = ("auto", "input", "bm25", "random", "none")
POSITIONS = ("front", "back", "random")

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
    qem_lambda: float      # trainer --qem_lambda (the trainer's own default is 0.1: pass 0 explicitly)
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

# ---------------------------------------------------------------------------------------------- prompts
# Our own wording of the paper's App. C prompts (Step 2: information requirement decomposition with disruption
# strategies; Step 3: constrained generation in the corpus' style). The exact templates are not in our sources.
COT_DECOMPOSE_ID = "causalneg-decompose-v1"
COT_WRITE_ID = "causalneg-write-v1"
VANILLA_ID = "syneg-vanilla-v1"

PERTURBATIONS: dict[str, str] = {
    # Sec. 3.2, stage 2: the three canonical violations.
    "entity_substitution": "replace the entity this requirement is about with a related but different one (a "
                           "sibling protein, another drug, another cell type, disease or population)",
    "requirement_drift": "shift the document's focus to an adjacent but different question on the same topic (for "
                         "example the mechanism instead of the clinical effect, or a different outcome)",
    "constraint_violation": "break a specific condition of this requirement: a different time, place, dose, "
                            "quantity, population, or the opposite direction of the effect",
}
PERTURBATION_ALIASES = {
    "entity": "entity_substitution", "substitution": "entity_substitution", "entity substitution":
    "entity_substitution", "drift": "requirement_drift", "requirement drift": "requirement_drift",
    "topic drift": "requirement_drift", "constraint": "constraint_violation", "violation": "constraint_violation",
    "constraint violation": "constraint_violation",
}

DECOMPOSE_HEAD = (
    "You analyse why a document is relevant to a search query. Think about what the query asks for, then list "
    "the {k} information requirements that the document satisfies and that together make it relevant. Each "
    "requirement is one concrete, checkable condition, such as \"names the enzyme that cleaves X\" or \"reports "
    "the effect in adults over 65\". For each one, say how to violate it: entity_substitution, requirement_drift "
    "or constraint_violation."
)
DECOMPOSE_FORMAT = (
    "Answer with a numbered list, one requirement per line, each followed by its perturbation in brackets, for "
    "example:\n1. names the enzyme that cleaves the precursor protein [entity_substitution]\n"
    'JSON is accepted too: {{"requirements": [{{"requirement": "...", "perturbation": "..."}}]}}'
)
WRITE_HEAD = (
    "You write documents for a collection of scientific abstracts. Match the style, length and vocabulary of "
    "these documents from the collection:"
)
VANILLA_HEAD = (
    "Write a hard negative document for the search query below: a passage that looks relevant to the query (same "
    "topic, similar words) but does not answer it. Write it like the relevant document shown."
)


def _clip(text: str, max_chars: int) -> str:
    """Cut a long text at a word boundary (prompt budget for small-context generators)."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars].rsplit(" ", 1)[0]
    return cut + " ..."


def build_decompose_prompt(query: str, positive: str, k: int, max_doc_chars: int = 1200) -> str:
    """Stage 1 (Sec. 3.2): decompose why d+ satisfies q into ``k`` falsifiable requirements, each with a
    suggested perturbation; asks for JSON (a numbered list is accepted too)."""
    return "\n".join([DECOMPOSE_HEAD.format(k=k), "", f"Query: {query}", f"Relevant document: "
                      f"{_clip(positive, max_doc_chars)}", "", DECOMPOSE_FORMAT.format(), "", "Requirements:"])


def build_write_prompt(query: str, positive: str, requirement: str, perturbation: str, style_refs: Sequence[str],
                       target_words: int = 120, max_doc_chars: int = 1200, max_ref_chars: int = 500) -> str:
    """Stage 3 (Sec. 3.2): write one negative realising ``perturbation`` of ``requirement``, in the style of the
    corpus documents ``style_refs`` (they constrain the surface form: Table 2's stylistic failure modes)."""
    if perturbation not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {perturbation!r}; expected one of {sorted(PERTURBATIONS)}")
    lines = [WRITE_HEAD, ""]
    for j, ref in enumerate(style_refs, start=1):
        lines.append(f"Example {j}: {_clip(ref, max_ref_chars)}")
    lines += ["", f"Search query: {query}", f"Relevant document: {_clip(positive, max_doc_chars)}",
              f"The relevant document satisfies this requirement of the query: {requirement}",
              "", f"Write a new document on the same topic that does NOT satisfy this requirement. To do so, "
              f"{PERTURBATIONS[perturbation]}. Keep everything else close to the relevant document. Do not say "
              f"that anything was changed and do not mention the query. Write only the document, about "
              f"{target_words} words.", "", "Document:"]
    return "\n".join(lines)


def build_vanilla_prompt(query: str, positive: str, target_words: int = 120, max_doc_chars: int = 1200) -> str:
    """The SyNeg-style single prompt of the "vanilla generation" baseline (Sec. 2.1): no requirement model."""
    return "\n".join([VANILLA_HEAD, "", f"Query: {query}", f"Relevant document: {_clip(positive, max_doc_chars)}",
                      "", f"Write only the document, about {target_words} words.", "", "Document:"])


# ---------------------------------------------------------------------------------------------- parsing
_WORD = _WORD_RE = re.compile(r"\w+")
_NUMBERED = re.compile(r"^\s*(?:\*\*)?(?:(?:requirement|req|r)\s*#?\s*(\d{1,2})\s*[:.)\-–]|(\d{1,2})\s*[.):]"
                       r"(?!\d))\s*(.*)$", re.I)
_BULLET = re.compile(r"^\s*[-*•]\s+(.*)$")
_PREAMBLE = re.compile(r"^(sure|here|certainly|okay|ok|of course|absolutely|great|below)\b", re.I)
# Requirements / documents that talk about the task instead of the topic (small models do this a lot).
_META_REQ = re.compile(r"\b(?:all|these|three|four|five|the following|listed|above|below)\b.{0,40}\b(?:requirements?|"
                       r"criteria)\b|\b(?:requirements?|criteria)\b.{0,40}\b(?:above|below|listed|specified)\b", re.I)
_META_DOC = re.compile(r"\b(?:this|the|original|relevant|new|your|my) (?:document|passage)s?\b|\bthe (?:search )?query\b"
                       r"|\brequirements?\b.{0,30}\b(?:above|below|listed|specified|provided|requested)\b"
                       r"|\bas requested\b|\bhere is\b|\bhard negative\b"
                       # a chat assistant's voice, never an abstract's: "I will describe", "your question", "let's"
                       r"|\bI (?:will|am|have|can|hope)\b|\bI'(?:m|ll|ve)\b|\byour (?:question|request|answer|"
                       r"response|goal)s?\b|\blet'?s\b|\bplease\b", re.I)
_EXAMPLE_REQS = {" ".join(_WORD_RE.findall(t.lower())) for t in (
    "names the enzyme that cleaves X", "reports the effect in adults over 65",
    "names the enzyme that cleaves the precursor protein")}  # the prompt's own examples, copied back
_KEYS_LIST = ("requirements", "requirement", "information_requirements", "conditions", "reqs")
_KEYS_TEXT = ("requirement", "text", "condition", "description", "name")
_KEYS_TYPE = ("perturbation", "perturbation_type", "strategy", "type", "violation")


def _norm(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def normalize_perturbation(value: Any) -> str | None:
    """Map a perturbation name the model wrote ("Entity substitution", "constraint-violation") to a canonical one."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower().replace("-", " ").replace("_", " ")
    if text.replace(" ", "_") in PERTURBATIONS:
        return text.replace(" ", "_")
    for alias, name in sorted(PERTURBATION_ALIASES.items(), key=lambda kv: -len(kv[0])):
        if alias in text:
            return name
    return None


def _json_values(text: str) -> list[Any]:
    """Every JSON object/array that starts somewhere in ``text`` (code fences, leading prose and trailing text
    are tolerated: each candidate start is decoded with ``raw_decode``)."""
    decoder = json.JSONDecoder()
    found = []
    pos = 0
    while True:
        starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
        if not starts:
            return found
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        found.append(value)
        pos = end


def _requirement_from(value: Any) -> tuple[str, str | None] | None:
    if isinstance(value, str):
        return value, None
    if isinstance(value, dict):
        text = next((value[k] for k in _KEYS_TEXT if isinstance(value.get(k), str)), None)
        if text is None:
            return None
        kind = next((value[k] for k in _KEYS_TYPE if isinstance(value.get(k), str)), None)
        return text, normalize_perturbation(kind)
    return None


def _from_json(values: list[Any]) -> tuple[list[tuple[str, str | None]] | None, str | None]:
    """Requirements from decoded JSON; (None, reason) when the JSON holds none ("wrong_key")."""
    for value in values:
        items = None
        if isinstance(value, dict):
            items = next((value[k] for k in _KEYS_LIST if isinstance(value.get(k), list)), None)
            if items is None and any(k in value for k in _KEYS_TEXT):
                items = [value]  # a single requirement object
        elif isinstance(value, list):
            items = value
        if items is None:
            continue
        parsed = [r for r in (_requirement_from(v) for v in items) if r is not None]
        if parsed:
            return parsed, None
    return None, "wrong_key" if values else None


def _type_in_text(text: str) -> tuple[str, str | None]:
    """Split a trailing perturbation annotation off a list item: "... (perturbation: entity substitution)",
    "... -> constraint violation", "... | requirement_drift"."""
    m = re.search(r"\s*(?:[(\[]\s*)?(?:perturbation|strategy|violation|violate(?: it)? by|how to violate)?\s*[:=]?"
                  r"\s*\b(entity[ _-]substitution|requirement[ _-]drift|constraint[ _-]violation)\b\s*[)\]]?\s*\.?$",
                  text, re.I)
    if m and m.start() > 0:
        head = re.sub(r"[\s\-–—>|:;,(\[]+$", "", text[:m.start()])
        return head, normalize_perturbation(m.group(1))
    return text, None


def _from_list(text: str) -> list[tuple[str, str | None]]:
    """Numbered items ("1. ...", "1) ...", "Requirement 1: ...") with their continuation lines; bullets if there is
    no numbered item."""
    items: list[list[str]] = []
    bullets: list[str] = []
    for line in text.splitlines():
        m = _NUMBERED.match(line)
        if m:
            items.append([m.group(3)])
            continue
        b = _BULLET.match(line)
        if b:
            bullets.append(b.group(1))
        if items and line.strip():
            items[-1].append(b.group(1) if b else line.strip())
    raw = [" ".join(part for part in item if part) for item in items] if items else bullets
    return [_type_in_text(item) for item in raw]


def _clean_requirement(text: str) -> str:
    text = text.replace("**", "").replace("__", "").replace("`", "")
    text = re.sub(r"^\s*(?:requirement|condition)\s*\d*\s*[:\-–]\s*", "", text, flags=re.I)
    text = " ".join(text.split()).strip(" \"'“”‘’-–—:;,")
    return text


def parse_requirements(raw: str, query: str = "", k: int | None = None, min_words: int = 3,
                       max_words: int = 60) -> tuple[list[dict], str]:
    """Stage-1 output -> ([{"requirement", "perturbation" (suggested or None)}], "ok") or ([], reason).

    Tolerant: JSON (in code fences, with leading prose or trailing text; the key ``requirements`` or a known
    alias; items as strings or objects), else a numbered list (continuation lines and sub-bullets joined), else
    bullets. Reasons: ``empty``, ``wrong_key`` (JSON without a requirements list), ``no_list`` (prose only),
    ``no_valid_requirement`` (every item too short, too long, an echo of the query, a duplicate, or about the task
    itself: "the document must satisfy all three requirements above").
    Keeps at most ``k`` requirements, in the order written (the chain order of Sec. 3.2).
    """
    text = (raw or "").replace("\r", "\n").strip()
    if not text:
        return [], "empty"
    parsed, reason = _from_json(_json_values(text))
    if parsed is None:
        parsed = _from_list(text)
        if not parsed:
            return [], reason or "no_list"
    out: list[dict] = []
    seen: set[str] = set()
    qnorm = _norm(query)
    for req, kind in parsed:
        req = _clean_requirement(req)
        words = _WORD.findall(req)
        key = _norm(req)
        if len(words) < min_words or len(words) > max_words or not key or key == qnorm or key in seen:
            continue
        if (_PREAMBLE.match(req) and req.endswith(":")) or _META_REQ.search(req) or key in _EXAMPLE_REQS:
            continue
        seen.add(key)
        out.append({"requirement": req, "perturbation": kind})
    if not out:
        return [], "no_valid_requirement"
    return (out[:k] if k else out), "ok"


_LABEL = re.compile(r"^(?:(?:new|negative|hard negative|generated|irrelevant|counterfactual)\s+)?"
                    r"(?:document|passage|abstract|text)\s*\d*\s*:\s*", re.I)
_PROMPT_MARKERS = ("example 1:", "search query:", "relevant document:", "requirement of the query",
                   "write only the document")


def _repeated_ngram_share(words: list[str], n: int = 4) -> float:
    """Share of a text's word n-grams that repeat an earlier one: ~0.9 for a generation loop, at most 0.22 (p99.9
    0.15) over the 5,183 SciFact abstracts, so a 0.3 cut rejects loops and no real abstract."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def clean_passage(raw: str, positive: str = "", min_words: int = 20, max_words: int = 400,
                  others: Iterable[str] = ()) -> tuple[str | None, str]:
    """Stage-3 / vanilla output -> (document, "ok") or (None, reason).

    Takes the text after a leading ``Document:`` label, drops chat preambles ("Here is the document:"), markdown
    and wrapping quotes, joins lines, and trims an unfinished last sentence (a cut at max_new_tokens) when enough
    words remain. Reasons: ``empty``, ``too_short`` (< ``min_words``), ``echo`` (repeats the prompt), ``meta`` (talks
    about the task or to the user: "this document meets the requirement", "the query", "I will", "your
    question", "please"), ``copy``
    (the positive itself, or a near copy: >= 90% of its words in the same order), ``duplicate`` (equals one of
    ``others``), ``not_text``, ``repetitive`` (> 30% of its 4-grams repeat an earlier one, or < 30% distinct
    words).
    """
    text = (raw or "").replace("\r", "\n").strip()
    m = list(re.finditer(r"(?:^|\n)\s*(?:\*\*)?document\s*:\s*(?:\*\*)?", text, re.I))
    if m:
        text = text[m[-1].end():]
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    while lines and (lines[0].endswith(":") or _PREAMBLE.match(lines[0])) and (
            len(lines) > 1 or (lines[0].endswith(":") and _PREAMBLE.match(lines[0]))):
        lines.pop(0)  # "Here is the document:" with nothing after it is an empty answer
    if not lines:
        return None, "empty"
    text = " ".join(re.sub(r"^(?:#+|>)\s*", "", ln) for ln in lines)
    text = text.replace("**", "").replace("__", "")
    text = _LABEL.sub("", text).strip().strip("\"'`“”‘’").strip()
    text = " ".join(text.split())
    if not text:
        return None, "empty"
    low = text.lower()
    if any(marker in low for marker in _PROMPT_MARKERS):
        return None, "echo"
    if _META_DOC.search(text):
        return None, "meta"
    words = _WORD.findall(low)
    if len(words) > max_words:
        text = " ".join(text.split()[:max_words])
        words = _WORD.findall(text.lower())
    if not re.search(r"[.!?][\"')\]]?$", text):  # cut mid-sentence by the token limit
        ends = [e.end() for e in re.finditer(r"[.!?](?=\s)", text)]
        if ends and len(_WORD.findall(text[:ends[-1]])) >= min_words:
            text = text[:ends[-1]]
            words = _WORD.findall(text.lower())
    if len(words) < min_words:
        return None, "too_short"
    letters = sum(ch.isalpha() for ch in text)
    if letters < 0.6 * len(text.replace(" ", "")):
        return None, "not_text"
    if _repeated_ngram_share(words) > 0.3 or len(set(words)) < 0.3 * len(words):
        return None, "repetitive"
    pos_words = _WORD.findall(positive.lower())
    if pos_words and (_norm(text) == _norm(positive) or _lcs_share(words, pos_words) >= 0.9):
        return None, "copy"
    if _norm(text) in {_norm(o) for o in others}:
        return None, "duplicate"
    return text, "ok"


def _lcs_share(a: list[str], b: list[str]) -> float:
    """Longest common subsequence of words / the shorter text's length: 1.0 for a copy, low for a rewrite."""
    if not a or not b:
        return 0.0
    if len(a) * len(b) > 400_000:  # long texts: a cheap order-free bound is enough to flag copies
        ca, cb = Counter(a), Counter(b)
        return sum((ca & cb).values()) / min(len(a), len(b))
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1] / min(len(a), len(b))


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


# ---------------------------------------------------------------------------------------------- input
@dataclass
class NegItem:
    """One (q, d+) to give negatives to. ``positives`` are every text known to answer q (never a negative)."""

    key: str
    id: str
    query: str
    positive: str
    positives: frozenset[str]
    positive_ids: frozenset[str] = frozenset()
    negatives: list[str] = field(default_factory=list)          # the input's hard negatives (best first)
    scores: list[float | None] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    traces: list[Any] = field(default_factory=list)
    extra: dict = field(default_factory=dict)                   # other input fields, written through


def item_key(query: str, positive: str) -> str:
    """A stable id of a (q, d+) pair: the resume key, independent of file order and of the run."""
    return hashlib.sha1(f"{query.strip()}\x00{positive.strip()}".encode()).hexdigest()[:16]


TRIPLET_REQUIRED = {"query": str, "pos_document": str}
TRIPLET_OPTIONAL = {"id": (str, int), "hard_negatives": list[str], "hard_negative_scores": list,
                    "negative_sources": list[str], "negative_traces": list, "d_neg": str}
_REWRITTEN = {"query", "pos_document", "hard_negatives", "hard_negative_scores", "d_neg", "negative_sources",
              "negative_traces", "key", "negatives_config", "generation"}


def _first_record(path: Path) -> dict | None:
    for rec in iter_jsonl(path):
        return rec
    return None


def load_items(path: str | os.PathLike, split: str = "train") -> tuple[list[NegItem], dict]:
    """Read (q, d+) pairs: a triplet JSONL (09 output: ``query``, ``pos_document``[, ``hard_negatives``, ...]) or
    any T0 that :func:`repair.data.load_seed` reads (BEIR folder + split, ``.pt``, JSONL ``{query, positive}``).

    A BEIR query gives one item (its first positive); all its qrels positives are excluded from its negatives.
    In the other formats every row is an item, and rows with the same query text share their positives.
    Returns (items, counts); a repeated (q, d+) pair is one item (``duplicate_items``).
    """
    path = Path(path)
    counts: Counter = Counter()
    items: list[NegItem] = []
    if path.suffix not in (".pt", ".pth") and path.is_file() and "pos_document" in (_first_record(path) or {}):
        rows = []
        for lineno, rec in iter_jsonl(path, TRIPLET_REQUIRED, TRIPLET_OPTIONAL, with_lineno=True):
            where = f"{path}:{lineno}"
            negs = rec.get("hard_negatives") or []
            for name in ("hard_negative_scores", "negative_sources", "negative_traces"):
                if rec.get(name) is not None and len(rec[name]) != len(negs):
                    raise DataError(f"{where}: field '{name}' has {len(rec[name])} entries but 'hard_negatives' has "
                                    f"{len(negs)}; they must be parallel")
            for s in rec.get("negative_sources") or []:
                if s not in (MINED, GENERATED):
                    raise DataError(f"{where}: field 'negative_sources' holds {s!r}; allowed: mined, generated")
            if not negs and rec.get("d_neg"):
                negs = [rec["d_neg"]]
            rows.append((rec, negs, where))
        by_query: dict[str, set[str]] = defaultdict(set)
        for rec, _, _ in rows:
            by_query[rec["query"].strip()].add(rec["pos_document"].strip())
        for n, (rec, negs, where) in enumerate(rows):
            query, positive = rec["query"].strip(), rec["pos_document"].strip()
            if not query or not positive:
                counts["dropped_empty"] += 1
                continue
            scores = rec.get("hard_negative_scores")
            items.append(NegItem(
                key=item_key(query, positive), id=str(rec.get("id", f"row{n}")), query=query, positive=positive,
                positives=frozenset(by_query[query]), negatives=list(negs),
                scores=list(scores) if scores is not None and len(scores) == len(negs) else [None] * len(negs),
                sources=list(rec.get("negative_sources") or [MINED] * len(negs)),
                traces=list(rec.get("negative_traces") or [None] * len(negs)),
                extra={k: v for k, v in rec.items() if k not in _REWRITTEN}))
        counts["format"] = "triplets"
    else:
        beir = path.is_dir()
        seed = load_seed(path, split, all_positives=beir)
        counts["dropped_empty"] += seed.dropped
        if beir:
            groups: dict[str, list[int]] = defaultdict(list)
            for i, qid in enumerate(seed.query_ids):
                groups[qid].append(i)
            for qid, rows_of in groups.items():
                first = rows_of[0]
                items.append(NegItem(key=item_key(seed.queries[first], seed.passages[first]), id=qid,
                                     query=seed.queries[first], positive=seed.passages[first],
                                     positives=frozenset(seed.passages[i] for i in rows_of),
                                     positive_ids=frozenset(seed.doc_ids[i] for i in rows_of),
                                     extra={"pos_doc_id": seed.doc_ids[first]}))
            counts["format"] = f"beir:{split}"
        else:
            by_query = defaultdict(set)
            for q, p in zip(seed.queries, seed.passages):
                by_query[q].add(p)
            for n, (q, p) in enumerate(zip(seed.queries, seed.passages)):
                items.append(NegItem(key=item_key(q, p), id=f"row{seed.kept_rows[n]}", query=q, positive=p,
                                     positives=frozenset(by_query[q])))
            counts["format"] = "seed"
    unique, seen = [], set()
    for item in items:
        if item.key in seen:
            counts["duplicate_items"] += 1
            continue
        seen.add(item.key)
        unique.append(item)
    counts["items"] = len(unique)
    return unique, dict(counts)


# ---------------------------------------------------------------------------------------------- corpus negatives
@dataclass
class CorpusNegative:
    text: str
    score: float | None
    doc_id: str
    method: str  # "bm25" | "random"
    rank: int | None = None


class CorpusNegatives:
    """BM25-mined and random negatives from a local corpus (the paper's "Mined-only" and "Random", Sec. 4.1 /
    App. E.1: 15 per query, positives removed), plus the style references of stage 3."""

    def __init__(self, corpus: str | os.PathLike, index_dir: str | os.PathLike | None = None):
        from .sources.local_corpus import LocalCorpus

        self.index = LocalCorpus(corpus, index_dir=index_dir)
        self.ids = [p.id for p in self.index.papers]
        self.texts = [f"{p.title} {p.abstract}".strip() for p in self.index.papers]
        self.usable = [i for i, t in enumerate(self.texts) if t]

    def __len__(self) -> int:
        return len(self.usable)

    @staticmethod
    def _excluded(item: NegItem) -> tuple[frozenset[str], set[str]]:
        return item.positive_ids, {_norm(p) for p in item.positives}

    def bm25(self, item: NegItem, n: int) -> list[CorpusNegative]:
        """The top ``n`` BM25 hits of the query (score > 0) that are not positives, by id or by text."""
        if n <= 0:
            return []
        ids, texts = self._excluded(item)
        depth = n + len(item.positives) + 5
        while True:
            hits = self.index.search(item.query, depth)
            out, seen = [], set()
            for rank, paper in enumerate(hits, start=1):
                text = f"{paper.title} {paper.abstract}".strip()
                key = _norm(text)
                if paper.id in ids or key in texts or not key or key in seen:
                    continue
                seen.add(key)
                out.append(CorpusNegative(text, float(paper.score), paper.id, "bm25", rank))
                if len(out) == n:
                    return out
            if len(hits) < depth or depth >= len(self.texts):
                return out  # the corpus has no more hits with a shared term
            depth *= 2

    def random(self, item: NegItem, n: int, rng: random.Random) -> list[CorpusNegative]:
        """``n`` distinct corpus documents drawn uniformly (without replacement), positives removed."""
        ids, texts = self._excluded(item)
        out, seen = [], set()
        candidates = self.usable[:]
        rng.shuffle(candidates)
        for i in candidates:
            key = _norm(self.texts[i])
            if self.ids[i] in ids or key in texts or key in seen:
                continue
            seen.add(key)
            out.append(CorpusNegative(self.texts[i], None, self.ids[i], "random"))
            if len(out) == n:
                break
        return out

    def style_references(self, item: NegItem, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """``n`` random corpus documents (not positives) as (id, text): stage 3's style anchors."""
        return [(c.doc_id, c.text) for c in self.random(item, n, rng)]


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
            key = _norm(text)
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
    banned = {_norm(p) for p in item.positives}
    candidates = [ref for ref in pool if _norm(ref[1]) not in banned]
    return rng.sample(candidates, min(n, len(candidates)))


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
    seen = {_norm(t) for t in negs} | {_norm(p) for p in item.positives}
    n_gen = 0
    for g in generated or []:
        key = _norm(g.text)
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
    path = Path(path)
    keys: set[str] = set()
    if not path.exists():
        return keys
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("key"):
                keys.add(rec["key"])
    return keys


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
    path = Path(path)
    out = Counter()
    perturbations: Counter = Counter()
    if path.exists():
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out["lines"] += 1
                for s, t in zip(rec.get("negative_sources") or [], rec.get("negative_traces") or []):
                    out[f"{s}_negatives"] += 1
                    if s == GENERATED and isinstance(t, dict) and t.get("perturbation"):
                        perturbations[t["perturbation"]] += 1
                gen = rec.get("generation") or {}
                out["generation_requested"] += gen.get("requested", 0)
                out["generation_written"] += gen.get("written", 0)
    return {**dict(out), "perturbations": dict(perturbations)}
