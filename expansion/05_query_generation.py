#!/usr/bin/env python
"""Stage II, query generation (paper App. A.2.1): per query, sample 1-3 concepts of C_conf, ground them in
PubChem / the Materials Project (optional; failures are recorded, not fatal), and have the generator write
one research query that is hard for a retriever. Writes the generated-queries JSONL that 06 verifies.

Example (offline default: SmolLM2-135M-Instruct, the retriever's backbone, as generator):
  python expansion/05_query_generation.py --concept_txt final_terms.bottom_30pct.txt \\
      --out_jsonl generated.jsonl --num_queries 64 --seed 42
Example (any OpenAI-compatible server, e.g. vLLM):
  OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python expansion/05_query_generation.py --backend openai \\
      --concept_txt final_terms.bottom_30pct.txt --out_jsonl generated.jsonl --num_queries 1000 --resume
"""

from __future__ import annotations

import argparse
import json
import sys


from repair.cli import fail, positive_float, positive_int, run_script, seed_int
from repair.expansion.generation import (add_generator_args, add_sampling_args, generator_from_args,
                               sampling_from_args)
from repair.expansion.query_generation import Grounder, generate_queries, generation_summary, read_concepts
from repair.runtime import setup_logging
from repair.expansion.sources import SourceError, make_cache


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concept_txt", required=True, help="C_conf: final_terms.bottom_{pp}pct.txt, one concept per line")
    p.add_argument("--out_jsonl", required=True, help="generated-queries JSONL (appended; see --resume)")
    p.add_argument("--num_queries", type=positive_int, default=64,
                   help="total queries to attempt in --out_jsonl, rounded up to whole rounds; raise it and pass "
                        "--resume to generate more (default: %(default)s)")
    p.add_argument("--round_size", type=positive_int, default=8,
                   help="queries per round = one generation batch; keep it fixed for a file (ids r{round}-{j}) "
                        "(default: %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue --out_jsonl: finished rounds are skipped")
    p.add_argument("--seed", type=seed_int, default=42,
                   help="seed of concept sampling and generation (default: %(default)s)")
    p.add_argument("--min_concepts", type=positive_int, default=1,
                   help="concepts per query, at least (default: %(default)s)")
    p.add_argument("--max_concepts", type=positive_int, default=3,
                   help="concepts per query, at most (default: %(default)s)")
    p.add_argument("--prompt", choices=["paper", "original"], default="paper",
                   help="paper: App. A.2.1 prompt over 1-3 grounded concepts; original: the original code's "
                        "three-shot single-term prompt (default: %(default)s)")
    p.add_argument("--grounding", choices=["none", "pubchem", "mp", "both"], default="none",
                   help="ground concepts in PubChem and/or the Materials Project (needs network; MP needs "
                        "$MP_API_KEY) (default: %(default)s)")
    p.add_argument("--pubchem_url", default=None,
                   help="PubChem PUG REST base URL (default: $PUBCHEM_API_URL or the public one)")
    p.add_argument("--mp_url", default=None, help="Materials Project base URL (default: $MP_API_URL or public)")
    p.add_argument("--mp_key_file", default=None, help="Materials Project keys, one per line (default: $MP_API_KEY)")
    p.add_argument("--cache_dir", default=None,
                   help="response cache of the grounding APIs (default: $REPAIR_CACHE/http; 'none' disables it)")
    p.add_argument("--timeout", type=positive_float, default=30.0,
                   help="seconds per grounding request (default: %(default)s)")
    add_generator_args(p, default_batch_help="--round_size")
    add_sampling_args(p)
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    p.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    return p.parse_args(argv)


def build_grounder(args: argparse.Namespace) -> Grounder:
    if args.grounding == "none":
        return Grounder()
    cache = make_cache(args.cache_dir)
    pubchem = mp = None
    if args.grounding in ("pubchem", "both"):
        from repair.expansion.sources.pubchem import PubChem

        pubchem = PubChem(args.pubchem_url, cache=cache, timeout=args.timeout)
    if args.grounding in ("mp", "both"):
        from repair.expansion.sources.materials_project import MaterialsProject

        mp = MaterialsProject(args.mp_url, key_file=args.mp_key_file, cache=cache, timeout=args.timeout)
    return Grounder(pubchem, mp)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    concepts = read_concepts(args.concept_txt)
    try:
        grounder = build_grounder(args)
    except SourceError as exc:
        fail(f"grounding unavailable: {exc}")
    generator = generator_from_args(args, default_batch_size=args.round_size)
    stats = generate_queries(concepts, generator, args.out_jsonl, num_queries=args.num_queries,
                             round_size=args.round_size, seed=args.seed, grounder=grounder, template=args.prompt,
                             min_concepts=args.min_concepts, max_concepts=args.max_concepts,
                             sampling=sampling_from_args(args),
                             resume=args.resume, progress=not args.no_progress)
    summary = {"out_jsonl": args.out_jsonl, "concepts": len(concepts), "generator": generator.describe(),
               "this_run": stats.as_dict(), "grounding": dict(grounder.counts),
               "file_totals": generation_summary(args.out_jsonl)}
    totals = summary["file_totals"]
    print(f"  rounds {totals['rounds']}  generated {totals['generated']}  accepted {totals['accepted']}  "
          f"rejected {totals['rejected']}", file=sys.stderr)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    run_script(main)
