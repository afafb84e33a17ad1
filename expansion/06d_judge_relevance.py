#!/usr/bin/env python
"""Step 06d (issue 30): an instruct model judges whether each verified hit is relevant to its query, between 06
(or 06c) and 07.

For each tuple of 06's expansion JSONL the judge reads the query and each of the first --judge_k hits (the
positive, then the negative candidates in the source's order) and gives P(yes) to "is this document relevant to
the query: does it answer it or give evidence for or against it?", read from the next-token logits (in process:
softmax over the yes/no token ids; a server: its top log-probabilities, or its text answer as 1.0 / 0.0 when it
returns none). Then:
  - the positive becomes the hit the judge rates highest (QUERY_FORM=title: q_new becomes its title);
  - a tuple whose judged hits all stay below --threshold is dropped;
  - the other hits judged relevant (P(yes) >= --threshold) leave negative_candidates for judged_relevant, so
    07-09 never use them as negatives.
The output is 06's format plus pos_p_yes, judged_relevant, judge, p_yes on the judged candidates and, when the
positive changed, source_pos_meta (docs/expansion.md). One status line per tuple (kept | repicked | dropped, every
P(yes)) goes to <out_jsonl>.status.jsonl. Judgments are cached in --cache_jsonl, keyed by the judge model and
the exact prompt: an interrupted run resumes where it stopped, a rerun (or another run given the same cache)
computes nothing twice. Measure a judge with bench/judge_accuracy.py on T0's own claims and choose --threshold
there: on SciFact the default Qwen2.5-Coder-0.5B judge was at chance (AUC 0.52) and the 1.5B near it (AUC 0.59 on
60 pairs; docs/results.md), so use a stronger served model (--backend openai) before trusting the judge.

Example (what the driver runs with JUDGE=1):
  python expansion/06d_judge_relevance.py --input_jsonl expansion.bottom_30pct.jsonl \\
      --out_jsonl expansion.judged.bottom_30pct.jsonl --cache_jsonl run/cache/judge.jsonl \\
      --model qwen2.5-coder-0.5b --threshold 0.5 --judge_k 5
"""

from __future__ import annotations

import argparse
import json
import sys

from repair.cli import bounded_int, positive_int, probability, run_script
from repair.expansion.generation import add_generator_args, generator_from_args
from repair.expansion.relevance_judge import (DEFAULT_JUDGE_K, DEFAULT_JUDGE_MODEL, DEFAULT_THRESHOLD, QUERY_FIELDS,
                                    JudgeCache, RelevanceJudge, judge_expansion, read_expansion_for_judge)
from repair.runtime import setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_jsonl", required=True, help="06's (or 06c's) expansion JSONL (verified tuples)")
    p.add_argument("--out_jsonl", required=True,
                   help="the judged expansion JSONL (written atomically); status lines go to "
                        "<out_jsonl>.status.jsonl")
    p.add_argument("--cache_jsonl", default=None,
                   help="judgment cache, shared by reruns and runs (default: <out_jsonl>.cache.jsonl)")
    p.add_argument("--threshold", type=probability, default=DEFAULT_THRESHOLD,
                   help="P(yes) at or above which a hit is relevant: the positive must reach it, the other hits "
                        "that reach it are never negatives (default: %(default)s)")
    p.add_argument("--judge_k", type=positive_int, default=DEFAULT_JUDGE_K,
                   help="hits judged per tuple: the positive and the first judge_k - 1 candidates; later "
                        "candidates stay negatives unjudged (default: %(default)s)")
    p.add_argument("--query_field", choices=QUERY_FIELDS, default="auto",
                   help="what the judge reads as the query: auto = q_model when q_new is the positive's own title "
                        "(QUERY_FORM=title), else q_new (default: %(default)s)")
    p.add_argument("--max_chars", type=bounded_int(100), default=1000,
                   help="abstracts in the prompt are cut to this many characters (default: %(default)s)")
    p.add_argument("--chunk", type=positive_int, default=16,
                   help="tuples judged between cache writes (default: %(default)s)")
    add_generator_args(p, default_model_help=f"{DEFAULT_JUDGE_MODEL}, an instruct model", default_batch_help="4")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    p.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    if args.backend == "hf" and not args.model:
        args.model = DEFAULT_JUDGE_MODEL
    read_expansion_for_judge(args.input_jsonl)  # a bad input is named before a model is loaded
    generator = generator_from_args(args, default_batch_size=4)
    cache = JudgeCache(args.cache_jsonl or f"{args.out_jsonl}.cache.jsonl")
    judge = RelevanceJudge(generator, cache, batch_size=args.batch_size or 4, max_chars=args.max_chars)
    stats = judge_expansion(args.input_jsonl, judge, args.out_jsonl, threshold=args.threshold,
                            judge_k=args.judge_k, query_field=args.query_field, chunk=args.chunk,
                            progress=not args.no_progress)
    summary = {"input_jsonl": args.input_jsonl, "out_jsonl": args.out_jsonl, "cache_jsonl": str(cache.path),
               "judge": judge.identity, "threshold": args.threshold, "judge_k": args.judge_k, **stats.as_dict()}
    print(f"  kept {stats.kept} (positive re-picked {stats.repicked})  dropped {stats.dropped} of {stats.tuples}  "
          f"relevant hits removed from negatives {stats.relevant_moved}  judgments computed {stats.computed}, "
          f"reused {stats.reused}", file=sys.stderr)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    run_script(main)
