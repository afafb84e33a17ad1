#!/usr/bin/env python
"""Evaluate a model (+ LoRA adapter) on one benchmark of any task family (ir, qa, mesh, relish, sts).

The command line, with the table of tasks and their metrics, is repair/evaluation/cli.py (``--help`` prints it);
eval_beir.py, eval_qa.py, eval_mesh.py, eval_relish.py and eval_biosses.py are this script with the task fixed.
Example: python eval/eval_task.py --task qa --data /data/icliniq --model minilm
"""

from __future__ import annotations

from repair.cli import run_script
from repair.evaluation.cli import main

if __name__ == "__main__":
    run_script(main)
