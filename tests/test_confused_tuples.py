"""Lever 3 of issue 16: the confused T0 queries as Stage III tuples (differentiation/06b_confused_tuples.py).

01 runs for real on a tiny random model; the tuples are checked against the confused file it wrote (candidates =
the first N non-positive hits, a second positive of the same query text never a candidate), then 07 and 08 read
them like expansion tuples and 08's top hard negative is the best-scoring candidate under the same model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from repair.diagnosis import margins as dg
from repair.diagnosis.confused_tuples import SOURCE, confused_query_tuples
from repair.data import read_jsonl, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
T0 = ROOT / "tests" / "fixtures" / "t0_materials_40.jsonl"
PCT, TOP_K, TOP_NEG_N = 40, 10, 4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(script: str, *args: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory, tiny_model_dir):
    base = tmp_path_factory.mktemp("confused_tuples")
    rows = read_jsonl(T0)
    # row 0's query a second time with row 1's passage: for query 0, passage 1 is a positive, never a negative
    rows.append({"query": rows[0]["query"], "positive": rows[1]["positive"]})
    t0 = base / "t0.jsonl"
    write_jsonl(t0, rows)
    env = {**os.environ, "REPAIR_CACHE": str(base / "cache"), "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    common = ["--model", str(tiny_model_dir), "--max_length", "64", "--batch_size", "16", "--device", "cpu"]
    dia = base / "dia"
    _run("diagnosis/01_diagnosis_margin.py", "--train_pt", str(t0), "--out_dir", str(dia), "--top_k", str(TOP_K),
         "--pct", str(PCT), *common, env=env)
    return {"base": base, "t0": t0, "rows": rows, "dia": dia, "env": env, "common": common}


def test_tuples_are_the_confused_queries_with_their_confusers(diagnosed):
    tuples, stats = confused_query_tuples(diagnosed["dia"], PCT, top_neg_n=TOP_NEG_N)
    _, cpath = dg.check_confused(diagnosed["dia"], PCT)
    records = dg.read_margin_records(cpath)
    rows = diagnosed["rows"]
    positives_of: dict[str, set[str]] = {}
    for r in rows:
        positives_of.setdefault(r["query"], set()).add(r["positive"])
    by_id = {t["id"]: t for t in tuples}
    assert stats.confused_queries == len(records) > 0
    excluded = 0
    for rec in records:
        i = rec["i"]
        query = rows[i]["query"]
        # independent: walk the top-k list, skip the row's own positive index and any known positive text
        expected = []
        for j in rec["topk_doc_indices_cos"]:
            if len(expected) == TOP_NEG_N:
                break
            if j == rec["pos_doc_index"] or j in (rec.get("positive_doc_indices") or []):
                continue
            if rows[j]["positive"] in positives_of[query]:
                excluded += 1
                continue
            expected.append(rows[j]["positive"])
        t = by_id[f"t0:{i}"]
        assert t["q_new"] == query and t["d_pos"] == rows[i]["positive"] and t["source"] == SOURCE
        assert [c["abstract"] for c in t["negative_candidates"]] == expected
        assert t["margin"] == rec["margin_cos"]
    assert stats.tuples == len(tuples) == len(records)
    assert stats.candidates_known_positive == excluded


def test_the_second_positive_of_a_query_is_never_its_candidate(diagnosed):
    tuples, _ = confused_query_tuples(diagnosed["dia"], PCT, top_neg_n=TOP_K)
    rows = diagnosed["rows"]
    for t in tuples:
        if t["q_new"] == rows[0]["query"]:
            assert rows[1]["positive"] not in {c["abstract"] for c in t["negative_candidates"]}
            assert rows[0]["positive"] not in {c["abstract"] for c in t["negative_candidates"]}


def test_07_08_take_them_like_expansion_tuples(diagnosed):
    base, env = diagnosed["base"], diagnosed["env"]
    out = base / "confused.jsonl"
    stdout = _run("differentiation/06b_confused_tuples.py", "--dia_out_dir", str(diagnosed["dia"]), "--pct",
                  str(PCT), "--top_neg_n", str(TOP_NEG_N), "--output_jsonl", str(out), env=env)
    assert stdout.strip().splitlines()[-1].startswith("06b: wrote")
    tuples = read_jsonl(out)
    emb = base / "emb"
    _run("differentiation/07_embed_candidates.py", "--input_jsonl", str(out), "--output_dir", str(emb),
         *diagnosed["common"], env=env)
    hard = base / "hard.jsonl"
    _run("differentiation/08_hard_negative_selection.py", "--input_jsonl", str(out), "--embedding_dir", str(emb),
         "--output_jsonl", str(hard), "--top_k", "2", env=env)
    selected = {r["query"]: r for r in read_jsonl(hard)}
    # under the model that diagnosed them, Eq. 7's best candidate is the first of D-(q) (01 ranked them) unless two
    # candidates tie within float noise
    for t in tuples:
        r = selected[t["q_new"]]
        assert r["hard_negatives"][0] == t["negative_candidates"][0]["abstract"] or \
            np.isclose(r["hard_negative_scores"][0], r["hard_negative_scores"][1], atol=1e-5)


def test_refuses_a_different_training_set(diagnosed, tmp_path):
    other = tmp_path / "other.jsonl"
    write_jsonl(other, diagnosed["rows"][:-1])
    with pytest.raises(dg.RunMismatchError, match="not the training set"):
        confused_query_tuples(diagnosed["dia"], PCT, train_pt=str(other))
