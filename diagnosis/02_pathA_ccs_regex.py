#!/usr/bin/env python
"""Stage I step 2 (PathA): Concept Confusion Scores with the rule-based extractor -> C_intra.

For the confused queries of --pct (from 01), concepts are extracted from D+ (their positives) and from D-(q)
(the first --top_neg_n hits of q that are not positives). CCS(e) = df(e; D-) / (df(e; D+) + eps) (Eq. 5);
C_intra(q) = the concept of D-(q) with the highest CCS. The extractor finds chemical formulas (NaCl, Fe2O3,
CH3NH3PbI3), acronyms, hyphenated compounds, parenthesised names and two-letter element symbols.

Writes into --out_dir (default <dia_out_dir>/pathA_ccs_train):
  pathA.entities.rank.train.bottom_{pp}pct.json     all concepts by CCS + run provenance (03/04 check it)
  pathA.entities.top200.train.bottom_{pp}pct.jsonl  the first 200 of them
  cintra.bottom_{pp}pct.jsonl                       {query_i, query, concept, CCS, freq_neg, freq_pos}
  per_query_neg_concepts.bottom_{pp}pct.json        {"<i>": [concepts of D-(q_i)]}  (PathB's input)

Example: python diagnosis/02_pathA_ccs_regex.py --pct 30 --dia_out_dir runs/iter1 --train_pt t0.jsonl \\
           --out_dir runs/iter1/pathA_ccs_train --top_neg_n 30
"""

from __future__ import annotations

import argparse


from repair.diagnosis.concepts import RegexExtractor
from repair.diagnosis.margins import PATHA_DIR
from repair.cli import positive_int, run_script
from repair.diagnosis.stages import add_pathA_args, check_pathA_args, print_summary, run_pathA
from repair.runtime import setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pathA_args(p, PATHA_DIR)
    p.add_argument("--max_entities_per_doc", type=positive_int, default=200,
                   help="keep the first N concepts of a document, in text order (default: %(default)s)")
    args = p.parse_args(argv)
    check_pathA_args(p, args, PATHA_DIR)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    summary = run_pathA(args.dia_out_dir, args.pct, args.out_dir, RegexExtractor(args.max_entities_per_doc),
                        train_pt=args.train_pt, split=args.split, top_neg_n=args.top_neg_n, eps=args.eps,
                        df=args.df, doc_text=args.doc_text, top_export=args.top_export)
    print_summary(summary)
    return summary


if __name__ == "__main__":
    run_script(main)
