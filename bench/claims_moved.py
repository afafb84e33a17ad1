#!/usr/bin/env python
"""Which test claims a REPAIR row moves against its twin, and whether Stage II's training tuples touch their gold
documents (issue 43: "name with evidence what they do to the model").

Why: a row's mean nDCG@10 can hide a trade: tuples can lift the claims whose gold document they teach as a
positive and push down the claims whose gold document they teach as a hard negative. This reads both rows' per-claim
test nDCG@10 (``<eval_dir>/<row>_s<seed>.test.json``, the study's own evaluation files, or for the subset
protocol's driver rows the driver's own test evaluation), averages each claim's
difference over the seeds both rows have, and sorts the claims by how the candidate run's Stage II tuples (every
final training tuple not from Q_conf's own claims, ``differentiation/final_train_data.*.jsonl`` of ``--run``) use
their gold documents: as a positive, as a hard negative, or not at all. Prints the mean change with its paired
randomization p (over the claims), with several seeds how far they agree on which claims move, that summary, then
the claims that moved most, up and down.

Example:
  python bench/claims_moved.py --eval_dir runs/quality/eval --candidate repair_conf_hard --baseline repair_conf_only \\
      --seeds 1 2 3 --run runs/quality/repair/repair_conf_hard_s1 --scifact ../shared/data/scifact
  # the decoder path (the subset protocol: the driver's own test evaluations, the subset's BEIR folder), with the
  # title-form row of the same seed beside it (--other: do two tuple sets move the same claims?)
  python bench/claims_moved.py --eval_dir runs/quality_smollm2/eval --candidate repair_conf_one_hard_gen \
      --baseline repair_conf_one --seeds 3 --run runs/quality_smollm2/repair/repair_conf_one_hard_gen_s3 \
      --scifact runs/quality_smollm2/data/scifact-subset-256-100-1000 --other repair_conf_one_hard
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import numpy as np

from repair.cli import positive_int, run_script
from repair.data import iter_jsonl, load_beir
from repair.diagnosis.confused_tuples import SOURCE as CONFUSED_SOURCE
from repair.evaluation.report import final_iteration
from repair.metrics import paired_randomization_p
from repair.tables import markdown_table

# the study's folder layout and its per-claim comparison of two rows: one implementation, shared with --compare
from quality_scifact import MOVED, better_worse, claim_changes, mean_changes


def seed_agreement(changes: list[dict[str, float]]) -> tuple[int, int, float]:
    """How far several per-claim changes agree (the seeds of one row, or two rows on one seed): (claims up in every
    one, claims down in every one, mean Pearson r over every pair of them; nan when no pair has two changes that
    vary, e.g. a row identical to its twin). Why: tuples that fix particular confusions move the same claims on
    every seed; changes that are noise in the encoder agree on few claims and correlate near 0."""
    claims = sorted(changes[0])
    up = sum(all(c[q] > MOVED for c in changes) for q in claims)
    down = sum(all(c[q] < -MOVED for c in changes) for q in claims)
    vectors = [np.array([c[q] for q in claims]) for c in changes]
    r = [float(np.corrcoef(a, b)[0, 1]) for i, a in enumerate(vectors) for b in vectors[i + 1:]
         if a.std() > 0 and b.std() > 0]
    return up, down, statistics.mean(r) if r else float("nan")


def _correlation(r: float) -> str:
    return f"correlate r {r:+.2f}" if not math.isnan(r) else "have no correlation (one moved no claim)"


def stage2_use(run_dir: Path, corpus: dict[str, dict[str, str]]) -> tuple[set[str], set[str]]:
    """(documents Stage II's final tuples teach as positives, documents they teach as the hard negative d-), by corpus
    id; d- is the tuple's ``d_neg`` (09's argmax, what training takes with NUM_HARD_NEG=1), else its first negative."""
    by_text = {doc["text"].strip(): doc_id for doc_id, doc in corpus.items()}
    positives, negatives = set(), set()
    for path in sorted((final_iteration(run_dir) / "differentiation").glob("final_train_data.*.jsonl")):
        for rec in iter_jsonl(path, required={"source": str, "pos_document": str, "hard_negatives": list},
                              optional={"d_neg": str}):
            if rec["source"] == CONFUSED_SOURCE:
                continue
            if (doc := by_text.get(rec["pos_document"].strip())) is not None:
                positives.add(doc)
            d_neg = rec.get("d_neg") or (rec["hard_negatives"][0] if rec["hard_negatives"] else "")
            if (doc := by_text.get(str(d_neg).strip())) is not None:
                negatives.add(doc)
    return positives, negatives


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eval_dir", type=Path, required=True,
                   help="the study's eval folder (<row>_s<seed>.<split>.json); a row without that file is read from its "
                        "driver run's last evaluation, <eval_dir>/../repair/<row>_s<seed> (the subset protocol's rows)")
    p.add_argument("--candidate", required=True, help="the row with Stage II's tuples")
    p.add_argument("--baseline", required=True, help="its twin without them")
    p.add_argument("--seeds", type=int, nargs="+", required=True, help="seeds both rows were evaluated for")
    p.add_argument("--run", type=Path, required=True, help="a driver run folder of the candidate row (its tuples)")
    p.add_argument("--scifact", type=Path, required=True, help="the BEIR folder (test claims, qrels, corpus)")
    p.add_argument("--split", default="test",
                   help="test (the study's evaluation files; the subset protocol's driver runs evaluate on test, "
                        "--scifact is then <out>/data/scifact-subset-*) or dev (the full protocol's driver runs' own "
                        "evaluations; --scifact is then the study's T0/dev folder, <out>/data/scifact-t0-dev) "
                        "(default: %(default)s)")
    p.add_argument("--other", metavar="ROW",
                   help="another row with the same twin and seeds (e.g. the same row with other Stage II tuples): "
                        "whether the two rows move the same claims on the same seed, which says the seed (warm start, "
                        "batch order) picks the claims that move rather than what the tuples teach")
    p.add_argument("--top", type=positive_int, default=8, help="claims listed each way (default: %(default)s)")
    args = p.parse_args(argv)
    data = load_beir(args.scifact, args.split)
    try:
        per_seed = [claim_changes(args.eval_dir, args.candidate, args.baseline, s, args.split) for s in args.seeds]
        other = ([claim_changes(args.eval_dir, args.other, args.baseline, s, args.split) for s in args.seeds]
                 if args.other else [])
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(str(err)) from None
    moved = mean_changes(per_seed)
    positives, negatives = stage2_use(args.run, data.corpus)

    def use(qid: str) -> str:
        gold = set(data.qrels.get(qid, {}))
        tags = [name for name, docs in (("positive", positives), ("hard negative", negatives)) if gold & docs]
        return " + ".join(tags) or "–"

    groups: dict[str, list[float]] = {}
    for qid, delta in moved.items():
        groups.setdefault(use(qid), []).append(delta)
    print(f"{args.candidate} - {args.baseline}, {args.split} nDCG@10 per claim, mean over seeds {args.seeds}: "
          f"{statistics.mean(moved.values()):+.4f}, paired randomization p {paired_randomization_p(list(moved.values())):.3f}; "
          f"Stage II's final tuples use {len(positives)} documents as positives, {len(negatives)} as hard negatives")
    if len(per_seed) > 1:
        up, down, r = seed_agreement(per_seed)
        print(f"the same way on every seed: {up} claims up, {down} down; two seeds' per-claim changes {_correlation(r)} "
              f"(mean over pairs of seeds)")
    for seed, change, other_change in zip(args.seeds, per_seed, other):
        up, down, r = seed_agreement([change, other_change])
        print(f"seed {seed}, {args.other} - {args.baseline} beside it: {up} claims up in both, {down} down in both; "
              f"per-claim changes {_correlation(r)}")
    print(markdown_table(["gold document in Stage II's tuples as", "claims", "mean change", "better", "worse"],
                         [[name, len(d), f"{statistics.mean(d):+.4f}", *better_worse(d)]
                          for name, d in sorted(groups.items())]))
    ranked = sorted(moved.items(), key=lambda kv: kv[1])
    shown = [kv for kv in ranked[::-1][:args.top] if kv[1] > 0] + [kv for kv in ranked[:args.top] if kv[1] < 0]
    print()
    print(markdown_table(["claim", "change", "gold in Stage II as", "text"],
                         [[qid, f"{delta:+.3f}", use(qid), data.queries[qid][:90]] for qid, delta in shown]))


if __name__ == "__main__":
    run_script(main)
