#!/usr/bin/env python
"""Dense retrieval evaluation of a model (+ LoRA adapter) on a BEIR-format IR folder (NFCorpus, SciFact,
SciDocs, TREC-COVID): nDCG@10 (headline), MAP@10, Recall@10/100, MRR@10 over the top 1000, documents as
title + " " + text, queries with the dataset's BMRetriever instruction. Prints one JSON line and writes it to
--output. (eval_task.py with --task ir.)
Example: python eval/eval_beir.py --model minilm --data ../shared/data/scifact --split test --max_length 256
"""

from __future__ import annotations



from repair.evaluation.cli import main as eval_task_main
from repair.cli import run_script


def main(argv=None) -> dict:
    return eval_task_main(argv, task="ir", description=__doc__)


if __name__ == "__main__":
    run_script(main)
