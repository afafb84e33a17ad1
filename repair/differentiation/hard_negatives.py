"""Steps 8 and 9 on an embedding dir: the model-aware hard negative (README Eq. 7) and the consistency filter
(Eq. 6) that turn Stage III tuples into training triplets, without loading a model.

* step 8 (Eq. 7) ranks D-_cand by s(q_new, d) and keeps the top ``top_k`` with scores, after an optional
  positive-aware false-negative guard (NV-Retriever's TopK-MarginPos / TopK-PercPos);
* step 9 (Eq. 6) keeps a tuple only if rank(d+ | q_new, D_pool) <= kappa with the *local* pool
  D_pool = {d+} u D-_cand, and d- = argmax over D-_cand. The original code's *global* pool (every document of
  every tuple; UPSTREAM 2.11) is ``pool="global"``. kappa may not exceed ``top_k`` (:func:`check_kappa`).

The scoring functions work on whole arrays (no per-tuple model calls) so tests can check them by hand. These are
the *mined* hard negatives; the LLM-written counterfactual ones (CausalNeg, 09b) live in :mod:`repair.differentiation.causalneg`.
Separate from the tuple reader (:mod:`repair.differentiation.tuples`) and the embedding dir (:mod:`repair.differentiation.embedding_dir`):
this is the ranking arithmetic, which needs neither torch nor a model.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict
from typing import Sequence

import numpy as np

from repair.data import MINED, DataError
from repair.differentiation.embedding_dir import EmbeddingDir
from repair.differentiation.tuples import TupleSet

logger = logging.getLogger(__name__)

POOLS = ("local", "global")


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


# ---------------------------------------------------------------------------------------------- steps 8 and 9
def score_tuples(tuples: TupleSet, emb: EmbeddingDir) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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


def score_summary(values: Sequence[float]) -> dict:
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
    _, _, pos_scores, cand_scores = score_tuples(tuples, emb)
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
             "pos_score": score_summary(pos_scores),
             "top1_score": score_summary([r["hard_negative_scores"][0] for r in records]),
             "load": asdict(tuples.stats), "embedding_fingerprint": emb.fingerprint,
             "seconds": round(time.perf_counter() - t0, 3)}
    if not records:  # a legitimate outcome (06 found no other hit for any query), but one worth seeing
        logger.warning("no tuple has a negative candidate left (%d without candidates, %d emptied by the "
                       "false-negative guard): the output holds no line", stats["no_candidates"],
                       stats["no_candidates_after_guard"])
    return records, stats


def _local_pool(tuples: TupleSet, emb: EmbeddingDir, top_k: int, kappa: int):
    """Eq. 6 on D_pool = {d+} u D-_cand: per tuple (rank, [(cand position, score)] best first, pos score)."""
    _, _, pos_scores, cand_scores = score_tuples(tuples, emb)
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
    from repair.search import exact_topk

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


def check_kappa(top_k: int, consistency_k: int) -> None:
    """TOP_K >= kappa: refuse ``consistency_k > top_k`` (a ValueError naming both flags).

    08 writes the ``top_k`` best negatives of a tuple and 09 decides rank(d+) <= kappa from that list, so a kappa
    above it asks about ranks nobody listed. 09 calls this before reading any input; :func:`consistency_filter`
    calls it too, so a library caller gets the same refusal.
    """
    if consistency_k > top_k:
        raise ValueError(f"--consistency_k {consistency_k} is above --top_k {top_k}: kappa must not exceed top_k "
                         f"(09 decides rank(d+) <= kappa from the top_k negatives 08 lists per tuple); raise "
                         f"--top_k or lower --consistency_k")


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
    check_kappa(top_k, consistency_k)
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
             "pos_score_kept": score_summary(pos_kept), "d_neg_score_kept": score_summary(dneg_kept),
             "margin_kept": score_summary(np.asarray(pos_kept) - np.asarray(dneg_kept)) if pos_kept else {},
             "load": asdict(tuples.stats), "embedding_fingerprint": emb.fingerprint,
             "seconds": round(time.perf_counter() - t0, 3)}
    if not records:  # legitimate (the retriever ranks no d+ in the top kappa), but one worth seeing
        logger.warning("the consistency filter kept none of %d tuples (%d with rank(d+) > %d, %d without a "
                       "negative): the output holds no line", processed, dropped_rank, consistency_k, dropped_empty)
    return records, stats
