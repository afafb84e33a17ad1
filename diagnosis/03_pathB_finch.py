#!/usr/bin/env python
"""Stage I step 3 (PathB): FINCH clusters of the confused queries -> C_inter.

The confused queries' embeddings (rows of 01's normalised query cache) are clustered with FINCH's first
partition: every query links to its exact nearest other query by cosine, and the connected components of
that undirected 1-NN graph are the clusters (computed in chunks, so 10^6 queries fit in memory; --levels
adds FINCH's further partitions). Each cluster's C_inter concept is the most frequent concept over its
members' D-(q) concepts from PathA.

Writes into --out_dir (default <dia_out_dir>/pathB_finch_train):
  pathB_finch_train.assignments.bottom_{pp}pct.jsonl  {i, query, margin_cos, component_root, component_id, concept}
  pathB_finch_train.components.bottom_{pp}pct.json    clusters sorted by (avg margin asc, size desc):
                                                      component_id, size, avg/min margin, concept, samples

Example: python diagnosis/03_pathB_finch.py --pct 30 --dia_out_dir runs/iter1 --device cuda
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


from repair.diagnosis.margins import PATHA_DIR, PATHB_DIR
from repair.cli import non_negative_int, percentile, positive_int, run_script
from repair.diagnosis.stages import print_summary, run_pathB
from repair.runtime import pick_device, setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pct", type=percentile, default=30,
                   help="percentile whose confused queries to cluster (default: %(default)s)")
    p.add_argument("--dia_out_dir", default=os.environ.get("DIA_OUT_DIR"),
                   help="folder of 01's outputs (default: $DIA_OUT_DIR)")
    p.add_argument("--out_dir", default="", help=f"output folder (default: <dia_out_dir>/{PATHB_DIR})")
    p.add_argument("--train_query_cache", default=None,
                   help="normalised query embeddings (.pt: fp16 tensor or dict with 'reps'), one row per T0 query "
                        "(default: the cache 01 recorded in its meta; refused if its rows or model differ)")
    p.add_argument("--patha_out_dir", default="",
                   help=f"PathA output folder with per_query_neg_concepts (default: <dia_out_dir>/{PATHA_DIR})")
    p.add_argument("--device", default=None,
                   help="cpu | cuda | cuda:N for the 1-NN search (default: cuda when available)")
    p.add_argument("--levels", type=non_negative_int, default=1,
                   help="FINCH partitions to compute: 1 = first partition only; 0 = all until FINCH stops "
                        "(default: %(default)s)")
    p.add_argument("--cinter_level", type=positive_int, default=1,
                   help="which partition's clusters give C_inter (default: %(default)s, the first)")
    p.add_argument("--samples", type=non_negative_int, default=5,
                   help="sample queries stored per cluster (default: %(default)s)")
    p.add_argument("--chunk", type=positive_int, default=4096, help="queries per 1-NN block (default: %(default)s)")
    p.add_argument("--doc_chunk", type=positive_int, default=65536,
                   help="neighbours per 1-NN block (default: %(default)s)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.dia_out_dir:
        p.error("--dia_out_dir is required (or set $DIA_OUT_DIR)")
    args.out_dir = args.out_dir or str(Path(args.dia_out_dir) / PATHB_DIR)
    args.patha_out_dir = args.patha_out_dir or str(Path(args.dia_out_dir) / PATHA_DIR)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    summary = run_pathB(args.dia_out_dir, args.pct, args.out_dir, args.patha_out_dir,
                        train_query_cache=args.train_query_cache, device=str(pick_device(args.device)),
                        levels=args.levels or None, cinter_level=args.cinter_level, samples=args.samples,
                        chunk=args.chunk, doc_chunk=args.doc_chunk)
    print_summary(summary)
    return summary


if __name__ == "__main__":
    run_script(main)
