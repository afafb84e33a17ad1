#!/usr/bin/env python
"""Step 6e (issue 43, opt-in: HARD_TUPLES=1): keep the verified Stage II tuples the current retriever gets wrong.

Verification keeps a generated query only when search finds a document for it, so most verified tuples are ones the
retriever already answers (docs/results.md: 90-98% ranked first). This step scores every tuple of 06's output
with the retriever (its margin s(q_new, d+) - max s(q_new, d-) over the source's other hits, and d+'s rank among
them) and writes the *hard* ones, rank(d+) > 1 or margin < --margin, hardest first, at most --budget. Two guards
drop a hard tuple whose label may be false: the retriever's preferred hit h* is a near-copy of d+
(cos >= --dup_cosine) or the source scored h* within --lex_tie of d+ (repair/differentiation/hard_tuples.py).

Embeddings go through step 7's code and the same cache (--cache_dir: the driver's $OUT_DIR/cache/embeddings), so 07
afterwards forwards nothing again, and a rerun (or the next expansion round, which rescored the grown file) forwards
only new texts. Writes --output_jsonl (06's lines, each with a "difficulty" field), --stats_json (the funnel and the
concept check of the guards) and prints a table and a one-line JSON summary.

Example (what the driver runs, shortened):
  python differentiation/06e_hard_tuples.py --input_jsonl run/iter1/expansion/expansion.bottom_30pct.jsonl \\
      --output_jsonl run/iter1/expansion/expansion.hard.bottom_30pct.jsonl --model minilm --margin 0.1 \\
      --cache_dir run/cache/embeddings
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from repair.cli import add_retriever_args, any_float, finite_float, non_negative_int, run_script
from repair.data import iter_jsonl, write_json, write_jsonl
from repair.differentiation.embedding_dir import EmbedConfig, EmbeddingDir, launch_embedding
from repair.differentiation.hard_tuples import (HardRule, LEXICAL_TIE, NEAR_DUPLICATE, OVER_BUDGET, hard_records,
                                                read_records)
from repair.differentiation.tuples import load_tuples
from repair.runtime import setup_logging
from repair.tables import text_table

DEFAULTS = HardRule()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_jsonl", required=True, help="06's verified tuples (expansion JSONL)")
    p.add_argument("--output_jsonl", required=True, help="the hard tuples to write (expansion JSONL, hardest first)")
    p.add_argument("--margin", type=any_float, default=DEFAULTS.margin,
                   help="hard: d+ not first, or s(q,d+) - max s(q,d-) below this; choose it on dev "
                        "(default: %(default)s)")
    p.add_argument("--budget", type=non_negative_int, default=DEFAULTS.budget,
                   help="keep at most this many hard tuples, lowest margin first; 0 = all (default: %(default)s)")
    p.add_argument("--dup_cosine", type=finite_float(-1, 1), default=DEFAULTS.dup_cosine,
                   help="guard: drop a hard tuple whose preferred hit has cosine >= this to d+ "
                        "(default: %(default)s)")
    p.add_argument("--lex_tie", type=any_float, default=DEFAULTS.lex_tie,
                   help="guard: drop a hard tuple whose preferred hit the source scored >= d+'s score x (1 - this); "
                        "a negative value turns the guard off (default: %(default)s)")
    p.add_argument("--embedding_dir", default=None,
                   help="where the scored embeddings go (default: <output_jsonl>.embeddings)")
    add_retriever_args(p, cache_help="embedding cache folder, shared with 07 (default: <embedding_dir>/cache); "
                                     "'none' disables it")
    p.add_argument("--stats_json", default=None, help="the funnel and checks (default: <output_jsonl>.stats.json)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    rule = HardRule(margin=args.margin, budget=args.budget, dup_cosine=args.dup_cosine, lex_tie=args.lex_tie)
    if not any(True for _ in iter_jsonl(args.input_jsonl)):  # a round that verified nothing: nothing is hard
        write_jsonl(args.output_jsonl, [])
        print(f"06e: {args.input_jsonl} holds no verified tuple; wrote an empty {args.output_jsonl}", flush=True)
        print(json.dumps({"tuples": 0, "hard": 0}))
        return {"tuples": 0, "kept": 0}
    tuples = load_tuples([args.input_jsonl])  # malformed input fails before the model loads
    emb_dir = args.embedding_dir or f"{args.output_jsonl}.embeddings"
    launch_embedding(EmbedConfig(input_jsonl=[args.input_jsonl], output_dir=emb_dir, model=args.model,
                                 adapter=args.adapter, pooling=args.pooling, max_length=args.max_length,
                                 batch_size=args.batch_size, device=args.device, cache_dir=args.cache_dir,
                                 trust_remote_code=args.trust_remote_code), 1)
    emb = EmbeddingDir.open(emb_dir)
    emb.check_input([args.input_jsonl])
    records, stats = hard_records(tuples, emb, read_records([args.input_jsonl]), rule)
    write_jsonl(args.output_jsonl, records)
    stats_path = args.stats_json or str(Path(args.output_jsonl).with_suffix(".stats.json"))
    write_json(stats_path, {"input": args.input_jsonl, "output": args.output_jsonl, "embedding_dir": emb_dir,
                            "retriever": emb.meta.get("retriever"), **stats})
    out = stats["outcomes"]
    print(text_table([
        ("verified tuples", stats["tuples"]),
        ("d+ not first / margin < {:g}".format(rule.margin), f"{stats['positive_not_first']} / {stats['margin_below']}"),
        ("guards dropped: near-duplicate / lexical tie", f"{out[NEAR_DUPLICATE]} / {out[LEXICAL_TIE]}"),
        ("over budget", out[OVER_BUDGET]),
        ("hard tuples written (d+ not first)", f"{stats['kept']} ({stats['kept_positive_not_first']})"),
        ("margin mean (all / kept)", f"{stats['margin_all'].get('mean', float('nan')):+.4f} / "
                                     f"{stats['margin_kept'].get('mean', float('nan')):+.4f}"),
    ], indent="  "))
    print(f"06e: wrote {stats['kept']} hard tuples of {stats['tuples']} to {args.output_jsonl}", flush=True)
    print(json.dumps({"tuples": stats["tuples"], "hard": stats["kept"],
                      "positive_not_first": stats["positive_not_first"], **{f"dropped_{k}": out[k] for k in
                                                                           (NEAR_DUPLICATE, LEXICAL_TIE)}}))
    return stats


if __name__ == "__main__":
    run_script(main)
