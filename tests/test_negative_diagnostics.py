"""Negative diagnostics (repair/differentiation/causalneg/diagnostics.py and dynamics.py, bench/negative_diagnostics.py) on
constructed data whose answers are known by construction: similarity-range overlap, histogram overlap,
intra-negative diversity, template ratio, HDBSCAN pure-cluster ratio, training-log dynamics, and the exact split of
the InfoNCE gradient by source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from repair.encoding import Retriever
from repair.differentiation.causalneg.diagnostics import (EmbeddedSet, NegativeSet, diagnose, diagnostics_table, histogram_overlap,
                                          intra_diversity, negative_group, pure_cluster_ratios, range_overlap,
                                          read_negative_sets, template_ratio)
from repair.training.causalneg_dynamics import ProbeExample, gradient_probe, probe_examples, probe_gradients, weight_dynamics

ROOT = Path(__file__).resolve().parents[1]
ONE_THREAD_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_range_overlap_known_intervals():
    group = np.linspace(0.5, 0.7, 101)
    mined = np.linspace(0.3, 0.6, 101)
    assert range_overlap(group, mined, 0, 100) == pytest.approx(0.5)           # [0.5,0.7] vs [0.3,0.6]
    # P5-P95: [0.51, 0.69] vs [0.315, 0.585] -> (0.585 - 0.51) / (0.69 - 0.51)
    assert range_overlap(group, mined) == pytest.approx(0.075 / 0.18)
    assert range_overlap(mined, mined) == pytest.approx(1.0)
    assert range_overlap(np.full(5, 0.4), mined) == 1.0 and range_overlap(np.full(5, 0.9), mined) == 0.0
    assert range_overlap(np.linspace(0.8, 0.9, 11), mined) == 0.0


def test_histogram_overlap_known_cases():
    a = np.array([0.0, 0.1, 0.2, 0.3])
    assert histogram_overlap(a, a) == pytest.approx(1.0)
    assert histogram_overlap(np.array([0.0, 0.01]), np.array([0.99, 1.0]), bins=10) == 0.0
    # two equal bins over [0, 1]: a has 2 of 4 in the low bin, b has all in the low bin -> min(.5,1)+min(.5,0)
    assert histogram_overlap(np.array([0.0, 0.1, 0.9, 1.0]), np.array([0.0, 0.2, 0.3, 0.4]), bins=2) == 0.5


def test_intra_diversity_hand_computed():
    e1, e2, e3 = np.eye(3)
    d = np.stack([e1, e2, e1, e1, e3])
    owner = np.array([0, 0, 1, 1, 2])  # query 0: orthogonal pair (1.0); query 1: identical pair (0.0); 2: alone
    assert intra_diversity(d, owner) == pytest.approx(0.5)
    v = np.stack([e1, e2, (e1 + e2) / np.sqrt(2)])
    # pairwise cos: 0, 1/sqrt2, 1/sqrt2 -> mean distance 1 - sqrt2/3
    assert intra_diversity(v, np.zeros(3, int)) == pytest.approx(1 - np.sqrt(2) / 3)


def test_template_ratio_counts_openings_shared_across_queries():
    texts = ["This study shows that X binds Y in mice.", "This study shows that Z fails.",
             "This study shows that W works.", "Unique opening for this one here.",
             "Same start within one query only.", "Same start within one query again."]
    owner = [0, 1, 0, 2, 3, 3]
    assert template_ratio(texts, owner) == pytest.approx(3 / 6)
    assert template_ratio(texts, owner, n_words=5) == 0.0  # the 5th words differ (X / Z / W)
    assert template_ratio(["short", "short"], [0, 1]) == 0.0
    # one corpus document mined for two queries is not a template
    same = "Clathrin is required for the function of the mitotic spindle."
    assert template_ratio([same, same, "Clathrin is required for mitosis in yeast cells."], [0, 1, 2]) == 1.0
    assert template_ratio([same, same], [0, 1]) == 0.0


def test_pure_cluster_ratios_from_labels():
    labels = np.array([0, 0, 0, 1, 1, -1, 2, 2])
    types = np.array(["query", "mined", "vanilla", "vanilla", "vanilla", "vanilla", "mined", "mined"])
    assert pure_cluster_ratios(labels, types) == {"query": 0.0, "mined": pytest.approx(2 / 3),
                                                  "vanilla": pytest.approx(2 / 4)}


def _constructed(seed: int = 0) -> EmbeddedSet:
    """Blob A (direction e0): queries, positives, mined, every cot negative and half of the vanilla ones; blob B
    (direction e5, far away): only vanilla negatives. So vanilla's pure-cluster ratio is 0.5 and cot's is 0."""
    rng = np.random.default_rng(seed)
    dim, n_q = 16, 24

    def blob(center: int, n: int) -> np.ndarray:
        x = np.zeros((n, dim))
        x[:, center] = 1.0
        x[:, 8:] += rng.normal(0, 0.08, (n, 8))
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    q, pos = blob(0, n_q), blob(0, n_q)
    mined, cot = blob(0, 3 * n_q), blob(0, n_q)
    van = np.concatenate([blob(0, n_q // 2), blob(5, n_q // 2)])
    data = NegativeSet(queries=[f"q{i}" for i in range(n_q)], positives=[f"p{i}" for i in range(n_q)])
    neg = []
    for group, vecs, per in (("mined", mined, 3), ("vanilla", van, 1), ("cot", cot, 1)):
        for j, v in enumerate(vecs):
            owner = j // per if group == "mined" else j
            data.neg_texts.append(f"{group} text number {j} for query {owner}")
            data.neg_owner.append(owner)
            data.neg_group.append(group)
            neg.append(v)
    return EmbeddedSet(data, q, pos, np.stack(neg))


def test_diagnose_pure_clusters_and_similarities_on_constructed_embeddings():
    emb = _constructed()
    res = diagnose(emb, min_cluster_size=5)
    rows = {r["group"]: r for r in res["rows"]}
    assert list(rows) == ["mined", "vanilla", "cot"]
    assert rows["vanilla"]["pure_cluster_ratio"] == pytest.approx(0.5)
    assert rows["cot"]["pure_cluster_ratio"] == 0.0 and rows["mined"]["pure_cluster_ratio"] == 0.0
    assert rows["vanilla"]["negatives"] == 24 and rows["mined"]["negatives"] == 72 and rows["mined"]["queries"] == 24
    # mean query similarity: brute force over the owners
    for g in rows:
        idx = [i for i, x in enumerate(emb.data.neg_group) if x == g]
        brute = np.mean([float(emb.q[emb.data.neg_owner[i]] @ emb.neg[i]) for i in idx])
        assert rows[g]["mean_query_similarity"] == pytest.approx(brute)
    # blob B is orthogonal to every query: vanilla's similarities reach ~0, outside the mined range
    assert rows["vanilla"]["range_overlap_with_mined"] < 0.2 and rows["cot"]["range_overlap_with_mined"] > 0.8
    assert rows["mined"]["range_overlap_with_mined"] == pytest.approx(1.0)
    table = diagnostics_table(res["rows"])
    assert "| vanilla | 24 |" in table and "| 50.0 |" in table


def test_read_negative_sets_groups_and_dedupes_across_files(tmp_path):
    a = tmp_path / "mixture.jsonl"
    b = tmp_path / "causalneg.jsonl"
    a.write_text(json.dumps({"query": "q", "pos_document": "p", "hard_negatives": ["m1", "m2", "v1"],
                             "negative_sources": ["mined", "mined", "generated"],
                             "negative_traces": [{"method": "bm25"}, None, {"method": "vanilla"}]}) + "\n")
    b.write_text(json.dumps({"query": "q", "pos_document": "p", "hard_negatives": ["m1", "m2", "c1"],
                             "negative_sources": ["mined", "mined", "generated"],
                             "negative_traces": [{"method": "bm25"}, None, {"method": "cot"}]}) + "\n"
                 + json.dumps({"query": "q2", "pos_document": "p2", "hard_negatives": ["r1"],
                               "negative_traces": [{"method": "random"}]}) + "\n")
    s = read_negative_sets([a, b])
    assert s.queries == ["q", "q2"] and s.positives == ["p", "p2"]
    assert list(zip(s.neg_texts, s.neg_owner, s.neg_group)) == [
        ("m1", 0, "mined"), ("m2", 0, "mined"), ("v1", 0, "vanilla"), ("c1", 0, "cot"), ("r1", 1, "random")]
    assert s.groups() == ["mined", "random", "vanilla", "cot"]
    assert read_negative_sets([a, b], max_queries=1).queries == ["q"]
    assert negative_group("generated", None) == "generated"


def test_weight_dynamics_windows():
    rows = [{"step": s, "weight_mined": 0.1, "weight_generated": 0.1 / s, "sim_mined": 0.5,
             "sim_generated": None if s == 1 else 0.4} for s in range(1, 7)]
    out = weight_dynamics(rows, windows=3)
    assert [(r["step_from"], r["step_to"]) for r in out] == [(1, 2), (3, 4), (5, 6)]
    assert out[0]["weight_generated"] == pytest.approx((0.1 + 0.05) / 2)
    assert out[2]["weight_ratio"] == pytest.approx(((0.1 / 5 + 0.1 / 6) / 2) / 0.1)
    assert out[0]["sim_generated"] == pytest.approx(0.4)  # None entries are skipped


# ---------------------------------------------------------------------------------------------- gradient probe
def test_probe_gradients_split_the_infonce_gradient_exactly(tiny_model_dir):
    torch.manual_seed(0)
    r = Retriever.load(str(tiny_model_dir), device="cpu", max_length=32)
    examples = [ProbeExample("alpha beta query", "alpha beta passage", ["gamma one", "delta two", "made up"],
                             [False, False, True]),
                ProbeExample("second query text", "second positive", ["mined text", "fake text"], [False, True])]
    tau = 0.05
    g = probe_gradients(r, examples, tau)
    assert (g["n_mined"], g["n_generated"]) == (3, 2)
    # independent: the summed InfoNCE over [d+, own negatives] with autograd
    params = list(r.model.parameters())
    loss = 0
    for e in examples:
        q = r.embed(r.collate(r.tokenize(r.format([e.query], "query"))))
        d = r.embed(r.collate(r.tokenize(r.format([e.positive, *e.negatives], "passage"))))
        loss = loss + F.cross_entropy((q @ d.T) / tau, torch.tensor([0]))
    full = torch.cat([x.reshape(-1) for x in torch.autograd.grad(loss, params)])
    combined = g["pos"] + 3 * g["mined"] + 2 * g["generated"]
    assert torch.allclose(combined, full, atol=1e-4, rtol=1e-3)
    stats = gradient_probe(r, examples, tau)
    assert stats["grad_norm_ratio"] == pytest.approx(float(g["generated"].norm() / g["mined"].norm()), rel=1e-5)
    p, kind = g["p"], g["kind"]
    assert stats["weight_generated"] == pytest.approx(float(p[kind == 2].mean()))


def test_probe_examples_need_both_sources(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"query": "a", "pos_document": "pa", "hard_negatives": ["x"], "negative_sources": ["mined"]},
        {"query": "b", "pos_document": "pb", "hard_negatives": ["x", "y"], "negative_sources": ["mined", "generated"]},
        {"query": "c", "pos_document": "pc", "hard_negatives": ["z", "w"],
         "negative_sources": ["mined", "generated"]}]) + "\n")
    got = probe_examples(f, 5)
    assert [e.query for e in got] == ["b", "c"] and got[0].generated == [False, True]
    assert [e.query for e in probe_examples(f, 1)] == ["b"]


# ---------------------------------------------------------------------------------------------- the bench script
def test_bench_script_writes_table_json_and_plots(tmp_path, tiny_model_dir):
    trip = tmp_path / "mix.jsonl"
    rng = np.random.default_rng(0)
    words = "cell protein gene tumour mouse receptor kinase signal enzyme dose patient cohort".split()
    rows = []
    for i in range(12):
        sent = lambda: " ".join(rng.choice(words, 8))  # noqa: E731
        rows.append({"query": f"claim {i} {sent()}", "pos_document": sent(),
                     "hard_negatives": [sent() for _ in range(4)] + [f"In this study we show {sent()}"],
                     "negative_sources": ["mined"] * 4 + ["generated"],
                     "negative_traces": [None] * 4 + [{"method": "vanilla"}]})
    trip.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    log = tmp_path / "train_log.jsonl"
    log.write_text("\n".join(json.dumps({"step": s, "weight_mined": 0.05, "weight_generated": 0.05 / s})
                             for s in range(1, 9)) + "\n")
    out = tmp_path / "diag"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "negative_diagnostics.py"), "--triplets", str(trip),
                           "--model", str(tiny_model_dir), "--cache_dir", "none", "--out_dir", str(out),
                           "--min_cluster_size", "3", "--train_log", f"mixture={log}", "--windows", "4"],
                          capture_output=True, text=True, timeout=300, env=ONE_THREAD_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "diagnostics.json").read_text())
    assert [r["group"] for r in res["table"]] == ["mined", "vanilla"]
    assert res["table"][1]["template_pattern_ratio"] == 1.0  # every vanilla text opens "In this study we"
    assert res["dynamics"]["mixture"]["weights"][0]["weight_mined"] == pytest.approx(0.05)
    assert "| vanilla | 12 |" in (out / "diagnostics.md").read_text()
    for name in ("similarities.png", "clusters.png", "dynamics.png"):
        assert (out / name).stat().st_size > 1000


def test_negative_overlap_script_counts_shared_trained_negatives(tmp_path):
    """bench/negative_overlap.py: the trained negative is the first of hard_negatives (Stage III writes it as d_neg
    too); texts compare whitespace-normalised; only queries in both files count."""
    a, b = tmp_path / "repair.jsonl", tmp_path / "bm25.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in [
        {"query": "q1", "pos_document": "p", "hard_negatives": ["y", "x"], "d_neg": "y"},   # trained y
        {"query": "q2", "pos_document": "p", "hard_negatives": ["z  doc", "w"]},           # trained "z doc"
        {"query": "q3", "pos_document": "p", "hard_negatives": ["v"]},                     # not in B
    ]) + "\n")
    b.write_text("\n".join(json.dumps(r) for r in [
        {"query": "q1", "pos_document": "p", "hard_negatives": ["y", "x"]},
        {"query": " q2", "pos_document": "p", "hard_negatives": ["u", "z doc"]},
    ]) + "\n")
    script = Path(__file__).resolve().parents[1] / "bench" / "negative_overlap.py"
    done = subprocess.run([sys.executable, script, a, b], capture_output=True, text=True, check=True)
    counts = json.loads(done.stdout.splitlines()[0])
    assert counts == {"queries_a": 3, "queries_b": 2, "shared_queries": 2, "same_trained_negative": 1,
                      "a_trained_in_b_list": 2, "b_trained_in_a_list": 1}
    b.write_text('{"query": "q1", "pos_document": "p", "hard_negatives": "y"}\n')
    bad = subprocess.run([sys.executable, script, a, b], capture_output=True, text=True)
    assert bad.returncode == 2 and f"{b}:1" in bad.stderr and "hard_negatives" in bad.stderr
