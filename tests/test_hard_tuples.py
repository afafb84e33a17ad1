"""Step 06e (issue 43): which verified Stage II tuples the current retriever gets wrong or nearly, the two guards
against a false label, the budget, the concept check that measures the guards, and the script end to end with a
tiny real model (its margins checked against the model's own vectors, and 07 afterwards forwarding nothing).

Expected values of the hand cases are worked out by hand from chosen scores (see ``HAND``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from repair.data import read_json, read_jsonl, write_jsonl
from repair.differentiation.embedding_dir import EmbeddingDir, write_embedding_dir, write_embedding_meta
from repair.differentiation.hard_tuples import (EASY, HARD, LEXICAL_TIE, NEAR_DUPLICATE, NO_CANDIDATES, OVER_BUDGET,
                                                HardRule, hard_records, read_records)
from repair.differentiation.tuples import load_tuples

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "differentiation" / "06e_hard_tuples.py"

# Every query embeds to e0; a document with chosen score s embeds to s*e0 + sqrt(1-s^2)*e_axis, so s(q, d) = s. Each
# document has its own axis except "twin", which shares D+'s axis (cos(D+, twin) = .5*.55 + sqrt(.75*.6975) = .998).
# tuple: (d+ score, [(candidate, score, lexical score)], d+ lexical score, concepts)
HAND = {
    "E": (0.90, [("e1", 0.50, 3.0), ("e2", 0.30, 2.0)], 9.0, []),       # margin +.40, d+ first: easy
    "N": (0.80, [("n1", 0.75, 3.0)], 9.0, []),                          # margin +.05 < .1: nearly wrong, hard
    "W": (0.40, [("w1", 0.70, 5.0), ("w2", 0.20, 1.0)], 9.0, ["alpha"]),  # margin -.30, rank 2: wrong, hard
    "D": (0.50, [("twin", 0.55, 4.0)], 9.0, []),                        # rank 2 but h* is d+'s twin: near_duplicate
    "L": (0.30, [("l1", 0.55, 9.9)], 10.0, ["beta"]),                   # rank 2, lexical 9.9 vs 10.0: lexical_tie
    "X": (0.90, [], 9.0, []),                                           # nothing to contrast with: no_candidates
}
TEXT = {"w1": "a study of alpha signalling", "W+": "a study of kinase signalling",
        "l1": "beta cells and their role", "L+": "beta receptors in the heart"}


def doc_text(name: str) -> str:
    return TEXT.get(name, f"document {name}: a passage about {name}")


def hand_lines() -> list[dict]:
    return [{"id": tid, "q_model": f"generated {tid}", "concepts": concepts, "q_new": f"query {tid}",
             "d_pos": doc_text(f"{tid}+"), "pos_meta": {"id": f"{tid}+", "title": f"title {tid}"},
             "pos_score": pos_lex, "source": "local_corpus",
             "negative_candidates": [{"id": n, "doi": None, "title": f"title {n}", "abstract": doc_text(n),
                                      "score": lex} for n, _, lex in cands]}
            for tid, (_, cands, pos_lex, concepts) in HAND.items()]


def hand_emb_dir(folder: Path, lines_path: Path) -> EmbeddingDir:
    tuples = load_tuples([lines_path])
    names = [f"{tid}+" for tid in HAND] + [n for _, cands, _, _ in HAND.values() for n, _, _ in cands]
    score = {f"{tid}+": pos for tid, (pos, _, _, _) in HAND.items()}
    score.update({n: s for _, cands, _, _ in HAND.values() for n, s, _ in cands})
    dim = len(names) + 1
    vectors = {}
    for axis, name in enumerate(names, start=1):
        v = np.zeros(dim, dtype=np.float32)
        v[0] = score[name]
        v[names.index("D+") + 1 if name == "twin" else axis] = math.sqrt(1 - score[name] ** 2)
        vectors[doc_text(name)] = v
    e0 = np.eye(dim, dtype=np.float32)[0]

    def encode(texts: list[str], kind: str) -> np.ndarray:
        return np.stack([e0 if kind == "query" else vectors[t] for t in texts])

    write_embedding_dir(folder, tuples.queries.texts, tuples.documents.texts, encode)
    write_embedding_meta(folder, {"retriever": {"name": "hand", "fingerprint": "hand"}, "input": {}})
    return EmbeddingDir.open(folder)


@pytest.fixture()
def hand(tmp_path):
    path = tmp_path / "expansion.jsonl"
    write_jsonl(path, hand_lines())
    return load_tuples([path]), hand_emb_dir(tmp_path / "emb", path), read_records([path])


def outcomes_of(stats: dict) -> dict:
    return {k: v for k, v in stats["outcomes"].items() if v}


def test_rule_guards_and_order_by_hand(hand):
    tuples, emb, records = hand
    kept, stats = hard_records(tuples, emb, records, HardRule(margin=0.1))
    # hardest first: W (-0.30) before N (+0.05); each written as 06 wrote it, plus its difficulty
    assert [r["id"] for r in kept] == ["W", "N"]
    assert kept[0]["difficulty"] == {"margin": pytest.approx(-0.30, abs=1e-6), "rank": 2, "preferred_id": "w1",
                                     "preferred_to_positive": pytest.approx(0.40 * 0.70, abs=1e-6)}
    assert kept[1]["difficulty"]["margin"] == pytest.approx(0.05, abs=1e-6) and kept[1]["difficulty"]["rank"] == 1
    assert {k: v for k, v in kept[0].items() if k != "difficulty"} == records[tuples.where[2]]
    assert outcomes_of(stats) == {EASY: 1, HARD: 2, NEAR_DUPLICATE: 1, LEXICAL_TIE: 1, NO_CANDIDATES: 1}
    assert stats["positive_not_first"] == 3 and stats["margin_below"] == 4  # W, D, L not first; N, W, D, L below
    assert stats["kept"] == 2 and stats["kept_positive_not_first"] == 1
    assert stats["margin_kept"]["mean"] == pytest.approx((-0.30 + 0.05) / 2, abs=1e-6)
    # the concept check over tuples whose d+ is not first and that have concepts: W (only h* names "alpha") was
    # kept; L (both name "beta") was dropped by the lexical guard
    assert stats["concept_check"] == {
        HARD: {"tuples": 1, "positive_mentions": 0, "preferred_mentions": 1, "only_preferred_mentions": 1},
        LEXICAL_TIE: {"tuples": 1, "positive_mentions": 1, "preferred_mentions": 1, "only_preferred_mentions": 0}}


def test_guards_off_budget_and_margin(hand):
    tuples, emb, records = hand
    # guards off: D and L become hard too; order by margin: W -0.30, L -0.25, D -0.05, N +0.05
    kept, stats = hard_records(tuples, emb, records, HardRule(margin=0.1, dup_cosine=1.0, lex_tie=-1))
    assert [r["id"] for r in kept] == ["W", "L", "D", "N"]
    # a budget keeps the hardest and says how many it cut
    kept, stats = hard_records(tuples, emb, records, HardRule(margin=0.1, budget=1))
    assert [r["id"] for r in kept] == ["W"] and stats["outcomes"][OVER_BUDGET] == 1
    # a margin of 0 keeps only what the retriever ranks wrong (N is right, by +0.05)
    kept, _ = hard_records(tuples, emb, records, HardRule(margin=0.0))
    assert [r["id"] for r in kept] == ["W"]
    # the lexical guard needs both scores: without the candidates' scores (Semantic Scholar) it cannot apply
    for rec in records.values():
        for cand in rec["negative_candidates"]:
            cand.pop("score")
    kept, stats = hard_records(tuples, emb, records, HardRule(margin=0.1))
    assert [r["id"] for r in kept] == ["W", "L", "N"] and stats["lexical_scores_missing"] == 5


def test_rule_refuses_nonsense():
    with pytest.raises(ValueError, match="budget"):
        HardRule(budget=-1)
    with pytest.raises(ValueError, match="cosine"):
        HardRule(dup_cosine=1.5)


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_script_with_a_real_model_matches_its_vectors_and_07_reuses_them(tiny_model_dir, tmp_path):
    from repair.encoding import Retriever

    path = tmp_path / "expansion.jsonl"
    write_jsonl(path, hand_lines())
    out, cache = tmp_path / "hard.jsonl", tmp_path / "cache"
    # margin 0.2 on a random-weight model: whatever it ranks, the selection must follow its own vectors
    done = run_script("--input_jsonl", str(path), "--output_jsonl", str(out), "--model", str(tiny_model_dir),
                      "--max_length", "64", "--margin", "0.2", "--cache_dir", str(cache), "--lex_tie", "-1",
                      "--dup_cosine", "1.0")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # the independent check: the model's own cosines, computed here without the step's code
    retriever = Retriever.load(str(tiny_model_dir), max_length=64)
    expected = {}
    for line in hand_lines():
        if not line["negative_candidates"]:
            continue
        q = retriever.encode([line["q_new"]], "query")[0]
        docs = retriever.encode([line["d_pos"]] + [c["abstract"] for c in line["negative_candidates"]], "passage")
        q, docs = q / q.norm(), docs / docs.norm(dim=1, keepdim=True)
        scores = (docs @ q).tolist()
        margin = scores[0] - max(scores[1:])
        rank = 1 + sum(s > scores[0] for s in scores[1:])
        if rank > 1 or margin < 0.2:
            expected[line["id"]] = (margin, rank)
    kept = read_jsonl(out)
    assert {r["id"] for r in kept} == set(expected) and summary["hard"] == len(expected)
    for record in kept:
        assert record["difficulty"]["margin"] == pytest.approx(expected[record["id"]][0], abs=1e-4)
        assert record["difficulty"]["rank"] == expected[record["id"]][1]
    assert [r["difficulty"]["margin"] for r in kept] == sorted(r["difficulty"]["margin"] for r in kept)
    stats = read_json(tmp_path / "hard.stats.json")
    assert stats["tuples"] == 6 and stats["kept"] == len(expected)
    # 07 on the same input with the same cache forwards no text again
    emb = subprocess.run([sys.executable, str(ROOT / "differentiation" / "07_embed_candidates.py"), "--input_jsonl",
                          str(path), "--output_dir", str(tmp_path / "emb07"), "--model", str(tiny_model_dir),
                          "--max_length", "64", "--cache_dir", str(cache)], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert emb.returncode == 0, emb.stderr[-3000:]
    assert json.loads(emb.stdout.strip().splitlines()[-1])["texts_forwarded"] == 0


def test_script_empty_input_and_bad_line(tmp_path, tiny_model_dir):
    empty, out = tmp_path / "empty.jsonl", tmp_path / "hard.jsonl"
    empty.write_text("")
    done = run_script("--input_jsonl", str(empty), "--output_jsonl", str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 0 and out.read_text() == ""
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"tuples": 0, "hard": 0}
    bad = tmp_path / "bad.jsonl"
    lines = hand_lines()
    del lines[1]["d_pos"]
    write_jsonl(bad, lines)
    done = run_script("--input_jsonl", str(bad), "--output_jsonl", str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 2 and f"{bad}:2" in done.stderr and "d_pos" in done.stderr
    assert "Traceback" not in done.stderr
