#!/usr/bin/env python
"""BIOSSES sentence similarity (paper Table 1): Spearman rho between the gold scores (mean of 5 annotators,
0-4) and the cosine of the two sentences' embeddings, plus Pearson. Both sentences are encoded in query format
with the BIOSSES instruction (BMRetriever's choice; --sts_format passage for the passage format). Reads the
shipped data/biosses/biosses.jsonl unless --data gives another JSONL/TSV file.
Prints one JSON line and writes it to --output. (eval_task.py with --task sts.)
Example: python eval/eval_biosses.py --model minilm
"""

from __future__ import annotations



from repair.evaluation.cli import main as eval_task_main
from repair.cli import run_script


def main(argv=None) -> dict:
    return eval_task_main(argv, task="sts", description=__doc__)


if __name__ == "__main__":
    run_script(main)
