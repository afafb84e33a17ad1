"""Retrieval and similarity metrics. IR metrics come from ``pytrec_eval`` (pytrec-eval-terrier), the
implementation BEIR and BMRetriever report with, so our numbers are comparable to published ones."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

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


def trec_order(hits: Mapping[str, float]) -> list[tuple[str, float]]:
    """A run's hits in trec_eval's ranking order: score descending, ties by doc id *descending*
    (trec_eval sorts equal scores by docno in reverse), so a cut at k keeps what trec_eval ranks first."""
    return sorted(hits.items(), key=lambda kv: (-kv[1], _Desc(kv[0])))


class _Desc(str):
    """A string that sorts in reverse order (tie-break key for :func:`trec_order`)."""

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)


def _truncate(run: Run, k: int) -> dict[str, dict[str, float]]:
    return {qid: dict(trec_order(hits)[:k]) for qid, hits in run.items()}


def evaluate_run(qrels: Qrels, run: Run, ndcg_at: Iterable[int] = (10,), map_at: Iterable[int] = (10,),
                 recall_at: Iterable[int] = (10, 100), mrr_at: Iterable[int] = (10,),
                 precision_at: Iterable[int] = (), *, ndcg_full: bool = False, map_full: bool = False,
                 relevance_level: int = 1) -> dict[str, float]:
    """Mean metrics over the queries of ``qrels`` (a query missing from ``run`` scores 0).

    Keys: ``ndcg@k``, ``map@k``, ``recall@k``, ``mrr@k``, ``p@k``, and with ``ndcg_full``/``map_full`` the
    uncut ``ndcg``/``map`` over the whole run (RELISH-style graded sets). nDCG uses the graded qrels as linear
    gains (trec_eval); MAP, recall, P and MRR count a document relevant when its grade >= ``relevance_level``.
    MRR@k is pytrec's reciprocal rank on the run cut to its top k. Ties in the run are broken as trec_eval
    breaks them (doc id descending, :func:`trec_order`).
    """
    import pytrec_eval

    qrels = {q: {d: int(s) for d, s in rels.items()} for q, rels in qrels.items()}
    full = {q: dict(run.get(q, {})) for q in qrels}
    measures = set()
    measures.update(f"ndcg_cut.{k}" for k in ndcg_at)
    measures.update(f"map_cut.{k}" for k in map_at)
    measures.update(f"recall.{k}" for k in recall_at)
    measures.update(f"P.{k}" for k in precision_at)
    if ndcg_full:
        measures.add("ndcg")
    if map_full:
        measures.add("map")
    per_query = (pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=relevance_level).evaluate(full)
                 if measures else {})
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
    if ndcg_full:
        out["ndcg"] = mean("ndcg")
    if map_full:
        out["map"] = mean("map")
    for k in mrr_at:
        rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"},
                                            relevance_level=relevance_level).evaluate(_truncate(full, k))
        out[f"mrr@{k}"] = float(sum(rr.get(q, {}).get("recip_rank", 0.0) for q in qrels) / n)
    return out


def per_query_ndcg(qrels: Qrels, run: Run, k: int = 10) -> dict[str, float]:
    """nDCG@k of every query of ``qrels`` (0 for a query missing from ``run``), as :func:`evaluate_run` averages
    them. Kept in an evaluation's output so two models can be compared query by query (a paired test: which queries
    one model ranks better, and whether the mean difference is more than the luck of which queries were drawn)."""
    import pytrec_eval

    qrels = {q: {d: int(s) for d, s in rels.items()} for q, rels in qrels.items()}
    scored = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{k}"}).evaluate(
        {q: dict(run.get(q, {})) for q in qrels})
    return {q: float(scored.get(q, {}).get(f"ndcg_cut_{k}", 0.0)) for q in qrels}


def paired_randomization_p(differences: Sequence[float], draws: int = 10000, seed: int = 0) -> float:
    """Two-sided p-value of a mean per-query difference between two systems (Fisher's paired randomization test, as
    IR evaluations use it, e.g. Smucker et al., CIKM 2007): under "no difference" each query's difference is as
    likely negated, so the share of ``draws`` random sign flips whose mean is at least as far from 0 as the observed
    one estimates p; (count + 1) / (draws + 1) keeps it above 0. Seeded: the same inputs give the same p."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        raise ValueError("paired_randomization_p: no differences")
    observed = abs(d.mean())
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(draws, d.size))
    extreme = int((np.abs((signs * d).mean(axis=1)) >= observed - 1e-12).sum())
    return (extreme + 1) / (draws + 1)


def spearman(gold: Iterable[float], predicted: Iterable[float]) -> float:
    """Spearman's rho with average ranks for ties (BIOSSES is scored this way)."""
    from scipy.stats import spearmanr

    g, p = np.asarray(list(gold), dtype=float), np.asarray(list(predicted), dtype=float)
    if len(g) != len(p) or len(g) < 2:
        raise ValueError(f"spearman needs two equal-length sequences of >= 2 values, got {len(g)} and {len(p)}")
    return float(spearmanr(g, p).statistic)
