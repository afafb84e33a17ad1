"""Stage III on the diagnosed queries themselves (issue 16, lever 3): Q_conf's own T0 queries as tuples.

Stage I finds the T0 queries the retriever is least sure about and, for each, the documents that beat (or nearly
beat) its positive: D-(q), the first non-positive hits of its top-k list (Eq. 1's search, over T0's passages).
The paper uses them only to extract concepts for Stage II. This module hands them to Stage III as well: each
confused query becomes one expansion-format tuple (``q_new`` = the T0 query, ``d_pos`` = its positive,
``negative_candidates`` = D-(q)), so steps 07-09 pick its model-aware hard negative (Eq. 7), keep it only when it
is consistent (Eq. 6), and may guard against false negatives (08's ``--fn_margin`` / ``--fn_pct``) exactly as for
the verified expansion tuples. The training data then holds the confused claims *with* the documents that
confuse them, next to the expansion tuples.

A document known to answer the query (its positive, a twin with the same text, or any other positive of the
same query text in the training set) is never a candidate.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

from repair.diagnosis import margins as dg
from repair.diagnosis.ccs import negatives_of
from repair.data import DataError, load_seed

logger = logging.getLogger(__name__)

SOURCE = "t0_confused"  # the ``source`` of every tuple written here (expansion tuples name their literature source)


@dataclass
class ConfusedTupleStats:
    confused_queries: int = 0
    tuples: int = 0
    candidates: int = 0
    candidates_known_positive: int = 0
    without_candidates: int = 0


def confused_query_tuples(dia_out_dir: str | os.PathLike, pct: int, *, train_pt: str | None = None,
                          split: str | None = None, top_neg_n: int = 30) -> tuple[list[dict], ConfusedTupleStats]:
    """Expansion-format tuples for the confused queries of diagnosis run ``dia_out_dir`` at percentile ``pct``.

    ``top_neg_n`` bounds D-(q) as in PathA (the first N non-positive hits, best first). ``train_pt``/``split``
    default to the ones the diagnosis recorded; a different training set is refused (indices would not line up).
    """
    if top_neg_n < 1:
        raise ValueError(f"top_neg_n must be >= 1, got {top_neg_n}")
    run = dg.open_confused_run(dia_out_dir, pct, train_pt, split)
    cpath, records, seed, train_pt, split = run.path, run.records, run.seed, run.train_pt, run.split
    # every positive a query text has anywhere in the training data (BEIR: all qrels positives, not only T0's first)
    known: dict[str, set[str]] = {}
    every = load_seed(train_pt, split, all_positives=True)
    for query, passage in zip(every.queries + seed.queries, every.passages + seed.passages):
        known.setdefault(query, set()).add(passage)
    stats = ConfusedTupleStats(confused_queries=len(records))
    tuples: list[dict] = []
    for rec in records:
        i = int(rec["i"])
        if not 0 <= i < len(seed):
            raise DataError(f"{cpath}: field 'i' = {i} is outside the training set ({len(seed)} rows)")
        query, positive = seed.queries[i], seed.passages[i]
        candidates = []
        for _, j in negatives_of(rec, top_neg_n):
            text = seed.passages[j]
            if text == positive or text in known.get(query, ()):
                stats.candidates_known_positive += 1
                continue
            candidates.append({"abstract": text, "t0_index": j})
        if not candidates:
            stats.without_candidates += 1
            continue
        stats.candidates += len(candidates)
        tuples.append({"id": f"t0:{i}", "q_new": query, "d_pos": positive, "negative_candidates": candidates,
                       "source": SOURCE, "concepts": [], "margin": rec["margin_cos"]})
    stats.tuples = len(tuples)
    logger.info("confused tuples: %s", asdict(stats))
    return tuples, stats
