#!/usr/bin/env python
"""QUERY_FORM=t0 (issue 16): rewrite each verified tuple's q_new (06 output) as a query in the style of T0's own
queries, e.g. a claim the verified abstract supports when T0 holds claims (SciFact), a question for a QA seed set.

The paper makes the top hit's title the new query because its T0 is title -> abstract; with another T0 the titles
are another task. The generator (same backends and flags as 05) sees k (query, passage) examples drawn from T0 with
a fixed seed, then the verified abstract, and writes one query; the project's query cleaning rejects echoes of the
prompt, empty, too short and too long answers, and answers sharing too few words with the abstract (off_passage).
A tuple whose rewrite fails keeps its title (--on_failure keep_title, the default) or is left out (drop); both are
counted. The output is 06's expansion JSONL with q_new replaced (the title kept as q_title), ready for 07-09.

QUERY_FORM=doc2query (issue 30, --doc2query N): the input is 06b's confused tuples instead; the first N documents
that outrank each confused query's positive (Stage I's D-(q), each document once) get a query written from them
(repair/expansion/doc2query.py): d+ is that document, the candidates are the documents it was confused with. The
tuples built are written to <out_jsonl>.sources.jsonl first; a document whose query fails is dropped.
--style mixed asks for a claim, a question and a keyword query in turn (Tamber et al. 2025, arXiv 2505.19274).
Use a capable generator (Qwen2.5-7B-Instruct, --backend openai): SmolLM2-135M writes claim-shaped text that is
mostly off topic (docs/expansion.md), at about 12 s per tuple on one CPU thread.

Example (T0 = SciFact train, any OpenAI-compatible server):
  python expansion/06c_t0_style_queries.py --input_jsonl expansion.bottom_30pct.jsonl \\
      --train_data ../shared/data/scifact --split train --out_jsonl expansion.t0.bottom_30pct.jsonl --seed 42 \
      --backend openai --openai_url http://127.0.0.1:8000/v1 --resume
"""

from __future__ import annotations

import argparse
import json
import sys


from dataclasses import asdict

from repair.cli import non_negative_int, positive_int, run_script, seed_int
from repair.data import load_seed, write_jsonl
from repair.expansion.doc2query import doc2query_tuples
from repair.expansion.generation import (add_generator_args, add_sampling_args, generator_from_args,
                               sampling_from_args)
from repair.runtime import setup_logging
from repair.expansion.t0_style import MIXED, MIXED_STYLES, T0_ON_FAILURE, T0_STYLES, rewrite_t0_style


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_jsonl", required=True,
                   help="06's expansion JSONL (verified tuples); with --doc2query, 06b's confused tuples")
    p.add_argument("--doc2query", type=non_negative_int, default=0, metavar="N",
                   help="0 = rewrite 06's tuples (QUERY_FORM=t0); N >= 1 = write a query for the first N documents "
                        "of each confused query's D-(q) in --input_jsonl (QUERY_FORM=doc2query) (default: %(default)s)")
    p.add_argument("--train_data", "--train_pt", dest="train_data", required=True,
                   help="T0, where the examples come from: original .pt, JSONL {query, positive}, or BEIR folder")
    p.add_argument("--split", default="train", help="qrels split of a BEIR --train_data (default: %(default)s)")
    p.add_argument("--out_jsonl", required=True,
                   help="expansion JSONL with T0-style q_new (appended one complete line at a time; see --resume); "
                        "status lines go to <out_jsonl>.status.jsonl")
    p.add_argument("--resume", action="store_true",
                   help="continue --out_jsonl: tuples already written (or dropped) are skipped")
    p.add_argument("--k", type=positive_int, default=3, help="T0 examples per prompt (default: %(default)s)")
    p.add_argument("--seed", type=seed_int, default=42,
                   help="seed of the examples drawn for each tuple and of sampling (default: %(default)s)")
    p.add_argument("--style", choices=["auto", *T0_STYLES, MIXED], default="auto",
                   help="the form asked for; auto = the most common form of T0's queries (ends with '?': question; "
                        f"with '.': claim; <= 4 words: keywords; else title); {MIXED} = {', '.join(MIXED_STYLES)} in "
                        "turn by input position (default: %(default)s)")
    p.add_argument("--on_failure", choices=T0_ON_FAILURE, default=None,
                   help="a tuple whose rewrite is rejected --attempts times: keep_title = keep the title as q_new "
                        "(query_form title; no verified tuple lost), drop = leave it out (default: keep_title; "
                        "drop with --doc2query, whose tuples have no title)")
    p.add_argument("--attempts", type=positive_int, default=2,
                   help="generations per tuple at most (a rejected answer is asked again) (default: %(default)s)")
    p.add_argument("--chunk_size", type=positive_int, default=8,
                   help="tuples per generation call; keep it fixed for a file (default: %(default)s)")
    p.add_argument("--contrast", action="store_true",
                   help="show each tuple's first negative candidate (with --doc2query: the positive of the confused "
                        "query the document outranked) as a related passage the query must not fit, and reject a "
                        "query sharing as many content words with it as with its own passage (not_distinct)")
    p.add_argument("--max_candidates", type=positive_int, default=20,
                   help="with --doc2query: negative candidates kept per document (default: %(default)s)")
    p.add_argument("--max_example_chars", type=non_negative_int, default=0,
                   help="the T0 examples' passages are cut to this many characters; 0 = --max_passage_chars. A CPU "
                        "generator's time goes into reading the prompt (default: %(default)s)")
    p.add_argument("--max_passage_chars", type=positive_int, default=1000,
                   help="passages in the prompt are cut to this many characters (default: %(default)s)")
    p.add_argument("--min_words", type=non_negative_int, default=3,
                   help="shortest query kept, in words (default: %(default)s)")
    p.add_argument("--max_words", type=non_negative_int, default=0,
                   help="longest query kept, in words; 0 = twice the 90th percentile of T0's query lengths, at "
                        "least 12 (default: %(default)s)")
    p.add_argument("--min_shared_words", type=non_negative_int, default=2,
                   help="content words the query must share with the verified abstract, else it is rejected as "
                        "off_passage; 0 = no check (default: %(default)s)")
    add_generator_args(p, default_batch_help="--chunk_size")
    add_sampling_args(p)
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    p.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    if args.doc2query and args.on_failure == "keep_title":
        raise SystemExit("--doc2query tuples have no title to keep: use --on_failure drop")
    on_failure = args.on_failure or ("drop" if args.doc2query else "keep_title")
    seed_set = load_seed(args.train_data, split=args.split)
    rewrite_input = args.input_jsonl
    if args.doc2query:  # the tuples to write queries for, built from Stage I's confused documents
        tuples, d2q_stats = doc2query_tuples(args.input_jsonl, args.doc2query, args.max_candidates)
        rewrite_input = f"{args.out_jsonl}.sources.jsonl"
        write_jsonl(rewrite_input, tuples)  # the same bytes for the same input: a resumed run finds its ids
    generator = generator_from_args(args, default_batch_size=args.chunk_size)
    stats = rewrite_t0_style(rewrite_input, seed_set, generator, args.out_jsonl, k=args.k, seed=args.seed,
                             style=args.style, chunk_size=args.chunk_size, attempts=args.attempts,
                             on_failure=on_failure, max_passage_chars=args.max_passage_chars,
                             max_example_chars=args.max_example_chars or None,
                             min_words=args.min_words, max_words=args.max_words or None,
                             min_shared_words=args.min_shared_words,
                             sampling=sampling_from_args(args), resume=args.resume, progress=not args.no_progress,
                             query_form="doc2query" if args.doc2query else "t0", contrast=args.contrast)
    summary = {"input_jsonl": args.input_jsonl, "out_jsonl": args.out_jsonl, "t0": seed_set.source,
               "generator": generator.describe(), **stats.as_dict()}
    if args.doc2query:
        summary["doc2query"] = {"sources_jsonl": rewrite_input, **asdict(d2q_stats)}
    print(f"  style {stats.style}  rewritten {stats.rewritten}  kept title {stats.kept_title}  dropped "
          f"{stats.dropped}  skipped (done before) {stats.skipped_done}  rejected {dict(stats.rejected)}",
          file=sys.stderr)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    run_script(main)
