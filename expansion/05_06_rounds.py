#!/usr/bin/env python
"""Stage II as the driver runs it: 05 -> 06 rounds until --target_valid valid tuples or --max_rounds rounds.

Round r runs 05 for r x --gen_round queries in all, then 06 on them, each as a driver step (skipped when its
marker in --state_dir exists; command in --logs_dir/<step>.cmd, output in <step>.log), and prints
"expansion round r: V / T valid tuples". A killed run resumes the unfinished round; a finished stage (marker
<iteration>.expansion.done, holding the valid count) is skipped. Everything after "--" goes to 05 as generator
flags (--backend, --model, --adapter, --openai_url ...). With --judge 1 (JUDGE=1, issue 30) each round also runs
06d (expansion/06d_judge_relevance.py, flags in --judge_args) on 06's file into --judged_jsonl, and the judged tuples
are the ones counted. With --hard_jsonl (HARD_TUPLES=1, issue 43) each round also runs 06e
(differentiation/06e_hard_tuples.py, flags in --hard_args) on the verified file, and with --hard_target N the rounds
go on until N hard tuples. run_repair.sh calls this once per iteration.

Example (what the driver runs, shortened):
  python expansion/05_06_rounds.py --iteration iter1 --state_dir run/.state --logs_dir run/logs \\
      --concept_txt run/iter1/diagnosis/PathAB_terms/final_terms.bottom_30pct.txt \\
      --generated_jsonl run/iter1/expansion/generated.bottom_30pct.jsonl \\
      --out_jsonl run/iter1/expansion/expansion.bottom_30pct.jsonl --gen_round 16 --max_rounds 3 \\
      --target_valid 24 --target_k 20 --source local --local_corpus data/demo/scifact-demo -- --backend hf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from repair.cli import non_negative_int, positive_int, run_script, seed_int
from repair.driver.steps import StepFailed, StepRunner
from repair.driver.expansion_rounds import SOURCES, ExpansionRounds, run_expansion_rounds

QUERY_FORM_SETTINGS = ("title", "generated", "t0")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(the flags, the generator flags after ``--``)."""
    own, generator_flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iteration", required=True, help="step-name prefix, e.g. iter1 (steps iter1.05_generate.r1 ...)")
    p.add_argument("--state_dir", required=True, help="the driver's marker folder ($OUT_DIR/.state)")
    p.add_argument("--logs_dir", required=True, help="the driver's log folder ($OUT_DIR/logs)")
    p.add_argument("--expansion", type=int, choices=[0, 1], default=1,
                   help="EXPANSION: 0 skips the stage (default: %(default)s)")
    p.add_argument("--force", type=int, choices=[0, 1], default=0,
                   help="FORCE: 1 reruns every step and starts a finished stage over (default: %(default)s)")
    p.add_argument("--concept_txt", required=True, help="C_conf, 04's final_terms.bottom_{pp}pct.txt")
    p.add_argument("--generated_jsonl", required=True, help="05's output (generated queries)")
    p.add_argument("--out_jsonl", required=True, help="06's output (expansion tuples)")
    p.add_argument("--gen_round", type=positive_int, required=True, help="GEN_ROUND: queries added per round")
    p.add_argument("--max_rounds", type=positive_int, required=True, help="MAX_ROUNDS: rounds at most")
    p.add_argument("--target_valid", type=positive_int, required=True, help="VALID_FACTOR x |T0|: valid tuples wanted")
    p.add_argument("--target_k", type=positive_int, required=True, help="TARGET_K: 06's negative candidates per tuple")
    p.add_argument("--seed", type=seed_int, default=42, help="SEED of 05 (default: %(default)s)")
    p.add_argument("--grounding", default="none", help="GROUNDING of 05 (default: %(default)s)")
    p.add_argument("--query_form", choices=QUERY_FORM_SETTINGS, default="title",
                   help="QUERY_FORM: generated makes 06 write the generated query as q_new; t0 is a later step "
                        "(default: %(default)s)")
    p.add_argument("--source", choices=SOURCES, default="local", help="SOURCE of 06 (default: %(default)s)")
    p.add_argument("--local_corpus", default="", help="LOCAL_CORPUS (SOURCE=local)")
    p.add_argument("--literature_index", default="",
                   help="LITERATURE_INDEX (SOURCE=local): a built on-disk index 06 searches instead of --local_corpus")
    p.add_argument("--s2_key_file", default="", help="S2_KEY_FILE (SOURCE=semantic_scholar; empty: $S2_API_KEY)")
    p.add_argument("--elsevier_key_file", default="",
                   help="ELSEVIER_KEY_FILE (SOURCE=elsevier; empty: $ELSEVIER_API_KEY)")
    p.add_argument("--device", default="", help="DEVICE of 05's generator (empty: 05's default)")
    p.add_argument("--judge", type=int, choices=[0, 1], default=0,
                   help="JUDGE: 1 runs 06d after each 06 and counts its kept tuples (default: %(default)s)")
    p.add_argument("--judged_jsonl", default="", help="06d's output (needed with --judge 1)")
    p.add_argument("--judge_args", default="",
                   help="06d's flags as one shell-quoted string, e.g. \"--backend hf --model qwen2.5-coder-0.5b "
                        "--threshold 0.5 --judge_k 5 --cache_jsonl run/cache/judge.jsonl\"")
    p.add_argument("--hard_jsonl", default="",
                   help="HARD_TUPLES=1: 06e's output; each round then runs differentiation/06e_hard_tuples.py on the "
                        "verified (judged) file (default: no selection)")
    p.add_argument("--hard_args", default="",
                   help="06e's flags as one shell-quoted string (retriever, --margin, --budget, guards, --cache_dir)")
    p.add_argument("--hard_target", type=non_negative_int, default=0,
                   help="HARD_TARGET: with --hard_jsonl, go on until this many hard tuples instead of --target_valid "
                        "verified ones; 0 = count verified ones (default: %(default)s)")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter that runs 05 and 06 (the driver's $PYTHON) (default: this one)")
    return p.parse_args(own), generator_flags


def main(argv: list[str]) -> int:
    args, generator_flags = parse_args(argv)
    if args.judge == 1 and not args.judged_jsonl:
        raise SystemExit("--judge 1 needs --judged_jsonl")
    stage = ExpansionRounds(
        iteration=args.iteration, concept_txt=Path(args.concept_txt), generated_jsonl=Path(args.generated_jsonl),
        out_jsonl=Path(args.out_jsonl), gen_round=args.gen_round, max_rounds=args.max_rounds,
        target_valid=args.target_valid, target_k=args.target_k, seed=args.seed, grounding=args.grounding,
        query_form=args.query_form, source=args.source, local_corpus=args.local_corpus,
        literature_index=args.literature_index,
        s2_key_file=args.s2_key_file, elsevier_key_file=args.elsevier_key_file, generator_flags=generator_flags,
        device=args.device, judged_jsonl=Path(args.judged_jsonl) if args.judge == 1 else None,
        judge_args=args.judge_args, hard_jsonl=Path(args.hard_jsonl) if args.hard_jsonl else None,
        hard_args=args.hard_args, hard_target=args.hard_target)
    runner = StepRunner(Path(args.state_dir), Path(args.logs_dir), force=args.force == 1)
    try:
        run_expansion_rounds(stage, runner, python=args.python, scripts=Path(__file__).absolute().parent,
                             enabled=args.expansion == 1)
    except StepFailed:
        return 1  # the step printed its log and command
    return 0


if __name__ == "__main__":
    run_script(main)
