"""The tuples Stage III works on (steps 7-9): the expansion, triplet and concept lines read into one deduplicated
:class:`TupleSet` (texts interned in two :class:`TextTable` tables, candidates in CSR arrays).

A tuple is (q_new, d+, D-_cand) of the expansion file (SCHEMAS.md, issue 4). Identity of documents is their exact
(stripped) text: identical texts are one document, a candidate equal to d+ (or to the positive of another tuple
with the same query text) is never a negative, and a tuple repeated across concept groups (same q_new and d+) is
one tuple whose candidate lists are merged.

Separate from the embedding dir (:mod:`repair.differentiation.embedding_dir`) and the scoring (:mod:`repair.differentiation.hard_negatives`)
because all three steps read their input through it, and the reading rules (formats, duplicates, error messages
naming file:line:field) are one idea that none of them owns.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from repair.data import MINED, NEGATIVE_SOURCES, DataError, iter_jsonl, validate_record
from repair.data import TRIPLET_OPTIONAL as _TRIPLET_OPTIONAL
from repair.data import TRIPLET_REQUIRED as _TRIPLET_REQUIRED

logger = logging.getLogger(__name__)

# negative_candidates items are checked in the loop that reads them (one pass instead of a recursive type check)
EXPANSION_REQUIRED = {"id": (str, int), "q_new": str, "d_pos": str, "negative_candidates": list}
# 08 / 09 rank a triplet line's listed negatives: here the list is required
TRIPLET_REQUIRED = {**_TRIPLET_REQUIRED, "hard_negatives": list[str]}
COMMON_OPTIONAL = {"concepts": list[str], "source": str, "negative_sources": list[str], "negative_traces": list}
TRIPLET_OPTIONAL = _TRIPLET_OPTIONAL


class TextTable:
    """Distinct texts with stable row numbers: identical texts are stored (and embedded) once."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._rows: dict[str, int] = {}

    def add(self, text: str) -> int:
        row = self._rows.get(text)
        if row is None:
            row = self._rows[text] = len(self.texts)
            self.texts.append(text)
        return row

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class LoadStats:
    """What the loader read and what it removed, reported by every stage."""

    lines: int = 0
    expansion_lines: int = 0
    triplet_lines: int = 0
    concept_lines: int = 0
    tuples: int = 0
    merged_duplicate_tuples: int = 0
    candidates_read: int = 0
    empty_candidates: int = 0
    duplicate_candidates: int = 0
    candidates_equal_positive: int = 0
    candidates_twin_positive: int = 0


@dataclass
class TupleSet:
    """All tuples of one input, texts interned in two tables, candidates in CSR arrays.

    Tuple t: query ``queries.texts[query_rows[t]]``, positive ``documents.texts[pos_rows[t]]``,
    candidates ``documents.texts[r]`` for r in ``cand_rows[cand_offsets[t]:cand_offsets[t+1]]`` in input
    order (API rank order for an expansion line, best first for a triplet line).
    """

    queries: TextTable
    documents: TextTable
    ids: list[str]
    where: list[str]                 # "file:line" of the tuple's first line, for error messages
    concepts: list[list[str]]
    sources: list[str]
    query_rows: np.ndarray           # int64 [n]
    pos_rows: np.ndarray             # int64 [n]
    cand_offsets: np.ndarray         # int64 [n + 1]
    cand_rows: np.ndarray            # int64 [total candidates]
    cand_sources: list[str]          # parallel to cand_rows: "mined" | "generated"
    cand_traces: list[Any]           # parallel to cand_rows: CausalNeg trace or None
    provenance: np.ndarray           # bool [n]: the input carried negative_sources / negative_traces
    truncated: np.ndarray            # bool [n]: the list is the top of a larger pool (08 output, --top_k)
    stats: LoadStats = field(default_factory=LoadStats)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.cand_offsets)

    @property
    def owner(self) -> np.ndarray:
        """Tuple index of every candidate (parallel to ``cand_rows``)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts)

    def candidates(self, t: int) -> np.ndarray:
        return self.cand_rows[self.cand_offsets[t]:self.cand_offsets[t + 1]]


# ---------------------------------------------------------------------------------------------- loading
@dataclass
class _Draft:
    id: str
    where: str
    query_row: int
    pos_row: int
    concepts: list[str]
    source: str
    provenance: bool
    truncated: bool
    cands: list[int] = field(default_factory=list)
    cand_sources: list[str] = field(default_factory=list)
    cand_traces: list[Any] = field(default_factory=list)
    seen: set = field(default_factory=set)


def _parallel_list(rec: dict, name: str, n: int, where: str) -> list | None:
    value = rec.get(name)
    if value is None:
        return None
    if len(value) != n:
        raise DataError(f"{where}: field '{name}' has {len(value)} entries but the line has {n} negative candidates")
    if name == "negative_sources":
        for i, v in enumerate(value):
            if v not in NEGATIVE_SOURCES:
                raise DataError(f"{where}: field 'negative_sources[{i}]' must be one of {NEGATIVE_SOURCES}, got {v!r}")
    return value


def _texts_of(items: list, field: str, key: str, where: str) -> list[str]:
    """The ``key`` text of every object in ``items`` ("" for null), checking each item names its field."""
    texts = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise DataError(f"{where}: field '{field}[{i}]' must be an object, got {type(item).__name__}")
        if key not in item:
            raise DataError(f"{where}: missing field '{field}[{i}].{key}'")
        value = item[key]
        if value is not None and not isinstance(value, str):
            raise DataError(f"{where}: field '{field}[{i}].{key}' must be str or null, got {type(value).__name__}")
        texts.append(value or "")
    return texts


def _parse_line(rec: dict, where: str) -> tuple[str, list[tuple[str, str, str, str, list[str], dict]]]:
    """(line kind, [(id, where, query, positive, candidate texts, extras)]) of one validated line.

    Three kinds: an expansion line (06 output, one tuple), a triplet line (08 output, one tuple), and the
    original's per-concept line ``{concept, papers}`` (``--mode concept``): every paper with a title and an
    abstract is a tuple (title, abstract) whose candidates are the group's other abstracts (UPSTREAM 2.10).
    """
    if "q_new" in rec:
        validate_record(rec, where, EXPANSION_REQUIRED, COMMON_OPTIONAL)
        kind, names, rid = "expansion", ("q_new", "d_pos"), str(rec["id"])
        query, positive = rec["q_new"], rec["d_pos"]
        texts = _texts_of(rec["negative_candidates"], "negative_candidates", "abstract", where)
    elif "query" in rec or "pos_document" in rec:
        validate_record(rec, where, TRIPLET_REQUIRED, TRIPLET_OPTIONAL)
        kind, names = "triplet", ("query", "pos_document")
        rid = str(rec["id"]) if rec.get("id") is not None else where.rsplit("/", 1)[-1]
        query, positive, texts = rec["query"], rec["pos_document"], list(rec["hard_negatives"])
    elif "papers" in rec and "concept" in rec:
        validate_record(rec, where, {"concept": str, "papers": list})
        titles = _texts_of(rec["papers"], "papers", "title", where)
        abstracts = _texts_of(rec["papers"], "papers", "abstract", where)
        extras = {"sources": None, "traces": None, "concepts": [rec["concept"]], "truncated": False}
        tuples = []
        for i, (title, abstract) in enumerate(zip(titles, abstracts)):
            if title.strip() and abstract.strip():
                source = rec["papers"][i].get("source") or ""
                tuples.append((f"{rec['concept']}#{i}", f"{where} papers[{i}]", title.strip(), abstract.strip(),
                               abstracts[:i] + abstracts[i + 1:], {**extras, "source": source}))
        return "concept", tuples
    else:
        raise DataError(f"{where}: not an expansion line (q_new, d_pos, negative_candidates), a triplet line "
                        f"(query, pos_document, hard_negatives) or a concept line (concept, papers)")
    query, positive = query.strip(), positive.strip()
    for name, value in zip(names, (query, positive)):
        if not value:
            raise DataError(f"{where}: field '{name}' is empty")
    extras = {"sources": _parallel_list(rec, "negative_sources", len(texts), where),
              "traces": _parallel_list(rec, "negative_traces", len(texts), where),
              "concepts": list(rec.get("concepts") or []),
              "source": rec.get("source") or "",
              "truncated": kind == "triplet" and int(rec.get("n_candidates") or 0) > len(texts)}
    return kind, [(rid, where, query, positive, texts, extras)]


def _add_tuple(drafts: list[_Draft], by_key: dict, queries: TextTable, documents: TextTable, stats: LoadStats,
               rid: str, where: str, query: str, positive: str, texts: list[str], ex: dict) -> None:
    """Intern one parsed tuple's texts, merging it into an earlier tuple with the same (query, positive)."""
    qrow, prow = queries.add(query), documents.add(positive)
    key = (qrow, prow)
    has_provenance = ex["sources"] is not None or ex["traces"] is not None
    if key in by_key:
        draft = drafts[by_key[key]]
        stats.merged_duplicate_tuples += 1
        draft.concepts += [c for c in ex["concepts"] if c not in draft.concepts]
        draft.provenance |= has_provenance
        draft.truncated |= ex["truncated"]
    else:
        by_key[key] = len(drafts)
        draft = _Draft(rid, where, qrow, prow, list(ex["concepts"]), ex["source"], has_provenance, ex["truncated"])
        drafts.append(draft)
    for i, text in enumerate(texts):
        stats.candidates_read += 1
        text = text.strip()
        if not text:
            stats.empty_candidates += 1
            continue
        row = documents.add(text)
        if row == prow:
            stats.candidates_equal_positive += 1
            continue
        if row in draft.seen:
            stats.duplicate_candidates += 1
            continue
        draft.seen.add(row)
        draft.cands.append(row)
        draft.cand_sources.append(ex["sources"][i] if ex["sources"] is not None else MINED)
        draft.cand_traces.append(ex["traces"][i] if ex["traces"] is not None else None)


def load_tuples(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> TupleSet:
    """Read expansion lines (06 output), triplet lines (08 output) and/or the original's concept lines into one
    deduplicated TupleSet.

    Duplicate rules (UPSTREAM 5.18 fixed): candidates are stripped, empty ones are not documents; a candidate
    whose text equals d+, or equals the positive of any tuple with the same query text, is removed; repeated
    candidates keep their first position; lines with the same (q_new, d+) are one tuple (first id, concepts
    and candidate lists merged in order). Input without a single tuple is a :class:`DataError`: every later step
    would silently write nothing.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    queries, documents, stats = TextTable(), TextTable(), LoadStats()
    drafts: list[_Draft] = []
    by_key: dict[tuple[int, int], int] = {}
    for path in paths:
        for lineno, rec in iter_jsonl(path, with_lineno=True):
            kind, parsed = _parse_line(rec, f"{path}:{lineno}")
            stats.lines += 1
            setattr(stats, f"{kind}_lines", getattr(stats, f"{kind}_lines") + 1)
            for rid, where, query, positive, texts, ex in parsed:
                _add_tuple(drafts, by_key, queries, documents, stats, rid, where, query, positive, texts, ex)
    # the positive of a tuple with the same query text is a positive of this query too, never a negative
    positives_of_query: dict[int, set[int]] = {}
    for d in drafts:
        positives_of_query.setdefault(d.query_row, set()).add(d.pos_row)
    cand_rows, cand_sources, cand_traces, offsets = [], [], [], [0]
    for d in drafts:
        twins = positives_of_query[d.query_row]
        for row, src, trace in zip(d.cands, d.cand_sources, d.cand_traces):
            if len(twins) > 1 and row in twins:
                stats.candidates_twin_positive += 1
                continue
            cand_rows.append(row)
            cand_sources.append(src)
            cand_traces.append(trace)
        offsets.append(len(cand_rows))
    stats.tuples = len(drafts)
    if not drafts:
        raise DataError(f"{', '.join(str(p) for p in paths)}: no tuples to read ({stats.lines} lines); the stage "
                        f"that writes this input produced nothing")
    if stats.merged_duplicate_tuples:
        logger.info("merged %d repeated tuples (same q_new and d+)", stats.merged_duplicate_tuples)
    return TupleSet(
        queries=queries, documents=documents, ids=[d.id for d in drafts], where=[d.where for d in drafts],
        concepts=[d.concepts for d in drafts], sources=[d.source for d in drafts],
        query_rows=np.array([d.query_row for d in drafts], dtype=np.int64),
        pos_rows=np.array([d.pos_row for d in drafts], dtype=np.int64),
        cand_offsets=np.array(offsets, dtype=np.int64), cand_rows=np.array(cand_rows, dtype=np.int64),
        cand_sources=cand_sources, cand_traces=cand_traces,
        provenance=np.array([d.provenance for d in drafts], dtype=bool),
        truncated=np.array([d.truncated for d in drafts], dtype=bool), stats=stats)
