#!/usr/bin/env python
"""CausalNeg hard negatives (second source document, Sec. 3.2) and the paper's baselines (Sec. 4.1).

For each (q, d+) of the input (a T0: BEIR folder + --split, .pt, JSONL {query, positive}; or a triplet file such as
09's final_train_data*.jsonl) writes one triplet line: corpus negatives (BM25-mined, random, or the input's own) and
generated negatives (CoT-guided counterfactual perturbation, or a vanilla SyNeg-style prompt), with parallel
negative_sources ("mined" | "generated") and negative_traces (requirement, perturbation, chain position, ...).

--config picks a row of the paper's comparison; every other flag overrides it:
  random     15 random corpus documents           mined      15 BM25-mined (positives excluded)
  vanilla    3 vanilla generated only             cot        3 CoT counterfactual generated only
  mixture    15 mined + 3 vanilla (SyNeg)         causalneg  15 mined + 3 CoT (train with QEM)
The summary prints the trainer flags the configuration needs (--num_hard_negatives -1, --qem_lambda ...).

Examples:
  python differentiation/09b_counterfactual_negatives.py --config mined --input ../shared/data/scifact --split train \\
      --corpus ../shared/data/scifact --output_jsonl neg/mined.jsonl
  python differentiation/09b_counterfactual_negatives.py --config causalneg --input ../shared/data/scifact \\
      --corpus ../shared/data/scifact --ratio 0.25 --output_jsonl neg/causalneg.jsonl --resume
  # REPAIR's triplets + 3 CoT negatives each (their own hard negatives stay the mined ones):
  python differentiation/09b_counterfactual_negatives.py --config causalneg --input final_train_data.bottom_30pct.jsonl \\
      --corpus corpus_dir --output_jsonl final_train_data.causalneg.jsonl --backend openai --resume
"""

from __future__ import annotations

import argparse
import json
import os
import sys


from repair.cli import (fail, non_negative_float, non_negative_int, positive_float, positive_int, positive_share,
                        probability, run_script, seed_int)
from repair.expansion.generation import add_generator_args, generator_from_args
from repair.differentiation.causalneg.generate import POSITIONS, GenerationSettings
from repair.differentiation.causalneg.inputs import CorpusNegatives, load_items
from repair.differentiation.causalneg.pipeline import CONFIGS, METHODS, MINED_FROM, run_negatives
from repair.runtime import setup_logging
from repair.tables import text_table

S = GenerationSettings.__dataclass_fields__


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="causalneg",
                   help="the paper's configuration (defaults of the flags below) (default: %(default)s)")
    p.add_argument("--input", "--input_jsonl", "--train_data", dest="input", required=True,
                   help="(q, d+) pairs: a BEIR folder (with --split), a .pt / JSONL T0, or a triplet JSONL "
                        "(query, pos_document[, hard_negatives, negative_sources, ...])")
    p.add_argument("--split", default="train", help="qrels split of a BEIR --input (default: %(default)s)")
    p.add_argument("--output_jsonl", "--out_jsonl", dest="output_jsonl", required=True,
                   help="triplet JSONL, appended one complete line per query (see --resume)")
    p.add_argument("--stats_json", default=None, help="statistics file (default: <output_jsonl>.stats.json)")
    p.add_argument("--resume", action="store_true",
                   help="continue --output_jsonl: queries already written are skipped; without it an existing "
                        "output is an error")
    p.add_argument("--max_items", type=positive_int, default=None,
                   help="use only the first N queries of the input (sized experiments)")
    g = p.add_argument_group("corpus negatives")
    g.add_argument("--corpus", default=os.environ.get("REPAIR_LOCAL_CORPUS"),
                   help="BEIR folder (corpus.jsonl[.gz]) or JSONL {id, title, abstract}: BM25 / random negatives and "
                        "the style references of stage 3 (default: $REPAIR_LOCAL_CORPUS; without it, style "
                        "references are other queries' positives)")
    g.add_argument("--index_dir", default=None,
                   help="BM25 index folder (default: $REPAIR_CACHE/bm25/<corpus sha256>, shared with 06)")
    g.add_argument("--mined_from", choices=MINED_FROM, default=None,
                   help="auto: the input's hard negatives when it has them, else BM25; input | bm25 | random | none "
                        "(default: the config's)")
    g.add_argument("--num_mined", type=non_negative_int, default=None,
                   help="corpus negatives per query (default: the config's)")
    g = p.add_argument_group("generated negatives")
    g.add_argument("--method", choices=METHODS, default=None,
                   help="cot: three-stage counterfactual perturbation; vanilla: SyNeg-style single prompt; none "
                        "(default: the config's)")
    g.add_argument("--k", type=non_negative_int, default=None,
                   help="generated negatives per augmented query (default: 3)")
    g.add_argument("--num_requirements", type=positive_int, default=None,
                   help="K requirements asked for in stage 1 (default: max(k, 3))")
    g.add_argument("--position", choices=POSITIONS, default=S["position"].default,
                   help="which requirements of the chain to perturb: front (paper default), back (App. D's best), "
                        "random (default: %(default)s)")
    g.add_argument("--ratio", type=probability, default=1.0,
                   help="fraction of queries that get generated negatives (Sec. 4.5), a seeded choice "
                        "(default: %(default)s)")
    g.add_argument("--generated_from", default=None,
                   help="take the generated negatives from an earlier output of this step (same input, method and "
                        "ratio) instead of generating: e.g. mixture from the vanilla run, causalneg from the cot run")
    g.add_argument("--max_retries", type=non_negative_int, default=S["max_retries"].default,
                   help="new attempts for a malformed generator output before it is counted as failed "
                        "(default: %(default)s)")
    g.add_argument("--style_refs", type=non_negative_int, default=S["style_refs"].default,
                   help="corpus documents shown as style references in stage 3 (default: %(default)s)")
    g.add_argument("--target_words", type=positive_int, default=S["target_words"].default,
                   help="length asked for a generated document (default: %(default)s)")
    g.add_argument("--min_words", type=non_negative_int, default=S["min_words"].default,
                   help="a generated document with fewer words is rejected (default: %(default)s)")
    g.add_argument("--max_doc_chars", type=positive_int, default=S["max_doc_chars"].default,
                   help="the positive is cut to this many characters in prompts (default: %(default)s)")
    g.add_argument("--max_ref_chars", type=positive_int, default=S["max_ref_chars"].default,
                   help="each style reference is cut to this many characters (default: %(default)s)")
    g.add_argument("--chunk_size", type=positive_int, default=8,
                   help="augmented queries per batched generation round (their stage-3 batch is k times larger); a "
                        "kill loses at most one chunk (default: %(default)s)")
    g.add_argument("--seed", type=seed_int, default=S["seed"].default,
                   help="seeds the ratio choice, random negatives, style references and sampling (default: %(default)s)")
    add_generator_args(p, default_batch_help="8")
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", type=non_negative_float, default=S["temperature"].default,
                   help="(default: %(default)s)")
    s.add_argument("--top_p", type=positive_share, default=S["top_p"].default, help="(default: %(default)s)")
    s.add_argument("--repetition_penalty", type=positive_float, default=S["repetition_penalty"].default,
                   help="(default: %(default)s)")
    s.add_argument("--decompose_tokens", type=positive_int, default=S["decompose_tokens"].default,
                   help="max new tokens of a stage-1 decomposition (default: %(default)s)")
    s.add_argument("--write_tokens", type=positive_int, default=S["write_tokens"].default,
                   help="max new tokens of a generated document (default: %(default)s)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    p.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    config = CONFIGS[args.config]
    method = args.method or config.method
    settings = GenerationSettings(
        k=config.k if args.k is None else args.k, num_requirements=args.num_requirements, position=args.position,
        max_retries=args.max_retries, style_refs=args.style_refs, target_words=args.target_words,
        min_words=args.min_words, max_doc_chars=args.max_doc_chars, max_ref_chars=args.max_ref_chars,
        decompose_tokens=args.decompose_tokens, write_tokens=args.write_tokens, temperature=args.temperature,
        top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed)
    if method != "none" and settings.k <= 0:
        fail(f"--k must be >= 1 with method {method}")
    items, counts = load_items(args.input, args.split)  # bad input ends in one line (run_script)
    if args.max_items is not None:
        items = items[:args.max_items]
    corpus = CorpusNegatives(args.corpus, args.index_dir) if args.corpus else None
    generator = None
    if method != "none" and not args.generated_from and args.ratio > 0:
        generator = generator_from_args(args, default_batch_size=8)
    info = {"input": str(args.input), "split": args.split, "load": counts, "corpus": args.corpus,
            "generator": generator.describe() if generator else None}
    result = run_negatives(items, args.output_jsonl, config, generator=generator, corpus=corpus,
                           mined_from=args.mined_from, num_mined=args.num_mined, method=method, ratio=args.ratio,
                           settings=settings, generated_from=args.generated_from, chunk_size=args.chunk_size,
                           resume=args.resume, stats_path=args.stats_json, progress=not args.no_progress,
                           run_info=info)
    gen = result["generation"]
    rows = [("queries in input", result["items"]), ("skipped (done before)", result["skipped_done"]),
            ("lines written", result["written"]), ("augmented queries", result["augmented"]),
            ("corpus negatives", result["corpus_negatives"]), ("generated negatives", result["generated_negatives"]),
            ("generated: failed after retries", gen["negatives_failed"]),
            ("decompositions failed", gen["items_failed_decompose"]),
            ("generator outputs rejected", sum(sum(c.values()) for c in gen["rejected"].values()))]
    print(text_table(rows, indent="  "), file=sys.stderr)
    print(f"  trainer flags: {' '.join(result['trainer_flags'])}", file=sys.stderr)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run_script(main)
