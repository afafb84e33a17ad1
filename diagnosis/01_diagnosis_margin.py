#!/usr/bin/env python
"""Stage I step 1: cosine margins of the seed training queries and the low-margin set Q_conf (Eq. 1).

Encodes every T0 query (query format) and passage (passage format) with the retriever, searches each query's
exact top-k over all T0 passages, and computes margin = s(q, d+) - the best top-k score of a document that is
not a positive of q (d+ and passages/queries duplicated in T0 are positives, never negatives). For each
--pct p, Q_conf = the queries whose margin is <= the p-th percentile (ties included).

Writes into --out_dir (original file names):
  01.train_all_query_margins.cos.jsonl               one line per query
  confused_train_queries.bottom_{pp}pct.cos.jsonl    one line per confused query, ascending i
  01.train_diagnosis_meta.cos_percentile.json        counts, thresholds, margin quantiles, model identity,
                                                     settings, file hashes; pathB.train_query_cache
  cache/cache.train_{query,doc}_reps.normfp16.<key>.pt  L2-normalised fp16 embeddings (03 reads the query one)
A rerun with the same model, adapter and T0 reuses the embeddings and the search (0 forward passes); a new
adapter changes the key, so everything is recomputed and rewritten.

Example: python diagnosis/01_diagnosis_margin.py --train_pt t0.jsonl --out_dir runs/iter1 --pct 30 40
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


from repair.cli import add_retriever_args, bounded_int, percentile, run_script
from repair.diagnosis.stages import print_summary, run_margins
from repair.encoding import Retriever
from repair.runtime import cache_dir_flag, setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train_pt", default=os.environ.get("TRAIN_PT"),
                   help="seed training set T0: the original .pt list of dicts, a JSONL {query, positive} file, "
                        "or a BEIR folder (with --split) (default: $TRAIN_PT)")
    p.add_argument("--split", default="train",
                   help="qrels split when --train_pt is a BEIR folder (default: %(default)s)")
    p.add_argument("--out_dir", default=os.environ.get("DIA_OUT_DIR"),
                   help="diagnosis output folder (default: $DIA_OUT_DIR)")
    add_retriever_args(p, cache_help="embedding cache folder: per-text vectors, normfp16 caches, top-k "
                                     "(default: <out_dir>/cache); 'none' disables the per-text vector cache (the "
                                     "normfp16 caches and top-k, which 03 reads, still go to <out_dir>/cache)")
    p.add_argument("--instruction", default=None,
                   help="query instruction (default: 'Given a query, retrieve passages that are relevant to "
                        "the query.')")
    p.add_argument("--top_k", type=bounded_int(2), default=50,
                   help="hits searched per query over all T0 passages (default: %(default)s)")
    p.add_argument("--pct", type=percentile, nargs="+", default=[30],
                   help="percentile(s) of the margin distribution that define Q_conf, e.g. --pct 30 or "
                        "--pct 10 30 40 (default: %(default)s)")
    p.add_argument("--search_backend", default="auto", choices=["auto", "faiss", "torch"],
                   help="exact search backend: faiss on GPU, torch matmul on CPU when auto (default: %(default)s)")
    p.add_argument("--force", action="store_true",
                   help="recompute the normfp16 caches, the search and all outputs even when they match")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.train_pt:
        p.error("--train_pt is required (or set $TRAIN_PT)")
    if not args.out_dir:
        p.error("--out_dir is required (or set $DIA_OUT_DIR)")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    cache_dir = cache_dir_flag(args.cache_dir, Path(args.out_dir) / "cache")
    retriever = Retriever.load(args.model, args.adapter, pooling=args.pooling, max_length=args.max_length,
                               device=args.device, cache_dir=cache_dir, trust_remote_code=args.trust_remote_code,
                               batch_size=args.batch_size)
    summary = run_margins(retriever, args.train_pt, args.out_dir, args.pct, split=args.split, top_k=args.top_k,
                          instruction=args.instruction, cache_dir=cache_dir, search_backend=args.search_backend,
                          device=args.device, force=args.force)
    print_summary(summary)
    return summary


if __name__ == "__main__":
    run_script(main)
