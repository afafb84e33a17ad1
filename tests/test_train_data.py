"""Training data: T0 + triplet files, hard-negative selection, sources, duplicate masking, batch layout."""

from __future__ import annotations

import json

import pytest
import torch

from repair.data import DataError
from repair.training.data import (TrainExample, build_layout, epoch_order, load_training_data, split_counts,
                               stats_table)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _triplet(q, pos, negs, sources=None, d_neg=None):
    row = {"query": q, "pos_document": pos, "hard_negatives": negs, "hard_negative_scores": [0.5] * len(negs),
           "d_neg": d_neg if d_neg is not None else (negs[0] if negs else None), "pos_rank": 1, "id": q,
           "concepts": []}
    if sources is not None:
        row["negative_sources"] = sources
    return row


@pytest.fixture()
def files(tmp_path):
    t0 = _write_jsonl(tmp_path / "t0.jsonl", [{"query": "q1", "positive": "p1"}, {"query": "q2", "positive": "p2"},
                                             {"query": "", "positive": "p3"}])
    trip = _write_jsonl(tmp_path / "final_train_data.bottom_30pct.jsonl", [
        _triplet("q1", "p1b", ["n1", "n2", "g1"], ["mined", "mined", "generated"]),
        _triplet("q4", "p4", ["p4", "n4"]),  # its first hard negative is its own positive: dropped
        _triplet("q5", "p5", []),
    ])
    return t0, trip


def test_num_hard_negatives_and_sources(files):
    t0, trip = files
    one = load_training_data([t0], [trip], num_hard_negatives=1)
    assert [e.query for e in one.examples] == ["q1", "q2", "q1", "q4", "q5"]
    assert one.examples[2].negatives == ("n1",) and one.examples[2].negative_sources == ("mined",)
    assert one.examples[3].negatives == ()  # d_neg == its positive -> not a negative
    assert one.sources[0].dropped_empty == 1 and one.sources[1].negatives_dropped_as_positive == 1
    every = load_training_data([t0], [trip], num_hard_negatives=-1)
    assert every.examples[2].negatives == ("n1", "n2", "g1")
    assert every.examples[2].negative_sources == ("mined", "mined", "generated")
    assert every.examples[3].negatives == ("n4",)
    two = load_training_data([], [trip], num_hard_negatives=2)
    assert two.examples[0].negatives == ("n1", "n2")
    none = load_training_data([], [trip], num_hard_negatives=0)
    assert all(not e.negatives for e in none.examples)
    # q1 is answered by p1 (T0) and p1b (triplets): both are its positives
    assert one.positives_of["q1"] == {"p1", "p1b"}
    table = stats_table(one)
    assert "total" in table and "generated" in table


def test_glob_and_bad_rows_name_file_line_field(tmp_path, files):
    _, trip = files
    data = load_training_data([], [str(tmp_path / "final_train_data*.jsonl")])
    assert len(data) == 3
    with pytest.raises(FileNotFoundError, match="no triplet file matches"):
        load_training_data([], [str(tmp_path / "nothing*.jsonl")])
    bad = _write_jsonl(tmp_path / "bad.jsonl", [_triplet("a", "b", ["c"]), {"query": "x", "hard_negatives": []}])
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field 'pos_document'"):
        load_training_data([], [bad])
    bad2 = _write_jsonl(tmp_path / "bad2.jsonl", [_triplet("a", "b", ["c", "d"], ["mined"])])
    with pytest.raises(DataError, match=r"bad2.jsonl:1: field 'negative_sources' has 1 entries"):
        load_training_data([], [bad2])
    bad3 = _write_jsonl(tmp_path / "bad3.jsonl", [_triplet("a", "b", ["c"], ["llm"])])
    with pytest.raises(DataError, match=r"bad3.jsonl:1: field 'negative_sources' holds 'llm'"):
        load_training_data([], [bad3])
    bad4 = _write_jsonl(tmp_path / "bad4.jsonl", [{"query": "a", "pos_document": "b", "hard_negatives": "c d"}])
    with pytest.raises(DataError, match=r"bad4.jsonl:1: field 'hard_negatives' must be list\[str\]"):
        load_training_data([], [bad4])


def test_layout_masks_duplicates_of_the_positive_only():
    examples = [TrainExample("qa", "P", ("N1",), ("mined",)),
                TrainExample("qb", "P", (), ()),  # same passage as qa: a positive of both
                TrainExample("qa", "P2", ("N1",), ("generated",)),  # qa's second positive
                TrainExample("qc", "R", ("P",), ("mined",))]  # qc's hard negative is qa's positive: fine for qc
    positives_of = {"qa": frozenset({"P", "P2"}), "qb": frozenset({"P"}), "qc": frozenset({"R"})}
    layout = build_layout(examples, positives_of, world=1)
    assert layout.documents == ["P", "P", "P2", "R", "N1", "N1", "P"]
    assert layout.targets.pos_index.tolist() == [0, 1, 2, 3]
    m = layout.targets.mask
    # qa (row 0): P at 1 and 6 and P2 at 2 are its positives -> masked; its own positive (0) is not
    assert m[0].tolist() == [False, True, True, False, False, False, True]
    assert m[1].tolist() == [True, False, False, False, False, False, True]
    assert m[2].tolist() == [True, True, False, False, False, False, True]
    assert m[3].tolist() == [False] * 7
    assert layout.targets.neg_owner.tolist() == [0, 2, 3]
    assert layout.targets.neg_index.tolist() == [4, 5, 6]
    assert layout.targets.neg_generated.tolist() == [False, True, False]


def test_layout_split_across_ranks_keeps_global_targets():
    examples = [TrainExample(f"q{i}", f"p{i}", tuple(f"n{i}.{k}" for k in range(i % 3)),
                             tuple("mined" for _ in range(i % 3))) for i in range(5)]
    positives_of = {e.query: frozenset({e.positive}) for e in examples}
    one, two = build_layout(examples, positives_of, 1), build_layout(examples, positives_of, 2)
    assert split_counts(5, 2) == [3, 2]
    assert [s.stop - s.start for s in two.q_slices] == [3, 2]
    # rank 0: p0 p1 p2 + negatives of q1 (1) and q2 (2); rank 1: p3 p4 + negatives of q3 (0) and q4 (1)
    assert two.documents == ["p0", "p1", "p2", "n1.0", "n2.0", "n2.1", "p3", "p4", "n4.0"]
    assert two.targets.pos_index.tolist() == [0, 1, 2, 6, 7]
    # the same (query, document) pairs are positives/negatives in both layouts
    for lay in (one, two):
        pairs = {(lay.queries[o], lay.documents[j]) for o, j in zip(lay.targets.neg_owner.tolist(),
                                                                     lay.targets.neg_index.tolist())}
        assert pairs == {("q1", "n1.0"), ("q2", "n2.0"), ("q2", "n2.1"), ("q4", "n4.0")}


def test_epoch_order_is_a_function_of_seed_and_epoch():
    a, b = epoch_order(50, 7, 0), epoch_order(50, 7, 0)
    assert a.tolist() == b.tolist() and sorted(a.tolist()) == list(range(50))
    assert epoch_order(50, 7, 1).tolist() != a.tolist() and epoch_order(50, 8, 0).tolist() != a.tolist()
    assert torch.tensor(a).unique().numel() == 50
