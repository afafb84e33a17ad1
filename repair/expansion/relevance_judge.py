"""Stage II step 06d (issue 30 section 2): a judge that checks whether each verified hit is relevant to the query.

06 trusts the source blindly: the top hit with an abstract is the positive, the other hits are negative candidates.
Here an instruct model reads the query and each of a tuple's first ``judge_k`` hits and says whether the abstract
answers the query or gives evidence for or against it. What is recorded is P(yes), read from the model's
next-token distribution, not the text it would write:

- in process (:class:`repair.expansion.generation.HFGenerator`): one forward pass over the chat-templated prompt that ends
  where the answer starts; softmax of the next-token logits restricted to the token ids of the answer words
  (:data:`YES_WORDS`, :data:`NO_WORDS`), P(yes) = the mass of the yes ids (:func:`hf_yes_probabilities`);
- an OpenAI-compatible server (:class:`repair.expansion.generation.OpenAIGenerator`): one token asked with ``logprobs`` and
  ``top_logprobs``; P(yes) = yes mass / (yes + no mass) among the returned alternatives. A server that returns no
  log-probabilities (or neither word among them) gives only its text: P(yes) is then 1.0 for an answer that starts
  with "yes" and 0.0 otherwise, recorded as ``from: "text"`` (the threshold becomes a plain vote)
  (:func:`openai_yes_probability`).

With the probabilities, :func:`judge_tuple` re-picks the positive (the hit the judge rates highest), drops a tuple
none of whose judged hits reaches the threshold, and moves every other hit judged relevant (P(yes) >= threshold) out
of ``negative_candidates`` into ``judged_relevant``: 07-09 read only ``negative_candidates``, so a hit the judge
calls relevant is never a negative (the false-negative guard Stage III's Eq. 7 lacks) and the file stays a valid
06 expansion file. Judgments are cached (:class:`JudgeCache`, keyed by the judge model and the exact prompt,
appended one flushed line per batch): a rerun, a resumed run and another run sharing the cache reuse them, and the
output, written atomically, is a function of the input and the cache only.

Separate from 06 (:mod:`repair.expansion.verification`, which needs a source, never a model) and from the backends
(:mod:`repair.expansion.generation`, which this module drives with prompts of its own).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from repair.data import DataError, JsonlAppender, iter_appended_jsonl, iter_jsonl, write_jsonl
from repair.expansion.verification import status_path_for  # 06's status-file naming, one definition
from repair.text import clip_text

logger = logging.getLogger(__name__)

JUDGE_PROMPT_ID = "repair-judge-v1"
# The answer words whose first-token probability is read. Several spellings, because which one a model puts first
# depends on its template ("Yes" after a chat turn, " yes" after "Answer:"); each counts only when the tokenizer
# writes it as a single token, so the ids are exactly the model's possible first answer tokens.
YES_WORDS = ("yes", "Yes", "YES", " yes", " Yes", " YES")
NO_WORDS = ("no", "No", "NO", " no", " No", " NO")
DEFAULT_THRESHOLD = 0.5
DEFAULT_JUDGE_MODEL = "qwen2.5-coder-0.5b"  # the in-process judge measured in docs/results.md
DEFAULT_JUDGE_K = 5
QUERY_FIELDS = ("auto", "q_new", "q_model")
# 06's default QUERY_FORM (repair.expansion.verification.DEFAULT_QUERY_FORM; not imported: the driver's settings read this
# module's defaults and should not load the literature sources): a line without query_form has q_new = its title
TITLE_FORM = "title"
OPENAI_TOP_LOGPROBS = 20  # the most the OpenAI API (and vLLM's default max_logprobs) allows


# ---------------------------------------------------------------------------------------------- prompt
def build_judge_prompt(query: str, title: str, abstract: str, max_chars: int = 1000) -> str:
    """The judge's question (our own wording): the query, the document, then the yes/no question last, so the
    answer is the next token. "For or against": a SciFact claim's relevant abstracts include those that refute it."""
    doc = f"Title: {' '.join(title.split())}\n" if title.strip() else ""
    return (f"Query: {' '.join(query.split())}\n\nDocument:\n{doc}Abstract: {clip_text(abstract, max_chars)}\n\n"
            "Is this document relevant to the query, that is, does it answer the query or give evidence for or "
            "against it? Answer with one word: yes or no.")


def answer_token_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(yes ids, no ids): the single-token spellings of :data:`YES_WORDS` / :data:`NO_WORDS`, deduplicated."""
    def ids(words: Sequence[str]) -> list[int]:
        found: list[int] = []
        for word in words:
            toks = tokenizer.encode(word, add_special_tokens=False)
            if len(toks) == 1 and toks[0] not in found:
                found.append(toks[0])
        return found

    yes, no = ids(YES_WORDS), ids(NO_WORDS)
    if not yes or not no or set(yes) & set(no):
        raise ValueError(f"the judge's tokenizer has no single-token 'yes'/'no' (yes ids {yes}, no ids {no})")
    return yes, no


# ---------------------------------------------------------------------------------------------- backends
def hf_yes_probabilities(generator: Any, prompts: Sequence[str], batch_size: int = 4) -> list[float]:
    """P(yes) of each prompt on an in-process :class:`repair.expansion.generation.HFGenerator`: one forward pass each (no
    generation), prompts chat-templated as the generator formats them and left-padded in length-sorted batches
    with explicit position ids, so a padded batch gives each prompt the logits it gets alone."""
    import torch

    tok = generator.tokenizer
    yes, no = answer_token_ids(tok)
    chat = generator.use_chat
    ids = [tok(generator.format(p), add_special_tokens=not chat)["input_ids"] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = [0.0] * len(ids)
    for start in range(0, len(order), max(1, batch_size)):
        batch = order[start:start + max(1, batch_size)]
        width = max(len(ids[i]) for i in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            input_ids[row, width - len(ids[i]):] = torch.tensor(ids[i])
            mask[row, width - len(ids[i]):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = generator.model(input_ids=input_ids.to(generator.device), attention_mask=mask.to(generator.device),
                                     position_ids=positions.to(generator.device), use_cache=False,
                                     logits_to_keep=1).logits[:, -1, :].float()
        probs = torch.softmax(logits[:, yes + no], dim=-1)[:, :len(yes)].sum(-1).cpu().tolist()
        for row, i in enumerate(batch):
            out[i] = float(probs[row])
    return out


def openai_yes_probability(generator: Any, prompt: str) -> tuple[float, str, str]:
    """(P(yes), "logprobs" | "text", the answer token) of one prompt on an OpenAI-compatible server
    (:class:`repair.expansion.generation.OpenAIGenerator`): one token, temperature 0, with its top log-probabilities."""
    body = {"model": generator.model_name, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1,
            "temperature": 0.0, "logprobs": True, "top_logprobs": OPENAI_TOP_LOGPROBS}
    body.update(generator.extra_body)
    resp = generator.client.post_json("chat/completions", body)
    choices = (resp.data or {}).get("choices") if isinstance(resp.data, dict) else None
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"{generator.base_url}/chat/completions answered without 'choices'")
    choice = choices[0]
    answer = ((choice.get("message") or {}).get("content") or choice.get("text") or "").strip()
    content = (choice.get("logprobs") or {}).get("content") or []
    alternatives = (content[0].get("top_logprobs") or []) if content and isinstance(content[0], dict) else []
    mass = Counter()
    for alt in alternatives:
        word = str(alt.get("token", "")).strip().lower()
        if word in ("yes", "no") and isinstance(alt.get("logprob"), (int, float)):
            mass[word] += math.exp(alt["logprob"])
    if mass["yes"] + mass["no"] > 0:
        return mass["yes"] / (mass["yes"] + mass["no"]), "logprobs", answer
    return (1.0 if answer.lower().startswith("yes") else 0.0), "text", answer


def judge_identity(generator: Any) -> dict:
    """What a judgment depends on besides the prompt (the cache key): backend, model, adapter, chat template and
    dtype in process (bf16 and fp32 give slightly different probabilities); backend and model for a server."""
    info = generator.describe() if hasattr(generator, "describe") else {"backend": "custom"}
    ident = {"backend": info.get("backend"), "model": info.get("model"), "prompt_id": JUDGE_PROMPT_ID}
    if info.get("backend") == "hf":
        ident.update(adapter=info.get("adapter"), chat_template=info.get("chat_template"),
                     dtype=str(getattr(generator, "dtype", "")))
    return ident


class JudgeCache:
    """Judgments on disk: one JSONL line ``{key, p_yes, from, answer}`` per (judge, prompt), appended and flushed
    as they are computed, so a killed run loses at most the batch it was computing."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        for rec in iter_appended_jsonl(self.path, required={"key": str, "p_yes": float}):
            self.entries[rec["key"]] = rec

    @staticmethod
    def key(identity: dict, prompt: str) -> str:
        return hashlib.sha256(json.dumps([identity, prompt], sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __getitem__(self, key: str) -> dict:
        return self.entries[key]

    def add(self, rows: list[dict]) -> None:
        with JsonlAppender(self.path) as out:
            for row in rows:
                out.append(row)
                self.entries[row["key"]] = row


class RelevanceJudge:
    """P(yes) for (query, title, abstract) triples through a generator backend, with the cache in between."""

    def __init__(self, generator: Any, cache: JudgeCache, *, batch_size: int = 4, max_chars: int = 1000):
        self.generator, self.cache = generator, cache
        self.batch_size, self.max_chars = max(1, batch_size), max_chars
        self.identity = judge_identity(generator)
        self.computed = self.reused = 0
        self.sources: Counter = Counter()

    def probabilities(self, pairs: Sequence[tuple[str, str, str]]) -> list[dict]:
        """The cache record of every (query, title, abstract), computing (and caching) the missing ones in batches
        of ``batch_size``."""
        prompts = [build_judge_prompt(q, t, a, self.max_chars) for q, t, a in pairs]
        keys = [JudgeCache.key(self.identity, p) for p in prompts]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))
        self.reused += len(keys) - sum(1 for k in keys if k in todo)
        prompt_of = dict(zip(keys, prompts))
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start:start + self.batch_size]
            self.cache.add(self._compute(batch, [prompt_of[k] for k in batch]))
            self.computed += len(batch)
        records = [self.cache[k] for k in keys]
        self.sources.update(r.get("from", "logits") for r in records)
        return records

    def _compute(self, keys: list[str], prompts: list[str]) -> list[dict]:
        if getattr(self.generator, "backend", "") == "openai":
            with ThreadPoolExecutor(max_workers=getattr(self.generator, "parallel", 1)) as pool:
                answers = list(pool.map(lambda p: openai_yes_probability(self.generator, p), prompts))
            return [{"key": k, "p_yes": round(p, 6), "from": src, "answer": ans}
                    for k, (p, src, ans) in zip(keys, answers)]
        probs = hf_yes_probabilities(self.generator, prompts, batch_size=self.batch_size)
        return [{"key": k, "p_yes": round(p, 6), "from": "logits", "answer": "yes" if p >= 0.5 else "no"}
                for k, p in zip(keys, probs)]


# ---------------------------------------------------------------------------------------------- tuples
def judged_query(rec: dict, query_field: str = "auto") -> str:
    """The text the judge reads as the query. ``auto``: the generated query (``q_model``) when q_new is the
    positive's own title (QUERY_FORM=title, the paper's default: judging a title against its own abstract says
    nothing), else q_new (the generated query itself, or a T0-style rewrite)."""
    if query_field not in QUERY_FIELDS:
        raise ValueError(f"unknown query field {query_field!r}; expected one of {QUERY_FIELDS}")
    if query_field == "auto":
        query_field = "q_model" if rec.get("query_form", TITLE_FORM) == TITLE_FORM else "q_new"
    return rec[query_field]


def tuple_hits(rec: dict) -> list[dict]:
    """The tuple's hits in the source's rank order: the positive (``pos_meta`` + ``d_pos``), then the candidates."""
    meta = rec.get("pos_meta") or {}
    pos = {"id": meta.get("id"), "doi": meta.get("doi"), "title": meta.get("title") or "", "abstract": rec["d_pos"]}
    return [pos] + [dict(c) for c in rec["negative_candidates"]]


def judge_tuple(rec: dict, probs: Sequence[float], threshold: float, judge_k: int) -> dict | None:
    """06's tuple after the judge, or None (dropped: no judged hit reaches ``threshold``).

    ``probs`` are P(yes) of the first ``len(probs)`` hits (:func:`tuple_hits`). The positive becomes the highest
    rated (ties: the source's order); with QUERY_FORM=title q_new becomes its title. Every other judged hit with
    P(yes) >= threshold moves to ``judged_relevant``; the judged hits below it stay in ``negative_candidates``
    with their ``p_yes`` (the source's top hit, when replaced and not relevant, first), then the unjudged ones.
    """
    hits = tuple_hits(rec)
    title_form = rec.get("query_form", TITLE_FORM) == TITLE_FORM
    # with QUERY_FORM=title the positive's title becomes q_new: a hit without a title cannot be the positive
    eligible = [i for i in range(len(probs)) if not title_form or hits[i]["title"].strip()]
    best = max(eligible, key=lambda i: (probs[i], -i), default=None)
    if best is None or probs[best] < threshold:
        return None
    out = dict(rec)
    pos = hits[best]
    relevant, negatives = [], []
    for i, hit in enumerate(hits):
        if i == best:
            continue
        if i < len(probs):
            hit = {**hit, "p_yes": round(probs[i], 6)}
            (relevant if probs[i] >= threshold else negatives).append(hit)
        else:
            negatives.append(hit)
    if best:
        out["source_pos_meta"] = rec.get("pos_meta") or {}
        out["pos_meta"] = {k: pos.get(k) for k in ("id", "doi", "title")}
        out["d_pos"] = pos["abstract"]
        for stale in ("pos_rank", "pos_score"):  # the source's rank and score of its own top hit
            out.pop(stale, None)
        if title_form:
            out["q_new"] = pos["title"]
    out["negative_candidates"] = negatives
    out["judged_relevant"] = relevant
    out["pos_p_yes"] = round(probs[best], 6)
    out["judge"] = {"prompt_id": JUDGE_PROMPT_ID, "threshold": threshold, "judge_k": judge_k,
                    "judged": len(probs), "picked": best}
    return out


@dataclass
class JudgeStats:
    tuples: int = 0
    kept: int = 0
    repicked: int = 0
    dropped: int = 0
    judged_pairs: int = 0
    computed: int = 0
    reused: int = 0
    relevant_moved: int = 0  # hits judged relevant taken out of negative_candidates
    p_from: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"tuples": self.tuples, "kept": self.kept, "repicked": self.repicked, "dropped": self.dropped,
                "judged_pairs": self.judged_pairs, "computed": self.computed, "reused_from_cache": self.reused,
                "relevant_removed_from_negatives": self.relevant_moved, "p_yes_from": self.p_from,
                "seconds": round(self.seconds, 2)}


def read_expansion_for_judge(path: str | Path) -> list[dict]:
    """06's tuples (ids unique, every candidate an object with a string abstract); a file the judge already wrote
    (``judge`` on its lines) is refused: its dropped tuples are gone and its positives already re-picked."""
    from repair.expansion.verification import EXPANSION_REQUIRED

    rows, first = [], {}
    for lineno, rec in iter_jsonl(path, required=EXPANSION_REQUIRED, with_lineno=True):
        where = f"{path}:{lineno}"
        if rec["id"] in first:
            raise DataError(f"{where}: field 'id': {rec['id']!r} repeats line {first[rec['id']]} (ids must be unique)")
        if "judge" in rec:
            raise DataError(f"{where}: field 'judge': this line was already judged; give 06's expansion JSONL")
        for name in ("q_model", "q_new"):
            if not rec[name].strip():
                raise DataError(f"{where}: field '{name}' is empty")
        if not isinstance(rec.get("pos_meta", {}), dict):
            raise DataError(f"{where}: field 'pos_meta' must be an object")
        for i, cand in enumerate(rec["negative_candidates"]):
            if not isinstance(cand, dict):
                raise DataError(f"{where}: field 'negative_candidates[{i}]' must be an object")
            if not isinstance(cand.get("abstract"), str):
                raise DataError(f"{where}: field 'negative_candidates[{i}].abstract' must be a string")
        first[rec["id"]] = lineno
        rows.append(rec)
    return rows


def judge_expansion(input_jsonl: str | Path, judge: RelevanceJudge, out_jsonl: str | Path, *,
                    threshold: float = DEFAULT_THRESHOLD, judge_k: int = DEFAULT_JUDGE_K, query_field: str = "auto",
                    chunk: int = 16, progress: bool = True) -> JudgeStats:
    """Judge every tuple of 06's ``input_jsonl`` (:func:`judge_tuple`) and write the kept ones to ``out_jsonl`` and
    one status line per tuple (``kept | repicked | dropped``, with every judged P(yes)) to
    ``<out_jsonl>.status.jsonl``, both atomically at the end. Judgments go through the cache ``chunk`` tuples at a
    time, so an interrupted run keeps what it computed and a rerun computes only the rest."""
    from tqdm import tqdm

    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    if judge_k < 1:
        raise ValueError(f"judge_k must be at least 1, got {judge_k}")
    t0 = time.time()
    rows = read_expansion_for_judge(input_jsonl)
    stats = JudgeStats(tuples=len(rows))
    kept, status = [], []
    for start in tqdm(range(0, len(rows), chunk), desc="judge", unit="chunk", disable=not progress):
        part = rows[start:start + chunk]
        pairs, spans = [], []
        for rec in part:
            query = judged_query(rec, query_field)
            hits = tuple_hits(rec)[:judge_k]
            spans.append((len(pairs), len(pairs) + len(hits)))
            pairs += [(query, h.get("title") or "", h["abstract"]) for h in hits]
        records = judge.probabilities(pairs)
        for rec, (a, b) in zip(part, spans):
            probs = [r["p_yes"] for r in records[a:b]]
            out = judge_tuple(rec, probs, threshold, judge_k)
            verdict = "dropped" if out is None else ("repicked" if out["judge"]["picked"] else "kept")
            status.append({"id": rec["id"], "status": verdict, "p_yes": [round(p, 6) for p in probs]})
            if out is None:
                stats.dropped += 1
                continue
            stats.kept += 1
            stats.repicked += verdict == "repicked"
            stats.relevant_moved += len(out["judged_relevant"])
            kept.append(out)
        stats.judged_pairs += len(pairs)
    write_jsonl(out_jsonl, kept)
    write_jsonl(status_path_for(out_jsonl), status)
    stats.computed, stats.reused, stats.p_from = judge.computed, judge.reused, dict(judge.sources)
    stats.seconds = time.time() - t0
    return stats
