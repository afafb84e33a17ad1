"""Model-aware selection of Stage II's tuples (issue 43): keep the verified tuples the current retriever gets wrong.

Why: 06 keeps a generated query only when lexical search finds a document for it (a round-trip filter, the one
Promptagator uses), and the top hit of a lexical search is what a dense retriever finds too: on SciFact the verified
positive was ranked first for 90-98% of the kept tuples (docs/results.md), so at equal optimizer steps they carry
almost no InfoNCE gradient. This applies REPAIR's own diagnosis to Stage II's output. Each verified tuple is scored
with the retriever being trained: its margin (Stage I's Eq. 1 on the tuple: s(q_new, d+) minus the best of the
source's other hits) and d+'s rank among those hits (Eq. 6's rank). A tuple is *hard* when d+ is not first or its
margin is below :attr:`HardRule.margin`; the hard ones are kept hardest first, up to :attr:`HardRule.budget`.

Hard is not wrong. When the retriever prefers another hit h*, h* may answer q_new better than d+ (the label came
from one lexical search), and h* is the negative 08 would pick. Two guards drop a hard tuple before training: h* is
a near-copy of d+ (passage cosine >= :attr:`HardRule.dup_cosine`), or the source scored h* within
:attr:`HardRule.lex_tie` of d+ (relative: the search itself could not tell them apart). The guards are measured,
not trusted: for every hard candidate whose d+ is not first, :func:`concept_check` counts whether d+ and h* mention
the query's concepts (the check that needs no human), split by what the guards did.

The scores come from an embedding dir written by step 7's own code with the run's embedding cache, so 07 after
this step forwards nothing again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from repair.data import DataError, iter_jsonl
from repair.differentiation.embedding_dir import EmbeddingDir
from repair.differentiation.hard_negatives import order_within_groups, positive_rank, score_summary, score_tuples
from repair.differentiation.tuples import TupleSet
from repair.text import mentions_any

logger = logging.getLogger(__name__)

# the outcome of one tuple, in the order the rule decides it (stats and the output's "difficulty" use these names)
EASY, NO_CANDIDATES, NEAR_DUPLICATE, LEXICAL_TIE, OVER_BUDGET, HARD = (
    "easy", "no_candidates", "near_duplicate", "lexical_tie", "over_budget", "hard")


@dataclass(frozen=True)
class HardRule:
    """When a verified tuple is hard enough to train on, and the guards against a false label."""

    margin: float = 0.1  # hard: rank(d+) > 1 or s(q, d+) - max s(q, d-) < margin (choose it on dev)
    budget: int = 0  # at most this many hard tuples, hardest (lowest margin) first; 0 = all
    dup_cosine: float = 0.95  # guard: drop when cos(d+, h*) >= this (h* is d+ again, or its twin)
    lex_tie: float = 0.02  # guard: drop when the source's score of h* >= d+'s - lex_tie x |d+'s|; < 0 = off

    def __post_init__(self) -> None:
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0 (0 = no cap), got {self.budget}")
        if not -1.0 <= self.dup_cosine <= 1.0 + 1e-9:
            raise ValueError(f"dup_cosine must be a cosine in [-1, 1], got {self.dup_cosine}")
        if not math.isfinite(self.margin):
            raise ValueError(f"margin must be a finite number, got {self.margin}")


@dataclass
class Difficulty:
    """Per tuple of a TupleSet, how the retriever sees it (arrays parallel to the tuples)."""

    margin: np.ndarray  # float64: s(q, d+) - max s(q, d-); +inf without candidates
    rank: np.ndarray  # int64: 1 + candidates scoring strictly above d+
    preferred: np.ndarray  # int64: document row of the best-scored candidate h*, -1 without candidates
    preferred_to_positive: np.ndarray  # float64: cos(h*, d+) in passage space; nan without candidates


def tuple_difficulty(tuples: TupleSet, emb: EmbeddingDir) -> Difficulty:
    """Score every tuple with the embedding dir's retriever (the arithmetic of steps 8/9, on Stage II's tuples)."""
    _, d_map, pos_scores, cand_scores = score_tuples(tuples, emb)
    owner = tuples.owner
    n = len(tuples)
    margin = np.full(n, np.inf)
    preferred = np.full(n, -1, dtype=np.int64)
    to_positive = np.full(n, np.nan)
    if len(cand_scores):
        order = order_within_groups(owner, cand_scores)
        first = order[np.r_[True, owner[order][1:] != owner[order][:-1]]]  # the best candidate of each group
        groups = owner[first]
        margin[groups] = pos_scores[groups].astype(np.float64) - cand_scores[first].astype(np.float64)
        preferred[groups] = tuples.cand_rows[first]
        docs = emb.documents
        to_positive[groups] = np.einsum("ij,ij->i", docs[d_map[tuples.pos_rows[groups]]],
                                        docs[d_map[tuples.cand_rows[first]]]).astype(np.float64)
    return Difficulty(margin, positive_rank(pos_scores, cand_scores, owner), preferred, to_positive)


def source_candidate(record: dict, text: str) -> dict:
    """06's ``negative_candidates`` entry whose abstract is ``text`` (a TupleSet document), {} when none is: the
    candidate's id, title and source score live there, not in the TupleSet."""
    return next((c for c in record.get("negative_candidates") or []
                 if isinstance(c, dict) and (c.get("abstract") or "").strip() == text), {})


def lexical_scores(tuples: TupleSet, difficulty: Difficulty, records: dict[str, dict]) -> tuple[np.ndarray, np.ndarray]:
    """(the source's score of d+, its score of h*) per tuple, from 06's ``pos_score`` and candidates' ``score``;
    nan where the source gave none (Semantic Scholar and Elsevier rank without a score)."""
    pos = np.full(len(tuples), np.nan)
    pref = np.full(len(tuples), np.nan)
    for t, where in enumerate(tuples.where):
        rec = records.get(where) or {}
        if isinstance(rec.get("pos_score"), (int, float)):
            pos[t] = rec["pos_score"]
        if difficulty.preferred[t] < 0:
            continue
        score = source_candidate(rec, tuples.documents.texts[difficulty.preferred[t]]).get("score")
        if isinstance(score, (int, float)):
            pref[t] = score
    return pos, pref


def select_hard(difficulty: Difficulty, lexical_pos: np.ndarray, lexical_pref: np.ndarray,
                rule: HardRule) -> tuple[list[int], list[str]]:
    """(kept tuple indices, hardest first; each tuple's outcome): the rule of the module docstring.

    Ties in margin keep input order, so the selection is deterministic.
    """
    outcomes: list[str] = []
    for t in range(len(difficulty.margin)):
        if difficulty.preferred[t] < 0:
            outcomes.append(NO_CANDIDATES)
        elif not (difficulty.rank[t] > 1 or difficulty.margin[t] < rule.margin):
            outcomes.append(EASY)
        elif difficulty.preferred_to_positive[t] >= rule.dup_cosine:
            outcomes.append(NEAR_DUPLICATE)
        elif (rule.lex_tie >= 0 and np.isfinite(lexical_pos[t]) and np.isfinite(lexical_pref[t])
              and lexical_pref[t] >= lexical_pos[t] - rule.lex_tie * abs(lexical_pos[t])):
            outcomes.append(LEXICAL_TIE)
        else:
            outcomes.append(HARD)
    hard = sorted((t for t, o in enumerate(outcomes) if o == HARD), key=lambda t: (difficulty.margin[t], t))
    if rule.budget and len(hard) > rule.budget:
        for t in hard[rule.budget:]:
            outcomes[t] = OVER_BUDGET
        hard = hard[:rule.budget]
    return hard, outcomes


def concept_check(tuples: TupleSet, difficulty: Difficulty, outcomes: Sequence[str],
                  records: dict[str, dict]) -> dict:
    """Where the retriever prefers h* over d+ (rank > 1), how often each mentions the query's concepts, per outcome.

    The check that needs no human (issue 43): a preferred hit that names the query's concept while d+ does not is a
    sign the verified label may be the wrong one. Tuples without concepts (doc2query's) are not counted.
    """
    groups: dict[str, dict[str, int]] = {}
    for t, outcome in enumerate(outcomes):
        concepts = [c for c in tuples.concepts[t] if c.strip()]
        if difficulty.rank[t] <= 1 or difficulty.preferred[t] < 0 or not concepts:
            continue
        rec = records.get(tuples.where[t]) or {}
        pos_title = ((rec.get("pos_meta") or {}).get("title") or "")
        pref_text = tuples.documents.texts[difficulty.preferred[t]]
        pref_title = source_candidate(rec, pref_text).get("title") or ""
        in_pos = mentions_any(f"{pos_title} {tuples.documents.texts[tuples.pos_rows[t]]}", concepts)
        in_pref = mentions_any(f"{pref_title} {pref_text}", concepts)
        group = groups.setdefault(outcome, {"tuples": 0, "positive_mentions": 0, "preferred_mentions": 0,
                                            "only_preferred_mentions": 0})
        group["tuples"] += 1
        group["positive_mentions"] += in_pos
        group["preferred_mentions"] += in_pref
        group["only_preferred_mentions"] += in_pref and not in_pos
    return groups


def read_records(paths: Sequence[str | Path]) -> dict[str, dict]:
    """Every input line by its ``file:line`` (TupleSet.where's key), to write the kept lines back as they were."""
    records: dict[str, dict] = {}
    for path in paths:
        for lineno, rec in iter_jsonl(path, with_lineno=True):
            records[f"{path}:{lineno}"] = rec
    return records


def hard_records(tuples: TupleSet, emb: EmbeddingDir, records: dict[str, dict],
                 rule: HardRule) -> tuple[list[dict], dict]:
    """(the kept expansion lines, hardest first, each with its ``difficulty``; the funnel and the guard's check)."""
    if tuples.stats.triplet_lines or tuples.stats.concept_lines:
        raise DataError("06e selects among 06's verified tuples: its input must be expansion lines (q_new, d_pos, "
                        "negative_candidates), not triplets or concept lines")
    difficulty = tuple_difficulty(tuples, emb)
    lexical_pos, lexical_pref = lexical_scores(tuples, difficulty, records)
    kept, outcomes = select_hard(difficulty, lexical_pos, lexical_pref, rule)
    out = []
    for t in kept:
        rec = dict(records[tuples.where[t]])
        pref_id = source_candidate(rec, tuples.documents.texts[difficulty.preferred[t]]).get("id")
        rec["difficulty"] = {"margin": round(float(difficulty.margin[t]), 6), "rank": int(difficulty.rank[t]),
                             "preferred_id": pref_id,
                             "preferred_to_positive": round(float(difficulty.preferred_to_positive[t]), 6)}
        out.append(rec)
    finite = difficulty.margin[np.isfinite(difficulty.margin)]
    counts = {o: outcomes.count(o) for o in (EASY, NO_CANDIDATES, NEAR_DUPLICATE, LEXICAL_TIE, OVER_BUDGET, HARD)}
    has_lexical = np.isfinite(lexical_pos) & np.isfinite(lexical_pref)
    stats = {"rule": asdict(rule), "tuples": len(tuples), "outcomes": counts,
             "positive_not_first": int((difficulty.rank > 1).sum()),
             "margin_below": int((difficulty.margin < rule.margin).sum()),
             "lexical_scores_missing": int((~has_lexical & (difficulty.preferred >= 0)).sum()),
             "kept": len(kept), "kept_positive_not_first": int(sum(difficulty.rank[t] > 1 for t in kept)),
             "margin_all": score_summary(finite.tolist()),
             "margin_kept": score_summary([float(difficulty.margin[t]) for t in kept]),
             "concept_check": concept_check(tuples, difficulty, outcomes, records), "load": asdict(tuples.stats)}
    logger.info("06e: %d tuples -> %d hard (d+ not first %d, margin < %g %d; guards dropped %d near-duplicate, %d "
                "lexical tie; %d over budget)", len(tuples), len(kept), stats["positive_not_first"], rule.margin,
                stats["margin_below"], counts[NEAR_DUPLICATE], counts[LEXICAL_TIE], counts[OVER_BUDGET])
    return out, stats
