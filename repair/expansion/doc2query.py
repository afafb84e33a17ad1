"""QUERY_FORM=doc2query (issue 30 section 3): new queries written *from* the documents that confuse the retriever.

The paper's Stage II writes a query about a concept and trusts the literature source's top hit as its positive;
with a small generator the query is vague and the "positive" is whatever ranks first (Eq. 6 drops most of them).
Here the direction is reversed, the one small models do best (doc2query): Stage I already names, for every confused
T0 query q, the documents D-(q) that the retriever ranks above (or next to) q's positive. Each such document D gets
one new query that D answers, so its positive is known by construction; its negative candidates are the documents
the retriever confuses D with: the positive of every confused query that D outranked, then those queries' other
D-(q) documents. Stage III then picks the model-aware hard negative (Eq. 7) and keeps consistent tuples (Eq. 6).

This module only builds those tuples, in 06's expansion format, from 06b's confused tuples
(:mod:`repair.diagnosis.confused_tuples`, read as a file: the stages meet through files); the query itself is
written by the T0-style rewrite (:func:`repair.expansion.t0_style.rewrite_t0_style`, ``query_form="doc2query"``),
which shows T0 examples, cleans the answer and drops a document whose query fails.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from repair.data import DataError, iter_jsonl
from repair.text import word_key

logger = logging.getLogger(__name__)

SOURCE = "doc2query"  # the ``source`` of every tuple built here
# what 06b writes for each confused query (the fields used here)
CONFUSED_REQUIRED = {"id": str, "q_new": str, "d_pos": str, "negative_candidates": list}


@dataclass
class Doc2QueryStats:
    confused_queries: int = 0
    documents: int = 0  # distinct confusing documents that get a query
    candidates: int = 0  # negative candidates over all of them


def doc2query_tuples(confused_jsonl: str | Path, docs_per_query: int = 1,
                     max_candidates: int = 20) -> tuple[list[dict], Doc2QueryStats]:
    """Expansion-format tuples (``q_new`` empty until the rewrite writes it) for the confusing documents of
    06b's ``confused_jsonl``: the first ``docs_per_query`` candidates of each confused query, each document once.

    A document that confuses several queries is one tuple whose candidates start with all their positives (in
    file order), then their other candidates; copies of the document itself (the same :func:`repair.text.word_key`)
    are never candidates, nor is a candidate listed twice; at most
    ``max_candidates`` are kept. Ids are ``d2q:<first confused id>:<rank>``, stable for a given input.
    """
    if docs_per_query < 1 or max_candidates < 1:
        raise ValueError("docs_per_query and max_candidates must be at least 1")
    confused = list(iter_jsonl(confused_jsonl, required=CONFUSED_REQUIRED, with_lineno=True))
    by_doc: dict[str, dict] = {}  # word_key of the document -> its tuple under construction
    for lineno, rec in confused:
        for rank, cand in enumerate(rec["negative_candidates"][:docs_per_query]):
            text = cand.get("abstract") if isinstance(cand, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"{confused_jsonl}:{lineno}: field 'negative_candidates[{rank}].abstract': "
                                "expected a non-empty string")
            entry = by_doc.setdefault(word_key(text), {"id": f"d2q:{rec['id']}:{rank}", "d_pos": text, "positives": [],
                                            "others": [], "seed_queries": []})
            entry["positives"].append(rec["d_pos"])
            entry["others"] += [c.get("abstract", "") for c in rec["negative_candidates"] if isinstance(c, dict)]
            entry["seed_queries"].append(rec["id"])
    stats = Doc2QueryStats(confused_queries=len(confused))
    tuples = []
    for key, entry in by_doc.items():
        candidates: list[str] = []
        seen = {key}  # the document itself, then every candidate kept
        for text in entry["positives"] + entry["others"]:
            if text.strip() and word_key(text) not in seen:
                seen.add(word_key(text))
                candidates.append(text)
        candidates = candidates[:max_candidates]
        if not candidates:
            continue
        stats.candidates += len(candidates)
        tuples.append({"id": entry["id"], "q_model": "", "q_new": "", "d_pos": entry["d_pos"],
                       "negative_candidates": [{"abstract": text} for text in candidates], "source": SOURCE,
                       "concepts": [], "seed_queries": entry["seed_queries"]})
    stats.documents = len(tuples)
    logger.info("doc2query tuples: %s", asdict(stats))
    return tuples, stats
