#!/usr/bin/env python
"""How well the relevance judge of step 06d (issue 30) separates relevant from irrelevant abstracts, measured on
T0's own claims before it is trusted, and the threshold chosen on them (never on dev or test).

Data: SciFact train claims minus the dev claims of data/scifact_split/dev_ids.txt (= T0 of the study protocol);
--n_claims of them drawn with --seed. Each claim gives one "yes" pair (its first qrels positive) and --n_neg "no"
pairs: the top BM25 hits of the claim over the SciFact corpus that are not among its qrels positives (hard
negatives, the same BM25 as 06's local source). Each pair is judged exactly as 06d judges a hit (same prompt,
same abstract cut, P(yes) from the logits).

Reported: AUC (sklearn roc_auc_score); accuracy, precision, recall and F1 at 0.5 and at the chosen threshold; the
threshold is the one that maximizes accuracy (ties: the one nearest 0.5) on the even-numbered claims and its
accuracy is also reported on the odd ones (held out), then the same rule on all claims gives the recommended
value; top-1 = the share of claims whose qrels positive gets the highest P(yes) among its pairs (what 06d's
re-pick needs). Results are merged into --out_json under the model's name, with the command and the wall time.

Example:
  OMP_NUM_THREADS=1 python bench/judge_accuracy.py --scifact ../shared/data/scifact --model qwen2.5-coder-0.5b \\
      --n_claims 100 --out_json docs/results/judge_accuracy.json --cache_jsonl runs/judge_bench/cache.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from pathlib import Path

from repair.cli import run_script
from repair.data import load_beir, read_json, read_lines, write_json
from repair.expansion.generation import add_generator_args, generator_from_args
from repair.expansion.relevance_judge import JudgeCache, RelevanceJudge
from repair.runtime import setup_logging

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scifact", required=True, help="the SciFact BEIR folder (corpus, queries, qrels/train.tsv)")
    p.add_argument("--dev_ids", default=str(ROOT / "data" / "scifact_split" / "dev_ids.txt"),
                   help="claims held out as dev, excluded here (default: the study's split)")
    p.add_argument("--n_claims", type=int, default=100, help="T0 claims drawn (default: %(default)s)")
    p.add_argument("--n_neg", type=int, default=2, help="BM25 negatives per claim (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the claim draw (default: %(default)s)")
    p.add_argument("--max_chars", type=int, default=1000,
                   help="abstract cut, as 06d's --max_chars (default: %(default)s)")
    p.add_argument("--cache_jsonl", required=True, help="judgment cache (06d's format; reruns are free)")
    p.add_argument("--out_json", required=True, help="results file; this model's entry is replaced")
    p.add_argument("--index_dir", default=None, help="BM25 index folder (default: REPAIR's cache)")
    add_generator_args(p, default_model_help="qwen2.5-coder-0.5b", default_batch_help="4")
    p.add_argument("--log_level", default="WARNING", help="logging level (default: %(default)s)")
    return p.parse_args(argv)


def pairs_for(args: argparse.Namespace) -> list[dict]:
    """(claim, document, label) pairs: per drawn T0 claim its first qrels positive and its top BM25 non-positives."""
    from repair.expansion.sources.local_corpus import LocalCorpus

    data = load_beir(args.scifact, "train")
    dev = set(read_lines(args.dev_ids)) if args.dev_ids and args.dev_ids != "none" else set()
    t0 = sorted((q for q in data.qrels if q not in dev), key=lambda q: (len(q), q))
    claims = random.Random(args.seed).sample(t0, min(args.n_claims, len(t0)))
    corpus = LocalCorpus(args.scifact, index_dir=args.index_dir)
    pairs = []
    for c, qid in enumerate(claims):
        claim, positives = data.queries[qid], {d for d, s in data.qrels[qid].items() if s > 0}
        pos = sorted(positives, key=lambda d: (len(d), d))[0]
        pairs.append({"claim": c, "qid": qid, "doc": pos, "label": 1})
        negatives = [p.id for p in corpus.search(claim, args.n_neg + len(positives) + 5) if p.id not in positives]
        pairs += [{"claim": c, "qid": qid, "doc": d, "label": 0} for d in negatives[:args.n_neg]]
    for pair in pairs:
        doc = data.corpus[pair["doc"]]
        pair.update(query=data.queries[pair["qid"]], title=doc.get("title", ""), abstract=doc["text"])
    return pairs


def at(probs: list[float], labels: list[int], threshold: float) -> dict:
    tp = sum(p >= threshold and y for p, y in zip(probs, labels))
    fp = sum(p >= threshold and not y for p, y in zip(probs, labels))
    fn = sum(p < threshold and y for p, y in zip(probs, labels))
    correct = sum((p >= threshold) == bool(y) for p, y in zip(probs, labels))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"threshold": round(threshold, 4), "accuracy": round(correct / len(labels), 4),
            "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}


def best_threshold(probs: list[float], labels: list[int]) -> float:
    """The threshold of highest accuracy (ties: nearest 0.5) among the midpoints between sorted distinct P(yes)."""
    values = sorted(set(probs))
    candidates = [0.5] + [(a + b) / 2 for a, b in zip(values, values[1:])]
    return max(candidates, key=lambda t: (at(probs, labels, t)["accuracy"], -abs(t - 0.5)))


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    from sklearn.metrics import roc_auc_score

    if args.backend == "hf" and not args.model:
        args.model = "qwen2.5-coder-0.5b"
    pairs = pairs_for(args)
    generator = generator_from_args(args, default_batch_size=4)
    judge = RelevanceJudge(generator, JudgeCache(args.cache_jsonl), batch_size=args.batch_size or 4,
                           max_chars=args.max_chars)
    t0 = time.time()
    records = []
    for start in range(0, len(pairs), 12):  # the cache is written as it goes: a killed bench resumes
        records += judge.probabilities([(p["query"], p["title"], p["abstract"]) for p in pairs[start:start + 12]])
        print(f"  {len(records)} / {len(pairs)} pairs judged ({time.time() - t0:.0f} s)", file=sys.stderr)
    seconds = time.time() - t0
    probs, labels = [r["p_yes"] for r in records], [p["label"] for p in pairs]
    even = [i for i, p in enumerate(pairs) if p["claim"] % 2 == 0]
    odd = [i for i, p in enumerate(pairs) if p["claim"] % 2 == 1]
    t_even = best_threshold([probs[i] for i in even], [labels[i] for i in even])
    chosen = best_threshold(probs, labels)
    by_claim: dict[int, list[int]] = {}
    for i, p in enumerate(pairs):
        by_claim.setdefault(p["claim"], []).append(i)
    top1 = sum(max(idx, key=lambda i: (probs[i], labels[i] == 0)) == idx[0] for idx in by_claim.values())
    result = {
        "model": judge.identity, "n_claims": len(by_claim), "n_pairs": len(pairs), "n_yes": sum(labels),
        "auc": round(float(roc_auc_score(labels, probs)), 4),
        "at_0.5": at(probs, labels, 0.5),
        "chosen": {**at(probs, labels, chosen), "rule": "max accuracy on all pairs (ties: nearest 0.5)"},
        "held_out": {"chosen_on_even_claims": at([probs[i] for i in even], [labels[i] for i in even], t_even),
                     "on_odd_claims": at([probs[i] for i in odd], [labels[i] for i in odd], t_even)},
        "top1_positive_rated_highest": round(top1 / len(by_claim), 4),
        "mean_p_yes": {"yes_pairs": round(sum(p for p, y in zip(probs, labels) if y) / max(1, sum(labels)), 4),
                       "no_pairs": round(sum(p for p, y in zip(probs, labels) if not y)
                                         / max(1, len(labels) - sum(labels)), 4)},
        "p_yes_from": dict(judge.sources), "computed": judge.computed, "reused_from_cache": judge.reused,
        "seconds": round(seconds, 1), "seconds_per_computed_pair": round(seconds / max(1, judge.computed), 2),
        "threads": os.environ.get("OMP_NUM_THREADS", "unset"), "max_chars": args.max_chars, "seed": args.seed,
        "command": "python bench/judge_accuracy.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
    }
    out = Path(args.out_json)
    results = read_json(out) if out.exists() else {}
    results[str(judge.identity.get("model"))] = result
    write_json(out, results)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    run_script(main)
