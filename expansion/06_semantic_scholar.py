#!/usr/bin/env python
"""Verify generated queries through the Semantic Scholar Graph API (or, with --mode concept, search concept
strings as the original did).

Example (the README command, original behaviour):
  python expansion/06_semantic_scholar.py --mode concept --concept_txt final_terms.bottom_30pct.txt \\
      --key_file semantic_api_keys.txt --out_jsonl expansion.jsonl --target_k 20 --resume
Example (the paper):
  python expansion/06_semantic_scholar.py --generated_jsonl generated.jsonl --out_jsonl expansion.jsonl --resume
"""

from __future__ import annotations



from repair.cli import run_script
from repair.expansion.cli import verification_main

if __name__ == "__main__":
    run_script(lambda argv: verification_main("semantic_scholar", argv))
