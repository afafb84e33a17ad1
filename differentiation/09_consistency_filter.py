#!/usr/bin/env python
"""Step 9 (README Eq. 6 + Eq. 7): consistency filter and the single hard negative d-.

Keeps (q_new, d+) only if the current retriever ranks d+ within the top --consistency_k (kappa) of the pool,
and takes d- = the best-scoring negative. --pool local (default, the README): {d+} u the tuple's candidates;
--pool global (the original code): every document of the embedding dir. Writes
final_train_data.bottom_{pp}pct.jsonl lines {"query", "pos_document", "hard_negatives" (best first),
"hard_negative_scores", "d_neg", "pos_rank", "pos_score", "id", "concepts", "source"} and a statistics JSON.

Example (README):
  python differentiation/09_consistency_filter.py --input_jsonl hard_negatives.jsonl --embedding_dir embed_cache/ \\
      --output_jsonl final_train_data.jsonl --top_k 15 --consistency_k 5
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path


from repair.cli import percentile, positive_int, run_script
from repair.data import write_json, write_jsonl
from repair.differentiation.embedding_dir import EmbeddingDir
from repair.differentiation.hard_negatives import check_kappa, consistency_filter
from repair.runtime import setup_logging
from repair.tables import text_table
from repair.differentiation.tuples import load_tuples


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_jsonl", required=True, nargs="+",
                   help="hard-negatives JSONL (08 output) or the expansion JSONL itself; several files allowed")
    p.add_argument("--embedding_dir", required=True, help="output dir of 07_embed_candidates.py")
    p.add_argument("--output_jsonl", required=True,
                   help="final training JSONL, or a directory to write final_train_data.bottom_{pp}pct.jsonl in")
    p.add_argument("--top_k", type=positive_int, default=15,
                   help="negatives written per kept tuple, best first (default: %(default)s)")
    p.add_argument("--consistency_k", type=positive_int, default=5,
                   help="kappa: keep a tuple iff rank(d+) <= kappa (README default 5; the paper uses 2) "
                        "(default: %(default)s)")
    p.add_argument("--pool", choices=["local", "global"], default="local",
                   help="local: {d+} u the tuple's candidates (README Eq. 6); global: all documents (original code)")
    p.add_argument("--pct", type=percentile, default=None,
                   help="bottom percentile for the file name when --output_jsonl is a directory "
                        "(default: read from the input name, e.g. bottom_30pct)")
    p.add_argument("--stats_json", default=None, help="statistics JSON (default: <output>.stats.json)")
    p.add_argument("--batch_size", type=positive_int, default=1024,
                   help="queries per search chunk, --pool global (default: %(default)s)")
    p.add_argument("--device", default=None,
                   help="device for --pool global search: cpu | cuda (default: cuda when available)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    return p.parse_args(argv)


def output_path(output: str, pct: int | None, inputs: list[str]) -> Path:
    """The output file; a directory gets final_train_data.bottom_{pp:02d}pct.jsonl (pp from --pct or the input name)."""
    path = Path(output)
    if not (path.is_dir() or output.endswith(("/", "\\"))):
        return path
    if pct is None:
        found = [m.group(1) for f in inputs if (m := re.search(r"bottom_(\d+)pct", Path(f).name))]
        if not found:
            raise SystemExit(f"--output_jsonl {output} is a directory: pass --pct to name the file "
                             f"(none found in the input names)")
        pct = int(found[0])
    return path / f"final_train_data.bottom_{pct:02d}pct.jsonl"


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    check_kappa(args.top_k, args.consistency_k)  # a bad pair of flags fails before any input is read
    out = output_path(args.output_jsonl, args.pct, args.input_jsonl)
    tuples = load_tuples(args.input_jsonl)  # malformed or empty input fails before anything else
    emb = EmbeddingDir.open(args.embedding_dir)
    emb.check_input(args.input_jsonl)
    records, stats = consistency_filter(tuples, emb, top_k=args.top_k, consistency_k=args.consistency_k,
                                        pool=args.pool, device=args.device, query_chunk=args.batch_size)
    write_jsonl(out, records)
    stats_path = args.stats_json or str(out.with_suffix(".stats.json"))
    write_json(stats_path, {"input": args.input_jsonl, "embedding_dir": args.embedding_dir, "output": str(out),
                            **stats})
    print(text_table([
        ("pool / kappa / top_k", f"{stats['pool']} / {stats['consistency_k']} / {stats['top_k']}"),
        ("processed", stats["processed"]),
        ("kept", stats["kept"]),
        ("dropped: rank(d+) > kappa", stats["dropped_rank_above_k"]),
        ("dropped: no negative", stats["dropped_no_negative"]),
        ("rank(d+) histogram", " ".join(f"{k}:{v}" for k, v in stats["pos_rank_histogram"].items())),
        ("pos / d- score of kept (mean)", f"{stats['pos_score_kept'].get('mean', '-')} / "
                                          f"{stats['d_neg_score_kept'].get('mean', '-')}"),
    ], indent="  "))
    print(f"09: processed {stats['processed']}, kept {stats['kept']}, dropped {stats['dropped']} "
          f"(kept rate {stats['kept_rate']:.2%}) -> {out}", flush=True)
    return stats


if __name__ == "__main__":
    run_script(main)
