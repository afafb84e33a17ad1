#!/usr/bin/env python
"""Does 06 verify the same way through the on-disk literature index (tantivy) as through today's bm25s source
(issue 41, point 4)? Replays queries through both over one corpus and prints, for the index as 06 opens it (exact
rescoring with bm25s' formula, the default) and for the engine's own ranking (``exact=False``), the share of queries whose top hit is
the same paper (goal >= 95%), the mean overlap of the top-k hit sets (|A & B| / k), how often both find hits and
the largest score difference of a paper both return.

Queries: a recorded run's 05 output (``--generated_jsonl``, its ``query`` field) when one is given or found under
``--runs``; else the corpus folder's own ``queries.jsonl`` (SciFact's claims, a stand-in for 05's 15-25 word
queries). The output says which.

Example: python bench/literature_agreement.py --corpus ../shared/data/scifact --k 21
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from repair.data import iter_jsonl
from repair.expansion.sources.base import cap_query
from repair.expansion.sources.literature import build_index
from repair.expansion.sources.literature_format import BM25
from repair.expansion.sources.literature_search import EXACT_B, EXACT_K1, RESCORE_POOL, LiteratureIndex
from repair.expansion.sources.local_corpus import B as BM25S_B
from repair.expansion.sources.local_corpus import K1 as BM25S_K1
from repair.expansion.sources.local_corpus import LocalCorpus


def find_queries(corpus: Path, generated: str | None, runs: Path) -> tuple[list[str], str]:
    """(queries, where they came from)."""
    files = [Path(generated)] if generated else sorted(runs.glob("**/expansion/generated*.jsonl"))
    queries = [cap_query(r["query"]) for f in files for r in iter_jsonl(f, optional={"query": str}) if r.get("query")]
    if queries:
        return queries, f"05 queries of a recorded run ({', '.join(str(f) for f in files)})"
    qfile = next((corpus / n for n in ("queries.jsonl", "queries.jsonl.gz") if (corpus / n).exists()), None)
    if qfile is None:
        raise SystemExit(f"no 05 queries found under {runs} and no queries.jsonl in {corpus}")
    return ([r["text"] for r in iter_jsonl(qfile, required={"text": str})],
            f"{qfile} (the corpus' own queries; no recorded 05 run found under {runs})")


def agreement(old: list[list], new: list[list]) -> dict:
    """How far the index's hits (``new``) are from bm25s' (``old``), query by query: the top hit, the hit sets, and
    the scores of the papers both return."""
    both = [(a, b) for a, b in zip(old, new) if a and b]
    top1 = sum(a[0].id == b[0].id for a, b in both)
    overlap = [len({h.id for h in a} & {h.id for h in b}) / max(len(a), len(b)) for a, b in both]
    diffs = [abs(h.score - scores[h.id]) for a, b in both for scores in [{x.id: x.score for x in a}] for h in b
             if h.id in scores]
    return {"hits_both": len(both), "hits_bm25s_only": sum(bool(a) and not b for a, b in zip(old, new)),
            "hits_index_only": sum(bool(b) and not a for a, b in zip(old, new)),
            "top1_identical": round(top1 / max(1, len(both)), 4),
            "mean_topk_overlap": round(sum(overlap) / max(1, len(overlap)), 4),
            "max_score_diff": float(max(diffs, default=0.0))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="BEIR folder (corpus.jsonl[.gz]) both sources search")
    p.add_argument("--generated_jsonl", default=None, help="05 output whose queries are replayed")
    p.add_argument("--runs", default="runs", help="where to look for recorded 05 outputs (default: %(default)s)")
    p.add_argument("--k", type=int, default=21, help="hits per query: 06's default target_k + 1 (default: %(default)s)")
    p.add_argument("--index", default=None, help="literature index folder (default: built in a temp folder)")
    p.add_argument("--threads", type=int, default=1, help="search threads of the index (default: %(default)s)")
    p.add_argument("--pool", type=int, default=RESCORE_POOL,
                   help="papers the engine proposes per query for exact rescoring (default: %(default)s)")
    args = p.parse_args(argv)
    corpus = Path(args.corpus)
    queries, origin = find_queries(corpus, args.generated_jsonl, Path(args.runs))
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = Path(args.index or Path(tmp) / "index")
        build = build_index([corpus], index_dir, progress=False)
        bm25s_source = LocalCorpus(corpus, index_dir=Path(tmp) / "bm25s")
        t0 = time.time()
        old = [bm25s_source.search(q, args.k) for q in queries]
        t_old = time.time() - t0
        modes = {}
        for mode, exact in (("index_exact", True), ("index_engine_only", False)):
            index = LiteratureIndex(index_dir, exact=exact, pool=args.pool)
            t0 = time.time()
            new = index.search_many(queries, args.k, threads=args.threads)
            modes[mode] = {**agreement(old, new), "seconds": round(time.time() - t0, 2)}
    result = {
        "queries": len(queries), "query_origin": origin, "corpus": str(corpus), "papers": build["papers"], "k": args.k,
        "bm25s": {"k1": BM25S_K1, "b": BM25S_B, "method": "lucene", "tokenizer": "bm25s.tokenize lower, stopwords=en",
                  "seconds": round(t_old, 2)},
        "index": {**BM25, "engine": index.manifest["engine"], "threads": args.threads,
                  "exact_rescoring": {"k1": EXACT_K1, "b": EXACT_B, "pool": max(args.k, args.pool)}},
        **modes,
    }
    print(f"queries: {len(queries)} from {origin}", file=sys.stderr)
    for mode in modes:
        m = modes[mode]
        print(f"{mode}: top-1 identical {m['top1_identical']:.1%} of {m['hits_both']} queries with hits in both; "
              f"mean top-{args.k} overlap {m['mean_topk_overlap']:.1%}; max |score - bm25s score| of a paper both "
              f"return {m['max_score_diff']:.2g}; {m['seconds']} s", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from repair.cli import run_script

    run_script(main)
