#!/usr/bin/env python
"""RELISH-style graded paper recommendation (paper Table 2): MAP and nDCG (headline), uncut, with graded
0-2 qrels (nDCG gains = grades; MAP counts grade >= --relevance_level as relevant). By default each query
ranks its own judged candidate pool (--candidates judged; the paper gives no depth, see docs/evaluation.md);
--candidates corpus searches the whole corpus (top 1000) instead. Fractions unless --percent.
Prints one JSON line and writes it to --output. (eval_task.py with --task relish.)
Example: python eval/eval_relish.py --model minilm --data /data/relish
"""

from __future__ import annotations



from repair.evaluation.cli import main as eval_task_main
from repair.cli import run_script


def main(argv=None) -> dict:
    return eval_task_main(argv, task="relish", description=__doc__)


if __name__ == "__main__":
    run_script(main)
