"""bm25s' BM25 (Lucene's variant) recomputed exactly for a few candidate papers, so that an engine that ranks with
other constants (tantivy: k1 fixed at 1.2, lengths in a one-byte code) verifies 06's queries as bm25s does (issue
41, point 4). The engine proposes; these functions decide.

Lucene's BM25 as bm25s computes it (method "lucene", no (k1 + 1) factor):
    score(q, d) = sum over query tokens t (each occurrence) of idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable


def lucene_idf(doc_freqs: dict[str, int], num_docs: int) -> dict[str, float]:
    """idf of each term that occurs in the corpus (a term with df 0 scores nothing, as in bm25s)."""
    return {t: math.log(1.0 + (num_docs - df + 0.5) / (df + 0.5)) for t, df in doc_freqs.items() if df}


def lucene_bm25(query_tokens: list[str], doc_tokens: list[str], idf: dict[str, float], avgdl: float, *,
                k1: float, b: float) -> float:
    """One paper's score: ``doc_tokens`` is its whole analysed text (its exact length is ``len(doc_tokens)``)."""
    counts = Counter(t for t in doc_tokens if t in idf)
    norm = k1 * (1.0 - b + b * len(doc_tokens) / avgdl)
    return sum(idf[t] * counts[t] / (counts[t] + norm) for t in query_tokens if counts[t])


def explained_average_length(explanation: dict) -> float | None:
    """The ``avgdl`` a BM25 score explanation reports (tantivy's ``Explanation.to_json()``: nested ``details``
    with ``description`` and ``value``), or None where it holds none. tantivy keeps the average exact (total
    tokens / documents) but exposes it only there."""
    stack: list[dict] = [explanation]
    while stack:
        node = stack.pop()
        if str(node.get("description", "")).startswith("avgdl"):
            return float(node["value"])
        stack.extend(_children(node.get("details")))
    return None


def _children(details: Iterable[dict] | None) -> list[dict]:
    return [d for d in details or [] if isinstance(d, dict)]
