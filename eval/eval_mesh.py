#!/usr/bin/env python
"""MeSH entity linking (paper Table 2): Recall@1, Recall@5 and MRR@5 (headline) of a model (+ LoRA adapter).

BEIR-format folder: queries = concept names, corpus = concept descriptions, qrels/test.tsv query -> concept.
Follows REPAIR's eval/eval_mesh.py (instruction "Given a concept, retrieve passages for its definition.",
documents = the text field only, MRR@5 = 1/rank of the first relevant hit in the top 5) and fixes its bugs:
the model has a default, the data path must be given (a clear message says where MeSH comes from when it is
missing), the result goes to --output (not next to the script) and to stdout. Fractions unless --percent
(the original printed x100). Passing an adapter folder as --model_path works as it did in the original.
Example: python eval/eval_mesh.py --model_path smollm2-135m --data_path /data/mesh_ir --output mesh.json --percent
"""

from __future__ import annotations



from repair.evaluation.cli import main as eval_task_main
from repair.cli import run_script


def main(argv=None) -> dict:
    return eval_task_main(argv, task="mesh", description=__doc__)


if __name__ == "__main__":
    run_script(main)
