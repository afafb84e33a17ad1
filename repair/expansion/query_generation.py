"""Stage II step 05, query generation (DESIGN 5 step 5): grounding, the prompt, cleaning, and the rounds file.

Each query samples 1-3 concepts of C_conf, grounds them in PubChem / Materials Project (:class:`Grounder`;
failures recorded, not fatal), prompts the generator with the paper's prompt (:func:`build_prompt`) and keeps the
cleaned completion (:func:`clean_query`). Queries come in rounds of ``round_size``; round ``r`` is fully determined
by ``(seed, r)``, so ids ``r{r}-{j}`` are stable across resumes and invocations (:func:`generate_queries`).

Separate from :mod:`repair.expansion.generation` (the backends that turn prompts into text, shared with 06c and CausalNeg)
and from :mod:`repair.expansion.verification` (06: what a literature source makes of these queries): this module is what
REPAIR asks a generator for, and how it judges the answer.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from repair.data import DataError, JsonlAppender, iter_appended_jsonl, iter_jsonl, read_lines
from repair.expansion.generation import DEFAULT_SAMPLING
from repair.expansion.sources.http import SourceError
from repair.text import content_words, word_key

logger = logging.getLogger(__name__)

GENERATED_REQUIRED = {"id": str, "query": str}
GENERATED_OPTIONAL = {"concepts": list[str], "round": int, "attributes": dict, "grounding_errors": dict,
                      "prompt_id": str, "generator": dict}


def rounds_path_for(out_jsonl: str | Path) -> Path:
    """``<out>.rounds.jsonl``: one line per finished 05 round, with its rejected completions."""
    return Path(str(out_jsonl) + ".rounds.jsonl")


def read_concepts(path: str | Path) -> list[str]:
    """C_conf from ``final_terms.bottom_{pp}pct.txt``: ``#`` lines skipped, case-insensitive de-dup, order kept."""
    seen: set[str] = set()
    out = []
    for term in read_lines(path):
        if term.lower() not in seen:
            seen.add(term.lower())
            out.append(term)
    if not out:
        raise DataError(f"{path}: holds no concept (one concept per line)")
    return out


# ---------------------------------------------------------------------------------------------- prompts
# The paper's prompt (App. A.2.1, as described in UPSTREAM 2.6 "Paper version"): one query that is
# inherently ambiguous or hard to resolve for standard retrievers, reading like a real paper title or
# research question, in indirect / context-dependent / metaphorical language, over 1-3 grounded concepts
# listed as "Concept k: {name} (Attributes: {attrs})", then an open "Query:". Our own wording.
PAPER_PROMPT_ID = "repair-paper-a2.1-v1"
PAPER_PROMPT_HEAD = (
    "You are an expert scientific researcher. Write one research query that is inherently ambiguous or hard "
    "to resolve for standard retrievers. It must read like a real paper title or research question, and use "
    "indirect, context-dependent or metaphorical language instead of naming the concepts plainly. "
    "Base it on the concepts below and their attributes. Write only the query, on one line."
)

# The original 05's three-shot completion prompt (UPSTREAM 2.6), our own wording, one term.
ORIGINAL_PROMPT_ID = "upstream-3shot-v1"
ORIGINAL_PROMPT_HEAD = (
    "You are an expert in materials science. For the given term, write exactly one specific research query.\n\n"
    "Term: Graphene\n"
    "Query: How does high pressure change the electron mobility and structural integrity of monolayer "
    "graphene?\n\n"
    "Term: Ti6Al4V\n"
    "Query: What controls the fatigue life of selective-laser-melted Ti6Al4V in biomedical implants?\n\n"
)
PROMPT_IDS = {"paper": PAPER_PROMPT_ID, "original": ORIGINAL_PROMPT_ID}


def describe_attributes(attributes: dict | None) -> str:
    """Grounded attributes as the short phrase the prompt shows ("formula C9H8O4; molecular weight ...")."""
    if not attributes:
        return "none known"
    parts: list[str] = []
    pc = attributes.get("pubchem") or {}
    mp = attributes.get("materials_project") or {}
    if pc.get("formula"):
        parts.append(f"formula {pc['formula']}")
    elif mp.get("formula"):
        parts.append(f"formula {mp['formula']}")
    if pc.get("molecular_weight") is not None:
        parts.append(f"molecular weight {pc['molecular_weight']:g} g/mol")
    if pc.get("iupac_name"):
        parts.append(f"IUPAC name {pc['iupac_name']}")
    if pc.get("synonyms"):
        parts.append("synonyms " + ", ".join(pc["synonyms"]))
    if mp.get("crystal_system"):
        parts.append(f"crystal system {mp['crystal_system']}")
    if mp.get("band_gap") is not None:
        parts.append(f"band gap {mp['band_gap']:g} eV")
    if mp.get("density") is not None:
        parts.append(f"density {mp['density']:.3g} g/cm^3")
    return "; ".join(parts) or "none known"


def build_prompt(concepts: list[str], attributes: dict[str, dict] | None = None, template: str = "paper") -> str:
    """The query-generation prompt for 1-3 concepts (``template`` "paper") or one term ("original")."""
    attributes = attributes or {}
    if template == "paper":
        lines = [PAPER_PROMPT_HEAD, ""]
        for k, concept in enumerate(concepts, start=1):
            lines.append(f"Concept {k}: {concept} (Attributes: {describe_attributes(attributes.get(concept))})")
        lines += ["", "Query:"]
        return "\n".join(lines)
    if template == "original":
        return f"{ORIGINAL_PROMPT_HEAD}Term: {concepts[0]}\nQuery:"
    raise ValueError(f"unknown prompt template {template!r}; expected one of {sorted(PROMPT_IDS)}")


# ---------------------------------------------------------------------------------------------- cleaning
_PREAMBLE = re.compile(r"^(sure|here|certainly|okay|ok|of course|absolutely|great)\b", re.I)
_LABEL = re.compile(r"^(?:(?:research|generated|new|final)\s+)?(?:query|question|title)\s*\d*\s*[:\-–]\s*", re.I)


def clean_query(raw: str, prompt: str = "", min_words: int = 4,
                max_words: int | None = None) -> tuple[str | None, str]:
    """Turn a raw completion into one query, or reject it: returns (query, "ok") or (None, reason).

    Reasons: ``empty``, ``echo`` (the model repeated the prompt), ``too_short`` (< ``min_words`` words),
    ``too_long`` (> ``max_words`` words, when given), ``vague`` (< 3 distinct content words), ``not_text``,
    ``repetitive`` (degenerate loops). Like the original, the text after the last ``Query:`` is taken when present.
    """
    text = (raw or "").replace("\r", "\n").strip()
    match = list(re.finditer(r"query\s*:", text, re.I))
    if match:
        text = text[match[-1].end():]
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    # Drop chat preambles ("Here is a research query:") when something follows them.
    while len(lines) > 1 and (lines[0].endswith(":") or _PREAMBLE.match(lines[0])):
        lines.pop(0)
    if not lines:
        return None, "empty"
    line = lines[0]
    line = re.sub(r"^(?:[#>*\-]+|\d{1,2}[.)])\s+", "", line)  # one markdown bullet / list number
    line = line.replace("**", "").replace("__", "")
    line = _LABEL.sub("", line).strip()
    line = line.strip(" \"'`“”‘’").strip()
    line = " ".join(line.split())
    if not line:
        return None, "empty"
    # One query: cut at the first sentence end that leaves a full query before it ("...cells? A study ...").
    for end in re.finditer(r"[.?!](?=\s+[A-Z\"“])", line):
        if len(re.findall(r"\w+", line[:end.end()])) >= min_words:
            line = line[:end.end()]
            break
    words = re.findall(r"\w+", line.lower())
    if re.match(r"^concept\s*\d+\s*:", line, re.I) or (len(words) >= min_words and prompt and
                                                         word_key(line) in word_key(prompt)):
        return None, "echo"
    if len(words) < min_words:
        return None, "too_short"
    if max_words is not None and len(words) > max_words:
        return None, "too_long"
    letters = sum(ch.isalpha() for ch in line)
    if letters < 0.5 * len(line.replace(" ", "")):
        return None, "not_text"
    top = Counter(words).most_common(1)[0][1]
    if (len(words) >= 6 and top > 0.4 * len(words)) or len(set(words)) < 0.5 * len(words):
        return None, "repetitive"
    if len({w.lower() for w in content_words(line)}) < 3:  # "What can we do with this?"
        return None, "vague"
    return line, "ok"


def shared_content_words(text: str, reference: str) -> int:
    """Distinct content words of ``text`` that ``reference`` also holds (case-insensitive; a word of 6+ letters
    also matches on its first 6, so "microRNAs" meets "microRNA"): a query written *for* a passage shares its
    terms, one that drifted off topic does not."""
    ref = {w.lower() for w in content_words(reference)}
    stems = {w[:6] for w in ref if len(w) >= 6}
    words = {w.lower() for w in content_words(text)}
    return sum(1 for w in words if w in ref or (len(w) >= 6 and w[:6] in stems))


# ---------------------------------------------------------------------------------------------- grounding
class Grounder:
    """Attributes of a concept from PubChem and/or the Materials Project, memoised.

    A concept PubChem does not know, or that is no formula for MP, is recorded as a grounding error and
    the query is still generated (DESIGN 5 step 5). A fatal error (bad key) turns that source off for the
    rest of the run, with one warning.
    """

    def __init__(self, pubchem: Any = None, materials_project: Any = None):
        self.pubchem, self.mp = pubchem, materials_project
        self._memo: dict[str, tuple[dict, str | None]] = {}
        self.counts: Counter = Counter()

    @property
    def enabled(self) -> bool:
        return self.pubchem is not None or self.mp is not None

    def _call(self, which: str, fn: Callable[[str], dict | None], arg: str) -> tuple[dict | None, str | None]:
        try:
            return fn(arg), None
        except SourceError as exc:
            if exc.fatal:
                logger.warning("grounding: %s turned off for this run: %s", which, exc)
                setattr(self, "pubchem" if which == "pubchem" else "mp", None)
            return None, str(exc)

    def ground(self, concept: str) -> tuple[dict, str | None]:
        """({"pubchem": {...}, "materials_project": {...}} with the sources that found it, error text or None)."""
        if concept in self._memo:
            return self._memo[concept]
        from repair.expansion.sources.materials_project import looks_like_formula

        attrs: dict[str, dict] = {}
        errors: list[str] = []
        if self.pubchem is not None:
            found, err = self._call("pubchem", self.pubchem.ground, concept)
            if found:
                attrs["pubchem"] = found
            else:
                errors.append(err or f"pubchem: no compound named {concept!r}")
        if self.mp is not None:
            formula = concept if looks_like_formula(concept) else (attrs.get("pubchem") or {}).get("formula")
            if not formula:
                errors.append(f"materials_project: {concept!r} is not a chemical formula")
            else:
                found, err = self._call("materials_project", self.mp.ground, formula)
                if found:
                    attrs["materials_project"] = found
                else:
                    errors.append(err or f"materials_project: no material with formula {formula!r}")
        self.counts["grounded" if attrs else "ungrounded"] += 1
        result = (attrs, "; ".join(errors) or None)  # a partial failure stays visible beside what was found
        self._memo[concept] = result
        return result


# ---------------------------------------------------------------------------------------------- 05
def sample_concepts(concepts: list[str], rng: random.Random, min_k: int = 1, max_k: int = 3) -> list[str]:
    """1-3 distinct concepts of C_conf (the paper's sampling), fewer when C_conf is smaller."""
    k = rng.randint(min_k, max(min_k, max_k))
    return rng.sample(concepts, min(k, len(concepts)))


@dataclass
class GenerationStats:
    rounds_done: int = 0
    rounds_skipped: int = 0
    generated: int = 0
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)
    total_accepted_in_file: int = 0

    def as_dict(self) -> dict:
        return {"rounds_done": self.rounds_done, "rounds_skipped": self.rounds_skipped,
                "generated": self.generated, "accepted": self.accepted, "rejected": dict(self.rejected),
                "total_accepted_in_file": self.total_accepted_in_file}


def _existing_ids(path: Path, required: dict) -> set[str]:
    return {rec["id"] for rec in iter_appended_jsonl(path, required=required)}


def _existing_rounds(path: Path, settings: dict) -> set[int]:
    """Finished rounds of a 05 file; a file made with another seed / round size / prompt cannot be resumed (its ids
    would mean different queries), nor one made by another generator or sampling (issue 44: its new rounds would be
    written another way than its old ones). Settings an older file lacks are not compared."""
    done = set()
    for lineno, rec in iter_appended_jsonl(path, required={"round": int}, with_lineno=True):
        for name, value in settings.items():
            if name not in rec:
                continue
            pairs = ([(f"{name}.{k}", rec[name].get(k), v) for k, v in value.items()]
                     if isinstance(value, dict) and isinstance(rec[name], dict) else [(name, rec[name], value)])
            for shown, old, new in pairs:
                if old != new:
                    raise ValueError(f"{path}:{lineno}: this file was generated with {shown}={old!r}, not {new!r}; "
                                     "resume with the same settings or start a new --out_jsonl")
        done.add(rec["round"])
    return done


def generate_queries(concepts: list[str], generator: Any, out_jsonl: str | Path, *, num_queries: int,
                     round_size: int = 8, seed: int = 42, grounder: Grounder | None = None,
                     template: str = "paper", min_concepts: int = 1, max_concepts: int = 3,
                     sampling: dict | None = None, resume: bool = False, progress: bool = True) -> GenerationStats:
    """Write generated queries (SCHEMAS "generated queries JSONL") until ``num_queries`` (rounded up to whole
    rounds) have been attempted in ``out_jsonl``; with ``resume`` finished rounds are skipped."""
    from tqdm import tqdm

    out_jsonl = Path(out_jsonl)
    rounds_file = rounds_path_for(out_jsonl)
    if not resume and ((out_jsonl.exists() and out_jsonl.stat().st_size) or rounds_file.exists()):
        raise FileExistsError(f"{out_jsonl} already exists; pass --resume to continue it, or choose a new path")
    sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
    grounder = grounder or Grounder()
    if template == "original":
        min_concepts = max_concepts = 1
    existing = _existing_ids(out_jsonl, GENERATED_REQUIRED)
    info = generator.describe() if hasattr(generator, "describe") else {"backend": "custom"}
    describe = {k: info[k] for k in ("backend", "model", "adapter") if info.get(k) is not None}
    settings = {"seed": seed, "round_size": round_size, "prompt_id": PROMPT_IDS[template],
                "generator": {k: describe.get(k) for k in ("backend", "model", "adapter")},
                "sampling": json.loads(json.dumps(sampling))}
    done_rounds = _existing_rounds(rounds_file, settings)
    n_rounds = math.ceil(num_queries / round_size)
    stats = GenerationStats()
    with JsonlAppender(out_jsonl) as out, JsonlAppender(rounds_file) as rounds_log:
        for r in tqdm(range(n_rounds), desc="05 query generation", unit="round", disable=not progress):
            if r in done_rounds:
                stats.rounds_skipped += 1
                continue
            rng = random.Random(f"{seed}:{r}")  # round r depends on (seed, r) only: stable ids on resume
            picks = [sample_concepts(concepts, rng, min_concepts, max_concepts) for _ in range(round_size)]
            attributes, errors = {}, {}
            for concept in {c for pick in picks for c in pick}:
                attributes[concept], errors[concept] = grounder.ground(concept) if grounder.enabled else ({}, None)
            prompts = [build_prompt(pick, attributes, template) for pick in picks]
            raws = generator.generate(prompts, n=1, seed=seed * 100_003 + r, **sampling)
            rejected = []
            accepted = 0
            for j, (pick, prompt, raw) in enumerate(zip(picks, prompts, raws)):
                qid = f"r{r}-{j}"
                query, reason = clean_query(raw, prompt)
                stats.generated += 1
                if query is None:
                    stats.rejected[reason] += 1
                    rejected.append({"id": qid, "reason": reason, "raw": raw})
                    continue
                accepted += 1
                stats.accepted += 1
                if qid in existing:
                    continue
                out.append({"id": qid, "round": r, "concepts": pick,
                            "attributes": {c: attributes[c] for c in pick if attributes.get(c)},
                            "grounding_errors": {c: errors[c] for c in pick if errors.get(c)},
                            "prompt_id": PROMPT_IDS[template], "query": query,
                            "generator": {**describe, "seed": seed}})
            rounds_log.append({"round": r, **settings, "generated": len(raws), "accepted": accepted,
                               "rejected": rejected})
            stats.rounds_done += 1
    stats.total_accepted_in_file = len(_existing_ids(out_jsonl, GENERATED_REQUIRED))
    return stats


def generation_summary(out_jsonl: str | Path) -> dict:
    """Totals over every finished round of a generated-queries file (all invocations)."""
    rounds_file = rounds_path_for(out_jsonl)
    totals = {"rounds": 0, "generated": 0, "accepted": 0, "rejected": Counter()}
    if rounds_file.exists():
        for rec in iter_jsonl(rounds_file, required={"round": int, "generated": int, "accepted": int}):
            totals["rounds"] += 1
            totals["generated"] += rec["generated"]
            totals["accepted"] += rec["accepted"]
            totals["rejected"].update(r["reason"] for r in rec.get("rejected", []))
    totals["rejected"] = dict(totals["rejected"])
    return totals

