"""What the CausalNeg pipeline draws on: the (q, d+) items to give negatives to (read from a triplet file or any T0)
and the corpus those items' corpus negatives come from (BM25-mined, random, and stage 3's style references).

Separate from generation because it needs no generator: the paper's Random and Mined-only baselines are this
module and the pipeline alone.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repair.data import MINED, NEGATIVE_SOURCES, TRIPLET_OPTIONAL, TRIPLET_REQUIRED, DataError, iter_jsonl, load_seed
from repair.text import word_key


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
                if s not in NEGATIVE_SOURCES:
                    raise DataError(f"{where}: field 'negative_sources' holds {s!r}; allowed: "
                                    f"{', '.join(NEGATIVE_SOURCES)}")
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
        from repair.expansion.sources.local_corpus import LocalCorpus

        self.index = LocalCorpus(corpus, index_dir=index_dir)
        self.ids = [p.id for p in self.index.papers]
        self.texts = [f"{p.title} {p.abstract}".strip() for p in self.index.papers]
        self.usable = [i for i, t in enumerate(self.texts) if t]

    def __len__(self) -> int:
        return len(self.usable)

    @staticmethod
    def _excluded(item: NegItem) -> tuple[frozenset[str], set[str]]:
        return item.positive_ids, {word_key(p) for p in item.positives}

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
                key = word_key(text)
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
            key = word_key(self.texts[i])
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
