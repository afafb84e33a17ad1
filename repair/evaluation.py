"""Dense-retrieval evaluation on BEIR folders, shared by ``eval/`` scripts, the driver and benchmarks."""

from __future__ import annotations

import logging
import time

from .data import BeirData
from .encoding import Retriever
from .metrics import evaluate_run, run_from_topk
from .search import exact_topk

logger = logging.getLogger(__name__)


def evaluate_beir(retriever: Retriever, data: BeirData, instruction: str, *, top_k: int = 1000,
                  batch_size: int | None = None, ndcg_at=(10,), map_at=(10,), recall_at=(10, 100),
                  mrr_at=(10,), precision_at=(), show_progress: bool | None = None) -> dict:
    """Encode corpus (title + " " + text) and queries, exact search, pytrec metrics.

    Returns the metrics plus counts and timings; a query's own id never counts as a hit.
    """
    t0 = time.time()
    doc_ids = list(data.corpus)
    doc_vecs = retriever.encode_passages([data.doc_text(d) for d in doc_ids], batch_size=batch_size,
                                         show_progress=show_progress, desc="encode corpus")
    t1 = time.time()
    query_ids = list(data.queries)
    query_vecs = retriever.encode_queries([data.queries[q] for q in query_ids], instruction=instruction,
                                          batch_size=batch_size, show_progress=show_progress,
                                          desc="encode queries")
    t2 = time.time()
    scores, indices = exact_topk(query_vecs, doc_vecs, top_k + 1)  # +1: room for a dropped identical id
    run = run_from_topk(query_ids, doc_ids, scores, indices, ignore_identical_ids=True)
    run = {q: dict(list(h.items())[:top_k]) for q, h in run.items()}
    metrics = evaluate_run(data.qrels, run, ndcg_at=ndcg_at, map_at=map_at, recall_at=recall_at,
                           mrr_at=mrr_at, precision_at=precision_at)
    t3 = time.time()
    metrics.update({"num_queries": len(query_ids), "num_docs": len(doc_ids),
                    "seconds_corpus": round(t1 - t0, 2), "seconds_queries": round(t2 - t1, 2),
                    "seconds_search_eval": round(t3 - t2, 2)})
    return metrics
