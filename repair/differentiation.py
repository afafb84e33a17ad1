"""Stage III, Differentiation (DESIGN 5 steps 7-9): verified expansion tuples -> training triplets.

For every tuple (q_new, d+, D-_cand) of the expansion file (SCHEMAS.md, issue 4):

* step 7 embeds every q_new in QUERY format and every document (d+ and the candidates) in PASSAGE format
  with the current retriever and stores the vectors in an *embedding dir* (``queries.npy`` /
  ``documents.npy``, one text per row in ``queries.jsonl`` / ``documents.jsonl``, the sha1 of each row's
  text in ``queries.sha1.npy`` / ``documents.sha1.npy``, and ``meta.json``), so steps 8 and 9 never load
  the model;
* step 8 (README Eq. 7) ranks D-_cand by s(q_new, d) and keeps the top ``top_k`` with scores, after an
  optional positive-aware false-negative guard (NV-Retriever's TopK-MarginPos / TopK-PercPos);
* step 9 (README Eq. 6) keeps a tuple only if rank(d+ | q_new, D_pool) <= kappa with the *local* pool
  D_pool = {d+} u D-_cand, and d- = argmax over D-_cand. The original code's *global* pool (every
  document of every tuple; UPSTREAM 2.11) is ``pool="global"``.

Identity of documents is their exact (stripped) text: identical texts are one document, a candidate
equal to d+ (or to the positive of another tuple with the same query text) is never a negative, and a
tuple repeated across concept groups (same q_new and d+) is one tuple whose candidate lists are merged.
The scoring functions work on whole arrays (no per-tuple model calls) so tests can check them by hand.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .data import DataError, iter_jsonl, read_json, validate_record, write_json, write_jsonl

logger = logging.getLogger(__name__)

MINED, GENERATED = "mined", "generated"
NEGATIVE_SOURCES = (MINED, GENERATED)
POOLS = ("local", "global")

EMBEDDING_DIR_FORMAT = "repair-embedding-dir"
EMBEDDING_DIR_VERSION = 1
QUERIES, DOCUMENTS = "queries", "documents"
META_FILE = "meta.json"

# negative_candidates items are checked in the loop that reads them (one pass instead of a recursive type check)
EXPANSION_REQUIRED = {"id": (str, int), "q_new": str, "d_pos": str, "negative_candidates": list}
TRIPLET_REQUIRED = {"query": str, "pos_document": str, "hard_negatives": list[str]}
COMMON_OPTIONAL = {"concepts": list[str], "source": str, "negative_sources": list[str], "negative_traces": list}
# input scores are not read (step 9 rescores from the embedding dir), so they are not validated either
TRIPLET_OPTIONAL = {"id": (str, int), "n_candidates": int, **COMMON_OPTIONAL}


def text_sha1(text: str) -> str:
    """Row key of the embedding dir: sha1 of the raw (stripped) text, independent of the model's format."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


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


# ---------------------------------------------------------------------------------------------- embedding dir
def write_embedding_dir(out_dir: str | os.PathLike, queries: Sequence[str], documents: Sequence[str],
                        encode: Callable[[list[str], str], np.ndarray], *, chunk: int = 65536,
                        write: bool = True) -> int:
    """Encode texts chunk by chunk (``encode(texts, "query"|"passage")``) into ``queries.npy``/``documents.npy``.

    Rows follow the given text order; ``<name>.jsonl`` holds ``{"text"}`` per row and ``<name>.sha1.npy`` the
    sha1 of each text (:func:`text_sha1`; the index steps 8/9 look texts up in). Vectors stream into
    a memory-mapped temp file renamed into place, so a corpus larger than RAM works and a killed run never
    leaves a half array. ``meta.json`` is removed first and written last (:func:`write_embedding_meta`): it
    marks a complete dir. With ``write=False`` (torch.distributed ranks > 0) only ``encode`` is called.
    Returns the vector width.
    """
    out = Path(out_dir)
    if write:
        out.mkdir(parents=True, exist_ok=True)
        (out / META_FILE).unlink(missing_ok=True)
    dim = 0
    for name, texts, kind in ((QUERIES, queries, "query"), (DOCUMENTS, documents, "passage")):
        tmp = out / f".{name}.npy.tmp"
        array = None
        for start in range(0, len(texts), chunk):
            vecs = np.asarray(encode(list(texts[start:start + chunk]), kind), dtype=np.float32)
            if dim and vecs.shape[1] != dim:
                raise ValueError(f"encoder returned width {vecs.shape[1]} for {name}, {dim} before")
            dim = vecs.shape[1]
            if write:
                if array is None:
                    array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(len(texts), dim))
                array[start:start + len(vecs)] = vecs
        if write:
            if array is None:
                with open(tmp, "wb") as fh:
                    np.save(fh, np.empty((0, dim), dtype=np.float32))
            else:
                array.flush()
                del array
            os.replace(tmp, out / f"{name}.npy")
            digests = [text_sha1(t) for t in texts]
            write_jsonl(out / f"{name}.jsonl", ({"text": t} for t in texts))
            sha_tmp = out / f".{name}.sha1.npy.tmp"
            with open(sha_tmp, "wb") as fh:
                np.save(fh, np.array(digests, dtype="S40"))
            os.replace(sha_tmp, out / f"{name}.sha1.npy")
    return dim


def write_embedding_meta(out_dir: str | os.PathLike, meta: dict) -> None:
    write_json(Path(out_dir) / META_FILE, {"format": EMBEDDING_DIR_FORMAT, "version": EMBEDDING_DIR_VERSION, **meta})


@dataclass
class EmbeddingDir:
    """A complete step-7 output opened read-only (vectors memory-mapped)."""

    path: Path
    meta: dict
    queries: np.ndarray
    documents: np.ndarray
    query_index: dict[str, int]
    document_index: dict[str, int]
    _document_texts: list[str] | None = None

    @classmethod
    def open(cls, path: str | os.PathLike) -> "EmbeddingDir":
        path = Path(path)
        if not (path / META_FILE).exists():
            raise FileNotFoundError(f"{path}: no {META_FILE}; not a complete embedding dir "
                                    f"(run differentiation/07_embed_candidates.py, or let it finish)")
        meta = read_json(path / META_FILE)
        if meta.get("format") != EMBEDDING_DIR_FORMAT or meta.get("version") != EMBEDDING_DIR_VERSION:
            raise DataError(f"{path / META_FILE}: not a {EMBEDDING_DIR_FORMAT} v{EMBEDDING_DIR_VERSION} meta file")
        arrays, indexes = {}, {}
        for name in (QUERIES, DOCUMENTS):
            arrays[name] = np.load(path / f"{name}.npy", mmap_mode="r")
            digests = np.load(path / f"{name}.sha1.npy")
            if arrays[name].shape[0] != len(digests):
                raise DataError(f"{path}: {name}.npy has {arrays[name].shape[0]} rows but {name}.sha1.npy "
                                f"lists {len(digests)} texts")
            index: dict[str, int] = {}
            for row, digest in enumerate(digests.tolist()):
                index.setdefault(digest.decode("ascii"), row)
            indexes[name] = index
        return cls(path, meta, arrays[QUERIES], arrays[DOCUMENTS], indexes[QUERIES], indexes[DOCUMENTS])

    @property
    def fingerprint(self) -> str:
        return str(self.meta.get("retriever", {}).get("fingerprint", ""))

    def document_texts(self) -> list[str]:
        if self._document_texts is None:
            self._document_texts = [r["text"] for r in iter_jsonl(self.path / f"{DOCUMENTS}.jsonl",
                                                                  required={"text": str})]
        return self._document_texts

    def align(self, tuples: TupleSet) -> tuple[np.ndarray, np.ndarray]:
        """Embedding rows of every tuple-set query and document; a clear error names a tuple with a missing text."""
        q_map = np.array([self.query_index.get(text_sha1(t), -1) for t in tuples.queries.texts], dtype=np.int64)
        d_map = np.array([self.document_index.get(text_sha1(t), -1) for t in tuples.documents.texts], dtype=np.int64)
        if len(tuples) == 0:
            return q_map, d_map
        for what, rows in (("query", q_map[tuples.query_rows]), ("positive document", d_map[tuples.pos_rows])):
            bad = np.flatnonzero(rows < 0)
            if len(bad):
                self._missing(tuples, int(bad[0]), what, len(bad))
        if len(tuples.cand_rows):
            bad = np.flatnonzero(d_map[tuples.cand_rows] < 0)
            if len(bad):
                t = int(np.searchsorted(tuples.cand_offsets, bad[0], side="right") - 1)
                pos = int(bad[0] - tuples.cand_offsets[t])
                self._missing(tuples, t, f"negative candidate #{pos}", len(bad))
        return q_map, d_map

    def _missing(self, tuples: TupleSet, t: int, what: str, n: int) -> None:
        built_from = self.meta.get("input", {}).get("paths")
        raise DataError(f"{self.path}: no vector for the {what} of tuple '{tuples.ids[t]}' ({tuples.where[t]}); "
                        f"{n} such texts are missing. This embedding dir was built from {built_from}: rerun "
                        f"differentiation/07_embed_candidates.py on this input")

    def check_input(self, paths: Sequence[str | os.PathLike]) -> None:
        """Log whether the input is the file the dir was built from (texts are checked by :meth:`align`)."""
        built = self.meta.get("input", {})
        same = [str(p) for p in paths] == built.get("paths") and \
            [file_sha256(p) for p in paths] == built.get("sha256")
        logger.info("embedding dir %s: retriever %s (fingerprint %s), %s", self.path,
                    self.meta.get("retriever", {}).get("name"), self.fingerprint,
                    "built from this input" if same else f"built from {built.get('paths')}; checking texts")


# ---------------------------------------------------------------------------------------------- array functions
def score_pairs(query_vecs: np.ndarray, doc_vecs: np.ndarray, q_idx: np.ndarray, d_idx: np.ndarray,
                chunk: int = 32768) -> np.ndarray:
    """s(q, d) = e_q . e_d (cosine on normalised vectors) for each pair (q_idx[i], d_idx[i]); float32."""
    out = np.empty(len(q_idx), dtype=np.float32)
    for start in range(0, len(q_idx), chunk):
        stop = start + chunk
        out[start:stop] = np.einsum("ij,ij->i", query_vecs[q_idx[start:stop]], doc_vecs[d_idx[start:stop]])
    return out


def order_within_groups(owner: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Permutation sorting candidates by (group, score descending, input position): Eq. 7's ranking.

    Ties keep the input order (the literature source's rank), so the result is deterministic.
    """
    return np.lexsort((np.arange(len(scores)), -scores.astype(np.float64), owner))


def rank_in_group(owner_sorted: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """0-based position of each element inside its group, for group-contiguous sorted arrays."""
    return np.arange(len(owner_sorted), dtype=np.int64) - offsets[owner_sorted]


def false_negative_keep(cand_scores: np.ndarray, pos_scores: np.ndarray, *, margin: float | None = None,
                        pct: float | None = None) -> np.ndarray:
    """Positive-aware false-negative guard (NV-Retriever, Moreira et al. 2024); True = keep the candidate.

    TopK-MarginPos drops a candidate scoring above ``pos - margin``; TopK-PercPos drops one scoring above
    ``pos * pct``, written ``pos - |pos| * (1 - pct)`` so a negative positive score does not loosen it.
    ``pos_scores`` is parallel to ``cand_scores`` (the positive score of each candidate's tuple).
    """
    drop = np.zeros(len(cand_scores), dtype=bool)
    if margin is not None:
        drop |= cand_scores > pos_scores - margin
    if pct is not None:
        drop |= cand_scores > pos_scores - np.abs(pos_scores) * (1.0 - pct)
    return ~drop


def positive_rank(pos_scores: np.ndarray, cand_scores: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """rank(d+ | q, {d+} u D-_cand) (1-based) per tuple: 1 + candidates scoring strictly above d+ (Eq. 6).

    A candidate must beat d+ to outrank it, so exact ties count in d+'s favour.
    """
    above = cand_scores > pos_scores[owner]
    return 1 + np.bincount(owner[above], minlength=len(pos_scores)).astype(np.int64)


def consistency_keep(ranks: np.ndarray, n_negatives: np.ndarray, kappa: int) -> np.ndarray:
    """Eq. 6: keep iff rank(d+) <= kappa; a tuple without any negative yields no triplet and is dropped too."""
    return (ranks <= kappa) & (n_negatives > 0)


# ---------------------------------------------------------------------------------------------- steps 8 and 9
def _score_tuples(tuples: TupleSet, emb: EmbeddingDir) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(query emb rows per tuple, doc emb row map, positive scores, candidate scores)."""
    q_map, d_map = emb.align(tuples)
    q_e = q_map[tuples.query_rows]
    pos_scores = score_pairs(emb.queries, emb.documents, q_e, d_map[tuples.pos_rows])
    cand_scores = score_pairs(emb.queries, emb.documents, q_e[tuples.owner], d_map[tuples.cand_rows])
    return q_e, d_map, pos_scores, cand_scores


def _round(x: float) -> float:
    return round(float(x), 6)


def _base_record(tuples: TupleSet, t: int) -> dict:
    return {"id": tuples.ids[t], "query": tuples.queries.texts[tuples.query_rows[t]],
            "pos_document": tuples.documents.texts[tuples.pos_rows[t]]}


def _score_summary(values: Sequence[float]) -> dict:
    if len(values) == 0:
        return {}
    a = np.asarray(values, dtype=np.float64)
    return {"mean": _round(a.mean()), "median": _round(np.median(a)), "min": _round(a.min()), "max": _round(a.max())}


def select_hard_negatives(tuples: TupleSet, emb: EmbeddingDir, *, top_k: int = 15,
                          fn_margin: float | None = None, fn_pct: float | None = None) -> tuple[list[dict], dict]:
    """Step 8 (Eq. 7 ranking): per tuple, D-_cand sorted by s(q_new, d), top ``top_k`` with scores.

    Returns the hard-negatives records (SCHEMAS.md; plus ``n_candidates`` = candidates left after the guard,
    so step 9 knows when a list was cut) and statistics. Tuples left without candidates are not written.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    t0 = time.perf_counter()
    _, _, pos_scores, cand_scores = _score_tuples(tuples, emb)
    owner = tuples.owner
    keep = false_negative_keep(cand_scores, pos_scores[owner], margin=fn_margin, pct=fn_pct)
    guard_dropped = int((~keep).sum())
    idx = np.flatnonzero(keep)
    owner_k, scores_k = owner[idx], cand_scores[idx]
    counts = np.bincount(owner_k, minlength=len(tuples)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    perm = order_within_groups(owner_k, scores_k)
    top = rank_in_group(owner_k[perm], offsets) < top_k
    chosen = idx[perm[top]]                        # candidate positions, grouped by tuple, best first
    chosen_offsets = np.concatenate([[0], np.cumsum(np.minimum(counts, top_k))])
    records = []
    for t in range(len(tuples)):
        sel = chosen[chosen_offsets[t]:chosen_offsets[t + 1]]
        if len(sel) == 0:
            continue
        rec = _base_record(tuples, t)
        rec.update({"hard_negatives": [tuples.documents.texts[r] for r in tuples.cand_rows[sel]],
                    "hard_negative_scores": [_round(s) for s in cand_scores[sel]],
                    "pos_score": _round(pos_scores[t]), "n_candidates": int(counts[t]),
                    "source": tuples.sources[t], "concepts": tuples.concepts[t]})
        if tuples.provenance[t]:
            rec["negative_sources"] = [tuples.cand_sources[i] for i in sel]
            rec["negative_traces"] = [tuples.cand_traces[i] for i in sel]
        records.append(rec)
    stats = {"tuples": len(tuples), "written": len(records),
             "no_candidates": int((tuples.counts == 0).sum()),
             "no_candidates_after_guard": int(((counts == 0) & (tuples.counts > 0)).sum()),
             "candidates": int(len(cand_scores)), "guard_dropped": guard_dropped,
             "guard_tuples_affected": int(len(np.unique(owner[~keep]))),
             "fn_margin": fn_margin, "fn_pct": fn_pct, "top_k": top_k,
             "negatives_written": int(sum(len(r["hard_negatives"]) for r in records)),
             "pos_score": _score_summary(pos_scores),
             "top1_score": _score_summary([r["hard_negative_scores"][0] for r in records]),
             "load": asdict(tuples.stats), "embedding_fingerprint": emb.fingerprint,
             "seconds": round(time.perf_counter() - t0, 3)}
    if not records:  # a legitimate outcome (06 found no other hit for any query), but one worth seeing
        logger.warning("no tuple has a negative candidate left (%d without candidates, %d emptied by the "
                       "false-negative guard): the output holds no line", stats["no_candidates"],
                       stats["no_candidates_after_guard"])
    return records, stats


def _local_pool(tuples: TupleSet, emb: EmbeddingDir, top_k: int, kappa: int):
    """Eq. 6 on D_pool = {d+} u D-_cand: per tuple (rank, [(cand position, score)] best first, pos score)."""
    _, _, pos_scores, cand_scores = _score_tuples(tuples, emb)
    owner, counts = tuples.owner, tuples.counts
    ranks = positive_rank(pos_scores, cand_scores, owner)
    undecidable = tuples.truncated & (ranks > counts) & (kappa > counts)
    if undecidable.any():
        t = int(np.flatnonzero(undecidable)[0])
        raise DataError(f"tuple '{tuples.ids[t]}' ({tuples.where[t]}): its {counts[t]} listed negatives are the "
                        f"top of a larger pool and all outscore d+, so rank(d+) <= {kappa} cannot be decided; "
                        f"rerun 08 with --top_k >= {kappa}, or run 09 on the expansion file")
    perm = order_within_groups(owner, cand_scores)
    in_top = rank_in_group(owner[perm], tuples.cand_offsets) < top_k
    chosen = perm[in_top]
    chosen_offsets = np.concatenate([[0], np.cumsum(np.minimum(counts, top_k))])
    for t in range(len(tuples)):
        sel = chosen[chosen_offsets[t]:chosen_offsets[t + 1]]
        yield t, int(ranks[t]), [(int(i), float(cand_scores[i])) for i in sel], float(pos_scores[t])


def _global_pool(tuples: TupleSet, emb: EmbeddingDir, top_k: int, kappa: int, device: str | None,
                 query_chunk: int):
    """The original's pool (UPSTREAM 2.11): every document of the embedding dir ranked for every query.

    Positives of tuples with the same query text are not negatives; rank(d+) is exact up to
    max(top_k, kappa) + 1, beyond that the tuple is dropped with rank None (as the original's "not found").
    """
    from .search import exact_topk

    q_map, d_map = emb.align(tuples)
    q_e, p_e = q_map[tuples.query_rows], d_map[tuples.pos_rows]
    positives: dict[int, set[int]] = {}
    for q, p in zip(q_e.tolist(), p_e.tolist()):
        positives.setdefault(q, set()).add(p)
    k = max(top_k, kappa) + 1 + max((len(s) - 1 for s in positives.values()), default=0)
    unique_q, inverse = np.unique(q_e, return_inverse=True)
    scores, hits = exact_topk(np.asarray(emb.queries[unique_q]), np.array(emb.documents), k, device=device,
                              query_chunk=query_chunk)
    own: list[dict[int, int]] = []  # per tuple: doc emb row -> candidate position (for provenance)
    for t in range(len(tuples)):
        lo, hi = tuples.cand_offsets[t], tuples.cand_offsets[t + 1]
        own.append({int(d_map[tuples.cand_rows[i]]): int(i) for i in range(lo, hi)})
    for t in range(len(tuples)):
        row = inverse[t]
        excluded, pos = positives[int(q_e[t])], int(p_e[t])
        rank, pos_score, negatives = None, None, []
        seen = 0
        for doc, score in zip(hits[row].tolist(), scores[row].tolist()):
            if doc == pos:
                rank, pos_score = seen + 1, score
                continue
            if doc in excluded:
                continue
            seen += 1
            if len(negatives) < top_k:
                negatives.append((doc, score, own[t].get(doc)))
        yield t, rank, negatives, pos_score


def consistency_filter(tuples: TupleSet, emb: EmbeddingDir, *, top_k: int = 15, consistency_k: int = 5,
                       pool: str = "local", device: str | None = None,
                       query_chunk: int = 1024) -> tuple[list[dict], dict]:
    """Step 9: keep (q_new, d+) iff rank(d+) <= kappa in the pool (Eq. 6); d- = best-scoring negative (Eq. 7).

    ``pool="local"`` (the README): {d+} u the tuple's candidates. ``pool="global"`` (the original code):
    every document of the embedding dir. Records follow SCHEMAS.md's final_train_data schema.
    """
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    if top_k < 1 or consistency_k < 1:
        raise ValueError(f"top_k and consistency_k must be >= 1, got {top_k} and {consistency_k}")
    t0 = time.perf_counter()
    records, hist = [], Counter()
    dropped_rank = dropped_empty = 0
    pos_kept, dneg_kept = [], []
    if pool == "local":
        rows = _local_pool(tuples, emb, top_k, consistency_k)
        doc_texts = None
    else:
        rows = _global_pool(tuples, emb, top_k, consistency_k, device, query_chunk)
        doc_texts = emb.document_texts()
    for t, rank, negatives, pos_score in rows:
        if not negatives:
            dropped_empty += 1
            continue
        hist[rank if rank is not None else "not_found"] += 1
        if rank is None or rank > consistency_k:
            dropped_rank += 1
            continue
        rec = _base_record(tuples, t)
        if pool == "local":
            texts = [tuples.documents.texts[tuples.cand_rows[i]] for i, _ in negatives]
            cand_pos = [i for i, _ in negatives]
        else:
            texts = [doc_texts[d] for d, _, _ in negatives]
            cand_pos = [i for _, _, i in negatives]
        scores = [_round(n[1]) for n in negatives]
        rec.update({"hard_negatives": texts, "hard_negative_scores": scores, "d_neg": texts[0],
                    "pos_rank": int(rank), "pos_score": _round(pos_score), "concepts": tuples.concepts[t],
                    "source": tuples.sources[t]})
        if tuples.provenance[t]:
            rec["negative_sources"] = [tuples.cand_sources[i] if i is not None else MINED for i in cand_pos]
            rec["negative_traces"] = [tuples.cand_traces[i] if i is not None else None for i in cand_pos]
        records.append(rec)
        pos_kept.append(pos_score)
        dneg_kept.append(scores[0])
    processed = len(tuples)
    stats = {"processed": processed, "kept": len(records), "dropped": processed - len(records),
             "dropped_rank_above_k": dropped_rank, "dropped_no_negative": dropped_empty,
             "kept_rate": round(len(records) / processed, 6) if processed else 0.0,
             "pool": pool, "consistency_k": consistency_k, "top_k": top_k,
             "pos_rank_histogram": {**{str(r): hist[r] for r in sorted(k for k in hist if k != "not_found")},
                                    **({"not_found": hist["not_found"]} if "not_found" in hist else {})},
             "pos_score_kept": _score_summary(pos_kept), "d_neg_score_kept": _score_summary(dneg_kept),
             "margin_kept": _score_summary(np.asarray(pos_kept) - np.asarray(dneg_kept)) if pos_kept else {},
             "load": asdict(tuples.stats), "embedding_fingerprint": emb.fingerprint,
             "seconds": round(time.perf_counter() - t0, 3)}
    if not records:  # legitimate (the retriever ranks no d+ in the top kappa), but one worth seeing
        logger.warning("the consistency filter kept none of %d tuples (%d with rank(d+) > %d, %d without a "
                       "negative): the output holds no line", processed, dropped_rank, consistency_k, dropped_empty)
    return records, stats


def format_table(rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column text table for the scripts' end-of-run statistics."""
    rows = [(str(k), str(v)) for k, v in rows]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


# ---------------------------------------------------------------------------------------------- step 7
@dataclass
class EmbedConfig:
    """Everything step 7 needs, picklable so spawned worker processes receive it."""

    input_jsonl: list[str]
    output_dir: str
    model: str = "smollm2-135m"
    adapter: str | None = None
    pooling: str | None = None
    max_length: int = 512
    batch_size: int = 32
    max_tokens: int | None = None
    device: str | None = None
    cache_dir: str | None = None
    instruction: str | None = None
    trust_remote_code: bool = False
    chunk: int = 65536
    show_progress: bool | None = None


def embed_candidates(retriever, tuples: TupleSet, config: EmbedConfig) -> dict:
    """Step 7 with a loaded retriever: write the embedding dir; returns its meta (rank 0) or {} (other ranks).

    Every rank calls :meth:`Retriever.encode`, which (with a cache, under torch.distributed) encodes a share
    of the missing texts and reads all back; rank 0 alone writes. ``texts_forwarded`` counts texts that went
    through the model on all ranks (0 on a rerun with the same model: everything came from the cache).
    """
    import torch

    from .runtime import dist_info

    rank, world = dist_info()
    if len(tuples) == 0:
        raise DataError(f"{config.input_jsonl}: no tuples to embed")
    if world > 1 and retriever.cache is None:
        raise ValueError("several processes need the embedding cache (cache_dir) to share their work")
    forwarded = [0]

    def count(_module, args, kwargs):
        ids = kwargs.get("input_ids") if kwargs else None
        forwarded[0] += int((ids if ids is not None else args[0]).shape[0])

    hook = retriever.model.register_forward_pre_hook(count, with_kwargs=True)
    t0 = time.perf_counter()
    try:
        def encode(texts: list[str], kind: str) -> np.ndarray:
            if world > 1:
                # every rank must have refreshed its cache view before any rank adds shards: the share of
                # missing texts each rank takes is computed from that view (repair.encoding.Retriever.encode)
                torch.distributed.barrier()
            return retriever.encode(texts, kind, instruction=config.instruction if kind == "query" else None,
                                    batch_size=config.batch_size, max_tokens=config.max_tokens,
                                    show_progress=config.show_progress, desc=f"07 encode {kind}s").numpy()

        dim = write_embedding_dir(config.output_dir, tuples.queries.texts, tuples.documents.texts, encode,
                                  chunk=config.chunk, write=rank == 0)
    finally:
        hook.remove()
    total = torch.tensor([forwarded[0]], dtype=torch.long, device=retriever.device)
    if world > 1:
        torch.distributed.all_reduce(total)
    if rank != 0:
        return {}
    instruction = retriever.text_format.instruction if config.instruction is None else config.instruction
    meta = {"retriever": retriever.describe(), "query_instruction": instruction,
            "dim": dim, "n_queries": len(tuples.queries), "n_documents": len(tuples.documents),
            "input": {"paths": [str(p) for p in config.input_jsonl],
                      "sha256": [file_sha256(p) for p in config.input_jsonl], "tuples": len(tuples)},
            "load": asdict(tuples.stats), "texts_forwarded": int(total.item()), "processes": world,
            "seconds": round(time.perf_counter() - t0, 3)}
    write_embedding_meta(config.output_dir, meta)
    return meta


def run_embedding(config: EmbedConfig) -> dict:
    """Load the tuples and the retriever (on this rank's device) and run step 7."""
    from .encoding import Retriever
    from .runtime import cache_dir_flag, dist_info

    rank, world = dist_info()
    tuples = load_tuples(config.input_jsonl)
    cache_dir = cache_dir_flag(config.cache_dir, Path(config.output_dir) / "cache")
    device = config.device
    if world > 1 and (device is None or device.startswith("cuda")):
        import torch

        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", rank))
            device = f"cuda:{local}"
            torch.cuda.set_device(local)
    retriever = Retriever.load(config.model, config.adapter, pooling=config.pooling, max_length=config.max_length,
                               device=device, cache_dir=cache_dir, trust_remote_code=config.trust_remote_code,
                               batch_size=config.batch_size)
    if rank == 0:
        logger.info("07: %d tuples, %d distinct queries, %d distinct documents; retriever %s (%s) on %s, "
                    "%d process(es)", len(tuples), len(tuples.queries), len(tuples.documents), retriever.name,
                    retriever.fingerprint(), retriever.device, world)
    return embed_candidates(retriever, tuples, config)


def _init_distributed(device: str | None) -> None:
    import torch

    use_nccl = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    torch.distributed.init_process_group("nccl" if use_nccl else "gloo")


def _spawned_worker(rank: int, world: int, port: int, config: EmbedConfig) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    import torch

    from .runtime import setup_logging

    if not torch.cuda.is_available() or (config.device or "").startswith("cpu"):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # CPU workers share the cores

    setup_logging("INFO" if rank == 0 else "WARNING")
    distributed_embedding(config)


def distributed_embedding(config: EmbedConfig) -> dict:
    """Run step 7 in a torch.distributed group from the environment (torchrun or a spawned worker)."""
    import torch

    if not torch.distributed.is_initialized():
        _init_distributed(config.device)
    try:
        return run_embedding(config)
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_embedding(config: EmbedConfig, nprocs: int) -> dict:
    """``--num_gpus N``: N processes (torch.multiprocessing spawn), one per GPU (or CPU workers with gloo).

    Under torchrun (WORLD_SIZE set) the launcher already made the processes; each joins the group instead.
    Returns the meta written by rank 0 (read back from the dir in the parent of spawned workers).
    """
    import torch

    from .runtime import cache_dir_flag

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if max(world, nprocs) > 1 and cache_dir_flag(config.cache_dir, Path(config.output_dir) / "cache") is None:
        raise ValueError(f"--cache_dir {config.cache_dir}: {max(world, nprocs)} processes share their work through "
                         f"the embedding cache; drop --cache_dir none or run one process")
    if world > 1:
        return distributed_embedding(config)
    if nprocs <= 1:
        return run_embedding(config)
    if torch.cuda.is_available() and (config.device is None or config.device.startswith("cuda")):
        if nprocs > torch.cuda.device_count():
            raise ValueError(f"--num_gpus {nprocs} but only {torch.cuda.device_count()} CUDA devices are visible")
    torch.multiprocessing.spawn(_spawned_worker, args=(nprocs, free_port(), config), nprocs=nprocs, join=True)
    return read_json(Path(config.output_dir) / META_FILE)
