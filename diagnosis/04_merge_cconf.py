#!/usr/bin/env python
"""Stage I step 4: the distractor concept set C_conf = C_intra (PathA) ∪ C_inter (PathB), case-insensitive.

Reads cintra.bottom_{pp}pct.jsonl (PathA) and pathB_finch_train.components.bottom_{pp}pct.json (PathB) after
checking both come from the same diagnosis run and percentile, and writes into --out_dir (default
<dia_out_dir>/PathAB_terms):
  final_terms.bottom_{pp}pct.txt    one concept per line (sorted case-insensitively): expansion's input
  final_terms.bottom_{pp}pct.json   {pct, counts: {A_raw, B_raw, A_unique, B_unique, overlap, union_total},
                                     terms: [{term, from: ["A","B"], A: {...}, B: {...}}]}

Example: python diagnosis/04_merge_cconf.py --pct 30 --dia_out_dir runs/iter1
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


from repair.diagnosis.margins import MERGE_DIR, PATHA_DIR, PATHB_DIR
from repair.cli import percentile, positive_int, run_script
from repair.diagnosis.stages import print_summary, run_merge
from repair.runtime import setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pct", type=percentile, default=30, help="percentile to merge (default: %(default)s)")
    p.add_argument("--dia_out_dir", default=os.environ.get("DIA_OUT_DIR"),
                   help="folder of 01's outputs (default: $DIA_OUT_DIR)")
    p.add_argument("--patha_out_dir", default="", help=f"PathA folder (default: <dia_out_dir>/{PATHA_DIR})")
    p.add_argument("--pathb_out_dir", default="", help=f"PathB folder (default: <dia_out_dir>/{PATHB_DIR})")
    p.add_argument("--out_dir", default="", help=f"output folder (default: <dia_out_dir>/{MERGE_DIR})")
    p.add_argument("--top_a", type=positive_int, default=None,
                   help="use only the first N C_intra lines (default: all)")
    p.add_argument("--top_comp", type=positive_int, default=None,
                   help="use only the first N FINCH components, lowest average margin first (default: all)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.dia_out_dir:
        p.error("--dia_out_dir is required (or set $DIA_OUT_DIR)")
    d = Path(args.dia_out_dir)
    args.patha_out_dir = args.patha_out_dir or str(d / PATHA_DIR)
    args.pathb_out_dir = args.pathb_out_dir or str(d / PATHB_DIR)
    args.out_dir = args.out_dir or str(d / MERGE_DIR)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    summary = run_merge(args.dia_out_dir, args.pct, args.patha_out_dir, args.pathb_out_dir, args.out_dir,
                        top_a=args.top_a, top_comp=args.top_comp)
    print_summary(summary)
    return summary


if __name__ == "__main__":
    run_script(main)
