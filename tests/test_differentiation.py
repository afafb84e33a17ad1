"""Stage III (07-09): ranking, false-negative guard, consistency filter, pools, duplicates, cache, scripts.

Modules: repair.differentiation.tuples (loading), repair.differentiation.embedding_dir (step 7), repair.differentiation.hard_negatives (steps 8 and 9).

Expected values are worked out by hand on a constructed fixture (every score is chosen, see ``HAND``) or by
an independent brute-force loop in this file.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from repair.data import DataError, read_json, read_jsonl, write_jsonl
from repair.differentiation.embedding_dir import (EmbedConfig, EmbeddingDir, embed_candidates, text_sha1, write_embedding_dir,
                                  write_embedding_meta)
from repair.differentiation.hard_negatives import (consistency_filter, false_negative_keep, order_within_groups, positive_rank,
                                   select_hard_negatives)
from repair.differentiation.tuples import load_tuples

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "expansion_tiny.jsonl"
SCRIPTS = ROOT / "differentiation"

# ------------------------------------------------------------------------------------------------ hand fixture
# Three tuples. Every query embeds to e0; a document with chosen score s embeds to s*e0 + sqrt(1-s^2)*e_j
# (its own axis), so s(q, d) = s for every query. Scores (positive first, candidates in input order):
HAND = {
    "A": (0.90, [("a1", 0.95), ("a2", 0.50), ("a3", 0.30)]),
    "B": (0.40, [("b1", 0.80), ("b2", 0.70), ("b3", 0.60), ("b4", 0.45), ("b5", 0.20)]),
    "C": (0.99, [("c1", 0.10), ("c2", 0.25)]),
}
# local pool {d+} u D-_cand: rank(A+) = 2 (a1 above), rank(B+) = 5, rank(C+) = 1
# global pool (all 13 documents) sorted: C+ .99, a1 .95, A+ .90, b1 .80, b2 .70, b3 .60, a2 .50, b4 .45, B+ .40,
#   a3 .30, c2 .25, b5 .20, c1 .10  ->  rank(A+) = 3, rank(B+) = 9, rank(C+) = 1
LOCAL_RANK = {"A": 2, "B": 5, "C": 1}
GLOBAL_RANK = {"A": 3, "B": 9, "C": 1}
GLOBAL_ORDER = ["C+", "a1", "A+", "b1", "b2", "b3", "a2", "b4", "B+", "a3", "c2", "b5", "c1"]


def doc_text(name: str) -> str:
    return f"document {name}: a passage about material {name}"


def hand_lines(sources: dict | None = None) -> list[dict]:
    lines = []
    for tid, (_, cands) in HAND.items():
        line = {"id": tid, "q_model": f"generated query {tid}", "concepts": [f"concept {tid}"],
                "q_new": f"query {tid}", "d_pos": doc_text(f"{tid}+"),
                "negative_candidates": [{"id": n, "doi": None, "title": n, "abstract": doc_text(n)}
                                        for n, _ in cands],
                "source": "local_corpus"}
        if sources and tid in sources:
            line["negative_sources"], line["negative_traces"] = sources[tid]
        lines.append(line)
    return lines


def hand_vectors(dim: int = 32) -> dict[str, np.ndarray]:
    scores = {}
    for tid, (pos, cands) in HAND.items():
        scores[doc_text(f"{tid}+")] = pos
        scores.update({doc_text(n): s for n, s in cands})
    table, e0 = {}, np.eye(dim, dtype=np.float64)[0]
    for axis, (text, s) in enumerate(sorted(scores.items()), start=1):
        table[text] = (s * e0 + np.sqrt(1 - s * s) * np.eye(dim)[axis]).astype(np.float32)
    for tid in HAND:
        table[f"query {tid}"] = e0.astype(np.float32)
    return table


def build_emb_dir(folder: Path, tuples, table: dict[str, np.ndarray]) -> EmbeddingDir:
    write_embedding_dir(folder, tuples.queries.texts, tuples.documents.texts,
                        lambda texts, kind: np.stack([table[t] for t in texts]))
    write_embedding_meta(folder, {"retriever": {"name": "hand", "fingerprint": "hand"},
                                  "input": {"paths": ["hand"], "sha256": []}})
    return EmbeddingDir.open(folder)


@pytest.fixture()
def hand(tmp_path):
    path = tmp_path / "expansion.bottom_30pct.jsonl"
    write_jsonl(path, hand_lines())
    tuples = load_tuples(path)
    return path, tuples, build_emb_dir(tmp_path / "emb", tuples, hand_vectors())


def by_id(records: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in records}


def names(texts: list[str]) -> list[str]:
    return [t.split(":")[0].removeprefix("document ") for t in texts]


# ------------------------------------------------------------------------------------------------ pure functions
def test_order_within_groups_sorts_by_score_and_keeps_input_order_on_ties():
    owner = np.array([0, 0, 0, 1, 1, 1])
    scores = np.array([0.2, 0.9, 0.2, 0.5, 0.7, 0.5], dtype=np.float32)
    assert order_within_groups(owner, scores).tolist() == [1, 0, 2, 4, 3, 5]


def test_positive_rank_counts_strictly_higher_candidates():
    pos = np.array([0.5, 0.9, 0.3], dtype=np.float32)
    cand = np.array([0.6, 0.5, 0.4, 0.95, 0.1, 0.2], dtype=np.float32)
    owner = np.array([0, 0, 0, 1, 1, 2])
    # tuple 0: 0.6 > 0.5, the tie 0.5 does not outrank d+ -> rank 2; tuple 1: 0.95 -> 2; tuple 2: none -> 1
    assert positive_rank(pos, cand, owner).tolist() == [2, 2, 1]


def test_step9_tuple_without_negative_is_dropped_even_at_rank_1(tmp_path):
    """Eq. 6 keeps rank(d+) <= kappa, but a tuple without any negative candidate yields no triplet: dropped."""
    lone = {"id": "D", "q_model": "generated query D", "concepts": ["concept D"], "q_new": "query D",
            "d_pos": doc_text("D+"), "negative_candidates": [], "source": "local_corpus"}
    path = tmp_path / "expansion.jsonl"
    write_jsonl(path, hand_lines() + [lone])
    tuples = load_tuples(path)
    table = hand_vectors()
    table[doc_text("D+")], table["query D"] = table[doc_text("C+")], table["query C"]
    records, stats = consistency_filter(tuples, build_emb_dir(tmp_path / "emb", tuples, table), consistency_k=5)
    assert set(by_id(records)) == {"A", "B", "C"}
    assert stats["processed"] == 4 and stats["dropped_no_negative"] == 1 and stats["dropped_rank_above_k"] == 0


def test_false_negative_guard_margin_and_pct():
    cand = np.array([0.85, 0.78, 0.70, 0.50], dtype=np.float32)
    pos = np.full(4, 0.8, dtype=np.float32)
    assert false_negative_keep(cand, pos).tolist() == [True] * 4
    # margin 0.05: threshold 0.75 -> 0.85 and 0.78 are probable false negatives
    assert false_negative_keep(cand, pos, margin=0.05).tolist() == [False, False, True, True]
    # pct 0.95: threshold 0.76; pct 0.85: threshold 0.68 (0.70 goes too)
    assert false_negative_keep(cand, pos, pct=0.95).tolist() == [False, False, True, True]
    assert false_negative_keep(cand, pos, pct=0.85).tolist() == [False, False, False, True]
    # a negative positive score: threshold -0.2 - 0.2*0.1 = -0.22, stricter than d+ (pos * pct = -0.18 is not)
    neg = np.array([-0.21, -0.30], dtype=np.float32)
    assert false_negative_keep(neg, np.full(2, -0.2, dtype=np.float32), pct=0.9).tolist() == [False, True]


# ------------------------------------------------------------------------------------------------ hand fixture
def test_step8_ranks_candidates_with_scores(hand):
    _, tuples, emb = hand
    records, stats = select_hard_negatives(tuples, emb, top_k=15)
    got = by_id(records)
    assert names(got["A"]["hard_negatives"]) == ["a1", "a2", "a3"]
    assert names(got["B"]["hard_negatives"]) == ["b1", "b2", "b3", "b4", "b5"]
    assert names(got["C"]["hard_negatives"]) == ["c2", "c1"]  # sorted by score, not input order
    np.testing.assert_allclose(got["B"]["hard_negative_scores"], [0.8, 0.7, 0.6, 0.45, 0.2], atol=1e-5)
    np.testing.assert_allclose([got[t]["pos_score"] for t in "ABC"], [0.9, 0.4, 0.99], atol=1e-5)
    assert [got[t]["n_candidates"] for t in "ABC"] == [3, 5, 2]
    top2, _ = select_hard_negatives(tuples, emb, top_k=2)
    assert names(by_id(top2)["B"]["hard_negatives"]) == ["b1", "b2"]
    assert stats["guard_dropped"] == 0 and stats["written"] == 3


def test_step8_false_negative_guard_counts(hand):
    _, tuples, emb = hand
    # margin 0.05: A drops a1 (0.95 > 0.85); B drops b1 b2 b3 b4 (> 0.35); C drops nothing
    records, stats = select_hard_negatives(tuples, emb, fn_margin=0.05)
    got = by_id(records)
    assert names(got["A"]["hard_negatives"]) == ["a2", "a3"]
    assert names(got["B"]["hard_negatives"]) == ["b5"]
    assert stats["guard_dropped"] == 5 and stats["guard_tuples_affected"] == 2
    # pct 0.4: thresholds A 0.36, B 0.16, C 0.396 -> B loses every candidate and is not written
    records, stats = select_hard_negatives(tuples, emb, fn_pct=0.4)
    assert set(by_id(records)) == {"A", "C"} and stats["no_candidates_after_guard"] == 1
    assert names(by_id(records)["A"]["hard_negatives"]) == ["a3"]


@pytest.mark.parametrize("kappa,kept", [(1, {"C"}), (2, {"A", "C"}), (5, {"A", "B", "C"})])
def test_step9_local_pool_keep_drop(hand, kappa, kept):
    _, tuples, emb = hand
    records, stats = consistency_filter(tuples, emb, consistency_k=kappa)
    got = by_id(records)
    assert set(got) == kept
    assert stats["processed"] == 3 and stats["kept"] == len(kept) and stats["dropped"] == 3 - len(kept)
    assert stats["kept_rate"] == pytest.approx(len(kept) / 3, abs=1e-6)
    for tid, rec in got.items():
        assert rec["pos_rank"] == LOCAL_RANK[tid]
        # d- is the argmax over D-_cand (Eq. 7), computed here by brute force over the hand scores
        best = max(HAND[tid][1], key=lambda c: c[1])[0]
        assert names([rec["d_neg"]]) == [best] and rec["d_neg"] == rec["hard_negatives"][0]
        assert rec["hard_negative_scores"] == sorted(rec["hard_negative_scores"], reverse=True)


@pytest.mark.parametrize("kappa,kept", [(1, {"C"}), (2, {"C"}), (5, {"A", "C"})])
def test_step9_global_pool_keep_drop(hand, kappa, kept):
    _, tuples, emb = hand
    records, stats = consistency_filter(tuples, emb, consistency_k=kappa, pool="global")
    got = by_id(records)
    assert set(got) == kept
    for tid, rec in got.items():
        assert rec["pos_rank"] == GLOBAL_RANK[tid]
        pos_name = f"{tid}+"
        expect = [n for n in GLOBAL_ORDER if n != pos_name]
        assert names(rec["hard_negatives"]) == expect[:15]
    # the pools differ where they should: C's d- is its own c2 locally, A's a1 from the global pool
    local = by_id(consistency_filter(tuples, emb, consistency_k=kappa)[0])
    assert names([local["C"]["d_neg"]]) == ["c2"] and names([got["C"]["d_neg"]]) == ["a1"]
    assert stats["pos_rank_histogram"] == {"1": 1, "3": 1, "9": 1}


def test_step9_global_pool_rank_beyond_search_depth_is_dropped(hand):
    _, tuples, emb = hand
    records, stats = consistency_filter(tuples, emb, top_k=2, consistency_k=2, pool="global")
    assert set(by_id(records)) == {"C"}
    assert stats["pos_rank_histogram"] == {"1": 1, "3": 1, "not_found": 1}  # depth 3: B+ (rank 9) unseen
    assert names(by_id(records)["C"]["hard_negatives"]) == ["a1", "A+"]


@pytest.mark.parametrize("pool", ["local", "global"])
def test_step9_refuses_kappa_above_top_k(hand, pool):
    """TOP_K >= kappa was checked only by the driver: the library ran kappa 5 with top_k 2 and wrote triplets."""
    _, tuples, emb = hand
    with pytest.raises(ValueError, match=r"--consistency_k 5 is above --top_k 2"):
        consistency_filter(tuples, emb, top_k=2, consistency_k=5, pool=pool)
    records, stats = consistency_filter(tuples, emb, top_k=5, consistency_k=5, pool=pool)  # equal is fine
    assert stats["top_k"] == stats["consistency_k"] == 5 and records


def test_step9_script_refuses_kappa_above_top_k_before_reading_input(hand, tmp_path):
    """09's CLI: one 'error:' line naming both flags, exit 2, no output file (it used to exit 0 and write one)."""
    path, _, emb = hand
    out = tmp_path / "final.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "09_consistency_filter.py"), "--input_jsonl", str(path),
                           "--embedding_dir", str(emb.path), "--output_jsonl", str(out), "--top_k", "3",
                           "--consistency_k", "5"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: --consistency_k 5 is above --top_k 3") and "Traceback" not in proc.stderr
    assert not out.exists()


def test_step9_on_step8_output_matches_step9_on_expansion(hand, tmp_path):
    path, tuples, emb = hand
    records8, _ = select_hard_negatives(tuples, emb, top_k=15)
    write_jsonl(tmp_path / "hn.jsonl", records8)
    via8 = consistency_filter(load_tuples(tmp_path / "hn.jsonl"), emb, consistency_k=5)[0]
    direct = consistency_filter(tuples, emb, consistency_k=5)[0]
    assert via8 == direct


def test_step9_refuses_an_undecidable_truncated_list(hand, tmp_path):
    _, tuples, emb = hand
    write_jsonl(tmp_path / "hn2.jsonl", select_hard_negatives(tuples, emb, top_k=2)[0])
    cut = load_tuples(tmp_path / "hn2.jsonl")
    # B lists b1, b2 (both above B+) out of 5: rank(B+) >= 3, unknown beyond -> undecidable for kappa 5
    with pytest.raises(DataError, match=r"tuple 'B'.*--top_k >= 5"):
        consistency_filter(cut, emb, consistency_k=5)
    records, _ = consistency_filter(cut, emb, consistency_k=2)  # rank >= 3 > 2: dropping B is exact
    assert set(by_id(records)) == {"A", "C"}


def test_negative_sources_and_traces_follow_the_ranking(tmp_path):
    traces = [{"requirement": "r1", "perturbation": "entity substitution"}, None, None]
    path = tmp_path / "exp.jsonl"
    write_jsonl(path, hand_lines({"A": (["generated", "mined", "mined"], traces)}))
    tuples = load_tuples(path)
    # give the generated a1 the lowest score: it must move to the end with its trace
    table = hand_vectors()
    table[doc_text("a1")] = table[doc_text("c1")].copy()  # score 0.10
    emb = build_emb_dir(tmp_path / "emb", tuples, table)
    rec8 = by_id(select_hard_negatives(tuples, emb)[0])
    assert names(rec8["A"]["hard_negatives"]) == ["a2", "a3", "a1"]
    assert rec8["A"]["negative_sources"] == ["mined", "mined", "generated"]
    assert rec8["A"]["negative_traces"] == [None, None, traces[0]]
    assert "negative_sources" not in rec8["B"]
    write_jsonl(tmp_path / "hn.jsonl", list(rec8.values()))
    rec9 = by_id(consistency_filter(load_tuples(tmp_path / "hn.jsonl"), emb, consistency_k=5)[0])
    assert rec9["A"]["negative_sources"] == ["mined", "mined", "generated"]
    assert rec9["A"]["negative_traces"][2] == traces[0]


def brute_force(queries, docs, tuples_spec, top_k, kappa):
    """Independent loops: per tuple, sort candidates by score, rank d+ in {d+} u candidates."""
    out = {}
    for tid, (q, pos, cands) in tuples_spec.items():
        s_pos = float(np.dot(queries[q], docs[pos]))
        scored = sorted(((float(np.dot(queries[q], docs[c])), i, c) for i, c in enumerate(cands)),
                        key=lambda x: (-x[0], x[1]))
        rank = 1 + sum(1 for s, _, _ in scored if s > s_pos)
        out[tid] = {"negatives": [c for _, _, c in scored[:top_k]], "rank": rank, "keep": rank <= kappa}
    return out


def test_random_tuples_match_brute_force(tmp_path):
    rng = np.random.default_rng(7)
    n_docs, dim = 60, 8
    docs = {f"doc {i}": v / np.linalg.norm(v) for i, v in enumerate(rng.normal(size=(n_docs, dim)))}
    queries = {f"q {i}": v / np.linalg.norm(v) for i, v in enumerate(rng.normal(size=(25, dim)))}
    names_docs = list(docs)
    spec, lines = {}, []
    for i, q in enumerate(queries):
        chosen = rng.choice(n_docs, size=int(rng.integers(2, 19)), replace=False)
        pos, cands = names_docs[chosen[0]], [names_docs[j] for j in chosen[1:]]
        spec[f"t{i}"] = (q, pos, cands)
        lines.append({"id": f"t{i}", "q_new": q, "d_pos": pos,
                      "negative_candidates": [{"id": c, "doi": None, "title": c, "abstract": c} for c in cands]})
    write_jsonl(tmp_path / "exp.jsonl", lines)
    tuples = load_tuples(tmp_path / "exp.jsonl")
    table = {k: v.astype(np.float32) for k, v in {**docs, **queries}.items()}
    emb = build_emb_dir(tmp_path / "emb", tuples, table)
    for top_k, kappa in ((15, 5), (3, 2), (1, 1)):
        expect = brute_force(queries, docs, spec, top_k, kappa)
        got8 = by_id(select_hard_negatives(tuples, emb, top_k=top_k)[0])
        assert {t: r["hard_negatives"] for t, r in got8.items()} == {t: e["negatives"] for t, e in expect.items()}
        got9 = by_id(consistency_filter(tuples, emb, top_k=top_k, consistency_k=kappa)[0])
        assert set(got9) == {t for t, e in expect.items() if e["keep"]}
        assert all(got9[t]["pos_rank"] == expect[t]["rank"] for t in got9)
    # global pool by brute force: rank d+ among every document of the embedding dir
    got = by_id(consistency_filter(tuples, emb, top_k=4, consistency_k=3, pool="global")[0])
    for tid, (q, pos, _) in spec.items():
        pool = set(tuples.documents.texts)
        scores = sorted(((float(np.dot(queries[q], v)), d) for d, v in docs.items() if d in pool), key=lambda x: -x[0])
        ranked = [d for _, d in scores]
        rank = ranked.index(pos) + 1
        assert (tid in got) == (rank <= 3)
        if tid in got:
            assert got[tid]["pos_rank"] == rank
            assert got[tid]["hard_negatives"] == [d for d in ranked if d != pos][:4]


# ------------------------------------------------------------------------------------------------ loading, duplicates
def test_fixture_duplicates_and_repeats():
    tuples = load_tuples(FIXTURE)
    s = tuples.stats
    assert (s.lines, s.tuples, s.merged_duplicate_tuples) == (6, 5, 1)
    assert (s.empty_candidates, s.duplicate_candidates) == (3, 2)
    assert (s.candidates_equal_positive, s.candidates_twin_positive) == (2, 2)
    ids = tuples.ids
    assert ids == ["r1-0", "r1-1", "r2-0", "r2-1", "r2-2"]  # r1-2 repeats r1-0: written once
    cands = {ids[t]: [tuples.documents.texts[r].split()[0] for r in tuples.candidates(t)] for t in range(5)}
    assert cands["r1-0"] == ["Rutile", "ZnO", "Hematite", "GaN"]  # padded ZnO copy and d+ copy removed
    assert cands["r2-0"] == ["LiFePO4", "GaN"]  # NMC811 is the positive of the same query (r2-1)
    assert cands["r2-1"] == ["LiFePO4", "SiC"]
    assert cands["r2-2"] == []
    assert tuples.concepts[0] == ["TiO2", "anatase"]
    assert len(tuples.documents) == 12 and len(tuples.queries) == 4


def test_identical_candidate_never_negative_after_selection(tmp_path):
    lines = hand_lines()
    lines[0]["negative_candidates"].append({"id": "x", "doi": None, "title": "x", "abstract": doc_text("A+") + "\n"})
    lines[0]["negative_candidates"].append({"id": "y", "doi": None, "title": "y", "abstract": doc_text("a2")})
    write_jsonl(tmp_path / "exp.jsonl", lines)
    tuples = load_tuples(tmp_path / "exp.jsonl")
    emb = build_emb_dir(tmp_path / "emb", tuples, hand_vectors())
    rec = by_id(consistency_filter(tuples, emb, consistency_k=5)[0])["A"]
    assert doc_text("A+") not in rec["hard_negatives"] and names(rec["hard_negatives"]) == ["a1", "a2", "a3"]


@pytest.mark.parametrize("mutate,message", [
    (lambda r: r.pop("d_pos"), r"exp.jsonl:2: missing field 'd_pos'"),
    (lambda r: r["negative_candidates"][1].pop("abstract"),
     r"exp.jsonl:2: missing field 'negative_candidates\[1\].abstract'"),
    (lambda r: r.update(negative_candidates="a string"), r"exp.jsonl:2: field 'negative_candidates' must be list"),
    (lambda r: r.update(negative_candidates=["a string"]),
     r"exp.jsonl:2: field 'negative_candidates\[0\]' must be an object"),
    (lambda r: r.update(q_new="   "), r"exp.jsonl:2: field 'q_new' is empty"),
    (lambda r: r.update(negative_sources=["mined"]), r"exp.jsonl:2: field 'negative_sources' has 1 entries"),
    (lambda r: r.update(negative_sources=["mined", "typo", "mined", "mined", "mined"]), r"negative_sources\[1\]"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, mutate, message):
    lines = hand_lines()
    mutate(lines[1])
    write_jsonl(tmp_path / "exp.jsonl", lines)
    with pytest.raises(DataError, match=message):
        load_tuples(tmp_path / "exp.jsonl")


def test_triplet_line_with_string_negatives_is_an_error(tmp_path):
    write_jsonl(tmp_path / "hn.jsonl", [{"id": "x", "query": "q", "pos_document": "d", "hard_negatives": "n1"}])
    with pytest.raises(DataError, match=r"hn.jsonl:1: field 'hard_negatives' must be list\[str\]"):
        load_tuples(tmp_path / "hn.jsonl")


def test_input_without_tuples_is_an_error(tmp_path):
    """Empty input made 08 exit 0 with an empty file; 07-09 now say the previous stage produced nothing."""
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl: no tuples to read \(0 lines\); the stage that writes this "
                                        r"input produced nothing"):
        load_tuples(tmp_path / "empty.jsonl")
    write_jsonl(tmp_path / "blank.jsonl", [])
    with pytest.raises(DataError, match="no tuples to read"):
        load_tuples([tmp_path / "empty.jsonl", tmp_path / "blank.jsonl"])


def test_step8_empty_result_is_written_with_a_warning(hand, tmp_path, caplog):
    """Tuples whose candidates the false-negative guard removes all: a legitimate empty output, but said aloud."""
    path, tuples, emb = hand
    with caplog.at_level("WARNING", logger="repair.differentiation.hard_negatives"):
        records, stats = select_hard_negatives(tuples, emb, fn_margin=1.0)
    assert records == [] and stats["written"] == 0 and stats["no_candidates_after_guard"] == 3
    assert any("no tuple has a negative candidate left" in r.getMessage() and "3 emptied" in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="repair.differentiation.hard_negatives"):
        records, stats = consistency_filter(tuples, emb, consistency_k=1, top_k=1)
    assert stats["kept"] == 1 and not caplog.records  # something kept: nothing to warn about


def test_embedding_dir_missing_text_names_the_tuple(hand, tmp_path):
    _, _, emb = hand
    lines = hand_lines()
    lines[2]["negative_candidates"].append({"id": "new", "doi": None, "title": "n", "abstract": "a new abstract"})
    write_jsonl(tmp_path / "more.jsonl", lines)
    with pytest.raises(DataError, match=r"negative candidate #2 of tuple 'C' \(.*more.jsonl:3\)"):
        select_hard_negatives(load_tuples(tmp_path / "more.jsonl"), emb)
    with pytest.raises(FileNotFoundError, match="not a complete embedding dir"):
        EmbeddingDir.open(tmp_path)


# ------------------------------------------------------------------------------------------------ step 7
def test_step7_vectors_and_cache_reuse(tiny_model_dir, tmp_path):
    from repair.encoding import Retriever

    tuples = load_tuples(FIXTURE)
    config = EmbedConfig(input_jsonl=[str(FIXTURE)], output_dir=str(tmp_path / "emb"))
    forwards = []

    def load():
        r = Retriever.load(str(tiny_model_dir), device="cpu", cache_dir=tmp_path / "emb" / "cache")
        r.model.register_forward_hook(lambda m, a, o: forwards.append(o.last_hidden_state.shape[0]))
        return r

    first = embed_candidates(load(), tuples, config)
    assert sum(forwards) == first["texts_forwarded"] == 4 + 12
    emb1 = EmbeddingDir.open(tmp_path / "emb")
    q1, d1 = np.array(emb1.queries), np.array(emb1.documents)
    forwards.clear()
    second = embed_candidates(load(), tuples, config)  # a new process would look the same: new Retriever
    assert forwards == [] and second["texts_forwarded"] == 0
    emb2 = EmbeddingDir.open(tmp_path / "emb")
    np.testing.assert_array_equal(q1, emb2.queries)
    np.testing.assert_array_equal(d1, emb2.documents)
    # rows are the retriever's query / passage vectors of the listed texts (uncached reference encode)
    ref = Retriever.load(str(tiny_model_dir), device="cpu")
    q_texts = [r["text"] for r in read_jsonl(tmp_path / "emb" / "queries.jsonl")]
    d_texts = [r["text"] for r in read_jsonl(tmp_path / "emb" / "documents.jsonl")]
    np.testing.assert_allclose(q1, ref.encode_queries(q_texts).numpy(), atol=1e-5)
    np.testing.assert_allclose(d1, ref.encode_passages(d_texts).numpy(), atol=1e-5)
    assert first["retriever"]["fingerprint"] == ref.fingerprint()


def run_script(name: str, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **(env_extra or {})}
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_scripts_chained_with_two_gloo_processes(tiny_model_dir, tmp_path):
    """07 (two gloo worker processes on CPU) -> 08 -> 09 as subprocesses, the README's command lines."""
    from repair.encoding import Retriever

    emb, hn, final_dir = tmp_path / "emb", tmp_path / "09.hard_negatives.bottom_30pct.jsonl", tmp_path / "final"
    final_dir.mkdir()
    proc = run_script("07_embed_candidates.py", "--input_jsonl", str(FIXTURE), "--output_dir", str(emb),
                      "--model", str(tiny_model_dir), "--device", "cpu", "--num_gpus", "2")
    meta = read_json(emb / "meta.json")
    assert meta["processes"] == 2 and meta["texts_forwarded"] == 16  # each text once, across both ranks
    assert "forwarded 16 texts" in proc.stdout
    assert len(list((emb / "cache").rglob("shard-*.keys.npy"))) >= 2  # both ranks wrote their share
    # two processes give the vectors one process gives
    two = EmbeddingDir.open(emb)
    one = Retriever.load(str(tiny_model_dir), device="cpu")
    np.testing.assert_allclose(two.queries, one.encode_queries(
        [r["text"] for r in read_jsonl(emb / "queries.jsonl")]).numpy(), atol=1e-5)
    np.testing.assert_allclose(two.documents, one.encode_passages(
        [r["text"] for r in read_jsonl(emb / "documents.jsonl")]).numpy(), atol=1e-5)
    run_script("08_hard_negative_selection.py", "--input_jsonl", str(FIXTURE), "--embedding_dir", str(emb),
               "--output_jsonl", str(hn), "--top_k", "15")
    proc = run_script("09_consistency_filter.py", "--input_jsonl", str(hn), "--embedding_dir", str(emb),
                      "--output_jsonl", str(final_dir), "--top_k", "15", "--consistency_k", "5")
    final = final_dir / "final_train_data.bottom_30pct.jsonl"
    rows = read_jsonl(final, required={"query": str, "pos_document": str, "hard_negatives": list[str],
                                       "hard_negative_scores": list[float], "d_neg": str, "pos_rank": int,
                                       "id": str, "concepts": list[str]})
    stats = read_json(final_dir / "final_train_data.bottom_30pct.stats.json")
    assert stats["processed"] == 4 and stats["kept"] == len(rows) and stats["kept"] + stats["dropped"] == 4
    assert f"09: processed 4, kept {len(rows)}" in proc.stdout
    vecs = EmbeddingDir.open(emb)
    q_index, d_index = vecs.query_index, vecs.document_index
    for row in rows:
        assert row["d_neg"] == row["hard_negatives"][0] and row["pos_document"] not in row["hard_negatives"]
        assert 1 <= row["pos_rank"] <= 5 and len(row["hard_negatives"]) == len(row["hard_negative_scores"])
        q = vecs.queries[q_index[text_sha1(row["query"])]]
        expect = [float(q @ vecs.documents[d_index[text_sha1(t)]]) for t in row["hard_negatives"]]
        np.testing.assert_allclose(row["hard_negative_scores"], expect, atol=1e-5)
        assert row["hard_negative_scores"] == sorted(row["hard_negative_scores"], reverse=True)
    assert len({(r["query"], r["pos_document"]) for r in rows}) == len(rows)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step9_output_name_from_pct(tmp_path):
    script = load_script("09_consistency_filter.py")
    assert script.output_path(str(tmp_path), 7, ["x.jsonl"]) == tmp_path / "final_train_data.bottom_07pct.jsonl"
    assert script.output_path(str(tmp_path), None, ["a/09.hard_negatives.bottom_30pct.jsonl"]).name == \
        "final_train_data.bottom_30pct.jsonl"
    assert script.output_path(str(tmp_path / "f.jsonl"), None, ["x"]) == tmp_path / "f.jsonl"
    with pytest.raises(SystemExit, match="pass --pct"):
        script.output_path(str(tmp_path), None, ["x.jsonl"])


def test_step8_script_guard_stats(hand, tmp_path):
    path, _, emb = hand
    load_script("08_hard_negative_selection.py").main([
        "--input_jsonl", str(path), "--embedding_dir", str(emb.path), "--output_jsonl", str(tmp_path / "hn.jsonl"),
        "--fn_margin", "0.05"])
    stats = read_json(tmp_path / "hn.stats.json")
    assert stats["guard_dropped"] == 5 and stats["written"] == 3 and stats["fn_margin"] == 0.05


def test_original_concept_lines_become_tuples_and_repeats_merge(tmp_path):
    def paper(title, abstract):
        return {"pid": title, "doi": None, "title": title, "abstract": abstract, "source": "semantic_scholar"}

    write_jsonl(tmp_path / "06.semantic.jsonl", [
        {"concept": "TiO2", "got_k": 3, "papers": [paper("t1", "abstract one"), paper("t2", "abstract two"),
                                                  paper("t3", None)]},
        {"concept": "ZnO", "got_k": 2, "papers": [paper("t2", "abstract two"), paper("t4", "abstract four")]},
        {"concept": "failed", "got_k": 0, "papers": [], "error": "HTTP 429"},
    ])
    tuples = load_tuples(tmp_path / "06.semantic.jsonl")
    got = {tuples.ids[t]: (tuples.queries.texts[tuples.query_rows[t]],
                           [tuples.documents.texts[r] for r in tuples.candidates(t)], tuples.concepts[t])
           for t in range(len(tuples))}
    # t2 is in both groups: one tuple, candidates of both groups, both concepts; t3 has no abstract
    assert got == {"TiO2#0": ("t1", ["abstract two"], ["TiO2"]),
                   "TiO2#1": ("t2", ["abstract one", "abstract four"], ["TiO2", "ZnO"]),
                   "ZnO#1": ("t4", ["abstract two"], ["ZnO"])}
    s = tuples.stats
    assert (s.concept_lines, s.tuples, s.merged_duplicate_tuples, s.empty_candidates) == (3, 3, 1, 2)
