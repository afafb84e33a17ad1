#!/usr/bin/env python
"""Measured quality on SciFact: does REPAIR beat plain fine-tuning here? (issues 9 and 16)

Protocol (issue 16, the default): a seeded dev set of 162 of SciFact's 809 train claims
(``data/scifact_split/dev_ids.txt``; their documents stay in the corpus), T0 = the other 647 claims (one positive
each). Every row is evaluated on the dev claims (nDCG@10, exact search over the full 5,183-document corpus) plus
BIOSSES Spearman; settings are chosen on dev; ``--test`` also evaluates a row on the 300 test claims, which is
done for the baseline rows and the final REPAIR rows only (rerunning a finished dev row with ``--test`` adds only
its test numbers). ``--dev_ids none`` is the issue-9 protocol (T0 = all
809 claims, test only). Every trained row gets the same budget (``--steps``, default 2 epochs of T0 at batch 32 =
42 steps) and the same settings; rows are run per seed.

Rows (``--rows``; each row's result lands in <out>/rows/<row>.json and is skipped when present):
  offshelf              the backbone as is
  inbatch               fine-tuned on T0, in-batch negatives only
  bm25                  fine-tuned on T0 + the top BM25 hit that is not a positive (bm25s), one per claim
  st_mined              fine-tuned on T0 + one dense negative per claim mined by sentence-transformers'
                        mine_hard_negatives (the library, off-the-shelf backbone, its relative-margin guard)
  repair                run_repair.sh, 2 iterations (diagnosis -> expansion with the local-corpus source ->
                        differentiation -> training on T0 + new triplets), each iteration 52 steps from the last
  causalneg             as repair with NEGATIVES=causalneg (CoT counterfactual negatives on --cn_ratio of the kept
                        tuples + QEM); iteration 1's stages up to 09 are copied from repair_s<seed> when it has them
  repair_basegen        as repair, but the generator is the plain backbone in every iteration (GEN_ADAPTER=none;
                        the paper merges the retriever's adapter into it); iteration 1 is copied from repair_s<seed>
  bm25_conf             bm25's data + repair_conf_only's kept tuples (lever 3 on top of the strongest baseline)
  inbatch2x / bm25x2 / st_minedx2  the 2-iteration budget (2 x --steps) for plain fine-tuning: one schedule of twice
                        the steps, to compare with repair iter 2 and the lever-4 rows
  inbatch_cont / bm25_cont  inbatch_s<seed> / bm25_s<seed> trained --steps more on the same data: the controls of
                        the lever-4 rows that start from those models (repair_conf_only_from_ft, repair_conf_bm25_from_bm25)
  st_reference          sentence-transformers' own trainer (MultipleNegativesRankingLoss), the calibration peer
  repair_conf_d2q       issue 30: repair_conf_only + Stage II as doc2query (QUERY_FORM=doc2query, Qwen2.5-Coder-1.5B
                        on CTranslate2): a claim written from each document that outranks a confused claim's positive;
                        _mixed asks for a claim, a question and a keyword query in turn, _contrast for a claim that
                        fits the document and not the positive it outranked (06c --contrast); all fix GEN_SEED=1, so
                        a later seed copies the lowest finished seed's stages up to 09 (one generation, paid once)
  repair_conf_t0_15     issue 30: repair_conf_only + Stage II's concept queries (Qwen2.5-Coder-1.5B on CTranslate2),
                        verified, then rewritten as claims in T0's style (QUERY_FORM=t0)
  repair_lit_bm25s      issue 41: the faithful Stage II (default generator, title form, half a round, one generation
                        for every seed) verified through the in-memory bm25s source; repair_lit_index the same 05
                        queries verified through the on-disk tantivy index of the same corpus (paired per seed)
  repair_conf_hard      issue 43: repair_conf_only + the faithful title-form Stage II tuples that the retriever gets
                        wrong or nearly (HARD_TUPLES=1, HARD_MARGIN 0.2), rounds until 130 hard or 3; _gen: the
                        generator's own query as q_new (QUERY_FORM=generated), which the retriever mostly gets wrong
  repair_conf_one       issue 30: the decoder form of repair_conf_bm25_one (in-batch warm start, then lever 3 in the
                        same schedule); its control is inbatch2x
  repair_conf_one_hard  issue 43 on the decoder path: repair_conf_one + the title-form Stage II tuples that its warm
                        start ranks wrong (HARD_MARGIN 0: d+ not first), rounds until 77 hard or 3; twin repair_conf_one;
                        _gen: the generator's own query as q_new (QUERY_FORM=generated, the form MiniLM's dev chose)
  repair_conf_bm25_one_hard_gen  issue 43 (c): the dev-chosen REPAIR row (repair_conf_bm25_one, 84 steps) + the
                        dev-chosen hard Stage II form (repair_conf_hard_gen's); its control is bm25x2
  (every lever row: VARIANTS below)

    python bench/quality_scifact.py --scifact ../shared/data/scifact --out runs/quality --rows offshelf inbatch bm25 repair --seeds 1 2
    python bench/quality_scifact.py --out runs/quality --summarize      # the table for docs/results.md
    # the secondary study: SmolLM2-135M (EOS pooling, LoRA lr 1e-3, 32 steps per training) on a 256/100/1000
    # subset at 128 tokens; REPAIR's trainings hold a hard negative per query, hence the GradCache chunking
    O="--out runs/quality_smollm2_b --subset 256 100 1000 --model smollm2-135m --full_finetune 0 --lora_lr 1e-3
       --temperature 0.02 --max_length 128 --steps 32 --iters 2 --max_rounds 1"
    python bench/quality_scifact.py $O --rows offshelf inbatch inbatch2x --seeds 1
    python bench/quality_scifact.py $O --rows repair repair_basegen --seeds 1 --mini_batch_size 32
    # a REPAIR row minus its control, seed by seed, from the recorded exports (the README's Results plot)
    python bench/quality_scifact.py --pair docs/results/scifact_minilm.json repair_conf_bm25_one bm25x2 \
        --pair docs/results/scifact_smollm2_subset.json repair_conf_one inbatch2x --paired_plot paired.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterable, NamedTuple
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from repair.data import (file_sha256, iter_jsonl, load_beir, load_qrels, load_seed, read_jsonl, read_lines, write_jsonl,
                         write_lines)
from repair.evaluation.beir_slice import write_beir_slice
from repair.evaluation.report import final_iteration
from repair.driver.steps import step_outputs, write_outputs
from repair.encoding import link_cache
from repair.tables import markdown_table
from repair.training.trainer import training_finished
from repair.training.config import epoch_steps

PY = sys.executable
DEV_IDS = ROOT / "data" / "scifact_split" / "dev_ids.txt"
DEV_FRACTION, DEV_SEED = 0.2, 2026


def trained_steps(folder: Path) -> int:
    """Optimizer steps a finished training took, read from its train_log.jsonl (the last logged step)."""
    steps = [int(r["step"]) for r in iter_jsonl(folder / "train_log.jsonl", skip_partial_last=True)]
    return max(steps, default=0)


def own_steps(folder: Path) -> int:
    """The optimizer steps a training took itself: its last step less the step it continued from (--continue_from,
    a slice of one schedule; 0 otherwise)."""
    start = json.loads((folder / "training_args.json").read_text()).get("continued_from_step") or 0
    return trained_steps(folder) - start


def carve_dev_ids(train_qrels: Path, fraction: float = DEV_FRACTION, seed: int = DEV_SEED) -> list[str]:
    """A seeded share of the train claims held out as dev (sorted ids). Seeded so the split is re-derivable, and kept
    in the repo so no later change of this function can move it."""
    ids = sorted(load_qrels(train_qrels), key=lambda q: (len(q), q))
    random.Random(seed).shuffle(ids)
    return sorted(ids[: round(fraction * len(ids))], key=lambda q: (len(q), q))


def write_dev_folder(scifact: Path, dev_ids: list[str], folder: Path) -> dict:
    """A BEIR folder whose qrels/train.tsv is T0 (train minus dev), qrels/dev.tsv the dev claims and qrels/test.tsv
    SciFact's test claims; corpus and queries are links to the original files (same documents, same texts)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in scifact.iterdir():
        if f.is_file() and not (folder / f.name).exists():
            (folder / f.name).symlink_to(f.resolve())
    header = "query-id\tcorpus-id\tscore"
    rows = [r for r in (scifact / "qrels" / "train.tsv").read_text().splitlines()[1:] if r.strip()]
    dev = set(dev_ids)
    missing = dev - {r.split("\t")[0] for r in rows}
    if missing:
        raise SystemExit(f"{DEV_IDS}: {len(missing)} ids are not SciFact train claims (e.g. {sorted(missing)[0]})")
    write_lines(folder / "qrels" / "train.tsv", [header] + [r for r in rows if r.split("\t")[0] not in dev])
    write_lines(folder / "qrels" / "dev.tsv", [header] + [r for r in rows if r.split("\t")[0] in dev])
    shutil.copy2(scifact / "qrels" / "test.tsv", folder / "qrels" / "test.tsv")
    return {"t0_claims": len({r.split("\t")[0] for r in rows}) - len(dev), "dev_claims": len(dev)}


def run(cmd: list[str], log: Path, env: dict | None = None) -> float:
    """Run a command with its output in ``log``; raise with the log's tail on failure. Returns seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(map(str, cmd)) + "\n")
        fh.flush()
        proc = subprocess.run(list(map(str, cmd)), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n--- {log} ---\n{tail}")
    return time.time() - t0


class Variant(NamedTuple):
    """A REPAIR configuration (issue 16's levers), one driver row. Each is opt-in; "repair" is the faithful pipeline."""
    settings: dict[str, str]   # extra driver settings (run_repair.sh variables)
    # "STEP[:ROW]": the last iteration-1 step shared with ROW_s<seed> (default repair): those steps' outputs are
    # copied instead of recomputed, since the same commands with the same seed write the same files; None = nothing
    shared: str | None = None
    budget: str = "steps"      # "steps": --steps optimizer steps; "claims": 2 epochs of T0 + tuples (lever 4);
                               # "driver": the driver's own ITER_STEPS=t0 budget, --steps per training (WARM_START rows)
    start: str = "offshelf"    # a baseline row ("inbatch", "bm25"): iteration 1 diagnoses and trains <row>_s<seed>'s
                               # model (lever 4), whose --steps count in the row's steps
    # "STEP": with GEN_SEED fixed in ``settings`` no step up to STEP takes the training seed (Stages I-III run on the
    # off-the-shelf model; only generation is seeded), so a seed's run copies them from the row's lowest other seed
    # that finished them: every seed trains on one generation, which is paid once (issue 30: "reuse identical
    # generations across rows and seeds"); the seeds then measure training's spread, not the generation's
    seed_free: str | None = None


D2Q_PROMPT = "--k 2 --max_example_chars 300"  # the doc2query rows' 06c prompt (issue 30)

# a LITERATURE_INDEX value that stands for SciFact's corpus as an on-disk index, built under --out on first use
# (Study.scifact_index); not a path, so a row that names it cannot reach the driver unresolved
SCIFACT_INDEX = "<scifact literature index>"

VARIANTS: dict[str, Variant] = {
    "repair": Variant({}, None),
    "repair_conf": Variant({"CONFUSED_TUPLES": "1"}, "06"),      # lever 3: Q_conf's own claims through Stage III too
    "repair_conf_only": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0"}, "04"),  # lever 3 without Stage II's tuples
    # lever 5 on lever 3: 08's false-negative guard over lever 3's diagnosis, tuples and embeddings
    "repair_conf_only_guard": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "FN_PCT": "0.95"}, "07:repair_conf_only"),
    "repair_conf_all": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "PCT": "100"}, None),  # every T0 claim diagnosed
    "repair_guard": Variant({"FN_PCT": "0.95"}, "07"),           # lever 5: 08's false-negative guard (NV-Retriever PercPos)
    "repair_global": Variant({"POOL": "global"}, "08"),          # lever 5: the original's global pool in 09
    "repair_neg3": Variant({"NUM_HARD_NEG": "3"}, "09"),         # lever 5: three hard negatives per triplet
    "repair_qgen": Variant({"QUERY_FORM": "generated"}, "05"),   # lever 2: the LLM's own query is q_new
    "repair_eqclaims": Variant({}, "09", budget="claims"),  # lever 4: T0's full epochs + the tuples (more steps)
    # lever 1: Qwen2.5-Coder-1.5B-Instruct served by llama.cpp (--served_generator URL) writes the queries; the
    # _gen / _t0 rows share its generated queries (the same 05 command) and change only what q_new is (lever 2)
    "repair_qwen": Variant({"QWEN": "1"}, "04"),
    "repair_qwen_gen": Variant({"QWEN": "1", "QUERY_FORM": "generated"}, "05:repair_qwen"),
    "repair_qwen_t0": Variant({"QWEN": "1", "QUERY_FORM": "t0"}, "06:repair_qwen"),
    "repair_qwen_gen_conf": Variant({"QWEN": "1", "QUERY_FORM": "generated", "CONFUSED_TUPLES": "1"}, "06:repair_qwen_gen"),
    # lever 1 in-process (no llama.cpp build): Qwen2.5-Coder-0.5B-Instruct through transformers (GENERATORS=1), a
    # half-size generation round (GEN_ROUND 324 of |T0| 647) so a row fits a session on two CPU cores, and the
    # diagnosis of lever 3's row (the same Stage I commands). The _gen row (levers 1 + 2: the LLM's query is q_new)
    # generates; the title row (lever 1 alone) shares its generated queries and redoes verification; _gen_conf
    # (levers 1 + 2 + 3) shares its verified tuples and adds Q_conf's own claims in Stage III.
    "repair_qwen05_gen": Variant({"GEN_MODEL": "qwen2.5-coder-0.5b", "GEN_ROUND": "324", "QUERY_FORM": "generated"},
                          "04:repair_conf_only"),
    "repair_qwen05": Variant({"GEN_MODEL": "qwen2.5-coder-0.5b", "GEN_ROUND": "324"}, "05:repair_qwen05_gen"),
    "repair_qwen05_gen_conf": Variant({"GEN_MODEL": "qwen2.5-coder-0.5b", "GEN_ROUND": "324", "QUERY_FORM": "generated",
                                "CONFUSED_TUPLES": "1"}, "06:repair_qwen05_gen"),
    # lever 2's claim rewrite with the same generator: 06's title-form tuples (repair_qwen05's, when that row ran in
    # this folder; else the same 05 and 06 commands run here) rewritten by 06c as claims in T0's style
    "repair_qwen05_t0": Variant({"GEN_MODEL": "qwen2.5-coder-0.5b", "GEN_ROUND": "324", "QUERY_FORM": "t0"},
                                "06:repair_qwen05"),
    # lever 1 with the larger generator, in-process like the 0.5B rows (the served rows above need llama.cpp's server,
    # a ~1 h build here): Qwen2.5-Coder-1.5B-Instruct (the same Q4_K_M GGUF, converted to fp32) in
    # repair_qwen05_gen's configuration, so the two rows differ only in the generator
    "repair_qwen15_gen": Variant({"GEN_MODEL": "qwen2.5-coder-1.5b", "GEN_ROUND": "324", "QUERY_FORM": "generated"},
                                 "04:repair_conf_only"),
    "repair_from_ft": Variant({}, None, start="inbatch"),  # lever 4: iteration 1 starts from inbatch_s<seed>
    # levers 4 and 5 on lever 3's configuration (the best on dev): the same diagnosis and tuples, reused
    "repair_conf_only_neg3": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "NUM_HARD_NEG": "3"}, "09:repair_conf_only"),
    "repair_conf_only_global": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "POOL": "global"}, "08:repair_conf_only"),
    "repair_conf_only_eqclaims": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0"}, "09:repair_conf_only", budget="claims"),
    "repair_conf_only_from_ft": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0"}, None, start="inbatch"),
    # the bm25_conf row as a driver run (T0_NEGATIVES=bm25, PROFILE=confused-bm25's levers): the same training data
    "repair_conf_bm25": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "T0_NEGATIVES": "bm25"}, "09:repair_conf_only"),
    # levers 3 + 4 + bm25 negatives for T0: lever 4's start (inbatch_s<seed>) and diagnosis with bm25_conf's data
    "repair_conf_bm25_from_ft": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "T0_NEGATIVES": "bm25"},
                                        "09:repair_conf_only_from_ft", start="inbatch"),
    # the same from the strongest baseline's model: diagnose bm25_s<seed> and train it 42 more steps with its own
    # data plus lever 3's tuples (the equal-steps control is bm25x2, 84 steps of BM25 negatives)
    "repair_conf_bm25_from_bm25": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "T0_NEGATIVES": "bm25"}, None,
                                          start="bm25"),
    # lever 4 in one schedule (SCHEDULE=one): the driver's warm start is the first --steps of one 2 x --steps BM25
    # schedule (bm25x2's first half, the same commands and data), iteration 1 diagnoses that model and goes on with the
    # same optimizer and LR schedule, lever 3's tuples added; bm25x2 is its exact control (no second warmup in either)
    # (when repair_conf_bm25_one_hard_gen ran this seed first, its warm start and Stage I are copied: the same commands)
    "repair_conf_bm25_one": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "T0_NEGATIVES": "bm25",
                                     "WARM_START": "1", "ITER_STEPS": "t0", "SCHEDULE": "one"},
                                    "04:repair_conf_bm25_one_hard_gen", budget="driver"),
    # the decoder form of repair_conf_bm25_one (issue 30 section 1): in-batch negatives for T0 throughout, since hard
    # negatives from step 1 slow SmolLM2's escape from its collapsed embeddings; the warm start is inbatch2x's first
    # half (the same commands and data), iteration 1 diagnoses that model and goes on in the same schedule with
    # lever 3's tuples added; inbatch2x (one schedule of 2 x --steps in-batch steps) is its exact control
    # (when repair_conf_one_hard_gen ran this seed first, its warm start and Stage I are copied: the same commands)
    "repair_conf_one": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "WARM_START": "1", "ITER_STEPS": "t0",
                                "SCHEDULE": "one"}, "04:repair_conf_one_hard_gen", budget="driver"),
    # issue 43 on the decoder path: repair_conf_one (its twin: the same warm start, diagnosis and 32 steps) + the
    # faithful title-form Stage II tuples for the concepts that model confuses, keeping only those its warm start ranks
    # wrong (HARD_MARGIN 0: another verified hit scores above d+; a scale-free rule, since the decoder's cosines are
    # not on MiniLM's scale, where 0.2 was chosen); rounds of 324 until as many hard tuples as Q_conf's claims (77)
    # or 3 rounds; a seed's own generation (its concepts are its warm start's)
    "repair_conf_one_hard": Variant({"CONFUSED_TUPLES": "1", "WARM_START": "1", "ITER_STEPS": "t0", "SCHEDULE": "one",
                                     "GEN_ROUND": "324", "MAX_ROUNDS": "3", "HARD_TUPLES": "1", "HARD_MARGIN": "0",
                                     "HARD_TARGET": "77"}, None, budget="driver"),
    # the same with the form MiniLM's dev chose (repair_conf_hard_gen): the generator's own query as q_new
    # (QUERY_FORM=generated), which the title form's 3-6 hard tuples in three rounds could not supply; everything
    # else repair_conf_one_hard's (rule, target, rounds), so repair_conf_one stays the twin; the warm start and Stage I
    # are copied from repair_conf_one_hard's run of the same seed when it has one (the same commands)
    "repair_conf_one_hard_gen": Variant({"CONFUSED_TUPLES": "1", "WARM_START": "1", "ITER_STEPS": "t0",
                                         "SCHEDULE": "one", "GEN_ROUND": "324", "MAX_ROUNDS": "3", "HARD_TUPLES": "1",
                                         "HARD_MARGIN": "0", "HARD_TARGET": "77", "QUERY_FORM": "generated"},
                                        "04:repair_conf_one_hard", budget="driver"),
    # issue 30 section 3: Stage II as doc2query on lever 3's configuration (the same diagnosis, reused): the 1.5B
    # generator (CTranslate2 int8) writes a claim from each document that outranks a confused claim's positive;
    # repair_conf_only is the same configuration without these tuples (Stage II's own contribution)
    # (two T0 examples cut to 300 characters: a ~440-token prompt instead of ~990; on one thread the 1.5B wrote a
    # chunk of 8 in 145 s with it, and had not finished the first chunk after 6.5 minutes with the default prompt)
    # (GEN_SEED 1: seed 1's generation, which its seed-1 row was measured with, is every seed's)
    "repair_conf_d2q": Variant({"CONFUSED_TUPLES": "1", "QUERY_FORM": "doc2query", "GEN_MODEL": "qwen2.5-coder-1.5b",
                                "GEN_BACKEND": "ct2", "QUERY_EXTRA": D2Q_PROMPT, "GEN_SEED": "1"},
                               "04:repair_conf_only", seed_free="09"),
    "repair_conf_d2q_mixed": Variant({"CONFUSED_TUPLES": "1", "QUERY_FORM": "doc2query", "QUERY_STYLE": "mixed",
                                      "GEN_MODEL": "qwen2.5-coder-1.5b", "GEN_BACKEND": "ct2", "QUERY_EXTRA": D2Q_PROMPT,
                                      "GEN_SEED": "1"}, "04:repair_conf_d2q", seed_free="09"),
    # doc2query told to write what tells the document apart from the positive it outranked (06c --contrast), since
    # repair_conf_d2q's claims restated titles the retriever already ranked first (90 of 96)
    "repair_conf_d2q_contrast": Variant({"CONFUSED_TUPLES": "1", "QUERY_FORM": "doc2query",
                                         "GEN_MODEL": "qwen2.5-coder-1.5b", "GEN_BACKEND": "ct2",
                                         "QUERY_EXTRA": f"{D2Q_PROMPT} --contrast", "GEN_SEED": "1"},
                                        "04:repair_conf_d2q", seed_free="09"),
    # issue 30 section 3's first form on lever 3's configuration: the 1.5B (CTranslate2 int8) writes the concept
    # queries (05, half a round as repair_qwen15_gen), 06 verifies them, 06c rewrites each verified title as a claim in
    # T0's style (the 0.5B could not: repair_qwen05_t0); repair_conf_only is its twin without Stage II
    "repair_conf_t0_15": Variant({"CONFUSED_TUPLES": "1", "QUERY_FORM": "t0", "GEN_MODEL": "qwen2.5-coder-1.5b",
                                  "GEN_BACKEND": "ct2", "GEN_ROUND": "324", "QUERY_EXTRA": D2Q_PROMPT, "GEN_SEED": "1"},
                                 "04:repair_conf_d2q", seed_free="09"),
    # issue 41's paired row: the faithful pipeline's Stage II (the default generator's concept queries, title form,
    # half a round, one generation for every seed) verified against SciFact's corpus through today's in-memory bm25s
    # source, and the same 05 queries verified through the on-disk tantivy index built from the same corpus
    # (LITERATURE_INDEX; SCIFACT_INDEX is replaced by <out>/literature/scifact, built on first use): the two rows
    # differ only in 06's engine, so their difference per seed is what the index costs in quality
    "repair_lit_bm25s": Variant({"GEN_ROUND": "324", "GEN_SEED": "1"}, None, seed_free="09"),
    "repair_lit_index": Variant({"GEN_ROUND": "324", "GEN_SEED": "1", "LITERATURE_INDEX": SCIFACT_INDEX},
                                "05:repair_lit_bm25s", seed_free="09"),
    # issue 43: lever 3 + Stage II's faithful title-form tuples, of which only the ones the off-the-shelf retriever
    # gets wrong or nearly (HARD_TUPLES=1: d+ not first, or margin below HARD_MARGIN) are kept; the rounds go on
    # (GEN_ROUND 324 each, round 1 = repair_lit_bm25s's 05) until as many hard tuples as Q_conf's kept claims (130)
    # or 3 rounds. HARD_MARGIN 0.2: the title form's 20th percentile (43 of 214 at round 1); its twin is
    # repair_conf_only (the same training without Stage II's tuples)
    "repair_conf_hard": Variant({"CONFUSED_TUPLES": "1", "GEN_ROUND": "324", "GEN_SEED": "1", "MAX_ROUNDS": "3",
                                 "HARD_TUPLES": "1", "HARD_MARGIN": "0.2", "HARD_TARGET": "130"},
                                "05:repair_lit_bm25s", seed_free="09"),
    # the tuples the retriever gets *wrong*: the same first round of 05 (repair_lit_bm25s's, copied) with the
    # generator's own query as q_new (QUERY_FORM=generated), where the off-the-shelf retriever ranks another hit above
    # the verified positive for 185 of 214 tuples; the same selection rule and guards
    "repair_conf_hard_gen": Variant({"CONFUSED_TUPLES": "1", "GEN_ROUND": "324", "GEN_SEED": "1",
                                     "QUERY_FORM": "generated", "HARD_TUPLES": "1", "HARD_MARGIN": "0.2"},
                                    "05:repair_lit_bm25s", seed_free="09"),
    # issue 43 (c): the dev-chosen full REPAIR row (repair_conf_bm25_one: bm25x2's first 42 steps, Stage I on that
    # model, the last 42 steps of the same schedule with lever 3's tuples) + the hard Stage II form that dev chose
    # at 42 steps (repair_conf_hard_gen: dev 0.7228 against the title form's 0.7187), with its rule unchanged
    # (HARD_MARGIN 0.2, one round of 324); the concepts are the warm start's, so each seed generates its own
    "repair_conf_bm25_one_hard_gen": Variant({"CONFUSED_TUPLES": "1", "T0_NEGATIVES": "bm25", "WARM_START": "1",
                                              "ITER_STEPS": "t0", "SCHEDULE": "one", "GEN_ROUND": "324",
                                              "QUERY_FORM": "generated", "HARD_TUPLES": "1", "HARD_MARGIN": "0.2"},
                                             None, budget="driver"),
    # Eq. 6 with kappa = TOP_K: keep the diagnosed claims whose gold positive ranks low in its own pool (the most
    # confused ones, which kappa 5 drops although their positive is gold, not generated)
    "repair_conf_only_k15": Variant({"CONFUSED_TUPLES": "1", "EXPANSION": "0", "CONSISTENCY_K": "15"}, "08:repair_conf_only"),
}

# ``Variant.shared``'s STEP: the iteration-1 step whose done marker says a source row has finished it
SHARED_UPTO = {"04": "04_merge", "05": "05_generate.r1", "06": "expansion", "07": "07_embed", "08": "08_hardneg",
               "09": "09_consistency", "eval": "eval"}


def variant_settings(row: str, served_generator: str | None) -> dict[str, str]:
    """A lever row's run_repair.sh settings: ``VARIANTS``' own, with ``QWEN`` turned into the served generator's
    (``GENERATOR=openai`` at ``served_generator``, llama.cpp's repeat penalty as 05's sampling)."""
    settings = dict(VARIANTS[row].settings)
    if settings.pop("QWEN", None):
        if not served_generator:
            raise SystemExit(f"{row}: needs --served_generator URL (python -m repair.model_packages serve "
                             "qwen2.5-coder-1.5b --port 8080 --n_threads 1)")
        settings.update({"GENERATOR": "openai", "OPENAI_URL": served_generator,
                         "OPENAI_EXTRA": '{"repeat_penalty": 1.2}'})
    return settings


class Study:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out).resolve()
        self.rows = self.out / "rows"
        self.rows.mkdir(parents=True, exist_ok=True)
        self.scifact = str(Path(args.scifact).resolve())
        self.dev = args.dev_ids.lower() != "none" and not args.subset
        if args.subset:
            self.scifact = self.make_subset(*args.subset)
        elif self.dev:
            self.scifact = self.make_dev_folder(Path(args.dev_ids))
        if args.steps is None:  # 2 epochs of T0 at batch 32: 42 steps on the 647 T0 claims (52 on all 809)
            args.steps = epoch_steps(len(load_seed(self.scifact, split="train")), 32, epochs=2)
        self.biosses = str(Path(args.biosses).resolve())
        # what a row is chosen on: dev claims under the dev protocol, else (issue 9) the test claims
        self.select_split = "dev" if self.dev else "test"

    # ---------------------------------------------------------------- shared pieces
    def make_dev_folder(self, ids_file: Path) -> str:
        """T0 / dev / test as one BEIR folder; the dev ids come from the repo (written once if absent)."""
        scifact = Path(self.scifact)
        if not ids_file.exists():
            write_lines(ids_file, carve_dev_ids(scifact / "qrels" / "train.tsv"))
        folder = self.out / "data" / "scifact-t0-dev"
        counts = write_dev_folder(scifact, read_lines(ids_file), folder)
        print(json.dumps({"dev_folder": str(folder), "dev_ids": str(ids_file), **counts}), flush=True)
        return str(folder)

    def make_subset(self, n_train: int, n_test: int, n_docs: int) -> str:
        """A documented SciFact subset (seeded, positives kept) for backbones too slow for the full corpus on a CPU."""
        folder = self.out / "data" / f"scifact-subset-{n_train}-{n_test}-{n_docs}"
        if not (folder / "qrels" / "test.tsv").exists():
            counts = write_beir_slice(load_beir(self.scifact, "train"), load_beir(self.scifact, "test"), folder,
                                      n_train, n_test, n_docs, seed=13)
            print(json.dumps({"subset": str(folder), **counts}), flush=True)
        return str(folder)

    def train_flags(self, steps: int) -> list[str]:
        a = self.args
        flags = ["--model", a.model, "--max_length", str(a.max_length), "--temperature", str(a.temperature),
                 "--global_batch_size", "32", "--mini_batch_size", str(a.mini_batch_size), "--lr", str(a.lr), "--warmup_ratio", "0.1",
                 "--weight_decay", "0.01", "--epochs", "100", "--max_steps", str(steps), "--save_steps", "0",
                 "--no_progress"]
        if a.full_finetune:
            flags.append("--full_finetune")
        elif a.lora_lr:
            flags[flags.index("--lr") + 1] = str(a.lora_lr)
        return flags

    def evaluate(self, name: str, model: str, split: str | None = None) -> dict:
        """nDCG@10 / Recall@100 on one split's claims (default: the selection split) and BIOSSES Spearman; ``model``
        may be an adapter folder. One file per split; the corpus embeddings are cached, so a second split of the
        same model encodes only its claims."""
        split = split or self.select_split
        out = self.out / "eval" / f"{name}.{split}.json"
        if not out.exists():
            cmd = [PY, ROOT / "eval" / "eval_suite.py", "--model", model, "--data", f"scifact:ir:{self.scifact}",
                   self.biosses, "--split", split, "--max_length", str(self.args.max_length), "--output", out,
                   "--cache_dir", self.out / "cache"]
            run(cmd, self.out / "logs" / f"eval_{name}.{split}.log")
        return self.read_eval(out, split)

    @staticmethod
    def read_eval(path: Path, split: str) -> dict:
        by = {r["dataset"]: r for r in json.loads(path.read_text())["results"]}
        return {f"{split}_ndcg10": by["scifact"]["ndcg@10"], f"{split}_recall100": by["scifact"]["recall@100"],
                "biosses": by["biosses"]["spearman"]}

    def evaluate_row(self, name: str, model: str) -> dict:
        """The selection split always; the test claims too with --test (final rows only, issue 16's hygiene)."""
        result = self.evaluate(name, model)
        if self.dev and self.args.test:
            result.update(self.evaluate(name, model, "test"))
        return result

    def bm25_triplets(self) -> Path:
        path = self.out / "data" / "scifact_train_bm25.jsonl"
        if not path.exists():
            run([PY, ROOT / "differentiation" / "09b_counterfactual_negatives.py", "--config", "mined", "--input",
                 self.scifact, "--split", "train", "--corpus", self.scifact, "--output_jsonl", path],
                self.out / "logs" / "bm25_triplets.log")
        return path

    def st_mined_triplets(self) -> Path:
        """T0 with one dense hard negative per claim from sentence-transformers' ``mine_hard_negatives`` (the peer,
        called as the library): the off-the-shelf backbone, top-ranked candidates, its own false-negative guard
        (``--st_relative_margin``: a negative must score at most (1 - margin) x the positive's score). Every positive
        of a claim is given to it, so none is mined as a negative. A claim for which the guard leaves no candidate in
        the library's search range keeps its plain (claim, positive) pair, so the row trains on all of T0 as the
        others do; the count is printed and kept in ``<file>.stats.json``."""
        path = self.out / "data" / f"scifact_train_st_mined_m{self.args.st_relative_margin}.jsonl"
        if path.exists():
            return path
        seed = load_seed(self.scifact, split="train")
        mined_path = path.with_suffix(".mined.jsonl")  # the library's triplets (claims it found a negative for)
        seconds = 0.0
        if not mined_path.exists():
            from datasets import Dataset
            from sentence_transformers import SentenceTransformer
            from sentence_transformers.util import mine_hard_negatives

            from repair.models import resolve_model

            train = load_beir(self.scifact, "train")
            pairs = [(train.queries[q], train.doc_text(d)) for q, rels in train.qrels.items()
                     for d, s in rels.items() if s > 0]
            model = SentenceTransformer(resolve_model(self.args.model).path, device="cpu")
            model.max_seq_length = self.args.max_length
            t0 = time.time()
            mined = mine_hard_negatives(
                Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]}), model,
                corpus=[train.doc_text(d) for d in train.corpus], num_negatives=1,
                relative_margin=self.args.st_relative_margin, sampling_strategy="top", output_format="triplet",
                batch_size=64, verbose=True)
            seconds = time.time() - t0
            write_jsonl(mined_path, [{"query": r["anchor"], "pos_document": r["positive"], "d_neg": r["negative"]}
                                     for r in mined])
        negative_of = {(r["query"], r["pos_document"]): r["d_neg"] for r in read_jsonl(mined_path)}
        rows = [{"query": q, "pos_document": p, **({"d_neg": negative_of[(q, p)]} if (q, p) in negative_of else {})}
                for q, p in zip(seed.queries, seed.passages)]
        stats = {"claims": len(rows), "with_negative": sum("d_neg" in r for r in rows),
                 "relative_margin": self.args.st_relative_margin, "mining_seconds": round(seconds)}
        write_jsonl(path, rows)
        (path.parent / (path.name + ".stats.json")).write_text(json.dumps(stats, indent=1))
        print(json.dumps({"st_mined": str(path), **stats}), flush=True)
        return path

    def save(self, row: str, result: dict) -> None:
        (self.rows / f"{row}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({"row": row, **{k: v for k, v in result.items() if k.endswith(("ndcg10", "recall100"))
                                          or k in ("biosses", "ndcg@10")}}), flush=True)

    # ---------------------------------------------------------------- rows
    def offshelf(self, seed: int) -> dict:
        t0 = time.time()
        return {**self.evaluate_row("offshelf", self.args.model), "eval_seconds": round(time.time() - t0),
                "steps": 0}

    def _train_and_eval(self, name: str, data_flags: list[str], steps: int, seed: int, model: str | None = None) -> dict:
        folder = self.out / "train" / name
        seconds = 0.0
        # an interrupted run resumes (from step 0 when it saved no checkpoint)
        if not training_finished(folder):
            flags = self.train_flags(steps)
            if model:
                flags[flags.index("--model") + 1] = model
            seconds = run([PY, ROOT / "training" / "10_train_lora.py", *flags, *data_flags,
                           "--seed", str(seed), "--output_dir", folder, "--resume"],
                          self.out / "logs" / f"train_{name}.log")
        # a LoRA folder is passed as the model: the eval suite reads its base from adapter_config.json
        t0 = time.time()
        result = self.evaluate_row(name, str(folder))
        return {**result, "train_seconds": round(seconds), "eval_seconds": round(time.time() - t0), "steps": steps}

    def inbatch(self, seed: int, steps: int | None = None, tag: str = "inbatch") -> dict:
        return self._train_and_eval(f"{tag}_s{seed}", ["--train_data", self.scifact, "--split", "train"],
                                    steps or self.args.steps, seed)

    def bm25(self, seed: int, steps: int | None = None, tag: str = "bm25") -> dict:
        return self._train_and_eval(f"{tag}_s{seed}", ["--triplets", self.bm25_triplets(), "--num_hard_negatives", "1"],
                                    steps or self.args.steps, seed)

    def st_mined(self, seed: int, steps: int | None = None, tag: str = "st_mined") -> dict:
        return self._train_and_eval(f"{tag}_s{seed}", ["--triplets", self.st_mined_triplets(),
                                                       "--num_hard_negatives", "1"], steps or self.args.steps, seed)

    def bm25_conf(self, seed: int) -> dict:
        """The strongest plain baseline and lever 3 together: T0 with its BM25 negative (the bm25 row's data) plus
        lever 3's kept tuples (``lever3_tuples``: the diagnosed claims with their model-aware Eq. 7 negative),
        trained from the backbone for the same --steps; the diagnosed claims appear twice, as in repair_conf_only."""
        tuples = self.lever3_tuples(seed)
        result = self._train_and_eval(f"bm25_conf_s{seed}", ["--triplets", self.bm25_triplets(), "--triplets", tuples,
                                                             "--num_hard_negatives", "1"], self.args.steps, seed)
        return {**result, "conf_tuples": str(tuples.relative_to(self.out)), "conf_tuples_sha256": file_sha256(tuples)}

    def seeds_done(self, row: str, step: str) -> list[int]:
        """The seeds whose driver run of ``row`` finished iteration 1's ``step`` (e.g. "09_consistency"), in
        numerical order (s2 before s10)."""
        seeds = sorted(int(tail) for f in (self.out / "repair").glob(f"{row}_s*")
                       if (tail := f.name.rpartition("_s")[2]).isdigit())
        return [s for s in seeds if (self.out / "repair" / f"{row}_s{s}" / ".state" / f"iter1.{step}.done").exists()]

    def seed_free_source(self, row: str, seed: int) -> int | None:
        """For a ``Variant.seed_free`` row: the lowest other seed whose run finished the seed-free steps, which
        ``seed``'s run copies instead of writing the same generation again; None when there is none (or the row
        is not seed-free)."""
        upto = VARIANTS[row].seed_free
        others = [s for s in self.seeds_done(row, SHARED_UPTO[upto]) if s != seed] if upto else []
        return others[0] if others else None

    def lever3_tuples(self, seed: int) -> Path:
        """repair_conf_only's kept tuples (Stage III on Q_conf's own claims). Stages I-III run on the off-the-shelf
        model and take no seed, so every seed's run writes the same file: this seed's run when it got that far, else
        the lowest seed's (the row records which file, with its sha256)."""
        def tuples_of(s: int) -> Path:
            return (self.out / "repair" / f"repair_conf_only_s{s}" / "iter1" / "differentiation"
                    / "final_train_data.bottom_30pct.jsonl")
        done = self.seeds_done("repair_conf_only", SHARED_UPTO["09"])
        if not done:
            raise SystemExit(f"bm25_conf: run the repair_conf_only row through step 09 first ({tuples_of(seed)})")
        return tuples_of(seed if seed in done else done[0])

    def continued(self, start_row: str, seed: int, data_flags: Callable[[], list[str]]) -> dict:
        """Plain fine-tuning continued from <start_row>_s<seed> for --steps more on ``flags``' data: the equal-steps
        control of a lever-4 row that starts from that model (a new schedule from the same start, as the driver's).
        ``data_flags`` is called only once the start exists (the BM25 triplets are mined on first use)."""
        start = self.out / "train" / f"{start_row}_s{seed}"
        if not training_finished(start):
            raise SystemExit(f"{start_row}_cont: run the {start_row} row for seed {seed} first ({start})")
        result = self._train_and_eval(f"{start_row}_cont_s{seed}", data_flags(), self.args.steps, seed, model=str(start))
        return {**result, "steps": 2 * self.args.steps}

    def inbatch_cont(self, seed: int) -> dict:
        """The control of repair_conf_only_from_ft / repair_from_ft: in-batch fine-tuning continued."""
        return self.continued("inbatch", seed, lambda: ["--train_data", self.scifact, "--split", "train"])

    def bm25_cont(self, seed: int) -> dict:
        """The control of repair_conf_bm25_from_bm25: BM25-negative fine-tuning continued from bm25_s<seed>."""
        return self.continued("bm25", seed, lambda: ["--triplets", self.bm25_triplets(), "--num_hard_negatives", "1"])

    def inbatch2x(self, seed: int) -> dict:
        return self.inbatch(seed, 2 * self.args.steps, "inbatch2x")

    def bm25x2(self, seed: int) -> dict:
        return self.bm25(seed, 2 * self.args.steps, "bm25x2")

    def st_minedx2(self, seed: int) -> dict:
        return self.st_mined(seed, 2 * self.args.steps, "st_minedx2")

    def _driver(self, name: str, seed: int, extra: dict) -> dict:
        a = self.args
        run_dir = self.out / "repair" / name
        env = {"MODEL": a.model, "TRAIN_DATA": self.scifact, "TRAIN_SPLIT": "train", "OUT_DIR": str(run_dir),
               "ITERS": str(a.iters), "EVAL_DATA": f"scifact:ir:{self.scifact} {self.biosses}",
               "EVAL_SPLIT": self.select_split,
               "LOCAL_CORPUS": self.scifact, "GEN_MODEL": a.generator, "MAX_LENGTH": str(a.max_length),
               "LR": str(a.lora_lr if (a.lora_lr and not a.full_finetune) else a.lr),
               "TEMPERATURE": str(a.temperature), "GLOBAL_BATCH": "32", "MINI_BATCH": str(a.mini_batch_size),
               "FULL_FINETUNE": "1" if a.full_finetune else "0", "SEED": str(seed),
               "MAX_ROUNDS": str(a.max_rounds), "PYTHON": PY,
               "TRAIN_EXTRA": f"--max_steps {a.steps} --epochs 100 --warmup_ratio 0.1 --weight_decay 0.01 "
                              f"--save_steps 0 --no_progress", **extra}
        if "MODEL" not in extra:  # the run starts from the off-the-shelf model, which this study evaluated
            self.reuse_eval("offshelf", run_dir, extra.get("WARM_START") == "1")
        self.share_embeddings(run_dir)
        seconds = run(["bash", ROOT / "run_repair.sh"], self.out / "logs" / f"driver_{name}.log", env=env)
        # and back: the final model's corpus vectors, so its --test evaluation encodes only the test claims
        link_cache(run_dir / "cache" / "embeddings", self.out / "cache")
        report = json.loads((run_dir / "report.json").read_text())
        per_iter = []
        for it in report["iterations"]:
            metrics = self.read_eval(run_dir / f"iter{it['iter']}" / "eval" / "eval.json", self.select_split)
            per_iter.append({"iter": it["iter"], **metrics,
                             **{k: it.get(k) for k in ("q_conf", "c_conf", "generated", "generated_accepted",
                                                       "verified", "hard", "kept", "kept_rate")},
                             "stage_seconds": it.get("seconds")})
        last = per_iter[-1]
        result = {k: v for k, v in last.items() if k.startswith(self.select_split) or k == "biosses"}
        if self.dev and a.test:  # the final model on the test claims (final rows only)
            final = final_iteration(run_dir) / "adapter"
            result.update({k: v for k, v in self.evaluate(name, str(final), "test").items() if k != "biosses"})
        # every training of the run (a warm start's too), each counted from where it started (SCHEDULE=one slices)
        adapters = [run_dir / f"iter{it['iter']}" / "adapter" for it in report["iterations"]
                    if (run_dir / f"iter{it['iter']}" / "adapter").is_dir()]
        return {**result, "iterations": per_iter, "steps": sum(own_steps(folder) for folder in adapters),
                "seconds": round(seconds), "run_dir": str(run_dir)}

    def reuse_eval(self, evaluated: str, run_dir: Path, warm_start: bool = False) -> None:
        """A driver run's iteration 0 evaluates the model it starts from (with WARM_START=1, step iter0.eval_offshelf
        does, before the warm start): when this study already evaluated that model (the offshelf row, or
        inbatch_s<seed> for repair_from_ft) with the same command and data, its result is copied in (with the
        driver's done marker) instead of re-encoding the corpus per row."""
        step = "eval_offshelf" if warm_start else "eval"
        source = self.out / "eval" / f"{evaluated}.{self.select_split}.json"
        target = run_dir / "iter0" / step / "eval.json"
        if source.exists() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            (run_dir / ".state").mkdir(parents=True, exist_ok=True)
            write_outputs(run_dir / ".state", f"iter0.{step}", [str(target.relative_to(run_dir))])
            (run_dir / ".state" / f"iter0.{step}.done").write_text("0\n")

    def share_embeddings(self, run_dir: Path) -> None:
        """Seed a driver run's embedding cache with the vectors this study's evaluations already computed, so its
        diagnosis of the model it starts from does not encode the 5,183-document corpus again (~10 min on one thread).
        The cache is content-addressed (model fingerprint / sha1 of the exact text) and its shards are written once
        and never changed, so a hard link shares a shard safely; the driver only adds shards of its own."""
        link_cache(self.out / "cache", run_dir / "cache" / "embeddings")

    def reuse_repair_stages(self, seed: int, run_dir: Path, upto: str, source_row: str = "repair",
                            source_seed: int | None = None) -> bool:
        """Start a variant run from the REPAIR run's finished iteration-1 steps up to ``upto`` ("04".."09" or "eval").

        A variant that changes only what follows a step runs the same commands with the same seed on the same model
        up to it (a CausalNeg run up to 09, a GEN_ADAPTER=none run through iteration 1's evaluation, lever rows up
        to the step their setting first changes), so copying those steps' files and done markers gives the files a
        fresh run would write, and the row pays only for what differs. Which files a step wrote is the driver's own
        record (``$STATE/<step>.outputs``, :mod:`repair.driver.steps`), so a step is copied exactly, wherever it
        writes (06b writes into differentiation/, 05's queries and 06's verification share expansion/). Later
        iterations are always run. ``source_seed`` (default ``seed``): another seed's run, for steps that take no
        training seed (``Variant.seed_free``).
        """
        src = self.out / "repair" / f"{source_row}_s{seed if source_seed is None else source_seed}"
        last = SHARED_UPTO[upto]
        marker = run_dir / "REUSED_FROM"  # so a resumed row still reports where its stages came from
        if (run_dir / "iter1").exists() or not (src / ".state" / f"iter1.{last}.done").exists():
            return marker.exists()

        def shared(step: str) -> bool:
            if step == "expansion":
                return upto >= "06"
            if step == "eval":
                return upto == "eval"
            return step[:2].isdigit() and (step[:2] <= upto or upto == "eval") and not step.startswith("09b")

        # iteration 0 and T0's own steps come before iteration 1's first, so a row sharing any step shares them: the
        # evaluations of the model the run starts from, and with WARM_START=1 the warm start and T0's BM25 negatives,
        # which take the training seed, so those only from the same seed's run
        same_seed = source_seed in (None, seed)
        steps = sorted(done.name[:-len(".done")] for done in (src / ".state").glob("*.done")
                       if done.name.startswith(("iter0.eval.", "iter0.eval_offshelf."))
                       or (same_seed and done.name.startswith(("iter0.", "t0.")))
                       or (done.name.startswith("iter1.") and shared(done.name.split(".")[1])))
        unrecorded = [step for step in steps if step_outputs(src / ".state", step) is None]
        if unrecorded:
            raise SystemExit(f"{src}: steps {', '.join(unrecorded)} have no .outputs record (the driver writes one "
                             f"per step since 2026-12-02); rerun the {source_row} row for seed {seed} to reuse it")
        (run_dir / "iter1").mkdir(parents=True)
        (run_dir / ".state").mkdir(exist_ok=True)
        for step in steps:
            for relative in step_outputs(src / ".state", step):
                (run_dir / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / relative, run_dir / relative)
            for suffix in (".outputs", ".done"):  # the record before the marker, as the driver writes them
                shutil.copy2(src / ".state" / f"{step}{suffix}", run_dir / ".state" / f"{step}{suffix}")
        warm = " (and its warm start)" if any(step.startswith("iter0.10") for step in steps) else ""
        marker.write_text(f"{src}: iteration 0 eval{warm} and iteration 1 steps up to {upto}\n")
        return True

    def variant(self, row: str, seed: int) -> dict:
        """A REPAIR configuration of ``VARIANTS``: its settings on top of the faithful row's, sharing what it can."""
        variant = VARIANTS[row]
        upto, _, source_row = (variant.shared or "").partition(":")
        name = f"{row}_s{seed}"
        run_dir = self.out / "repair" / name
        extra = variant_settings(row, self.args.served_generator if "QWEN" in variant.settings else None)
        if variant.budget == "claims":  # the budget counted in claims: 2 epochs of T0 + tuples, no step cap
            extra["TRAIN_EXTRA"] = "--epochs 2 --warmup_ratio 0.1 --weight_decay 0.01 --save_steps 0 --no_progress"
        elif variant.budget == "driver":  # ITER_STEPS=t0: each training EPOCHS x ceil(|T0| / 32) steps = --steps
            per_epoch = epoch_steps(len(load_seed(self.scifact, split="train")), 32)
            if self.args.steps % per_epoch:
                raise SystemExit(f"{row}: --steps {self.args.steps} is not a whole number of T0 epochs "
                                 f"({per_epoch} steps each), which ITER_STEPS=t0 counts in")
            extra["EPOCHS"] = str(self.args.steps // per_epoch)
            extra["TRAIN_EXTRA"] = "--warmup_ratio 0.1 --weight_decay 0.01 --save_steps 0 --no_progress"
        if variant.start != "offshelf":  # iteration 1 diagnoses and trains a plain fine-tuned model (lever 4)
            start = self.out / "train" / f"{variant.start}_s{seed}"
            if not training_finished(start):
                raise SystemExit(f"{row}: run the {variant.start} row for seed {seed} first ({start})")
            extra["MODEL"] = str(start)
            self.reuse_eval(f"{variant.start}_s{seed}", run_dir, extra.get("WARM_START") == "1")
        if extra.get("LITERATURE_INDEX") == SCIFACT_INDEX:
            extra["LITERATURE_INDEX"] = str(self.scifact_index())
        source_seed = self.seed_free_source(row, seed)
        if source_seed is not None:  # one generation for every seed: this row's steps up to seed_free, copied
            reused = self.reuse_repair_stages(seed, run_dir, variant.seed_free, row, source_seed=source_seed)
        else:
            reused = self.reuse_repair_stages(seed, run_dir, upto, source_row or "repair") if upto else False
        result = self._driver(name, seed, extra)
        if variant.start != "offshelf":
            result["steps"] += self.args.steps  # the plain fine-tuning it starts from
        marker = run_dir / "REUSED_FROM"  # which run's steps were copied (another seed's, for seed_free rows)
        source = {"reused_from": marker.read_text().strip()} if reused and marker.exists() else {}
        return {**result, "reused_repair_stages": reused, **source}

    def scifact_index(self) -> Path:
        """SciFact's corpus as an on-disk literature index (issue 41), built once by the project's build command:
        the build is idempotent, so a rerun over a finished index checks its inputs and returns."""
        index = self.out / "literature" / "scifact"
        run([PY, "-m", "repair.expansion.sources.literature", "build", self.scifact, "--index", index, "--no_progress"],
            self.out / "logs" / "literature_index_scifact.log")
        return index

    def causalneg(self, seed: int) -> dict:
        name = f"causalneg_s{seed}"
        reused = self.reuse_repair_stages(seed, self.out / "repair" / name, "09")
        extra = {"NEGATIVES": "causalneg", "CN_RATIO": str(self.args.cn_ratio), "CN_EXTRA": self.args.cn_extra}
        return {**self._driver(name, seed, extra), "reused_repair_stages": reused}

    def repair_basegen(self, seed: int) -> dict:
        name = f"repair_basegen_s{seed}"
        reused = self.reuse_repair_stages(seed, self.out / "repair" / name, "eval")
        return {**self._driver(name, seed, {"GEN_ADAPTER": "none"}), "reused_repair_stages": reused}

    def st_reference(self, seed: int) -> dict:
        folder = self.out / "train" / f"st_reference_s{seed}"
        seconds = 0.0
        if not (folder / "config.json").exists():
            seconds = run([PY, ROOT / "bench" / "st_reference_train.py", "--scifact", self.scifact, "--seed", str(seed),
                           "--output_dir", folder, "--max_length", str(self.args.max_length)],
                          self.out / "logs" / f"train_st_reference_s{seed}.log")
        return {**self.evaluate_row(f"st_reference_s{seed}", str(folder)), "train_seconds": round(seconds)}


BASELINE_ROWS = ("offshelf", "inbatch", "bm25", "st_mined", "inbatch2x", "inbatch_cont", "bm25x2", "bm25_cont",
                 "st_minedx2", "st_reference")


def row_name(stem: str) -> str:
    """``inbatch_s2`` -> ``inbatch``; ``offshelf`` stays."""
    head, _, tail = stem.rpartition("_s")
    return head if head and tail.isdigit() else stem


def collect(out: Path) -> dict[str, dict[int, dict]]:
    """Every finished row file: {row name: {seed: result}} (offshelf has seed 0)."""
    rows: dict[str, dict[int, dict]] = {}
    for f in sorted((out / "rows").glob("*.json")):
        name = row_name(f.stem)
        seed = int(f.stem.rpartition("_s")[2]) if name != f.stem else 0
        rows.setdefault(name, {})[seed] = json.loads(f.read_text())
    return rows


def _metric(result: dict, key: str) -> float | None:
    legacy = {"test_ndcg10": "ndcg@10", "test_recall100": "recall@100", "biosses": "biosses_spearman"}
    value = result.get(key, result.get(legacy.get(key, "")))
    return value


def _stat(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def summarize(rows_by_name: dict[str, dict[int, dict]]) -> str:
    """The results table: per row, mean ± sample standard deviation over its seeds (per-seed values in the JSON)."""
    rows = []
    for name, by_seed in rows_by_name.items():
        results = [by_seed[k] for k in sorted(by_seed)]
        cells = [_stat([v for r in results if (v := _metric(r, key)) is not None])
                 for key in ("dev_ndcg10", "test_ndcg10", "test_recall100", "biosses")]
        steps = sorted({r.get("steps") for r in results if r.get("steps") is not None})
        seeds = ", ".join(str(k) for k in sorted(by_seed)) if name != "offshelf" else "–"
        rows.append([name, seeds, "/".join(map(str, steps)) or "–", *cells])
    return markdown_table(["row", "seeds", "steps", "dev nDCG@10", "test nDCG@10", "test Recall@100", "BIOSSES ρ"],
                          rows)


METRICS = ("dev_ndcg10", "test_ndcg10", "test_recall100", "biosses")
# two trainings of one (row, seed) on the same kind of machine agree to float order; more means another model
SAME_MODEL_TOLERANCE = 2e-4


def recorded_rows(path: Path) -> dict[str, dict[int, dict]]:
    """The per-seed results an earlier ``--export`` recorded (the inverse of ``export``): what ``--merge`` keeps of a
    run folder that is gone (a new machine, a new session). Each result carries its recorded walls and counts."""
    rows: dict[str, dict[int, dict]] = {}
    for obj in json.loads(path.read_text()):
        for seed in obj["seeds"]:
            result = {key: obj[key].get(str(seed)) for key in METRICS}
            result.update({"steps": obj.get("steps"), "settings": obj.get("config"), "command": obj.get("command"),
                           "recorded_stage": (obj.get("wall_seconds_per_stage") or {}).get(str(seed)),
                           "recorded_counts": (obj.get("counts") or {}).get(str(seed), []),
                           "recorded_in": str(path)})
            rows.setdefault(obj["name"], {})[seed] = result
    return rows


def budget_name(name: str, steps: int | None, recorded: dict[str, dict[int, dict]]) -> str:
    """A folder's row trained for another number of steps than the recorded row of that name (a study run with
    ``--steps 84`` in its own ``--out``) is another configuration: it is kept as ``<name>@<steps>`` beside the
    recorded one, never merged into it (rows compare only at equal steps)."""
    recorded_steps = {r.get("steps") for r in recorded.get(name, {}).values()} - {None}
    if steps is None or not recorded_steps or steps in recorded_steps:
        return name
    return f"{name}@{steps}"


def is_baseline(name: str) -> bool:
    """``bm25@84`` is the bm25 baseline at another budget."""
    return name.partition("@")[0] in BASELINE_ROWS


def merged_rows(out: Path, recorded: Path | None) -> dict[str, dict[int, dict]]:
    """The run folder's rows, plus (with ``recorded``) every (row, seed) of an earlier export the folder lacks. A
    (row, seed) in both keeps the recorded result, the one its test numbers were computed on, and prints the
    folder's rerun next to it (how the study's determinism is checked on a new machine)."""
    rows = collect(out)
    if recorded is None or not recorded.exists():
        return rows
    merged = recorded_rows(recorded)
    for folder_name, by_seed in rows.items():
        for seed, result in by_seed.items():
            name = budget_name(folder_name, result.get("steps"), merged)
            kept = merged.setdefault(name, {}).get(seed)
            if kept is None:
                merged[name][seed] = result
                continue
            rerun = {k: result.get(k) for k in METRICS if result.get(k) is not None}
            print(f"{name} seed {seed}: kept the recorded result "
                  f"{ {k: kept.get(k) for k in rerun} }; this folder's rerun: {rerun}", flush=True)
            missing = [k for k in rerun if kept.get(k) is None]
            if not missing:
                continue
            # the rerun has numbers the recorded result lacks (a row chosen for test after its folder was lost):
            # they belong to the recorded (row, seed) only if the rerun trained the same model, which its
            # selection-split number tells; otherwise the rerun's result replaces the recorded one whole, so every
            # number of a (row, seed) comes from one model
            split = "dev_ndcg10" if kept.get("dev_ndcg10") is not None else "test_ndcg10"
            if kept.get(split) is not None and abs(kept[split] - rerun.get(split, math.inf)) <= SAME_MODEL_TOLERANCE:
                kept.update({k: rerun[k] for k in missing})
                print(f"{name} seed {seed}: the rerun reproduces {split} within {SAME_MODEL_TOLERANCE}; "
                      f"added its {', '.join(missing)}", flush=True)
            else:
                merged[name][seed] = result
                print(f"{name} seed {seed}: the rerun does not reproduce the recorded {split}; its result is used "
                      f"whole (it has {', '.join(missing)})", flush=True)
    return merged


# issue 16's bar: a REPAIR row's three-seed mean test nDCG@10 at least this far above the best baseline at equal steps
WIN_MARGIN = 0.01


def _steps_of(by_seed: dict[int, dict]) -> set:
    return {r.get("steps") for r in by_seed.values()} - {None}


def row_per_query(eval_dir: Path, key: str, split: str = "test") -> dict[str, float]:
    """One study row's per-claim SciFact nDCG@10 for one seed (``key`` = ``<row>_s<seed>``): the study's evaluation
    file ``<eval_dir>/<key>.<split>.json``, else the evaluation of the last iteration of the row's finished driver run
    ``<eval_dir>/../repair/<key>`` (the subset protocol's rows, which the driver itself evaluates on test; the full
    protocol's driver runs evaluate on dev). Raises FileNotFoundError when neither exists and ValueError for an
    evaluation of another split or one without per-query scores (files written before 2026-12-02): a comparison is
    never made against another split's numbers."""
    path = eval_dir / f"{key}.{split}.json"
    if not path.exists():
        run_dir = eval_dir.parent / "repair" / key
        if not (run_dir / "report.json").exists():
            raise FileNotFoundError(f"{path}: no such evaluation file, and {run_dir} is no finished driver run")
        path = final_iteration(run_dir) / "eval" / "eval.json"
    evaluation = json.loads(path.read_text())
    if evaluation.get("split", split) != split:
        raise ValueError(f"{path}: an evaluation on {evaluation['split']}, not on {split}")
    results = {r["dataset"]: r for r in evaluation["results"]}
    scores = (results.get("scifact", {}).get("per_query") or {}).get("ndcg@10")
    if not scores:
        raise ValueError(f"{path}: no per-query nDCG@10 for scifact")
    return scores


# a per-claim change smaller than this is no change (the float noise of two equal rankings' nDCG)
MOVED = 1e-12


def claim_changes(eval_dir: Path, candidate: str, baseline: str, seed: int, split: str = "test") -> dict[str, float]:
    """Candidate minus baseline, claim by claim, on one seed (both read by :func:`row_per_query`, whose errors pass
    through): the paired per-query difference every per-claim comparison of two rows starts from."""
    cand = row_per_query(eval_dir, f"{candidate}_s{seed}", split)
    base = row_per_query(eval_dir, f"{baseline}_s{seed}", split)
    return {q: cand[q] - base[q] for q in sorted(cand)}


def mean_changes(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Each claim's change averaged over seeds (the per-claim values the paired randomization test is run on)."""
    return {q: statistics.mean(change[q] for change in per_seed) for q in per_seed[0]}


def better_worse(changes: Iterable[float]) -> tuple[int, int]:
    """How many claims the candidate ranks better and worse (changes beyond :data:`MOVED` either way)."""
    values = list(changes)
    return sum(d > MOVED for d in values), sum(d < -MOVED for d in values)


def per_query_test(eval_dir: Path, candidate: str, baseline: str, seeds: list[int]) -> str:
    """Query by query on the test claims, for the seeds both rows have per-query test nDCG@10 for
    (:func:`row_per_query`): each claim's difference averaged over those seeds, how many claims the candidate ranks
    better / worse, and the paired randomization test's two-sided p of the mean."""
    from repair.metrics import paired_randomization_p

    per_seed: dict[int, dict[str, float]] = {}
    for seed in seeds:
        try:
            per_seed[seed] = claim_changes(eval_dir, candidate, baseline, seed, "test")
        except (FileNotFoundError, ValueError):
            continue  # a row without per-claim test numbers for this seed: compared on the other seeds
    if not per_seed:
        return "–"
    diffs = list(mean_changes(list(per_seed.values())).values())
    better, worse = better_worse(diffs)
    return (f"s{','.join(map(str, per_seed))}: {better} better / {worse} worse of {len(diffs)}, "
            f"p {paired_randomization_p(diffs):.3f}")


def paired_differences(candidate: dict[int, dict], baseline: dict[int, dict], key: str) -> dict[int, float]:
    """Candidate minus baseline on ``key``, per seed both rows have it for (in seed order). Paired, because the two
    rows of one seed share their data order and initialisation, so the difference shows whether a gain holds seed by
    seed or rests on one."""
    return {seed: c - b for seed in sorted(set(candidate) & set(baseline))
            if (c := _metric(candidate[seed], key)) is not None and (b := _metric(baseline[seed], key)) is not None}


def paired_comparison(rows: dict[str, dict[int, dict]], candidate: str, baselines: list[str],
                      margin: float = WIN_MARGIN, eval_dir: Path | None = None) -> str:
    """``candidate`` against each baseline row, from the row files: the difference of the means on dev and test, the
    per-seed paired test differences (seeds both rows have) and whether the test-mean difference clears ``margin``.
    A baseline trained for other steps than the candidate is shown but marked, since rows compare only at equal
    steps; a row missing a split shows '–'. Why paired: the rows of one seed share the data order of their common
    parts, so a per-seed difference shows whether a gain holds for every seed or rests on one. With ``eval_dir`` (the
    study folder's eval/), also the per-claim comparison of :func:`per_query_test`."""
    missing = [name for name in [candidate, *baselines] if name not in rows]
    if missing:
        raise SystemExit(f"--compare: no row named {', '.join(missing)} (rows: {', '.join(sorted(rows))})")
    cand = rows[candidate]
    cand_steps = _steps_of(cand)

    def mean(by_seed: dict[int, dict], key: str) -> float | None:
        values = [v for r in by_seed.values() if (v := _metric(r, key)) is not None]
        return statistics.mean(values) if values else None

    def diff(a: float | None, b: float | None) -> str:
        return "–" if a is None or b is None else f"{a - b:+.4f}"

    table = []
    for name in baselines:
        base = rows[name]
        equal = _steps_of(base) == cand_steps
        paired = [f"s{seed} {d:+.4f}" for seed, d in paired_differences(cand, base, "test_ndcg10").items()]
        c_test, b_test = mean(cand, "test_ndcg10"), mean(base, "test_ndcg10")
        verdict = ("–" if c_test is None or b_test is None
                   else ("yes" if c_test - b_test >= margin else "no") + ("" if equal else " (other steps)"))
        table.append([name, ", ".join(map(str, sorted(base))), "/".join(map(str, sorted(_steps_of(base)))),
                      _stat([v for r in base.values() if (v := _metric(r, "test_ndcg10")) is not None]),
                      diff(mean(cand, "dev_ndcg10"), mean(base, "dev_ndcg10")), diff(c_test, b_test),
                      ", ".join(paired) or "–", verdict,
                      per_query_test(eval_dir, candidate, name, sorted(set(cand) & set(base))) if eval_dir else "–"])
    head = (f"{candidate}: seeds {', '.join(map(str, sorted(cand)))}, steps {'/'.join(map(str, sorted(cand_steps)))}, "
            f"test nDCG@10 {_stat([v for r in cand.values() if (v := _metric(r, 'test_ndcg10')) is not None])}")
    return head + "\n\n" + markdown_table(
        ["baseline", "seeds", "steps", "test nDCG@10", "dev: mean diff", "test: mean diff", "test: paired per seed",
         f"test mean diff >= {margin}", "test: per claim (paired randomization)"], table)


def export(rows: dict[str, dict[int, dict]], path: Path) -> list[dict]:
    """``docs/results/scifact_minilm.json``: one object per row, every number read from the row files (or, for rows
    kept by ``--merge``, from the export that read them)."""
    objects = []
    for name, by_seed in rows.items():
        seeds = sorted(by_seed)
        first = by_seed[seeds[0]]
        per_seed = {key: {str(k): _metric(by_seed[k], key) for k in seeds} for key in METRICS}
        means = {f"{key}_mean": round(statistics.mean(v), 4) if (v := [x for x in per_seed[key].values() if x is not None])
                 else None for key in per_seed}
        stage = {str(k): by_seed[k]["recorded_stage"] if "recorded_stage" in by_seed[k] else
                 by_seed[k].get("iterations") and [it.get("stage_seconds") for it in by_seed[k]["iterations"]]
                 or {key: by_seed[k].get(key) for key in ("train_seconds", "eval_seconds")} for k in seeds}
        counts = {str(k): by_seed[k]["recorded_counts"] if "recorded_counts" in by_seed[k] else
                  [{c: it.get(c) for c in ("q_conf", "c_conf", "generated", "verified", "hard", "kept")
                    if c != "hard" or it.get("hard") is not None}  # HARD_TUPLES=1 rows (issue 43) only
                   for it in by_seed[k].get("iterations", [])] for k in seeds}
        config = dict(first.get("settings") or {})
        command = first.get("command") or ""
        # machine paths -> the README's (SciFact downloaded to ~/data/scifact, runs under runs/)
        for key, portable in (("scifact", "~/data/scifact"), ("out", f"runs/{Path(config.get('out') or 'runs/quality_dev').name}"),
                              ("biosses", "data/biosses")):
            if config.get(key):
                command = command.replace(str(config[key]), portable).replace(" --biosses data/biosses", "")
                config[key] = portable
        if seeds != [0]:
            command = re.sub(r"--seeds( \d+)+", "--seeds " + " ".join(map(str, seeds)), command)
        objects.append({"name": name, "kind": "baseline" if is_baseline(name) else "repair",
                        "config": config, "command": command, "seeds": seeds,
                        **per_seed, **means, "steps": first.get("steps"), "wall_seconds_per_stage": stage,
                        "counts": counts if any(counts.values()) else None})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(objects, indent=1) + "\n")
    return objects


def plot_dev(rows: dict[str, dict[int, dict]], path: Path) -> None:
    """Dev nDCG@10 per row (each seed a dot, the mean a bar): baselines grey, REPAIR configurations blue."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = {name: sorted({r.get("steps") for r in by_seed.values() if r.get("steps") is not None})
             for name, by_seed in rows.items()}
    dev = [(name, [v for r in by_seed.values() if (v := _metric(r, "dev_ndcg10")) is not None])
           for name, by_seed in rows.items()]
    dev = [(n, v) for n, v in dev if v]
    # grouped by budget (rows compare only with rows of the same steps), then baselines first, then by mean
    dev.sort(key=lambda nv: (steps[nv[0]], not is_baseline(nv[0]), statistics.mean(nv[1])))
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(dev) + 1.2))
    for y, (name, values) in enumerate(dev):
        colour = "0.6" if is_baseline(name) else "tab:blue"
        ax.barh(y, statistics.mean(values), color=colour, alpha=0.5)
        ax.plot(values, [y] * len(values), "o", color=colour, ms=4)
    ax.set_yticks(range(len(dev)), [f"{n} ({len(v)} seed{'s' * (len(v) > 1)}, "
                                    f"{'/'.join(map(str, steps[n])) or '?'} steps)" for n, v in dev])
    lo = min(min(v) for _, v in dev)
    ax.set_xlim(lo - 0.02, max(max(v) for _, v in dev) + 0.01)
    ax.set_xlabel("dev nDCG@10 (162 held-out train claims;\ndot = seed, bar = mean)", fontsize=9)
    ax.set_title("SciFact, all-MiniLM-L6-v2: plain baselines (grey) vs REPAIR (blue),\n"
                 "grouped by optimizer steps (compare within a group)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def paired_panels(pairs: list[tuple[str, str, str]]) -> list[dict]:
    """For each (recorded export JSON, candidate row, baseline row): the per-seed paired differences of nDCG@10 and of
    BIOSSES, read from the export. nDCG@10 is compared on test where both rows have test numbers on a common seed (the
    final rows), else on dev (a row dev rejected, never run on test); the split is named, since the two differ in
    what they can claim. Rows of other steps are refused: rows compare only at equal optimizer steps."""
    panels = []
    for json_path, candidate, baseline in pairs:
        rows = recorded_rows(Path(json_path))
        missing = [name for name in (candidate, baseline) if name not in rows]
        if missing:
            raise SystemExit(f"--pair {json_path}: no row named {', '.join(missing)} (rows: {', '.join(sorted(rows))})")
        cand, base = rows[candidate], rows[baseline]
        if _steps_of(cand) != _steps_of(base):
            raise SystemExit(f"--pair {json_path}: {candidate} ({sorted(_steps_of(cand))} steps) and {baseline} "
                             f"({sorted(_steps_of(base))} steps) are not at equal steps")
        test = paired_differences(cand, base, "test_ndcg10")
        split, ndcg = ("test", test) if test else ("dev", paired_differences(cand, base, "dev_ndcg10"))
        if not ndcg:
            raise SystemExit(f"--pair {json_path}: {candidate} and {baseline} share no seed with nDCG@10")
        panels.append({"source": Path(json_path).name, "candidate": candidate, "baseline": baseline, "split": split,
                       "steps": "/".join(map(str, sorted(_steps_of(cand)))), "ndcg10": ndcg,
                       "biosses": paired_differences(cand, base, "biosses")})
    return panels


def paired_table(panels: list[dict]) -> str:
    """The paired differences as a markdown table: each seed's difference and the mean, nDCG@10 and BIOSSES."""
    def cells(diffs: dict[int, float]) -> list[str]:
        return [", ".join(f"s{seed} {d:+.4f}" for seed, d in diffs.items()) or "–",
                f"{statistics.mean(diffs.values()):+.4f}" if diffs else "–"]

    return markdown_table(
        ["candidate − baseline", "results", "steps", "split", "nDCG@10 per seed", "nDCG@10 mean", "BIOSSES per seed",
         "BIOSSES mean"],
        [[f"{pn['candidate']} − {pn['baseline']}", pn["source"], pn["steps"], pn["split"], *cells(pn["ndcg10"]),
          *cells(pn["biosses"])] for pn in panels])


def plot_paired(panels: list[dict], path: Path, margin: float = WIN_MARGIN) -> None:
    """One line per comparison: each seed's paired difference a dot, the mean a bar, nDCG@10 and BIOSSES side by side,
    zero and the issue's +0.01 bar marked, so a gain that rests on one seed is visible at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.7 * len(panels) + 1.6), sharey=True)
    for ax, key, label in ((axes[0], "ndcg10", "nDCG@10 (split per line)"), (axes[1], "biosses", "BIOSSES Spearman")):
        for y, pn in enumerate(panels):
            diffs = list(pn[key].values())
            if not diffs:
                continue
            mean = statistics.mean(diffs)
            ax.barh(y, mean, color="tab:blue" if mean > 0 else "tab:red", alpha=0.4)
            ax.plot(diffs, [y] * len(diffs), "o", color="k", ms=4)
        ax.axvline(0, color="0.3", lw=0.8)
        if key == "ndcg10":
            ax.axvline(margin, color="0.5", lw=0.8, ls="--")
        ax.set_xlabel(f"candidate − baseline, {label}\n(dot = seed, bar = mean)", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_yticks(range(len(panels)), [f"{pn['candidate']} − {pn['baseline']}\n({pn['source']}, {pn['steps']} "
                                            f"steps, {pn['split']}, {len(pn['ndcg10'])} seeds)" for pn in panels],
                       fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"Paired per-seed differences at equal steps (dashed: the +{margin} bar)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def row_command(row: str, seed: int) -> str:
    """The one command line that reproduces this row and seed (this invocation with --rows/--seeds narrowed)."""
    argv, skip = [], False
    for tok in sys.argv[1:]:
        if tok in ("--rows", "--seeds"):
            skip = True
            continue
        if skip and not tok.startswith("--"):
            continue
        skip = False
        argv.append(tok)
    seeds = [] if row == "offshelf" else ["--seeds", str(seed)]
    return shlex.join(["python", "bench/quality_scifact.py", *argv, "--rows", row, *seeds])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scifact", default="../shared/data/scifact", help="BEIR SciFact folder (train + test qrels)")
    p.add_argument("--out", default="runs/quality", help="study folder (resumable: finished rows are skipped)")
    p.add_argument("--rows", nargs="+", default=["offshelf", "inbatch", "bm25", "repair"],
                   help="rows to run (see the module docstring)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="training seeds (default: %(default)s)")
    p.add_argument("--biosses", default=str(ROOT / "data" / "biosses"),
                   help="BIOSSES folder (default: the shipped copy; a driver row's recorded settings name it, so a "
                        "study resumed from another checkout passes the path its rows were made with)")
    p.add_argument("--model", default="minilm", help="backbone (default: %(default)s)")
    p.add_argument("--generator", default="smollm2-135m", help="query/negative generator (default: %(default)s)")
    p.add_argument("--full_finetune", type=int, default=1, help="1 = full fine-tuning, 0 = LoRA (default: 1)")
    p.add_argument("--lr", type=float, default=2e-5, help="full fine-tuning learning rate (default: %(default)s)")
    p.add_argument("--lora_lr", type=float, default=None, help="learning rate when --full_finetune 0")
    p.add_argument("--temperature", type=float, default=0.05, help="InfoNCE temperature (default: %(default)s)")
    p.add_argument("--max_length", type=int, default=256, help="tokens per text (default: %(default)s)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per training run (default: 2 epochs of T0 at batch 32; 52 on SciFact)")
    p.add_argument("--mini_batch_size", type=int, default=64,
                   help="texts per forward pass; when a batch's queries or documents exceed it, GradCache chunks them "
                        "(the same gradients, bounded memory: SmolLM2 with one hard negative per query went past "
                        "23 GB on CPU at 64, the no-chunking value for 32 queries) (default: %(default)s)")
    p.add_argument("--subset", type=int, nargs=3, metavar=("TRAIN", "TEST", "DOCS"), default=None,
                   help="study a seeded SciFact subset instead (train claims, test claims, corpus size; every chosen "
                        "positive is kept): the secondary SmolLM2 study")
    p.add_argument("--iters", type=int, default=2, help="REPAIR iterations (default: %(default)s)")
    p.add_argument("--max_rounds", type=int, default=3, help="05 -> 06 rounds per iteration (default: %(default)s)")
    p.add_argument("--cn_ratio", type=float, default=0.25,
                   help="causalneg row: share of the kept tuples given CoT negatives (CN_RATIO; default: %(default)s, "
                        "sized for a CPU generator)")
    # --num_mined 1 keeps the repair row's one model-aware negative per triplet, so rows repair and causalneg differ
    # only in what CausalNeg adds (generated negatives + QEM); the rest sizes SmolLM2's generation for a CPU
    p.add_argument("--cn_extra", default="--num_mined 1 --max_retries 1 --write_tokens 160 --decompose_tokens 128 "
                                         "--target_words 100",
                   help="causalneg row: extra flags for 09b_counterfactual_negatives.py (CN_EXTRA; default: %(default)s)")
    p.add_argument("--dev_ids", default=str(DEV_IDS.relative_to(ROOT)),
                   help="dev claim ids (one per line; T0 = the other train claims); 'none' = the issue-9 protocol "
                        "(T0 = all train claims, rows evaluated on test) (default: %(default)s)")
    p.add_argument("--test", action="store_true",
                   help="also evaluate each row on the test claims (final rows only: baselines and the chosen REPAIR "
                        "configuration)")
    p.add_argument("--st_relative_margin", type=float, default=0.05,
                   help="st_mined row: mine_hard_negatives' relative_margin (false-negative guard) (default: %(default)s)")
    p.add_argument("--served_generator", default=None, metavar="URL",
                   help="repair_qwen* rows: the OpenAI-compatible endpoint serving Qwen2.5-Coder-1.5B-Instruct "
                        "(python -m repair.model_packages serve qwen2.5-coder-1.5b --port 8080 --n_threads 1)")
    p.add_argument("--summarize", action="store_true", help="print the results table and exit")
    p.add_argument("--export", default=None, metavar="JSON",
                   help="write the machine-readable results (one object per row) here and exit")
    p.add_argument("--plot", default=None, metavar="PNG", help="with --export/--summarize: plot dev nDCG@10 per row")
    p.add_argument("--compare", nargs="+", default=None, metavar="ROW",
                   help="print the first ROW against each following ROW (with --merge: recorded rows too): mean and "
                        "per-seed paired differences, and whether the test mean clears issue 16's +0.01, then exit")
    p.add_argument("--merge", default=None, metavar="JSON",
                   help="with --export/--summarize: also every (row, seed) an earlier export recorded that --out lacks "
                        "(a run folder lost with its machine); a (row, seed) in both keeps the recorded result and "
                        "prints the rerun beside it; a row trained for other --steps than the recorded one is kept as <row>@<steps>")
    p.add_argument("--pair", nargs=3, action="append", default=None, metavar=("JSON", "CANDIDATE", "BASELINE"),
                   help="(repeatable) print the per-seed paired differences of CANDIDATE minus BASELINE read from a "
                        "recorded export JSON (test where both rows have it, else dev), then exit")
    p.add_argument("--paired_plot", default=None, metavar="PNG", help="with --pair: plot the paired differences")
    args = p.parse_args()
    out = Path(args.out)
    if args.pair:
        panels = paired_panels(args.pair)
        print(paired_table(panels))
        if args.paired_plot:
            plot_paired(panels, Path(args.paired_plot))
        return
    if args.compare:
        if len(args.compare) < 2:
            raise SystemExit("--compare: give the candidate row and at least one baseline row")
        rows = merged_rows(out, Path(args.merge) if args.merge else None)
        print(paired_comparison(rows, args.compare[0], args.compare[1:], eval_dir=out / "eval"))
        return
    if args.summarize or args.export:
        rows = merged_rows(out, Path(args.merge) if args.merge else None)
        if args.export:
            print(f"{len(export(rows, Path(args.export)))} rows -> {args.export}")
        if args.plot:
            plot_dev(rows, Path(args.plot))
        print(summarize(rows))
        return
    study = Study(args)
    settings = {k: v for k, v in vars(args).items() if k not in ("rows", "seeds", "summarize", "export")}
    for row in args.rows:
        for seed in ([0] if row == "offshelf" else args.seeds):
            key = row if row == "offshelf" else f"{row}_s{seed}"
            row_file = study.rows / f"{key}.json"
            if row_file.exists():
                done = json.loads(row_file.read_text())
                if not (study.dev and args.test and "test_ndcg10" not in done):
                    print(f"skip {key} (done)", flush=True)
                    continue
                # a row chosen as final after its dev run: its finished training/driver steps are skipped, so only
                # the test evaluation runs; the row keeps its dev numbers, walls and command (plus --test)
                result = study.variant(row, seed) if row in VARIANTS else getattr(study, row)(seed)
                done.update({k: v for k, v in result.items() if k.startswith("test_")})
                done["command"], done["settings"] = row_command(row, seed), settings
                study.save(key, done)
                continue
            t0 = time.time()
            result = study.variant(row, seed) if row in VARIANTS else getattr(study, row)(seed)
            result["wall_seconds"] = round(time.time() - t0)
            result["settings"] = settings
            result["command"] = row_command(row, seed)
            study.save(key, result)
    print(summarize(collect(out)))


if __name__ == "__main__":
    main()
