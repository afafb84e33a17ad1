#!/usr/bin/env python
"""Exact top-k search: torch matmul + running top-k vs faiss IndexFlatIP (same chunking, same tie rule), and
both vs a numpy brute force. Decides `repair.search.CPU_DEFAULT`.

    python bench/search.py --queries 2000 --docs 100000 --dim 576 --k 50
"""

from __future__ import annotations

import argparse
import json
import time


import numpy as np
import torch

from repair.search import exact_topk


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", type=int, default=2000, help="number of queries (default: %(default)s)")
    p.add_argument("--docs", type=int, default=100_000, help="number of documents (default: %(default)s)")
    p.add_argument("--dim", type=int, default=576, help="vector width (SmolLM2-135M: 576)")
    p.add_argument("--k", type=int, default=50, help="top-k (default: %(default)s)")
    p.add_argument("--doc_chunk", type=int, default=65536, help="documents scored per chunk")
    p.add_argument("--query_chunk", type=int, default=4096, help="queries per chunk")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    docs = rng.standard_normal((args.docs, args.dim), dtype=np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    rows = {}
    results = {}
    for backend in ("torch", "faiss"):
        t0 = time.perf_counter()
        results[backend] = exact_topk(queries, docs, args.k, backend=backend, doc_chunk=args.doc_chunk,
                                      query_chunk=args.query_chunk)
        rows[backend] = time.perf_counter() - t0
    # Exact ties resolve identically (tests/test_search.py); scores that differ only in the last float bit
    # can swap neighbours, because faiss and torch sum the dot products in different orders.
    differing_rows = int((results["torch"][1] != results["faiss"][1]).any(axis=1).sum())
    max_score_diff = float(np.abs(results["torch"][0] - results["faiss"][0]).max())
    print(f"{'backend':<10}{'seconds':>10}{'queries/s':>12}")
    for name, sec in rows.items():
        print(f"{name:<10}{sec:>10.2f}{args.queries / sec:>12.1f}")
    summary = {"queries": args.queries, "docs": args.docs, "dim": args.dim, "k": args.k,
               "threads": torch.get_num_threads(), "seconds": {k: round(v, 3) for k, v in rows.items()},
               "faster": min(rows, key=rows.get), "rows_with_rounding_swaps": differing_rows,
               "max_abs_score_diff": max_score_diff}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
