"""eval/eval_beir.py end to end on a tiny model and a tiny BEIR folder, checked by an independent nDCG."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from repair.encoding import Retriever
from repair.evaluation.instructions import instruction_for

ROOT = Path(__file__).resolve().parents[1]
DOCS = {
    "d1": ("Graphene mobility", "Electron mobility in monolayer graphene under pressure."),
    "d2": ("Ti6Al4V fatigue", "Fatigue of laser-melted Ti6Al4V implants."),
    "d3": ("BCL-2", "Venetoclax inhibits BCL-2 in leukemia."),
    "d4": ("Cyclin D1", "BCL1 rearrangement marks mantle cell lymphoma."),
    "d5": ("Perovskites", "CH3NH3PbI3 films degrade in humid air."),
    "q2": ("Same id as a query", "This document shares its id with query q2 and must never count."),
}
QUERIES = {"q1": "Which protein does venetoclax inhibit?", "q2": "graphene electron mobility",
           "q3": "humidity and perovskite stability"}
QRELS = [("q1", "d3", 1), ("q2", "d1", 1), ("q2", "q2", 1), ("q3", "d5", 2), ("q3", "d2", 1)]


def make_beir(folder: Path) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": k, "title": t, "text": x}) + "\n" for k, (t, x) in DOCS.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in QUERIES.items()))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{s}\n" for q, d, s in QRELS))
    return folder


def ndcg_at_10(ranked: list[str], rels: dict[str, int]) -> float:
    """trec_eval's ndcg_cut (what BEIR reports): the gain is the graded relevance itself."""
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(rels.values(), reverse=True)
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal[:10]))
    return dcg / idcg if idcg else 0.0


def test_eval_beir_cli_matches_independent_ndcg(tiny_model_dir, tmp_path):
    data = make_beir(tmp_path / "scifact")
    out = tmp_path / "metrics.json"
    cmd = [sys.executable, str(ROOT / "eval" / "eval_beir.py"), "--model", str(tiny_model_dir), "--data", str(data),
           "--split", "test", "--max_length", "64", "--cache_dir", str(tmp_path / "cache"), "--output", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    written = json.loads(out.read_text())
    # the file is the printed line plus the per-query nDCG@10 (for paired tests), which stdout leaves out
    per_query = written.pop("per_query")["ndcg@10"]
    assert written == printed and "per_query" not in printed
    assert printed["instruction"] == instruction_for("scifact")
    for key in ("ndcg@10", "map@10", "recall@10", "recall@100", "mrr@10"):
        assert 0.0 <= printed[key] <= 1.0

    # independent: same vectors, numpy ranking, hand nDCG (trec_eval's linear gain), own id removed
    r = Retriever.load(str(tiny_model_dir), device="cpu", max_length=64)
    ids = list(DOCS)
    d = r.encode_passages([(t + " " + x).strip() for t, x in DOCS.values()]).numpy()
    q = r.encode_queries(list(QUERIES.values()), instruction=instruction_for("scifact")).numpy()
    qrels: dict[str, dict[str, int]] = {}
    for qid, did, s in QRELS:
        qrels.setdefault(qid, {})[did] = s
    expected = []
    for row, qid in enumerate(QUERIES):
        order = [ids[j] for j in np.lexsort((np.arange(len(ids)), -(d @ q[row])))]
        expected.append(ndcg_at_10([x for x in order if x != qid], qrels[qid]))
    assert printed["ndcg@10"] == pytest.approx(float(np.mean(expected)), abs=1e-6)
    assert [per_query[qid] for qid in QUERIES] == pytest.approx(expected, abs=1e-6)

    # a second run reads every vector from the cache
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert json.loads(again.stdout.strip().splitlines()[-1])["ndcg@10"] == printed["ndcg@10"]


def test_eval_beir_missing_folder_message(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "eval" / "eval_beir.py"), "--data", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and str(tmp_path / "nope") in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr
