#!/usr/bin/env python
"""Build the offline demo slices shipped in data/demo/ from a BEIR SciFact folder (run once by maintainers;
the committed output is what the demo reads, so users never need the full data).

Each slice is a BEIR folder: the positives of the chosen train and test claims plus seeded random
distractors form the corpus (which is also the local literature corpus that verification searches);
qrels/train.tsv is T0 (one positive per claim), qrels/test.tsv the evaluation.

    python data/make_demo.py --scifact ../shared/data/scifact --out data/demo
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repair.data import load_beir  # noqa: E402

SLICES = {  # name: (train claims, test claims, corpus size)
    "scifact-demo": (48, 30, 300),
    "scifact-tiny": (16, 10, 80),
}


def build_slice(train, test, out: Path, n_train: int, n_test: int, n_docs: int, seed: int) -> dict:
    rng = random.Random(seed)
    train_q = sorted(train.qrels)
    test_q = sorted(test.qrels)
    rng.shuffle(train_q)
    rng.shuffle(test_q)
    chosen_train = sorted(train_q[:n_train], key=int)
    chosen_test = sorted(test_q[:n_test], key=int)
    docs: list[str] = []
    for qid in chosen_train:
        docs.append(next(iter(train.qrels[qid])))  # T0: the first positive only
    for qid in chosen_test:
        docs.extend(test.qrels[qid])
    docs = list(dict.fromkeys(docs))
    pool = [d for d in sorted(train.corpus, key=int) if d not in set(docs)]
    rng.shuffle(pool)
    docs += pool[: max(0, n_docs - len(docs))]
    docs = sorted(set(docs), key=int)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps({"_id": d, "title": train.corpus[d]["title"], "text": train.corpus[d]["text"],
                                 "metadata": {}}) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for qid in chosen_train:
            fh.write(json.dumps({"_id": qid, "text": train.queries[qid], "metadata": {}}) + "\n")
        for qid in chosen_test:
            fh.write(json.dumps({"_id": qid, "text": test.queries[qid], "metadata": {}}) + "\n")
    with open(out / "qrels" / "train.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid in chosen_train:
            fh.write(f"{qid}\t{next(iter(train.qrels[qid]))}\t1\n")
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid in chosen_test:
            for d, s in test.qrels[qid].items():
                fh.write(f"{qid}\t{d}\t{s}\n")
    return {"train_claims": len(chosen_train), "test_claims": len(chosen_test), "corpus": len(docs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scifact", required=True, help="BEIR SciFact folder (corpus, queries, qrels/train+test)")
    p.add_argument("--out", default="data/demo", help="output folder (default: %(default)s)")
    p.add_argument("--seed", type=int, default=13, help="sampling seed (default: %(default)s)")
    args = p.parse_args()
    train, test = load_beir(args.scifact, "train"), load_beir(args.scifact, "test")
    for name, (n_train, n_test, n_docs) in SLICES.items():
        counts = build_slice(train, test, Path(args.out) / name, n_train, n_test, n_docs, args.seed)
        print(name, json.dumps(counts))


if __name__ == "__main__":
    main()
