#!/usr/bin/env python
"""Evaluate a model (+ LoRA adapter) on one benchmark of any task family:

  ir      BEIR IR folder (NFCorpus, SciFact, SciDocs, TREC-COVID)   nDCG@10, MAP@10, R@10/100, MRR@10
  qa      QA retrieval folder (iCliniq, ChemLit-QA)                  R@5, R@20, nDCG@20
  mesh    entity linking folder (MeSH)                               R@1, R@5, MRR@5
  relish  graded 0-2 folder (RELISH), judged candidates ranked       MAP, nDCG (uncut)
  sts     sentence-pair file (BIOSSES)                               Spearman (and Pearson) of cosine vs gold

The task is inferred from the folder name unless --task is given; the instruction comes from the dataset
name (repair/instructions.py). Metrics are fractions unless --percent (the paper's Table 2 is x100).
Prints one JSON line and writes it to --output. eval_beir.py, eval_qa.py, eval_mesh.py, eval_relish.py and
eval_biosses.py are this script with the task fixed.
Example: python eval/eval_task.py --task qa --data /data/icliniq --model minilm
"""

from __future__ import annotations

from repair.cli import run_script
from repair.evaluation_cli import main

if __name__ == "__main__":
    run_script(main)
