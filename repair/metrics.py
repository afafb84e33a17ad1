"""Retrieval and similarity metrics. IR metrics come from ``pytrec_eval`` (pytrec-eval-terrier), the
implementation BEIR and BMRetriever report with, so our numbers are comparable to published ones."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def run_from_topk(query_ids: list[str], doc_ids: list[str], scores: np.ndarray, indices: np.ndarray,
                  ignore_identical_ids: bool = True) -> dict[str, dict[str, float]]:
    """Turn top-k arrays into a pytrec run; a query's own id never counts as a hit (BEIR's rule)."""
    scores, indices = np.asarray(scores), np.asarray(indices)
    run: dict[str, dict[str, float]] = {}
    for row, qid in enumerate(query_ids):
        hits = {}
        for s, j in zip(scores[row].tolist(), indices[row].tolist()):
            did = doc_ids[j]
            if ignore_identical_ids and did == qid:
                continue
            hits[did] = float(s)
        run[qid] = hits
    return run


def _truncate(run: Run, k: int) -> dict[str, dict[str, float]]:
    out = {}
    for qid, hits in run.items():
        top = sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        out[qid] = dict(top)
    return out


def evaluate_run(qrels: Qrels, run: Run, ndcg_at: Iterable[int] = (10,), map_at: Iterable[int] = (10,),
                 recall_at: Iterable[int] = (10, 100), mrr_at: Iterable[int] = (10,),
                 precision_at: Iterable[int] = ()) -> dict[str, float]:
    """Mean metrics over the queries of ``qrels`` (a query missing from ``run`` scores 0).

    Keys: ``ndcg@k``, ``map@k``, ``recall@k``, ``mrr@k``, ``p@k``. MRR@k is pytrec's reciprocal rank on the
    run truncated to its top k. Ties in the run are ordered by doc id, as trec_eval does.
    """
    import pytrec_eval

    qrels = {q: {d: int(s) for d, s in rels.items()} for q, rels in qrels.items()}
    full = {q: dict(run.get(q, {})) for q in qrels}
    measures = set()
    measures.update(f"ndcg_cut.{k}" for k in ndcg_at)
    measures.update(f"map_cut.{k}" for k in map_at)
    measures.update(f"recall.{k}" for k in recall_at)
    measures.update(f"P.{k}" for k in precision_at)
    per_query = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(full) if measures else {}
    out: dict[str, float] = {}
    n = max(len(qrels), 1)

    def mean(key: str) -> float:
        return float(sum(per_query.get(q, {}).get(key, 0.0) for q in qrels) / n)

    for k in ndcg_at:
        out[f"ndcg@{k}"] = mean(f"ndcg_cut_{k}")
    for k in map_at:
        out[f"map@{k}"] = mean(f"map_cut_{k}")
    for k in recall_at:
        out[f"recall@{k}"] = mean(f"recall_{k}")
    for k in precision_at:
        out[f"p@{k}"] = mean(f"P_{k}")
    for k in mrr_at:
        rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(_truncate(full, k))
        out[f"mrr@{k}"] = float(sum(rr.get(q, {}).get("recip_rank", 0.0) for q in qrels) / n)
    return out


def spearman(gold: Iterable[float], predicted: Iterable[float]) -> float:
    """Spearman's rho with average ranks for ties (BIOSSES is scored this way)."""
    from scipy.stats import spearmanr

    g, p = np.asarray(list(gold), dtype=float), np.asarray(list(predicted), dtype=float)
    if len(g) != len(p) or len(g) < 2:
        raise ValueError(f"spearman needs two equal-length sequences of >= 2 values, got {len(g)} and {len(p)}")
    return float(spearmanr(g, p).statistic)
