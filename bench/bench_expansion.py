#!/usr/bin/env python
"""Stage II speed, ours vs the original's way, on the same inputs, printed as one table:

1. query generation (05): our batched, left-padded HF generation vs one prompt at a time (the original 05
   generated a single query per model call), SmolLM2-135M-Instruct, the paper prompt, 40 new tokens;
2. verification (06) on the local corpus: BM25 index build vs reload from disk, then queries per second;
3. the response cache: a remote source behind a local server that answers in ``--latency`` seconds, first run
   vs a resumed/repeated run (the original asked again every time: no cache).

Example: python bench/bench_expansion.py --corpus ../shared/data/scifact --prompts 16
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


from repair.expansion.generation import HFGenerator
from repair.expansion.query_generation import build_prompt
from repair.expansion.sources import ResponseCache
from repair.expansion.sources.local_corpus import LocalCorpus
from repair.expansion.sources.semantic_scholar import SemanticScholar
from repair.tables import text_table

CONCEPTS = [["BCL-2", "venetoclax"], ["cyclin D1", "mantle cell lymphoma"], ["TiO2"], ["APOE4", "amyloid"],
            ["LRRK2"], ["FGF21", "diet-induced"], ["PD-1", "CD8"], ["STING", "DNA"]]


def bench_generation(model: str, n_prompts: int, batch_size: int) -> list[tuple[str, float, str]]:
    prompts = [build_prompt(CONCEPTS[i % len(CONCEPTS)]) for i in range(n_prompts)]
    gen = HFGenerator(model, batch_size=batch_size)
    rows = []
    for label, bs in ((f"batched (batch {batch_size})", batch_size), ("one prompt per call (original)", 1)):
        gen.batch_size = bs
        start = time.perf_counter()
        gen.generate(prompts, seed=0, max_new_tokens=40)
        dt = time.perf_counter() - start
        rows.append((f"05 generate {n_prompts} queries, {label}", dt, f"{n_prompts / dt:.2f} queries/s"))
    return rows


def bench_local(corpus: str, n_queries: int) -> list[tuple[str, float, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        src = LocalCorpus(corpus, index_dir=Path(tmp) / "idx")
        build = time.perf_counter() - start
        start = time.perf_counter()
        src = LocalCorpus(corpus, index_dir=Path(tmp) / "idx")
        load = time.perf_counter() - start
        queries = [p.title for p in src.papers[:n_queries]]
        start = time.perf_counter()
        for q in queries:
            src.search(q, 21)
        dt = time.perf_counter() - start
    return [(f"06 local: build BM25 index ({len(src.papers)} papers)", build, "once per corpus"),
            ("06 local: reload the saved index", load, "every later run"),
            (f"06 local: verify {n_queries} queries (k=21)", dt, f"{n_queries / dt:.1f} queries/s")]


def bench_cache(n_queries: int, latency: float) -> list[tuple[str, float, str]]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            q = parse_qs(urlparse(self.path).query).get("query", [""])[0]
            time.sleep(latency)
            body = json.dumps({"total": 1, "offset": 0, "data": [
                {"paperId": q, "title": f"Paper about {q}", "abstract": "An abstract.", "externalIds": {}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label in ("first run (asks the server)", "repeated / resumed run (response cache)"):
                client = SemanticScholar(url, keys=[], rate=None, cache=ResponseCache(tmp))
                start = time.perf_counter()
                for i in range(n_queries):
                    client.search(f"query {i}", 5)
                dt = time.perf_counter() - start
                rows.append((f"06 remote, {n_queries} queries, {latency * 1000:.0f} ms server: {label}", dt,
                             f"{client.client.stats['requests']} requests"))
    finally:
        server.shutdown()
        server.server_close()
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="generator (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=16, help="prompts to generate for (default: %(default)s)")
    p.add_argument("--batch_size", type=int, default=8, help="batched generation size (default: %(default)s)")
    p.add_argument("--corpus", default=os.environ.get("REPAIR_LOCAL_CORPUS"),
                   help="BEIR folder or JSONL of papers for the local-corpus rows (skipped when absent)")
    p.add_argument("--queries", type=int, default=500, help="local verification queries (default: %(default)s)")
    p.add_argument("--latency", type=float, default=0.05, help="fake server latency in s (default: %(default)s)")
    p.add_argument("--skip_generation", action="store_true", help="skip the (slow on CPU) generation rows")
    args = p.parse_args(argv)
    rows = []
    if not args.skip_generation:
        rows += bench_generation(args.model, args.prompts, args.batch_size)
    if args.corpus:
        rows += bench_local(args.corpus, args.queries)
    rows += bench_cache(50, args.latency)
    print(text_table([(what, f"{secs:8.2f}", note) for what, secs, note in rows], ("what", "seconds", "note"),
                     align="lrl"))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
