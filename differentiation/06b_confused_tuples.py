#!/usr/bin/env python
"""Stage III input from Stage I (issue 16, lever 3; opt-in, driver setting CONFUSED_TUPLES=1): the confused T0
queries themselves, with the documents that confuse them as negative candidates.

For each confused query of --pct (01 output in --dia_out_dir): q_new = the T0 query, d_pos = its positive,
negative_candidates = D-(q), its first --top_neg_n non-positive hits (best first; known positives excluded).
The lines have the expansion format (06 output), so 07 -> 08 -> 09 treat them like verified tuples: Eq. 7 picks
the model-aware hard negative, 08's --fn_margin/--fn_pct guard against false negatives, Eq. 6 keeps consistent
ones. Pass this file to 07/08 next to the expansion JSONL.

Example:
  python differentiation/06b_confused_tuples.py --dia_out_dir runs/demo/iter1/diagnosis --pct 30 \\
      --output_jsonl runs/demo/iter1/expansion/confused_tuples.bottom_30pct.jsonl
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path


from repair.cli import percentile, positive_int, run_script
from repair.diagnosis.confused_tuples import confused_query_tuples
from repair.data import write_json, write_jsonl
from repair.runtime import setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dia_out_dir", required=True, help="01's output folder (confused queries + diagnosis meta)")
    p.add_argument("--pct", type=percentile, default=30,
                   help="percentile of Q_conf, as given to 01 (default: %(default)s)")
    p.add_argument("--train_pt", default=None, help="T0 (default: the one the diagnosis recorded)")
    p.add_argument("--split", default=None, help="BEIR split of T0 (default: the one the diagnosis recorded)")
    p.add_argument("--top_neg_n", type=positive_int, default=30,
                   help="negative candidates per query: the first N non-positive hits (default: %(default)s)")
    p.add_argument("--output_jsonl", required=True, help="expansion-format JSONL to write")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    tuples, stats = confused_query_tuples(args.dia_out_dir, args.pct, train_pt=args.train_pt, split=args.split,
                                          top_neg_n=args.top_neg_n)
    if not tuples:
        raise ValueError(f"{args.dia_out_dir}: no confused query has a negative candidate (pct {args.pct}, "
                         f"top_neg_n {args.top_neg_n})")
    write_jsonl(args.output_jsonl, tuples)
    write_json(str(Path(args.output_jsonl).with_suffix(".stats.json")), {**vars(args), **asdict(stats)})
    print(f"06b: wrote {stats.tuples} tuples of {stats.confused_queries} confused queries with {stats.candidates} "
          f"negative candidates ({stats.candidates_known_positive} known positives excluded, "
          f"{stats.without_candidates} queries without a candidate) to {args.output_jsonl}", flush=True)
    return asdict(stats)


if __name__ == "__main__":
    run_script(main)
