#!/usr/bin/env python
"""Cost of the on-disk literature index (issue 41) as the corpus grows: build time and peak RSS, then the searching
process' memory split into its own (RssAnon) and the index's memory-mapped pages (RssFile), and queries/s with one
and with two threads, for queries shaped like 05's (15-25 words).

The corpus is synthetic (seeded): titles of 10 and abstracts of 160 words drawn from a Zipf vocabulary of 50k
pseudo-words, written as a gzipped ``{id, title, abstract}`` JSONL (``--papers N``, streamed: any N fits) and then
built by ``build_index`` as a user's corpus would be. Each phase runs in its own process, so each peak RSS is that
phase's. ``--compare_bm25s`` also measures today's source (``LocalCorpus``, bm25s in memory) on the same corpus and
queries. One JSON line per measurement (the fields of docs/results/scale.json).

Example: python bench/literature_index.py --papers 100000 --queries 2000 --threads 1,2 --compare_bm25s
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VOCAB = 50_000


def _words(rng: np.random.Generator, n: int) -> list[str]:
    ids = np.minimum(rng.zipf(1.15, size=n), VOCAB) - 1
    return [f"w{i:x}" for i in ids]


def write_corpus(path: Path, papers: int, seed: int = 0) -> Path:
    """``papers`` synthetic papers as a gzipped JSONL, written in a stream."""
    rng = np.random.default_rng(seed)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as fh:
        for i in range(papers):
            words = _words(rng, 170)
            record = {"id": f"p{i}", "title": " ".join(words[:10]), "abstract": " ".join(words[10:])}
            fh.write(json.dumps(record) + "\n")
    return path


def make_queries(path: Path, n: int, papers: int, seed: int = 1) -> list[str]:
    """05-shaped queries: 15-25 words, most of them from one paper's abstract (a claim about it), some not."""
    rng = np.random.default_rng(seed)
    wanted = set(rng.choice(papers, size=min(n, papers), replace=False).tolist())
    queries = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i in wanted:
                words = json.loads(line)["abstract"].split()
                length = int(rng.integers(15, 26))
                own = rng.choice(len(words), size=length - length // 3, replace=False)
                queries.append(" ".join([words[j] for j in sorted(own)] + _words(rng, length // 3)))
    rng.shuffle(queries)
    return queries


def memory() -> dict:
    """This process' peak RSS, RssAnon and RssFile (MB), from /proc/self/status."""
    fields = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"peak_rss_mb": fields.get("VmHWM"), "rss_anon_mb": fields.get("RssAnon"),
            "rss_file_mb": fields.get("RssFile")}


def phase_build(corpus: Path, index: Path, threads: int) -> dict:
    from repair.expansion.sources.literature import build_index

    stats = build_index([corpus], index, threads=threads, progress=False)
    return {"stage": "06_build", "engine": "tantivy", "size": stats["papers"], "unit": "papers", "threads": threads,
            "seconds": stats["seconds"], "index_mb": round(stats["index_bytes"] / 2**20, 1), **memory()}


def phase_search(index: Path, queries_file: Path, k: int) -> list[dict]:
    from repair.expansion.sources.literature_search import LiteratureIndex

    queries = json.loads(queries_file.read_text())
    rows = []
    # "tantivy": the engine's own ranking; "tantivy:exact": as 06 opens the index (its top 50 rescored with bm25s'
    # formula, the same hits as bm25s)
    for engine, exact in (("tantivy", False), ("tantivy:exact", True)):
        t0 = time.time()
        source = LiteratureIndex(index, exact=exact)
        open_s = time.time() - t0
        for threads in (1, 2):
            t0 = time.time()
            hits = source.search_many(queries, k, threads=threads)
            seconds = time.time() - t0
            rows.append({"stage": "06_search", "engine": engine, "size": len(source), "unit": "papers",
                         "threads": threads, "queries": len(queries), "seconds": round(seconds, 3),
                         "queries_per_s": round(len(queries) / seconds, 1), "open_s": round(open_s, 3),
                         "mean_hits": round(sum(map(len, hits)) / len(hits), 2), **memory()})
    return rows


def phase_bm25s(corpus: Path, queries_file: Path, k: int, cache: Path) -> list[dict]:
    from repair.expansion.sources.local_corpus import LocalCorpus

    queries = json.loads(queries_file.read_text())
    t0 = time.time()
    source = LocalCorpus(corpus, index_dir=cache)
    build_s = time.time() - t0
    rows = [{"stage": "06_build", "engine": "bm25s", "size": len(source.papers), "unit": "papers", "threads": 1,
             "seconds": round(build_s, 3), **memory()}]
    t0 = time.time()
    for q in queries:
        source.search(q, k)
    seconds = time.time() - t0
    rows.append({"stage": "06_search", "engine": "bm25s", "size": len(source.papers), "unit": "papers", "threads": 1,
                 "queries": len(queries), "seconds": round(seconds, 3),
                 "queries_per_s": round(len(queries) / seconds, 1), **memory()})
    return rows


def run_phase(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, __file__, "--phase", *args], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"phase {args[0]} failed: {out.stderr.strip()[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--phase":  # one measured phase, in its own process
        name, *rest = argv[1:]
        if name == "build":
            rows = [phase_build(Path(rest[0]), Path(rest[1]), int(rest[2]))]
        elif name == "search":
            rows = phase_search(Path(rest[0]), Path(rest[1]), int(rest[2]))
        else:
            rows = phase_bm25s(Path(rest[0]), Path(rest[1]), int(rest[2]), Path(rest[3]))
        for row in rows:
            print(json.dumps(row))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--papers", type=int, default=100_000, help="synthetic papers (default: %(default)s)")
    p.add_argument("--queries", type=int, default=2000, help="05-shaped queries searched (default: %(default)s)")
    p.add_argument("--k", type=int, default=21, help="hits per query: 06's target_k + 1 (default: %(default)s)")
    p.add_argument("--threads", default="1",
                   help="tantivy indexing threads, or a comma list: one build each (the first one is searched) "
                        "(default: %(default)s)")
    p.add_argument("--skip_search", action="store_true", help="measure the builds only")
    p.add_argument("--workdir", default=None, help="where the corpus and index go (default: a temp folder, removed)")
    p.add_argument("--compare_bm25s", action="store_true", help="also measure LocalCorpus (bm25s) on the same corpus")
    p.add_argument("--out_json", default=None, help="append the measurements (JSON lines) here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus = work / f"synthetic_{args.papers}.jsonl.gz"
        t0 = time.time()
        if not corpus.exists():
            write_corpus(corpus, args.papers)
        print(f"corpus: {corpus} ({corpus.stat().st_size / 2**20:.0f} MB gz) in {time.time() - t0:.0f} s",
              file=sys.stderr)
        queries = work / "queries.json"
        queries.write_text(json.dumps(make_queries(corpus, args.queries, args.papers)))
        rows = []
        for i, threads in enumerate(args.threads.split(",")):
            index = work / f"index_{args.papers}_t{threads}"
            rows += run_phase("build", str(corpus), str(index), threads)
            if i == 0 and not args.skip_search:
                rows += run_phase("search", str(index), str(queries), str(args.k))
        if args.compare_bm25s:
            rows += run_phase("bm25s", str(corpus), str(queries), str(args.k), str(work / "bm25s"))
    for row in rows:
        print(json.dumps(row))
    if args.out_json:
        with open(args.out_json, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
