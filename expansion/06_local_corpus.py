#!/usr/bin/env python
"""Verify generated queries against a local corpus with BM25 (no key, no network): the default source.

Example: python expansion/06_local_corpus.py --corpus ../shared/data/scifact --generated_jsonl generated.jsonl \\
      --out_jsonl expansion.jsonl --target_k 20 --resume
Count valid tuples (for the 2 x |T0| loop): python expansion/06_local_corpus.py --out_jsonl expansion.jsonl --count_only
"""

from __future__ import annotations



from repair.cli import run_script
from repair.expansion.cli import verification_main

if __name__ == "__main__":
    run_script(lambda argv: verification_main("local_corpus", argv))
