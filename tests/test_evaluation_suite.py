"""Eval-suite metrics on hand-made cases whose expected values are computed by hand (in the comments),
driven through the library paths the scripts use (fixtures in tests/fixtures/eval/)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from repair.data import DataError, load_beir
from repair.evaluation.benchmarks import DataNotFound, DatasetSpec, check_dataset, infer_task, parse_dataset_spec
from repair.evaluation.evaluate import PROFILES, evaluate_dataset, load_sts_pairs, pair_cosines, results_table, scale_metrics
from repair.evaluation.instructions import instruction_for
from repair.metrics import evaluate_run

FIX = Path(__file__).resolve().parent / "fixtures" / "eval"


class HandEncoder:
    """Stands in for the retriever (the thing under test is the evaluation around it): returns the vector
    written by hand for each exact text and records the (kind, instruction) of every call. A text the
    evaluation should not encode (e.g. a title under text-only MeSH) raises KeyError."""

    def __init__(self, table: dict[str, list[float]]):
        self.table = table
        self.calls: list[tuple[str, str | None, int]] = []

    def encode(self, texts, kind="passage", *, instruction=None, **kw) -> torch.Tensor:
        self.calls.append((kind, instruction, len(texts)))
        return torch.tensor([self.table[t] for t in texts], dtype=torch.float32)

    def encode_queries(self, texts, instruction=None, **kw):
        return self.encode(texts, "query", instruction=instruction)

    def encode_passages(self, texts, **kw):
        return self.encode(texts, "passage")


def one_hot(i: int, n: int) -> list[float]:
    v = [0.0] * n
    v[i] = 1.0
    return v


def ranked_query(order: list[str], doc_ids: list[str]) -> list[float]:
    """A query vector whose dot product with one-hot docs ranks ``order`` first to last (no ties)."""
    w = [0.0] * len(doc_ids)
    for pos, d in enumerate(order):
        w[doc_ids.index(d)] = 1.0 - 0.1 * pos
    return w


# ---------------------------------------------------------------------------------------------- BIOSSES
def unit2(cos: float, scale: float = 1.0) -> list[float]:
    return [scale * cos, scale * math.sqrt(1.0 - cos * cos)]


def test_biosses_spearman_hand_made_five_pairs_with_a_tie():
    pairs = load_sts_pairs(FIX / "biosses-tiny.jsonl")
    assert [p.score for p in pairs] == [4.0, 3.0, 2.0, 2.0, 0.2]
    # cosines we give the pairs (sentence1 = x axis, sentence2 at the angle; scales differ on purpose)
    cos = [0.9, 0.5, 0.6, 0.1, 0.3]
    table = {}
    for p, c in zip(pairs, cos):
        table[p.sentence1] = [2.0, 0.0]
        table[p.sentence2] = unit2(c, scale=3.0)
    enc = HandEncoder(table)
    row = evaluate_dataset(enc, DatasetSpec("biosses", "sts", FIX / "biosses-tiny.jsonl"))
    # gold ranks (ties averaged): 4.0->5, 3.0->4, 2.0,2.0->2.5,2.5, 0.2->1  => [5, 4, 2.5, 2.5, 1], mean 3
    # cosine ranks: 0.9->5, 0.5->3, 0.6->4, 0.1->1, 0.3->2              => [5, 3, 4, 1, 2],     mean 3
    # deviations g [2, 1, -.5, -.5, -2], p [2, 0, 1, -2, -1]: sum gp = 4+0-.5+1+2 = 6.5,
    # sum g^2 = 9.5, sum p^2 = 10  =>  rho = 6.5 / sqrt(95) = 0.666886
    assert row["spearman"] == pytest.approx(6.5 / math.sqrt(95), abs=1e-9)
    assert row["num_pairs"] == 5 and row["task"] == "sts" and row["headline"] == "spearman"
    # pearson on the raw values, by hand: gold mean 2.24, cos mean 0.48
    g = np.array([4.0, 3.0, 2.0, 2.0, 0.2]) - 2.24
    c = np.array(cos) - 0.48
    assert row["pearson"] == pytest.approx(float((g * c).sum() / math.sqrt((g * g).sum() * (c * c).sum())), abs=1e-6)
    # both sentences in query format with the BIOSSES instruction, in one encode call
    assert enc.calls == [("query", instruction_for("biosses"), 10)]
    assert row["instruction"] == instruction_for("biosses")


def test_biosses_passage_format_uses_no_instruction_and_tsv_reads_the_same_pairs():
    jl, tsv = load_sts_pairs(FIX / "biosses-tiny.jsonl"), load_sts_pairs(FIX / "biosses-tiny.tsv")
    assert jl == tsv
    table = {t: [1.0, float(i)] for i, t in enumerate({s for p in jl for s in (p.sentence1, p.sentence2)})}
    enc = HandEncoder(table)
    row = evaluate_dataset(enc, DatasetSpec("biosses", "sts", FIX / "biosses-tiny.tsv"), sts_format="passage")
    assert enc.calls == [("passage", None, 10)] and row["instruction"] is None


def test_pair_cosines_renormalises():
    a = np.array([[3.0, 0.0], [0.0, 2.0]])
    b = np.array([[1.0, 1.0], [0.0, -5.0]])
    assert pair_cosines(a, b).tolist() == pytest.approx([1 / math.sqrt(2), -1.0])


def test_sts_reader_errors_name_file_line_and_field(tmp_path):
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"sentence1": "a", "sentence2": "b", "score": 1}\n{"sentence1": "a", "score": 2}\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:2: missing field 'sentence2'"):
        load_sts_pairs(bad)
    bad_tsv = tmp_path / "pairs.tsv"
    bad_tsv.write_text("id\tsentence1\tsentence2\tscore\n1\ta\tb\t1\n2\tc\td\thigh\n")
    with pytest.raises(DataError, match=r"pairs.tsv:3: field 'score' is not a number"):
        load_sts_pairs(bad_tsv)


# ---------------------------------------------------------------------------------------------- MeSH
def test_mesh_mrr5_recall_hand_made_case_text_only_documents():
    data = load_beir(FIX / "mesh-tiny")
    doc_ids = list(data.corpus)  # D001..D007
    n = len(doc_ids)
    # designed rank of each query's own concept: q1 -> 1, q2 -> 3, q3 -> 6 (outside the top 5), q4 -> 2, q5 -> 5
    others = {"qD001": ["D001", "D002", "D003", "D004", "D005", "D006", "D007"],
              "qD002": ["D006", "D007", "D002", "D001", "D003", "D004", "D005"],
              "qD003": ["D001", "D002", "D004", "D005", "D006", "D003", "D007"],
              "qD004": ["D007", "D004", "D001", "D002", "D003", "D005", "D006"],
              "qD005": ["D001", "D002", "D003", "D004", "D005", "D006", "D007"]}
    table = {data.corpus[d]["text"]: one_hot(i, n) for i, d in enumerate(doc_ids)}  # text only: no titles
    for qid, order in others.items():
        table[data.queries[qid]] = ranked_query(order, doc_ids)
    enc = HandEncoder(table)
    # a name with no instruction of its own: the mesh task still brings the MeSH instruction
    row = evaluate_dataset(enc, DatasetSpec("concepts", "mesh", FIX / "mesh-tiny"))
    # MRR@5 = (1/1 + 1/3 + 0 + 1/2 + 1/5) / 5 = 2.0333.../5 = 0.406667; R@1 = 1/5; R@5 = 4/5
    assert row["mrr@5"] == pytest.approx((1 + 1 / 3 + 0 + 1 / 2 + 1 / 5) / 5, abs=1e-9)
    assert row["recall@1"] == pytest.approx(0.2) and row["recall@5"] == pytest.approx(0.8)
    assert row["doc_text"] == "text" and row["headline"] == "mrr@5"
    assert ("query", "Given a concept, retrieve passages for its definition.", 5) in enc.calls
    pct = scale_metrics(row)
    assert pct["mrr@5"] == pytest.approx(40.6667, abs=1e-3) and pct["scale"] == "percent"
    assert pct["num_queries"] == row["num_queries"]  # counts are never scaled


# ---------------------------------------------------------------------------------------------- QA
def test_qa_recall5_recall20_ndcg20_hand_computed():
    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"c": 1}}
    filler = [f"x{i:02d}" for i in range(30)]
    # q1: a at rank 3, b at rank 12; q2: c at rank 25 (beyond 20)
    q1 = filler[:2] + ["a"] + filler[2:10] + ["b"] + filler[10:23]
    q2 = filler[:24] + ["c"]
    run = {q: {d: 100.0 - i for i, d in enumerate(order)} for q, order in (("q1", q1), ("q2", q2))}
    prof = PROFILES["qa"]
    m = evaluate_run(qrels, run, ndcg_at=prof.ndcg_at, map_at=prof.map_at, recall_at=prof.recall_at,
                     mrr_at=prof.mrr_at)
    assert set(m) == {"recall@5", "recall@20", "ndcg@20"}
    # q1: R@5 = 1/2, R@20 = 2/2; nDCG@20 = (1/log2(4) + 1/log2(13)) / (1 + 1/log2(3)) = 0.770238/1.630930 = 0.472269
    # q2: all 0.  Means: R@5 = 0.25, R@20 = 0.5, nDCG@20 = 0.472269/2 = 0.236135
    ndcg_q1 = (1 / math.log2(4) + 1 / math.log2(13)) / (1 + 1 / math.log2(3))
    assert m["recall@5"] == pytest.approx(0.25)
    assert m["recall@20"] == pytest.approx(0.5)
    assert m["ndcg@20"] == pytest.approx(ndcg_q1 / 2, abs=1e-9)
    assert ndcg_q1 / 2 == pytest.approx(0.236135, abs=1e-6)


# ---------------------------------------------------------------------------------------------- RELISH
def relish_encoder(data, orders: dict[str, list[str]]) -> HandEncoder:
    doc_ids = list(data.corpus)  # c1..c8
    table = {data.doc_text(d): one_hot(i, len(doc_ids)) for i, d in enumerate(doc_ids)}
    for qid, order in orders.items():
        table[data.queries[qid]] = ranked_query(order, doc_ids)
    return HandEncoder(table)


RELISH_ORDERS = {  # unjudged c8 first for r1: it must not count in judged mode
    "r1": ["c8", "c3", "c1", "c4", "c2", "c5", "c6", "c7"],
    "r2": ["c7", "c5", "c6", "c1", "c2", "c3", "c4", "c8"],
}


def test_relish_graded_map_ndcg_over_judged_pools_hand_computed():
    data = load_beir(FIX / "relish-tiny")
    row = evaluate_dataset(relish_encoder(data, RELISH_ORDERS), DatasetSpec("relish", "relish", FIX / "relish-tiny"))
    assert row["candidates"] == "judged" and row["headline"] == "ndcg" and row["num_docs"] == 7
    # r1 pool c1(2) c2(1) c3(1) c4(0) ranked c3, c1, c4, c2:
    #   AP (grade>=1 relevant: 3) = (1/1 + 2/2 + 3/4) / 3 = 0.916667
    #   DCG = 1/log2(2) + 2/log2(3) + 0 + 1/log2(5) = 2.692536;  IDCG = 2 + 1/log2(3) + 1/log2(4) = 3.130930
    # r2 pool c5(2) c6(2) c7(0) ranked c7, c5, c6:
    #   AP = (1/2 + 2/3) / 2 = 0.583333;  DCG = 2/log2(3) + 2/log2(4) = 2.261860;  IDCG = 2 + 2/log2(3) = 3.261860
    # MAP = 0.75, nDCG = (0.859980 + 0.693426) / 2 = 0.776703
    l2 = math.log2
    ndcg_r1 = (1 + 2 / l2(3) + 1 / l2(5)) / (2 + 1 / l2(3) + 1 / l2(4))
    ndcg_r2 = (2 / l2(3) + 2 / l2(4)) / (2 + 2 / l2(3))
    assert row["map"] == pytest.approx(0.75, abs=1e-9)
    assert row["ndcg"] == pytest.approx((ndcg_r1 + ndcg_r2) / 2, abs=1e-9)
    assert row["ndcg"] == pytest.approx(0.776703, abs=1e-6)


def test_relish_corpus_mode_lets_unjudged_papers_in():
    data = load_beir(FIX / "relish-tiny")
    row = evaluate_dataset(relish_encoder(data, RELISH_ORDERS), DatasetSpec("relish", "relish", FIX / "relish-tiny"),
                           candidates="corpus")
    # r1 full ranking c8, c3, c1, c4, c2, ...: AP = (1/2 + 2/3 + 3/5) / 3 = 0.588889
    #   DCG = 0 + 1/log2(3) + 2/log2(4) + 0 + 1/log2(6) = 2.017783 -> nDCG = 2.017783 / 3.130930
    # r2 unchanged (c7, c5, c6 lead): AP 0.583333, nDCG as in judged mode
    l2 = math.log2
    ap_r1 = (1 / 2 + 2 / 3 + 3 / 5) / 3
    ndcg_r1 = (1 / l2(3) + 2 / l2(4) + 1 / l2(6)) / (2 + 1 / l2(3) + 1 / l2(4))
    ndcg_r2 = (2 / l2(3) + 2 / l2(4)) / (2 + 2 / l2(3))
    assert row["map"] == pytest.approx((ap_r1 + 7 / 12) / 2, abs=1e-9)
    assert row["ndcg"] == pytest.approx((ndcg_r1 + ndcg_r2) / 2, abs=1e-9)
    assert row["candidates"] == "corpus" and row["num_docs"] == 8


def test_relevance_level_two_counts_only_grade_two():
    qrels = {"q": {"a": 2, "b": 1, "c": 0}}
    run = {"q": {"c": 3.0, "b": 2.0, "a": 1.0}}
    # grade >= 2 relevant: only a, at rank 3 -> AP = 1/3; grade >= 1: b@2, a@3 -> (1/2 + 2/3)/2
    assert evaluate_run(qrels, run, ndcg_at=(), map_at=(), recall_at=(), mrr_at=(), map_full=True,
                        relevance_level=2)["map"] == pytest.approx(1 / 3)
    assert evaluate_run(qrels, run, ndcg_at=(), map_at=(), recall_at=(), mrr_at=(),
                        map_full=True)["map"] == pytest.approx(7 / 12)


def test_mrr_cut_follows_trec_eval_tie_order():
    # three docs tied: trec_eval ranks ties by doc id descending (c, b, a), so 'a' is at rank 3
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0, "c": 1.0}}
    m = evaluate_run(qrels, run, ndcg_at=(), map_at=(), recall_at=(), mrr_at=(1, 3))
    assert m["mrr@1"] == 0.0 and m["mrr@3"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------------------- IR / datasets
def test_ir_profile_keeps_beir_metrics_and_ignores_queries_outside_the_split():
    data = load_beir(FIX / "ir-tiny")
    assert set(data.queries) == {"c1", "c2", "c3"}
    doc_ids = list(data.corpus)
    table = {data.doc_text(d): one_hot(i, len(doc_ids)) for i, d in enumerate(doc_ids)}  # title + text
    orders = {"c1": ["d1", "d2", "d3", "d4", "d5", "d6"],   # rank 1
              "c2": ["d1", "d3", "d2", "d4", "d5", "d6"],   # rank 2
              "c3": ["d1", "d2", "d3", "d5", "d6", "d4"]}   # rank 6
    for q, order in orders.items():
        table[data.queries[q]] = ranked_query(order, doc_ids)
    row = evaluate_dataset(HandEncoder(table), DatasetSpec("scifact-like", "ir", FIX / "ir-tiny"))
    assert {"ndcg@10", "map@10", "recall@10", "recall@100", "mrr@10"} <= set(row)
    # MRR@10 = (1 + 1/2 + 1/6) / 3; nDCG@10 = (1 + 1/log2(3) + 1/log2(7)) / 3 (one relevant each, IDCG 1)
    assert row["mrr@10"] == pytest.approx((1 + 1 / 2 + 1 / 6) / 3)
    assert row["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(7)) / 3)
    assert row["doc_text"] == "title_text" and row["top_k"] == 1000
    # the per-query values the mean is made of (what a paired comparison of two models reads)
    assert row["per_query"]["ndcg@10"] == pytest.approx({"c1": 1.0, "c2": 1 / math.log2(3), "c3": 1 / math.log2(7)})


@pytest.mark.parametrize("text,name,task", [
    ("/d/nfcorpus", "nfcorpus", "ir"), ("/d/BIOSSES/biosses.jsonl", "biosses", "sts"),
    ("/d/mesh_ir", "mesh_ir", "mesh"),
    ("/d/ChemLit-QA_mat", "ChemLit-QA_mat", "qa"), ("/d/icliniq/", "icliniq", "qa"), ("/d/RELISH", "RELISH", "relish"),
    ("qa:/d/somewhere", "somewhere", "qa"), ("myset:relish:/d/x", "myset", "relish"),
    ("trec-covid:ir:/d/tc", "trec-covid", "ir"),
])
def test_parse_dataset_spec(text, name, task):
    spec = parse_dataset_spec(text)
    assert (spec.name, spec.task) == (name, task)
    assert infer_task("refreshing") == "ir"  # a token must start with the hint, not merely contain it


def test_unknown_task_in_a_spec_is_named_not_the_folder(tmp_path):
    """``scifact:irr:PATH`` was read as a folder named 'scifact:irr:PATH' and reported as not found."""
    with pytest.raises(ValueError) as err:
        parse_dataset_spec(f"scifact:irr:{tmp_path}")
    assert str(err.value) == (f"dataset 'scifact:irr:{tmp_path}': unknown task 'irr' in NAME:TASK:PATH "
                              f"(expected one of ir, qa, mesh, relish, sts)")
    with pytest.raises(ValueError, match="unknown task 'IR' in TASK:PATH"):
        parse_dataset_spec(f"IR:{tmp_path}")
    odd = tmp_path / "odd:name"  # an existing path with a colon is still a path
    odd.mkdir()
    assert parse_dataset_spec(str(odd)).path == odd
    assert parse_dataset_spec(str(tmp_path / "x:y")).path == tmp_path / "x:y"  # a path-like field is no task


def test_missing_data_messages_name_the_path_and_the_source(tmp_path):
    with pytest.raises(DataNotFound) as err:
        check_dataset(parse_dataset_spec(str(tmp_path / "mesh_ir")))
    msg = str(err.value)
    assert str(tmp_path / "mesh_ir") in msg and "nlm.nih.gov" in msg and "qrels/<split>.tsv" in msg
    (tmp_path / "nfcorpus").mkdir()
    (tmp_path / "nfcorpus" / "corpus.jsonl").write_text("")
    with pytest.raises(DataNotFound, match=r"queries\.jsonl\[\.gz\]: not found .*nfcorpus\.zip"):
        check_dataset(parse_dataset_spec(str(tmp_path / "nfcorpus")))
    with pytest.raises(DataNotFound, match="qrels/dev.tsv"):
        check_dataset(DatasetSpec("mesh", "mesh", FIX / "mesh-tiny"), split="dev")


def test_results_table_lists_every_dataset_with_its_headline():
    rows = [{"dataset": "biosses", "task": "sts", "headline": "spearman", "spearman": 0.8125, "pearson": 0.84,
             "num_pairs": 100},
            {"dataset": "mesh", "task": "mesh", "headline": "mrr@5", "mrr@5": 0.4, "recall@1": 0.2,
             "recall@5": 0.8, "num_queries": 5}]
    table = results_table(rows).splitlines()
    assert table[0].split() == ["dataset", "task", "n", "headline", "value", "metrics"]
    assert table[2].split()[:5] == ["biosses", "sts", "100", "spearman", "0.8125"]
    assert "recall@1=0.2000" in table[3] and table[3].split()[4] == "0.4000"
