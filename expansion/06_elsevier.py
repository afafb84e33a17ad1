#!/usr/bin/env python
"""Verify generated queries through Elsevier Scopus Search (COMPLETE view when entitled, else STANDARD +
Abstract Retrieval); --mode concept searches concept strings as the original did.

Example: ELSEVIER_API_KEY=... python expansion/06_elsevier.py --generated_jsonl generated.jsonl \\
      --out_jsonl expansion.elsevier.jsonl --target_k 15 --resume
"""

from __future__ import annotations



from repair.cli import run_script
from repair.expansion.cli import verification_main

if __name__ == "__main__":
    run_script(lambda argv: verification_main("elsevier", argv))
