#!/usr/bin/env python
"""Step 8 (README Eq. 7 ranking): per tuple, rank the negative candidates by s(q_new, d) and keep the top --top_k.

Reads the expansion JSONL and the embedding dir of step 7 (no model is loaded). Writes one line per tuple:
{"id", "query", "pos_document", "hard_negatives" (best first), "hard_negative_scores", "pos_score",
 "n_candidates", "source", "concepts"} (+ "negative_sources"/"negative_traces" when the input has them).
Optional positive-aware false-negative guard (off by default): --fn_margin M drops a candidate scoring above
pos - M, --fn_pct P one scoring above pos * P (NV-Retriever's TopK-MarginPos / TopK-PercPos).

Example (README):
  python differentiation/08_hard_negative_selection.py --input_jsonl expansion.jsonl --embedding_dir embed_cache/ \\
      --output_jsonl hard_negatives.jsonl --top_k 15
"""

from __future__ import annotations

import argparse
from pathlib import Path


from repair.cli import any_float, positive_int, positive_share, run_script
from repair.data import write_json, write_jsonl
from repair.differentiation.embedding_dir import EmbeddingDir
from repair.differentiation.hard_negatives import select_hard_negatives
from repair.runtime import setup_logging
from repair.tables import text_table
from repair.differentiation.tuples import load_tuples


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_jsonl", required=True, nargs="+", help="expansion JSONL (06 output); several files allowed")
    p.add_argument("--embedding_dir", required=True, help="output dir of 07_embed_candidates.py")
    p.add_argument("--output_jsonl", required=True, help="hard-negatives JSONL to write")
    p.add_argument("--top_k", type=positive_int, default=15,
                   help="negatives kept per tuple, best first (default: %(default)s)")
    p.add_argument("--fn_margin", type=any_float, default=None,
                   help="false-negative guard: drop candidates scoring above pos_score - MARGIN (default: off)")
    p.add_argument("--fn_pct", type=positive_share, default=None,
                   help="false-negative guard: drop candidates scoring above pos_score * PCT, e.g. 0.95 (default: off)")
    p.add_argument("--num_gpus", type=positive_int, default=1,
                   help="accepted for the original command line; selection is vectorised on CPU and needs no GPU")
    p.add_argument("--stats_json", default=None, help="statistics JSON (default: <output_jsonl>.stats.json)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    tuples = load_tuples(args.input_jsonl)  # malformed or empty input fails before anything else
    emb = EmbeddingDir.open(args.embedding_dir)
    emb.check_input(args.input_jsonl)
    records, stats = select_hard_negatives(tuples, emb, top_k=args.top_k, fn_margin=args.fn_margin,
                                           fn_pct=args.fn_pct)
    write_jsonl(args.output_jsonl, records)
    stats_path = args.stats_json or str(Path(args.output_jsonl).with_suffix(".stats.json"))
    write_json(stats_path, {"input": args.input_jsonl, "embedding_dir": args.embedding_dir,
                            "output": args.output_jsonl, **stats})
    load = stats["load"]
    print(text_table([
        ("tuples (after merging repeats)", f"{stats['tuples']} ({load['merged_duplicate_tuples']} repeats merged)"),
        ("candidates read / kept", f"{load['candidates_read']} / {stats['candidates']}"),
        ("  removed: empty / duplicate", f"{load['empty_candidates']} / {load['duplicate_candidates']}"),
        ("  removed: equal to a positive", load["candidates_equal_positive"] + load["candidates_twin_positive"]),
        ("false-negative guard dropped", f"{stats['guard_dropped']} in {stats['guard_tuples_affected']} tuples "
                                         f"(margin {stats['fn_margin']}, pct {stats['fn_pct']})"),
        ("tuples without candidates", stats["no_candidates"] + stats["no_candidates_after_guard"]),
        ("pos score (mean/min/max)", _mmm(stats["pos_score"])),
        ("top-1 negative score (mean/min/max)", _mmm(stats["top1_score"])),
    ], indent="  "))
    print(f"08: wrote {stats['written']} of {stats['tuples']} tuples with {stats['negatives_written']} hard "
          f"negatives (top_k {args.top_k}) to {args.output_jsonl} in {stats['seconds']} s", flush=True)
    return stats


def _mmm(summary: dict) -> str:
    return "-" if not summary else f"{summary['mean']:.4f} / {summary['min']:.4f} / {summary['max']:.4f}"


if __name__ == "__main__":
    run_script(main)
