#!/usr/bin/env python
"""QA retrieval evaluation (iCliniq, ChemLit-QA mat/biomed; paper Table 2): Recall@5, Recall@20 and
nDCG@20 (headline) of a model (+ LoRA adapter) on a BEIR-format folder whose queries are questions and whose
relevant documents are their answers/contexts. Fractions unless --percent (the paper prints x100).
Prints one JSON line and writes it to --output. (eval_task.py with --task qa.)
Example: python eval/eval_qa.py --model smollm2-135m --adapter runs/iter2/adapter --data /data/icliniq
"""

from __future__ import annotations



from repair.evaluation.cli import main as eval_task_main
from repair.cli import run_script


def main(argv=None) -> dict:
    return eval_task_main(argv, task="qa", description=__doc__)


if __name__ == "__main__":
    run_script(main)
