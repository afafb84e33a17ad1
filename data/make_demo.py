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
from pathlib import Path


from repair.evaluation.beir_slice import write_beir_slice
from repair.data import load_beir

SLICES = {  # name: (train claims, test claims, corpus size)
    "scifact-demo": (48, 30, 300),
    "scifact-tiny": (16, 10, 80),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scifact", required=True, help="BEIR SciFact folder (corpus, queries, qrels/train+test)")
    p.add_argument("--out", default="data/demo", help="output folder (default: %(default)s)")
    p.add_argument("--seed", type=int, default=13, help="sampling seed (default: %(default)s)")
    args = p.parse_args()
    train, test = load_beir(args.scifact, "train"), load_beir(args.scifact, "test")
    for name, (n_train, n_test, n_docs) in SLICES.items():
        counts = write_beir_slice(train, test, Path(args.out) / name, n_train, n_test, n_docs, args.seed)
        print(name, json.dumps(counts))


if __name__ == "__main__":
    main()
