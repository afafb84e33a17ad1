"""Tolerant parsing of CausalNeg's generator outputs: stage 1's requirement lists (JSON, numbered lists, bullets)
and stage 3 / vanilla documents (labels, chat preambles, loops, copies and talk about the task removed or rejected).

Separate from the prompts and the calls because it is where weak models fail (SmolLM2-135M mostly writes unusable
text): each rejection has a named reason that the run counts, and the rules are tested on recorded outputs alone.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Iterable

from repair.text import word_key
from repair.differentiation.causalneg.prompts import PERTURBATION_ALIASES, PERTURBATIONS

_WORD = re.compile(r"\w+")
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
_EXAMPLE_REQS = {word_key(t) for t in (
    "names the enzyme that cleaves X", "reports the effect in adults over 65",
    "names the enzyme that cleaves the precursor protein")}  # the prompt's own examples, copied back
_KEYS_LIST = ("requirements", "requirement", "information_requirements", "conditions", "reqs")
_KEYS_TEXT = ("requirement", "text", "condition", "description", "name")
_KEYS_TYPE = ("perturbation", "perturbation_type", "strategy", "type", "violation")


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
    qnorm = word_key(query)
    for req, kind in parsed:
        req = _clean_requirement(req)
        words = _WORD.findall(req)
        key = word_key(req)
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
    if pos_words and (word_key(text) == word_key(positive) or _lcs_share(words, pos_words) >= 0.9):
        return None, "copy"
    if word_key(text) in {word_key(o) for o in others}:
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
