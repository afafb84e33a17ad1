"""Cutting a smaller BEIR folder out of a dataset's train and test splits (the demo slices, study subsets).

Reading BEIR folders is :mod:`repair.data`'s job; this module derives new ones. It is apart because it is
dataset preparation run once before any stage (``data/make_demo.py``, the benchmarks), not a file the stages
exchange: a seeded, reproducible choice of claims whose corpus still answers every chosen claim.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from repair.data import BeirData, write_jsonl, write_lines


def _id_order(doc_or_query_id: str) -> tuple[int, str]:
    """Numeric ids in numeric order (SciFact's), any other id by length then text: a stable, seedable order."""
    return len(doc_or_query_id), doc_or_query_id


def write_beir_slice(train: BeirData, test: BeirData, out: str | os.PathLike, n_train: int, n_test: int, n_docs: int,
                     seed: int) -> dict:
    """Write a smaller BEIR folder cut from one dataset's train and test splits (the demo slices, study subsets).

    A seeded choice of ``n_train`` train claims (T0 keeps their first positive only) and ``n_test`` test claims
    (all their positives); the corpus is every chosen positive plus seeded random distractors up to ``n_docs``, so
    each claim can be answered inside the slice and the corpus doubles as the local literature source.
    Returns the counts written.
    """
    out = Path(out)
    rng = random.Random(seed)
    train_q = sorted(train.qrels)
    test_q = sorted(test.qrels)
    rng.shuffle(train_q)
    rng.shuffle(test_q)
    chosen_train = sorted(train_q[:n_train], key=_id_order)
    chosen_test = sorted(test_q[:n_test], key=_id_order)
    docs: list[str] = []
    for qid in chosen_train:
        docs.append(next(iter(train.qrels[qid])))  # T0: the first positive only
    for qid in chosen_test:
        docs.extend(test.qrels[qid])
    docs = list(dict.fromkeys(docs))
    pool = [d for d in sorted(train.corpus, key=_id_order) if d not in set(docs)]
    rng.shuffle(pool)
    docs += pool[: max(0, n_docs - len(docs))]
    docs = sorted(set(docs), key=_id_order)
    # the project's atomic writers: an interrupted cut never leaves a half slice that a later run would trust
    write_jsonl(out / "corpus.jsonl", ({"_id": d, "title": train.corpus[d]["title"], "text": train.corpus[d]["text"],
                                        "metadata": {}} for d in docs))
    write_jsonl(out / "queries.jsonl",
                [{"_id": q, "text": train.queries[q], "metadata": {}} for q in chosen_train]
                + [{"_id": q, "text": test.queries[q], "metadata": {}} for q in chosen_test])
    header = "query-id\tcorpus-id\tscore"
    write_lines(out / "qrels" / "train.tsv", [header] + [f"{q}\t{next(iter(train.qrels[q]))}\t1" for q in chosen_train])
    write_lines(out / "qrels" / "test.tsv",
                [header] + [f"{q}\t{d}\t{s}" for q in chosen_test for d, s in test.qrels[q].items()])
    return {"train_claims": len(chosen_train), "test_claims": len(chosen_test), "corpus": len(docs)}
