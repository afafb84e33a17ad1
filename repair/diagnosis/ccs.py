"""Concept Confusion Scores (paper Eq. 5), C_intra per confused query, and C_conf = C_intra ∪ C_inter.

Given the concepts of each document (any extractor of :mod:`repair.diagnosis.concepts`), this module scores how much
more often a concept shows up in the documents that beat a confused query's positive, D-(q), than in the
positives D+ (:func:`compute_ccs`), picks each confused query's top concept (C_intra), and merges that list
with PathB's cluster concepts (:func:`merge_cconf`). It is apart from extraction because it is pure
arithmetic over (query, document, concept) incidences: it needs no model, no regex and no text, and the
same scores follow from any extractor's output.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence


# ------------------------------------------------------------------------------------------ CCS (Eq. 5)
def positives_of(record: Mapping) -> set[int]:
    return {int(record["pos_doc_index"]), *(int(x) for x in record.get("positive_doc_indices") or ())}


def negatives_of(record: Mapping, top_neg_n: int) -> list[tuple[int, int]]:
    """D-(q): the first ``top_neg_n`` non-positive hits of the top-k list, as (rank0 in top-k, doc index)."""
    pos = positives_of(record)
    out = []
    for rank0, doc in enumerate(record["topk_doc_indices_cos"]):
        if len(out) >= top_neg_n:
            break
        if int(doc) not in pos:
            out.append((rank0, int(doc)))
    return out


def referenced_docs(records: Iterable[Mapping], top_neg_n: int) -> list[int]:
    """Every document whose concepts CCS needs: D+ and all D-(q), sorted."""
    docs: set[int] = set()
    for rec in records:
        docs.add(int(rec["pos_doc_index"]))
        docs.update(d for _, d in negatives_of(rec, top_neg_n))
    return sorted(docs)


@dataclass
class CCSResult:
    entities: list[dict]                        # sorted by (-CCS, -freq_neg, entity)
    per_query: dict[int, list[str]]             # query row i -> concepts of D-(q_i), first-occurrence order
    cintra: list[dict]                          # one line per confused query with >= 1 negative concept
    ccs: dict[str, float] = field(default_factory=dict)
    short_negatives: int = 0                    # queries whose top-k held fewer than top_neg_n negatives


def rank_key(entity: str, ccs: Mapping[str, float], freq_neg: Mapping[str, int]) -> tuple:
    """Deterministic order: higher CCS, then higher df(e; D-), then the string (code-point order)."""
    return (-ccs[entity], -freq_neg[entity], entity)


def compute_ccs(records: Sequence[Mapping], doc_concepts: Mapping[int, Sequence[str]] | Callable[[int], Sequence[str]],
                *, top_neg_n: int = 30, eps: float = 0.5, df: str = "incidence",
                max_examples: int = 5) -> CCSResult:
    """CCS(e) = df(e; D-) / (df(e; D+) + eps) over Q_conf (paper Eq. 5), and C_intra per confused query.

    ``df="incidence"`` (the original's count, UPSTREAM 5.14): +1 for every (confused query, document) pair
    whose document holds e, so a document in the D- of ten queries counts ten times and D+ counts each
    query's positive. ``df="unique"``: the number of distinct documents of D+ = {d+(q)} and of
    D- = ∪ D-(q) that hold e (set semantics of the paper's formula).
    C_intra(q) = the concept of D-(q) with the highest CCS (ties: :func:`rank_key`).
    """
    if df not in ("incidence", "unique"):
        raise ValueError(f"df must be 'incidence' or 'unique', got {df!r}")
    if eps <= 0:
        raise ValueError("eps must be > 0 (it keeps concepts absent from D+ finite)")
    get = doc_concepts if callable(doc_concepts) else doc_concepts.__getitem__
    freq_pos: Counter = Counter()
    freq_neg: Counter = Counter()
    examples: dict[str, list[dict]] = defaultdict(list)
    per_query: dict[int, list[str]] = {}
    pos_docs: set[int] = set()
    neg_docs: set[int] = set()
    short = 0
    for rec in records:
        i = int(rec["i"])
        pos_doc = int(rec["pos_doc_index"])
        if df == "incidence":
            freq_pos.update(set(get(pos_doc)))
        pos_docs.add(pos_doc)
        negs = negatives_of(rec, top_neg_n)
        short += len(negs) < top_neg_n
        seen: dict[str, None] = {}
        for rank0, doc in negs:
            concepts = list(dict.fromkeys(get(doc)))
            if df == "incidence":
                freq_neg.update(concepts)
            neg_docs.add(doc)
            for e in concepts:
                seen.setdefault(e, None)
                if len(examples[e]) < max_examples:
                    examples[e].append({"q_i": i, "doc_idx": doc, "rank0": rank0})
        per_query[i] = list(seen)
    if df == "unique":
        for doc in pos_docs:
            freq_pos.update(set(get(doc)))
        for doc in neg_docs:
            freq_neg.update(set(get(doc)))
    ccs = {e: freq_neg[e] / (freq_pos[e] + eps) for e in freq_neg if freq_neg[e] > 0}
    ranked = sorted(ccs, key=lambda e: rank_key(e, ccs, freq_neg))
    entities = [{"entity": e, "CCS": ccs[e], "freq_neg": freq_neg[e], "freq_pos": freq_pos[e],
                 "examples": examples[e]} for e in ranked]
    cintra = []
    for rec in records:
        i = int(rec["i"])
        if per_query[i]:
            best = min(per_query[i], key=lambda e: rank_key(e, ccs, freq_neg))
            cintra.append({"query_i": i, "query": rec["query"], "concept": best, "CCS": ccs[best],
                           "freq_neg": freq_neg[best], "freq_pos": freq_pos[best]})
    return CCSResult(entities=entities, per_query=per_query, cintra=cintra, ccs=ccs, short_negatives=short)


# ------------------------------------------------------------------------------------------ C_conf
def _dedup(items: Iterable[tuple[str, dict]]) -> tuple[dict[str, tuple[str, dict]], int, Counter]:
    """First occurrence per case-insensitive key, the raw count, and how often each key occurred."""
    first: dict[str, tuple[str, dict]] = {}
    seen: Counter = Counter()
    raw = 0
    for term, info in items:
        term = term.strip()
        if not term:
            continue
        raw += 1
        key = term.lower()
        seen[key] += 1
        first.setdefault(key, (term, info))
    return first, raw, seen


def merge_cconf(cintra: Iterable[Mapping], components: Iterable[Mapping], *, top_a: int | None = None,
                top_comp: int | None = None) -> dict:
    """C_conf = C_intra ∪ C_inter, case-insensitive (UPSTREAM 2.5), with provenance and counts.

    A terms: the first ``top_a`` C_intra lines; B terms: the first ``top_comp`` FINCH components (in
    component_id order). Each side keeps its first occurrence per lowercase key; the union is sorted by that
    key; the displayed casing comes from A when A has the term. ``A.queries``/``B.components`` count how many
    confused queries / clusters produced the term.
    """
    a_items = []
    for n, row in enumerate(cintra):
        if top_a is not None and n >= top_a:
            break
        a_items.append((str(row.get("concept") or ""), {"CCS": row.get("CCS"), "query_i": row.get("query_i")}))
    b_items = []
    for n, comp in enumerate(components):
        if top_comp is not None and n >= top_comp:
            break
        b_items.append((str(comp.get("concept") or ""),
                        {"component_id": comp.get("component_id"), "component_size": comp.get("size"),
                         "component_avg_margin": comp.get("avg_margin"), "concept_count": comp.get("concept_count")}))
    a, a_raw, a_seen = _dedup(a_items)
    b, b_raw, b_seen = _dedup(b_items)
    terms = []
    for key in sorted(set(a) | set(b)):
        term = a[key][0] if key in a else b[key][0]
        entry: dict = {"term": term, "from": [s for s, side in (("A", a), ("B", b)) if key in side]}
        if key in a:
            entry["A"] = {**a[key][1], "term": a[key][0], "queries": a_seen[key]}
        if key in b:
            entry["B"] = {**b[key][1], "term": b[key][0], "components": b_seen[key]}
        terms.append(entry)
    counts = {"A_raw": a_raw, "B_raw": b_raw, "A_unique": len(a), "B_unique": len(b),
              "overlap": len(set(a) & set(b)), "union_total": len(terms)}
    return {"counts": counts, "terms": terms}
