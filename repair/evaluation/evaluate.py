"""Evaluation of a retriever on every benchmark family the paper reports (README "Evaluated Benchmarks"),
shared by the ``eval/`` scripts, the driver and the benchmarks.

Task families (one :class:`MetricProfile` each; ``docs/evaluation.md`` lists datasets and sources):

- ``ir``      BEIR IR sets (NFCorpus, SciFact, SciDocs, TREC-COVID): nDCG@10, plus MAP@10, R@10/100, MRR@10
- ``qa``      QA retrieval (iCliniq, ChemLit-QA mat/biomed): R@5, R@20, nDCG@20
- ``mesh``    entity linking (MeSH): R@1, R@5, MRR@5; documents are the ``text`` field only (UPSTREAM 4.1)
- ``relish``  graded (0-2) paper recommendation (RELISH): uncut MAP and nDCG over each query's judged
              candidates (the paper gives no depth; see :data:`PROFILES`)
- ``sts``     sentence similarity (BIOSSES): Spearman between gold scores and the cosine of the two
              sentences' embeddings, both encoded in query format with the dataset instruction

Every metric is a fraction in [0, 1]; the paper prints Table 2 (QA, MeSH, RELISH) x100, which
:func:`scale_metrics` reproduces on request. Which benchmark a path holds, its instruction and the fail-fast
check of its files are :mod:`repair.evaluation.benchmarks`; this module scores a retriever on data that is there.
"""

from __future__ import annotations

import csv
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from repair.evaluation.benchmarks import DatasetSpec, check_dataset, dataset_instruction, sts_pairs_file
from repair.data import BeirData, DataError, iter_jsonl, load_beir, open_text
from repair.encoding import Retriever
from repair.metrics import evaluate_run, per_query_ndcg, run_from_topk, spearman
from repair.search import exact_topk
from repair.tables import text_table

logger = logging.getLogger(__name__)

DOC_TEXTS = ("title_text", "text")
CANDIDATES = ("corpus", "judged")
STS_FORMATS = ("query", "passage")


# ---------------------------------------------------------------------------------------------- profiles
@dataclass(frozen=True)
class MetricProfile:
    """What one task family measures and how its candidate documents are formed.

    ``candidates``: ``corpus`` = exact search over the whole corpus, the top ``top_k`` kept (BEIR);
    ``judged`` = each query ranks only its own judged documents (qrels rows, grade 0 included).
    ``doc_text``: ``title_text`` = title + " " + text (BEIR/BMRetriever); ``text`` = the text field only.
    """

    task: str
    headline: str
    ndcg_at: tuple[int, ...] = ()
    map_at: tuple[int, ...] = ()
    recall_at: tuple[int, ...] = ()
    mrr_at: tuple[int, ...] = ()
    ndcg_full: bool = False
    map_full: bool = False
    top_k: int = 1000
    candidates: str = "corpus"
    doc_text: str = "title_text"

    @property
    def metric_keys(self) -> list[str]:
        keys = [f"ndcg@{k}" for k in self.ndcg_at] + [f"map@{k}" for k in self.map_at]
        keys += [f"recall@{k}" for k in self.recall_at] + [f"mrr@{k}" for k in self.mrr_at]
        keys += ["ndcg"] * self.ndcg_full + ["map"] * self.map_full
        return keys


PROFILES: dict[str, MetricProfile] = {
    # BEIR/BMRetriever: top 1000, nDCG@10 headline (UPSTREAM 6 "eval.py").
    "ir": MetricProfile("ir", "ndcg@10", ndcg_at=(10,), map_at=(10,), recall_at=(10, 100), mrr_at=(10,),
                        top_k=1000),
    # Paper Table 2: R@5, R@20, nDCG@20; nothing deeper than 20 is scored, 100 leaves room.
    "qa": MetricProfile("qa", "ndcg@20", ndcg_at=(20,), recall_at=(5, 20), top_k=100),
    # REPAIR eval_mesh.py: recall.1, recall.5 and MRR@5; documents are the text field only.
    "mesh": MetricProfile("mesh", "mrr@5", recall_at=(1, 5), mrr_at=(5,), top_k=100, doc_text="text"),
    # Paper Table 2 "RELISH MAP / nDCG" with no depth. RELISH judges ~60 candidates per query article and the
    # paper's 191.2K abstracts are the union of those pools (3.2K x ~60); MAP 0.85 / nDCG 0.91 is only
    # reachable when each query ranks its own judged pool, so that is the default (SciRepEval's protocol);
    # ``candidates="corpus"`` gives full-corpus retrieval (top 1000) instead.
    "relish": MetricProfile("relish", "ndcg", ndcg_full=True, map_full=True, top_k=1000, candidates="judged"),
}
STS_KEYS = ["spearman", "pearson"]


def metric_keys(task: str) -> list[str]:
    """The metric names a task reports (what :func:`scale_metrics` scales)."""
    if task == "sts":
        return list(STS_KEYS)
    return PROFILES[task].metric_keys


def headline_metric(task: str) -> str:
    return "spearman" if task == "sts" else PROFILES[task].headline


# ---------------------------------------------------------------------------------------------- retrieval
def document_texts(data: BeirData, doc_ids: Sequence[str], doc_text: str = "title_text") -> list[str]:
    """Passage texts for ``doc_ids``: ``title_text`` (BEIR) or ``text`` only (REPAIR's eval_mesh.py)."""
    if doc_text == "title_text":
        return [data.doc_text(d) for d in doc_ids]
    if doc_text == "text":
        return [data.corpus[d].get("text", "").strip() for d in doc_ids]
    raise ValueError(f"doc_text must be one of {DOC_TEXTS}, got {doc_text!r}")


def judged_candidates(data: BeirData) -> list[str]:
    """Every document judged for some query (qrels order); all must exist in the corpus."""
    doc_ids = list(dict.fromkeys(d for rels in data.qrels.values() for d in rels))
    missing = [d for d in doc_ids if d not in data.corpus]
    if missing:
        raise DataError(f"{data.name or 'BEIR folder'}: {len(missing)} judged document ids are not in the corpus "
                        f"(e.g. {missing[0]!r}); judged-candidate ranking needs every judged document's text")
    return doc_ids


def judged_run(query_ids: Sequence[str], query_vecs: torch.Tensor, doc_ids: Sequence[str],
               doc_vecs: torch.Tensor, qrels: dict[str, dict[str, int]],
               ignore_identical_ids: bool = True) -> dict[str, dict[str, float]]:
    """Score each query against its own judged documents only (re-ranking a judged pool)."""
    row_of = {d: i for i, d in enumerate(doc_ids)}
    run: dict[str, dict[str, float]] = {}
    for qi, qid in enumerate(query_ids):
        judged = [d for d in qrels.get(qid, {}) if not (ignore_identical_ids and d == qid)]
        if not judged:
            run[qid] = {}
            continue
        rows = torch.as_tensor([row_of[d] for d in judged], dtype=torch.long)
        scores = (doc_vecs[rows] @ query_vecs[qi]).tolist()
        run[qid] = dict(zip(judged, map(float, scores)))
    return run


def evaluate_beir(retriever: Retriever, data: BeirData, instruction: str, *, top_k: int = 1000,
                  batch_size: int | None = None, ndcg_at=(10,), map_at=(10,), recall_at=(10, 100),
                  mrr_at=(10,), precision_at=(), show_progress: bool | None = None, ndcg_full: bool = False,
                  map_full: bool = False, doc_text: str = "title_text", candidates: str = "corpus",
                  relevance_level: int = 1) -> dict:
    """Encode documents (passage format) and queries (query format + instruction), rank, pytrec metrics.

    ``candidates="corpus"``: exact search over the whole corpus, top ``top_k``; ``"judged"``: each query ranks
    its judged documents only. Returns the metrics plus counts and timings; a query's own id never counts
    as a hit (BEIR's rule).
    """
    if candidates not in CANDIDATES:
        raise ValueError(f"candidates must be one of {CANDIDATES}, got {candidates!r}")
    t0 = time.time()
    doc_ids = list(data.corpus) if candidates == "corpus" else judged_candidates(data)
    doc_vecs = retriever.encode_passages(document_texts(data, doc_ids, doc_text), batch_size=batch_size,
                                         show_progress=show_progress, desc="encode corpus")
    t1 = time.time()
    query_ids = list(data.queries)
    query_vecs = retriever.encode_queries([data.queries[q] for q in query_ids], instruction=instruction,
                                          batch_size=batch_size, show_progress=show_progress,
                                          desc="encode queries")
    t2 = time.time()
    if candidates == "corpus":
        scores, indices = exact_topk(query_vecs, doc_vecs, top_k + 1)  # +1: room for a dropped identical id
        run = run_from_topk(query_ids, doc_ids, scores, indices, ignore_identical_ids=True)
        run = {q: dict(list(h.items())[:top_k]) for q, h in run.items()}
    else:
        run = judged_run(query_ids, query_vecs, doc_ids, doc_vecs, data.qrels)
    metrics = evaluate_run(data.qrels, run, ndcg_at=ndcg_at, map_at=map_at, recall_at=recall_at,
                           mrr_at=mrr_at, precision_at=precision_at, ndcg_full=ndcg_full, map_full=map_full,
                           relevance_level=relevance_level)
    # the first nDCG cut per query (fractions, whatever --percent says): what a paired comparison of two models reads
    per_query = {f"ndcg@{k}": per_query_ndcg(data.qrels, run, k) for k in list(ndcg_at)[:1]}
    t3 = time.time()
    metrics.update({"num_queries": len(query_ids), "num_docs": len(doc_ids),
                    "seconds_corpus": round(t1 - t0, 2), "seconds_queries": round(t2 - t1, 2),
                    "seconds_search_eval": round(t3 - t2, 2)})
    if per_query:
        metrics["per_query"] = per_query
    return metrics


def evaluate_task(retriever: Retriever, data: BeirData, task: str, instruction: str, *,
                  top_k: int | None = None, candidates: str | None = None, doc_text: str | None = None,
                  batch_size: int | None = None, show_progress: bool | None = None,
                  relevance_level: int = 1) -> dict:
    """:func:`evaluate_beir` with a task family's metric profile; explicit arguments override the profile."""
    if task not in PROFILES:
        raise ValueError(f"task must be one of {sorted(PROFILES)} for a BEIR folder, got {task!r}")
    prof = PROFILES[task]
    top_k = top_k or prof.top_k
    candidates = candidates or prof.candidates
    doc_text = doc_text or prof.doc_text
    metrics = evaluate_beir(retriever, data, instruction, top_k=top_k, batch_size=batch_size,
                            ndcg_at=prof.ndcg_at, map_at=prof.map_at, recall_at=prof.recall_at,
                            mrr_at=prof.mrr_at, ndcg_full=prof.ndcg_full, map_full=prof.map_full,
                            doc_text=doc_text, candidates=candidates, show_progress=show_progress,
                            relevance_level=relevance_level)
    metrics.update({"candidates": candidates, "doc_text": doc_text,
                    "top_k": top_k if candidates == "corpus" else None})
    return metrics


# ---------------------------------------------------------------------------------------------- STS
@dataclass(frozen=True)
class StsPair:
    """One sentence pair with its gold similarity (BIOSSES: mean of 5 annotators, 0-4)."""

    id: str
    sentence1: str
    sentence2: str
    score: float


def load_sts_pairs(path: str | Path) -> list[StsPair]:
    """Read sentence pairs from JSONL ``{id?, sentence1, sentence2, score}`` or a TSV with a header row naming
    ``sentence1``, ``sentence2``, ``score`` (``id`` optional; BIOSSES' TSV is read with quoting off, its
    sentences contain quote characters). A folder with one such file is accepted too."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        path = sts_pairs_file(path)
    pairs: list[StsPair] = []
    if ".tsv" in path.suffixes:
        with open_text(path) as fh:
            rows = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(rows, None)
            if header is None:
                raise DataError(f"{path}: empty file")
            cols = {name.strip(): i for i, name in enumerate(header)}
            for name in ("sentence1", "sentence2", "score"):
                if name not in cols:
                    raise DataError(f"{path}:1: header has no '{name}' column (found {header})")
            for lineno, row in enumerate(rows, start=2):
                if not row:
                    continue
                if len(row) < len(header):
                    raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, got {len(row)}")
                try:
                    score = float(row[cols["score"]])
                except ValueError:
                    raise DataError(f"{path}:{lineno}: field 'score' is not a number: {row[cols['score']]!r}") from None
                pid = row[cols["id"]] if "id" in cols else str(len(pairs) + 1)
                pairs.append(StsPair(pid, row[cols["sentence1"]], row[cols["sentence2"]], score))
    else:
        for rec in iter_jsonl(path, required={"sentence1": str, "sentence2": str, "score": float},
                              optional={"id": (str, int)}):
            pid = str(rec["id"]) if rec.get("id") is not None else str(len(pairs) + 1)
            pairs.append(StsPair(pid, rec["sentence1"], rec["sentence2"], float(rec["score"])))
    if len(pairs) < 2:
        raise DataError(f"{path}: {len(pairs)} sentence pairs; Spearman needs at least 2")
    return pairs


def pair_cosines(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [N, H] arrays (re-normalised in float64, so any encoder's vectors work)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    return (a * b).sum(axis=1)


def evaluate_sts(retriever: Retriever, pairs: Sequence[StsPair], instruction: str | None = None, *,
                 sts_format: str = "query", batch_size: int | None = None,
                 show_progress: bool | None = None) -> dict:
    """Spearman (and Pearson) between gold scores and cosine(sentence1, sentence2).

    Both sentences go through the same format, so the score is symmetric in the pair: ``query`` (default)
    = query template with ``instruction`` on both sides, as BMRetriever encodes STS and as instruction-tuned
    embedders (E5-Mistral, MTEB) do; ``passage`` = passage template on both sides (no instruction).
    """
    if sts_format not in STS_FORMATS:
        raise ValueError(f"sts_format must be one of {STS_FORMATS}, got {sts_format!r}")
    t0 = time.time()
    n = len(pairs)
    texts = [p.sentence1 for p in pairs] + [p.sentence2 for p in pairs]
    vecs = retriever.encode(texts, sts_format, instruction=instruction if sts_format == "query" else None,
                            batch_size=batch_size, show_progress=show_progress, desc="encode sentences")
    cos = pair_cosines(vecs[:n], vecs[n:])
    gold = np.asarray([p.score for p in pairs], dtype=np.float64)
    pearson = float(np.corrcoef(gold, cos)[0, 1]) if np.std(cos) > 0 and np.std(gold) > 0 else float("nan")
    return {"spearman": spearman(gold, cos), "pearson": pearson, "num_pairs": n, "sts_format": sts_format,
            "seconds_encode": round(time.time() - t0, 2)}


# ---------------------------------------------------------------------------------------------- one benchmark
def evaluate_dataset(retriever: Retriever, spec: DatasetSpec, *, split: str = "test",
                     instruction: str | None = None, top_k: int | None = None, candidates: str | None = None,
                     doc_text: str | None = None, sts_format: str = "query", batch_size: int | None = None,
                     show_progress: bool | None = None, relevance_level: int = 1) -> dict:
    """Load one benchmark and evaluate it with its task profile; returns one flat result row.

    The instruction defaults to :func:`dataset_instruction` (BMRetriever's table and our documented choices).
    """
    check_dataset(spec, split)
    instruction = dataset_instruction(spec.name, spec.task, instruction)
    # what the result reports is the instruction the encoder really saw (plain-text models such as MiniLM
    # have no {instruction} slot; STS in passage format uses none)
    fmt = getattr(retriever, "text_format", None)
    shown = instruction if fmt is None or "{instruction}" in fmt.query else None
    row = {"dataset": spec.name, "task": spec.task, "path": str(spec.path), "headline": headline_metric(spec.task)}
    if spec.task == "sts":
        pairs = load_sts_pairs(spec.path)
        row.update({"split": None, "instruction": shown if sts_format == "query" else None})
        row.update(evaluate_sts(retriever, pairs, instruction, sts_format=sts_format, batch_size=batch_size,
                                show_progress=show_progress))
        return row
    data = load_beir(spec.path, split)
    data.name = spec.name
    row.update({"split": split, "instruction": shown})
    row.update(evaluate_task(retriever, data, spec.task, instruction, top_k=top_k, candidates=candidates,
                             doc_text=doc_text, batch_size=batch_size, show_progress=show_progress,
                             relevance_level=relevance_level))
    return row


# ---------------------------------------------------------------------------------------------- reporting
def scale_metrics(row: dict, factor: float = 100.0) -> dict:
    """A copy of a result row with its task's metrics multiplied (x100 = the paper's Table 2 convention)."""
    out = dict(row)
    for key in metric_keys(row["task"]):
        if isinstance(out.get(key), (int, float)):
            out[key] = out[key] * factor
    out["scale"] = "percent" if factor == 100.0 else f"x{factor:g}"
    return out


def _fmt(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def results_table(rows: Iterable[dict]) -> str:
    """A fixed-width table: dataset, task, size, headline metric, then every metric of the task."""
    rows = list(rows)
    header = ["dataset", "task", "n", "headline", "value", "metrics"]
    body = []
    for r in rows:
        n = r.get("num_pairs") if r["task"] == "sts" else r.get("num_queries")
        head = r["headline"]
        others = "  ".join(f"{k}={_fmt(r[k])}" for k in metric_keys(r["task"]) if k != head and k in r)
        body.append([r["dataset"], r["task"], str(n), head, _fmt(r.get(head)), others])
    return text_table(body, header, rule="  ")
