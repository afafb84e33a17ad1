"""QUERY_FORM=t0 (issue 16, ``expansion/06c_t0_style_queries.py``): verified tuples' q_new rewritten in T0's style.

The paper makes the top hit's title the new query because its T0 is title -> abstract; with another T0 (claims,
questions) the titles are another task. Here the generator sees ``k`` (query, passage) examples of T0
(:func:`draw_t0_examples`) and the verified abstract, and writes one query in T0's form (:func:`t0_query_style`,
:func:`build_t0_style_prompt`); :func:`rewrite_t0_style` cleans, retries, keeps or drops, and writes resumably.

Separate from 05 (:mod:`repair.expansion.query_generation`) and 06 (:mod:`repair.expansion.verification`) because it runs after both,
on 06's output, only when the driver's QUERY_FORM asks for it; it reuses 05's cleaning and 06's output checks.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from repair.data import DataError, JsonlAppender, SeedSet, iter_appended_jsonl, iter_jsonl, read_jsonl, write_jsonl
from repair.expansion.generation import DEFAULT_SAMPLING
from repair.expansion.query_generation import clean_query, shared_content_words
from repair.expansion.verification import DEFAULT_QUERY_FORM, EXPANSION_REQUIRED, check_new_outputs, status_path_for
from repair.text import clip_text

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------- prompt
# The T0-style rewrite (issue 16, QUERY_FORM=t0): the verified abstract gets a query in the form of the seed set's
# own queries (a claim for SciFact, a question for QA sets, a title for the paper's title -> abstract T0), shown
# through k (query, passage) examples of T0. Our own wording.
T0_STYLE_PROMPT_ID = "repair-t0-style-v1"
T0_STYLES = {
    "claim": "a claim (one declarative sentence) that the passage supports",
    "question": "a question that the passage answers",
    "title": "a title the passage could have, like a paper title",
    "keywords": "a short keyword query the passage is relevant to",
}

MIXED = "mixed"  # --style mixed: the three forms below in turn (issue 30 section 3)
MIXED_STYLES = ("claim", "question", "keywords")


def query_style(query: str) -> str:
    """The form of one query: ``question`` (ends with ?), ``keywords`` (<= 4 words, no final punctuation),
    ``claim`` (ends with . or !), else ``title``."""
    text = query.strip()
    if text.endswith("?"):
        return "question"
    if text.endswith((".", "!")):
        return "claim"
    return "keywords" if len(re.findall(r"\w+", text)) <= 4 else "title"


def t0_query_style(queries: Sequence[str]) -> str:
    """The most common :func:`query_style` of a seed set's queries (ties: the order of :data:`T0_STYLES`), what
    the rewrite prompt asks for when ``--style auto``."""
    if not queries:
        raise ValueError("no query to infer the seed set's query style from")
    counts = Counter(query_style(q) for q in queries)
    return max(T0_STYLES, key=lambda style: (counts[style], -list(T0_STYLES).index(style)))


def style_of(style: str, position: int) -> str:
    """The form asked for the tuple at input ``position``: ``style`` itself, or with :data:`MIXED` the
    :data:`MIXED_STYLES` in turn (a function of the position only, so a resumed run asks the same)."""
    return MIXED_STYLES[position % len(MIXED_STYLES)] if style == MIXED else style


def build_t0_style_prompt(examples: Sequence[tuple[str, str]], passage: str, style: str,
                          max_passage_chars: int = 1000, match_form: bool = True,
                          max_example_chars: int | None = None, contrast: str | None = None) -> str:
    """The T0-style rewrite prompt: ``examples`` (query, passage) pairs of T0, then ``passage`` (the verified
    abstract) and an open ``Query:``; passages are clipped to ``max_passage_chars`` (small-context generators), the
    examples' to ``max_example_chars`` when given (the prompt's length is what a CPU generator pays for).
    ``match_form`` False (mixed styles) asks for ``style`` although the examples have T0's own form.
    ``contrast`` (clipped like the examples) is shown just before the passage as a related passage the query must
    not fit: the one the retriever confuses with it, so the query has to name what tells the two apart."""
    if style not in T0_STYLES:
        raise ValueError(f"unknown query style {style!r}; expected one of {sorted(T0_STYLES)}")
    ask = (f"in the same style: {T0_STYLES[style]}. Match the examples' form and length, and do not copy"
           if match_form else f"as {T0_STYLES[style]} (the examples show the topic and level of detail, not the "
           "form). Do not copy")
    apart = (" The query must fit the last passage and not the related passage shown just before it, which a search "
             "engine confuses with it: build it on what the last passage says and the related one does not."
             if contrast else "")
    lines = ["Below are queries from a retrieval training set, each after the passage it retrieves. Write one new "
             f"query for the last passage {ask} a sentence of the passage.{apart} Write only the query, on one "
             "line.", ""]
    for query, example in examples:
        lines += [f"Passage: {clip_text(example, max_example_chars or max_passage_chars)}",
                  f"Query: {' '.join(query.split())}", ""]
    if contrast:
        lines += [f"Related passage (not this one): {clip_text(contrast, max_example_chars or max_passage_chars)}",
                  ""]
    lines += [f"Passage: {clip_text(passage, max_passage_chars)}", "Query:"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- rewrite
T0_ON_FAILURE = ("keep_title", "drop")
T0_REWRITE_STATUSES = ("rewritten", "kept_title", "dropped")


def contrast_passage(row: dict) -> str | None:
    """The passage a ``contrast`` query must not fit: the tuple's first negative candidate (for a doc2query tuple,
    the positive of the first confused query its document outranked); None when it has none."""
    for cand in row.get("negative_candidates") or []:
        text = cand.get("abstract") if isinstance(cand, dict) else None
        if isinstance(text, str) and text.strip():
            return text
    return None


def draw_t0_examples(seed_set: SeedSet, key: str, k: int, seed: int, exclude: str = "") -> list[int]:
    """The rows of T0 shown as examples for the tuple ``key``: a function of (seed, key) only, so a resumed,
    reordered or grown input draws the same ones for a tuple. A row whose passage contains ``exclude`` (the
    tuple's own abstract, when the literature source is T0's corpus) is skipped: its query would be the answer."""
    n = len(seed_set)
    rng = random.Random(f"{seed}:t0-examples:{key}")
    excluded = " ".join(exclude.split())
    # a small T0 is shuffled whole; a large one sampled with replacement (O(k), not O(|T0|), per tuple)
    candidates: Iterable[int] = rng.sample(range(n), n) if n <= 8 * k else (rng.randrange(n) for _ in range(64 * k))
    picks: list[int] = []
    for i in candidates:
        if i in picks or (excluded and excluded in " ".join(seed_set.passages[i].split())):
            continue
        picks.append(i)
        if len(picks) == k:
            break
    return picks


def t0_max_words(queries: list[str]) -> int:
    """The default length limit of a T0-style query: twice the 90th percentile of T0's query lengths (words), at
    least 12, so a claim set does not get paragraph-long "claims"."""
    lengths = sorted(len(re.findall(r"\w+", q)) for q in queries)
    return max(12, 2 * lengths[int(0.9 * (len(lengths) - 1))]) if lengths else 12


@dataclass
class T0StyleStats:
    style: str = ""
    max_words: int = 0
    tuples: int = 0
    skipped_done: int = 0
    rewritten: int = 0
    kept_title: int = 0
    dropped: int = 0
    prompts: int = 0  # prompts sent to the generator this run (retries included)
    rejected: Counter = field(default_factory=Counter)  # cleaning verdicts of the rejected completions

    def as_dict(self) -> dict:
        return {"style": self.style, "max_words": self.max_words, "tuples": self.tuples,
                "skipped_done": self.skipped_done, "rewritten": self.rewritten, "kept_title": self.kept_title,
                "dropped": self.dropped, "prompts": self.prompts, "rejected": dict(self.rejected)}


def _read_expansion_for_rewrite(path: str | Path) -> list[dict]:
    """06's tuples, ids unique; a file that already holds T0-style queries (``q_title``) is refused (its q_new
    would be rewritten again and ``q_title`` lost)."""
    rows, first_line = [], {}
    for lineno, rec in iter_jsonl(path, required=EXPANSION_REQUIRED, with_lineno=True):
        if rec["id"] in first_line:
            raise DataError(f"{path}:{lineno}: field 'id': {rec['id']!r} repeats line {first_line[rec['id']]} "
                            "(ids must be unique)")
        if "q_title" in rec or "t0_rewrite" in rec:
            field_name = "q_title" if "q_title" in rec else "t0_rewrite"
            raise DataError(f"{path}:{lineno}: field '{field_name}': this line was already rewritten in T0's style; "
                            "give 06's expansion JSONL as input")
        first_line[rec["id"]] = lineno
        rows.append(rec)
    return rows


def _t0_done(out_jsonl: Path, status_path: Path, settings: dict, generator: dict) -> set[str]:
    """Ids already written (or dropped) by an earlier run with the same settings and generator (its backend, model
    and adapter: issue 44); other settings are an error."""
    done: set[str] = set()
    for path in (out_jsonl, status_path):
        for lineno, rec in iter_appended_jsonl(path, required={"id": str, "t0_rewrite": dict}, with_lineno=True):
            written_by = {"generator": generator} if "generator" in rec["t0_rewrite"] else {}  # status lines: none
            for name, value in {"contrast": None, **settings, **written_by}.items():  # (no contrast key: off)
                if rec["t0_rewrite"].get(name) != value:
                    raise ValueError(f"{path}:{lineno}: this file was written with {name}="
                                     f"{rec['t0_rewrite'].get(name)!r}, not {value!r}; resume with the same settings "
                                     "or choose a new --out_jsonl")
            if path == out_jsonl or rec["t0_rewrite"].get("status") == "dropped":
                done.add(rec["id"])
    return done


def rewrite_t0_style(expansion_jsonl: str | Path, seed_set: SeedSet, generator: Any, out_jsonl: str | Path, *,
                     k: int = 3, seed: int = 42, style: str = "auto", chunk_size: int = 8, attempts: int = 2,
                     on_failure: str = "keep_title", max_passage_chars: int = 1000,
                     max_example_chars: int | None = None, min_words: int = 3,
                     max_words: int | None = None, min_shared_words: int = 2, sampling: dict | None = None,
                     resume: bool = False, progress: bool = True, query_form: str = "t0",
                     contrast: bool = False) -> T0StyleStats:
    """QUERY_FORM=t0 (issue 16): rewrite each verified tuple's q_new as a query in T0's own style.

    The generator sees ``k`` (query, passage) examples of T0 (:func:`draw_t0_examples`) and the tuple's d+, and
    writes one query (:func:`build_t0_style_prompt`); :func:`repair.expansion.query_generation.clean_query`
    rejects echoes of the prompt (the examples' queries, the passage's sentences), empty, too short and too long
    (``max_words``, default :func:`t0_max_words`) answers, and ``off_passage`` ones that share fewer than
    ``min_shared_words`` content words with d+ (a small generator drifts off topic); rejected answers are asked
    again, up to ``attempts`` generations in all.
    A tuple whose rewrite still fails keeps its title (``on_failure`` "keep_title": no verified tuple is lost; the
    line says ``query_form: title``) or is left out ("drop"); both are counted. Output lines are 06's with q_new
    replaced, the title in ``q_title``, ``query_form`` and a ``t0_rewrite`` record; ids, d+ and the candidates are
    unchanged. Tuples go in chunks of ``chunk_size`` fixed by input position, each sampled with a seed of (seed,
    chunk): a resumed run regenerates a partly written chunk whole, so it writes the same bytes as one
    uninterrupted run. Lines are appended one complete line at a time; ``resume`` skips the ids done.
    ``style`` "mixed" asks for the :data:`MIXED_STYLES` in turn by input position (Tamber et al. 2025: mixed query
    types help where one synthetic type hurts). ``query_form`` is what the written lines are marked as: "t0" for
    06's tuples, "doc2query" for :mod:`repair.expansion.doc2query`'s (which have no title to keep: use "drop").
    ``contrast`` shows each tuple's first negative candidate (for doc2query: the positive of the confused query the
    document outranked) as a passage the query must not fit, and rejects a query sharing at least as many content
    words with it as with d+ (``not_distinct``): Stage II's doc2query claims restated d+'s title, which the retriever
    already ranks first (docs/results.md, issue 30), so they taught it nothing about the pair it confuses.
    """
    from tqdm import tqdm

    if on_failure not in T0_ON_FAILURE:
        raise ValueError(f"unknown on_failure {on_failure!r}; expected one of {T0_ON_FAILURE}")
    if k < 1 or attempts < 1 or chunk_size < 1:
        raise ValueError("k, attempts and chunk_size must be at least 1")
    if not len(seed_set):
        raise DataError(f"{seed_set.source}: T0 holds no (query, passage) row to draw examples from")
    out_jsonl = Path(out_jsonl)
    status_path = status_path_for(out_jsonl)
    rows = _read_expansion_for_rewrite(expansion_jsonl)
    if not rows:
        logger.warning("%s holds no verified tuple: nothing to rewrite", expansion_jsonl)
    check_new_outputs(out_jsonl, status_path, resume)
    inferred = style == "auto"
    style = t0_query_style(seed_set.queries) if inferred else style
    if style != MIXED and style not in T0_STYLES:
        raise ValueError(f"unknown query style {style!r}; expected auto, {MIXED} or one of {sorted(T0_STYLES)}")
    max_words = max_words or t0_max_words(seed_set.queries)
    sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
    settings = {"prompt_id": T0_STYLE_PROMPT_ID, "seed": seed, "k": k, "style": style, "chunk_size": chunk_size}
    if contrast:  # recorded only when on, so files written before the option resume as they were
        settings["contrast"] = True
    info = generator.describe() if hasattr(generator, "describe") else {"backend": "custom"}
    describe = {key: info[key] for key in ("backend", "model", "adapter") if info.get(key) is not None}
    done = _t0_done(out_jsonl, status_path, settings, json.loads(json.dumps(describe)))
    example_ids = seed_set.query_ids or [str(r) for r in seed_set.kept_rows] or [str(i) for i in range(len(seed_set))]
    stats = T0StyleStats(style=style, max_words=max_words, tuples=len(rows))
    logger.info("T0-style queries: style %s (%s), %d examples per prompt, at most %d words", style,
                "inferred from T0's queries" if inferred else "given", k, max_words)
    with JsonlAppender(out_jsonl) as out, JsonlAppender(status_path) as status_log:
        chunks = list(enumerate(range(0, len(rows), chunk_size)))
        for c, start in tqdm(chunks, desc="T0-style queries", unit="chunk", disable=not progress):
            chunk = rows[start:start + chunk_size]
            if all(row["id"] in done for row in chunk):
                stats.skipped_done += len(chunk)
                continue
            examples = [draw_t0_examples(seed_set, row["id"], k, seed, row["d_pos"]) for row in chunk]
            contrasts = [contrast_passage(row) if contrast else None for row in chunk]
            prompts = [build_t0_style_prompt([(seed_set.queries[i], seed_set.passages[i]) for i in picks],
                                             row["d_pos"], style_of(style, start + j), max_passage_chars,
                                             match_form=style != MIXED, max_example_chars=max_example_chars,
                                             contrast=contrasts[j])
                       for j, (row, picks) in enumerate(zip(chunk, examples))]
            queries: list[str | None] = [None] * len(chunk)
            used: list[int] = [0] * len(chunk)
            reasons: list[list[str]] = [[] for _ in chunk]
            pending = list(range(len(chunk)))
            for attempt in range(attempts):
                if not pending:
                    break
                raws = generator.generate([prompts[i] for i in pending], n=1,
                                          seed=(seed * 100_003 + c) * attempts + attempt, **sampling)
                stats.prompts += len(pending)
                still = []
                for i, raw in zip(pending, raws):
                    used[i] = attempt + 1
                    query, reason = clean_query(raw, prompts[i], min_words=min_words, max_words=max_words)
                    own = shared_content_words(query, chunk[i]["d_pos"]) if query is not None else 0
                    if query is not None and own < min_shared_words:
                        query, reason = None, "off_passage"
                    elif query is not None and contrasts[i] and shared_content_words(query, contrasts[i]) >= own:
                        query, reason = None, "not_distinct"  # fits the confused passage as well as its own
                    if query is None:
                        reasons[i].append(reason)
                        stats.rejected[reason] += 1
                        still.append(i)
                    else:
                        queries[i] = query
                pending = still
            for i, row in enumerate(chunk):
                if row["id"] in done:
                    stats.skipped_done += 1
                    continue
                title = (row.get("pos_meta") or {}).get("title") or row["q_new"]
                titled = {"q_title": title} if title else {}  # doc2query tuples have none
                trace = {"status": "rewritten", **settings, "attempts": used[i], "rejected": reasons[i],
                         "examples": [example_ids[j] for j in examples[i]], "generator": describe}
                if queries[i] is not None:
                    if style == MIXED:
                        trace["asked_style"] = style_of(style, start + i)
                    out.append({**row, "q_new": queries[i], **titled, "query_form": query_form, "t0_rewrite": trace})
                    stats.rewritten += 1
                elif on_failure == "keep_title":
                    trace["status"] = "kept_title"
                    out.append({**row, **titled, "query_form": row.get("query_form", DEFAULT_QUERY_FORM),
                                "t0_rewrite": trace})
                    stats.kept_title += 1
                else:
                    trace["status"] = "dropped"
                    stats.dropped += 1
                status_log.append({"id": row["id"], "t0_rewrite": {key: trace[key] for key in
                                                                   ("status", *settings, "attempts", "rejected")}})
    order = {row["id"]: i for i, row in enumerate(rows)}
    current = read_jsonl(out_jsonl)
    ranked = sorted(current, key=lambda rec: order.get(rec["id"], len(order)))
    if ranked != current:  # only when the input changed between runs: keep the output in input order
        write_jsonl(out_jsonl, ranked)
    return stats
