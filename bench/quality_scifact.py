#!/usr/bin/env python
"""Measured quality on SciFact: does REPAIR beat plain fine-tuning here? (issue 9)

T0 = the 809 SciFact train claims (one positive each), evaluation = the 300 test claims over the full
5,183-document corpus (exact search), plus BIOSSES Spearman. Every trained row gets the same budget
(52 optimizer steps of 32 examples = 2 epochs of T0) and the same settings; rows are run per seed.

Rows (``--rows``; each row's result lands in <out>/rows/<row>.json and is skipped when present):
  offshelf              the backbone as is
  inbatch               fine-tuned on T0, in-batch negatives only
  bm25                  fine-tuned on T0 + the top BM25 hit that is not a positive (bm25s), one per claim
  repair                run_repair.sh, 2 iterations (diagnosis -> expansion with the local-corpus source ->
                        differentiation -> training on T0 + new triplets), each iteration 52 steps from the last
  causalneg             as repair with NEGATIVES=causalneg (CoT counterfactual negatives on --cn_ratio of the kept
                        tuples + QEM); iteration 1's stages up to 09 are copied from repair_s<seed> when it has them
  repair_basegen        as repair, but the generator is the plain backbone in every iteration (GEN_ADAPTER=none;
                        the paper merges the retriever's adapter into it); iteration 1 is copied from repair_s<seed>
  inbatch2x / bm25x2    the 2-iteration budget (2 x --steps) for plain fine-tuning, to compare with repair iter 2
  st_reference          sentence-transformers' own trainer (MultipleNegativesRankingLoss), the calibration peer

    python bench/quality_scifact.py --scifact ../shared/data/scifact --out runs/quality --rows offshelf inbatch bm25 repair --seeds 1 2
    python bench/quality_scifact.py --out runs/quality --summarize      # the table for docs/results.md
    # the secondary study: SmolLM2-135M (EOS pooling, LoRA lr 1e-3, 32 steps per training) on a 256/100/1000
    # subset at 128 tokens; REPAIR's trainings hold a hard negative per query, hence the GradCache chunking
    O="--out runs/quality_smollm2_b --subset 256 100 1000 --model smollm2-135m --full_finetune 0 --lora_lr 1e-3
       --temperature 0.02 --max_length 128 --steps 32 --iters 2 --max_rounds 1"
    python bench/quality_scifact.py $O --rows offshelf inbatch inbatch2x --seeds 1
    python bench/quality_scifact.py $O --rows repair repair_basegen --seeds 1 --mini_batch_size 32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from repair.data import load_beir, load_seed, write_beir_slice  # noqa: E402
from repair.train import training_finished  # noqa: E402

PY = sys.executable


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


class Study:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out).resolve()
        self.rows = self.out / "rows"
        self.rows.mkdir(parents=True, exist_ok=True)
        self.scifact = str(Path(args.scifact).resolve())
        if args.subset:
            self.scifact = self.make_subset(*args.subset)
        if args.steps is None:  # 2 epochs of T0 at batch 32: 52 steps on the 809 SciFact claims
            args.steps = 2 * math.ceil(len(load_seed(self.scifact, split="train")) / 32)
        self.biosses = str(ROOT / "data" / "biosses")

    # ---------------------------------------------------------------- shared pieces
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

    def evaluate(self, name: str, model: str) -> dict:
        """nDCG@10 / Recall@100 on the SciFact test claims and BIOSSES Spearman; ``model`` may be an adapter folder."""
        out = self.out / "eval" / f"{name}.json"
        if not out.exists():
            cmd = [PY, ROOT / "eval" / "eval_suite.py", "--model", model, "--data", f"scifact:ir:{self.scifact}",
                   self.biosses, "--max_length", str(self.args.max_length), "--output", out,
                   "--cache_dir", self.out / "cache"]
            run(cmd, self.out / "logs" / f"eval_{name}.log")
        res = json.loads(out.read_text())
        by = {r["dataset"]: r for r in res["results"]}
        return {"ndcg@10": by["scifact"]["ndcg@10"], "recall@100": by["scifact"]["recall@100"],
                "biosses_spearman": by["biosses"]["spearman"]}

    def bm25_triplets(self) -> Path:
        path = self.out / "data" / "scifact_train_bm25.jsonl"
        if not path.exists():
            run([PY, ROOT / "differentiation" / "09b_counterfactual_negatives.py", "--config", "mined", "--input",
                 self.scifact, "--split", "train", "--corpus", self.scifact, "--output_jsonl", path],
                self.out / "logs" / "bm25_triplets.log")
        return path

    def save(self, row: str, result: dict) -> None:
        (self.rows / f"{row}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({"row": row, **{k: v for k, v in result.items() if k in ("ndcg@10", "recall@100",
                                                                                   "biosses_spearman")}}),
              flush=True)

    # ---------------------------------------------------------------- rows
    def offshelf(self, seed: int) -> dict:
        t0 = time.time()
        return {**self.evaluate("offshelf", self.args.model), "seconds": round(time.time() - t0)}

    def _train_and_eval(self, name: str, data_flags: list[str], steps: int, seed: int) -> dict:
        folder = self.out / "train" / name
        seconds = 0.0
        # an interrupted run resumes (from step 0 when it saved no checkpoint)
        if not training_finished(folder):
            seconds = run([PY, ROOT / "training" / "10_train_lora.py", *self.train_flags(steps), *data_flags,
                           "--seed", str(seed), "--output_dir", folder, "--resume"],
                          self.out / "logs" / f"train_{name}.log")
        # a LoRA folder is passed as the model: the eval suite reads its base from adapter_config.json
        return {**self.evaluate(name, str(folder)), "train_seconds": round(seconds), "steps": steps}

    def inbatch(self, seed: int, steps: int | None = None, tag: str = "inbatch") -> dict:
        return self._train_and_eval(f"{tag}_s{seed}", ["--train_data", self.scifact, "--split", "train"],
                                    steps or self.args.steps, seed)

    def bm25(self, seed: int, steps: int | None = None, tag: str = "bm25") -> dict:
        return self._train_and_eval(f"{tag}_s{seed}", ["--triplets", self.bm25_triplets(), "--num_hard_negatives", "1"],
                                    steps or self.args.steps, seed)

    def inbatch2x(self, seed: int) -> dict:
        return self.inbatch(seed, 2 * self.args.steps, "inbatch2x")

    def bm25x2(self, seed: int) -> dict:
        return self.bm25(seed, 2 * self.args.steps, "bm25x2")

    def _driver(self, name: str, seed: int, extra: dict) -> dict:
        a = self.args
        run_dir = self.out / "repair" / name
        env = {"MODEL": a.model, "TRAIN_DATA": self.scifact, "TRAIN_SPLIT": "train", "OUT_DIR": str(run_dir),
               "ITERS": str(a.iters), "EVAL_DATA": f"scifact:ir:{self.scifact} {self.biosses}",
               "LOCAL_CORPUS": self.scifact, "GEN_MODEL": a.generator, "MAX_LENGTH": str(a.max_length),
               "LR": str(a.lora_lr if (a.lora_lr and not a.full_finetune) else a.lr),
               "TEMPERATURE": str(a.temperature), "GLOBAL_BATCH": "32", "MINI_BATCH": str(a.mini_batch_size),
               "FULL_FINETUNE": "1" if a.full_finetune else "0", "SEED": str(seed),
               "MAX_ROUNDS": str(a.max_rounds), "PYTHON": PY,
               "TRAIN_EXTRA": f"--max_steps {a.steps} --epochs 100 --warmup_ratio 0.1 --weight_decay 0.01 "
                              f"--save_steps 0 --no_progress", **extra}
        self.reuse_offshelf_eval(run_dir)
        seconds = run(["bash", ROOT / "run_repair.sh"], self.out / "logs" / f"driver_{name}.log", env=env)
        report = json.loads((run_dir / "report.json").read_text())
        per_iter = []
        for it in report["iterations"]:
            ev = json.loads((run_dir / f"iter{it['iter']}" / "eval" / "eval.json").read_text())
            by = {r["dataset"]: r for r in ev["results"]}
            per_iter.append({"iter": it["iter"], "ndcg@10": by["scifact"]["ndcg@10"],
                             "recall@100": by["scifact"]["recall@100"], "biosses_spearman": by["biosses"]["spearman"],
                             **{k: it.get(k) for k in ("q_conf", "c_conf", "generated", "generated_accepted",
                                                       "verified", "kept", "kept_rate")},
                             "stage_seconds": it.get("seconds")})
        last = per_iter[-1]
        return {"ndcg@10": last["ndcg@10"], "recall@100": last["recall@100"],
                "biosses_spearman": last["biosses_spearman"], "iterations": per_iter,
                "seconds": round(seconds), "run_dir": str(run_dir)}

    def repair(self, seed: int) -> dict:
        return self._driver(f"repair_s{seed}", seed, {})

    def reuse_offshelf_eval(self, run_dir: Path) -> None:
        """A driver run's iteration 0 evaluates the untouched backbone: the offshelf row's result, same command and
        data, so it is copied in (with the driver's done marker) instead of re-encoding the corpus per row."""
        offshelf = self.out / "eval" / "offshelf.json"
        target = run_dir / "iter0" / "eval" / "eval.json"
        if offshelf.exists() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(offshelf, target)
            (run_dir / ".state").mkdir(exist_ok=True)
            (run_dir / ".state" / "iter0.eval.done").write_text("0\n")

    def reuse_repair_stages(self, seed: int, run_dir: Path, whole_iteration: bool = False) -> bool:
        """Start a variant run from the REPAIR run's finished iteration-1 stages (up to 09, or all of them).

        Up to 09 a CausalNeg run is the same commands with the same seed on the same model (NEGATIVES only changes
        what follows 09); a GEN_ADAPTER=none run is the same through iteration 1's evaluation (iteration 1's
        generator has no retriever adapter yet). Copying those outputs and done markers gives the files a fresh
        run would write, and the row pays only for what differs. Later iterations are always run.
        """
        src = self.out / "repair" / f"repair_s{seed}"
        last = "iter1.eval" if whole_iteration else "iter1.09_consistency"
        marker = run_dir / "REUSED_FROM"  # so a resumed row still reports where its stages came from
        if (run_dir / "iter1").exists() or not (src / ".state" / f"{last}.done").exists():
            return marker.exists()
        (run_dir / "iter1").mkdir(parents=True)
        (run_dir / ".state").mkdir(exist_ok=True)
        shutil.copytree(src / "iter0", run_dir / "iter0", dirs_exist_ok=True)
        stages = ("diagnosis", "expansion", "differentiation") + (("adapter", "eval") if whole_iteration else ())
        for stage in stages:
            shutil.copytree(src / "iter1" / stage, run_dir / "iter1" / stage)
        shared_steps = ("01_", "02_", "03_", "04_", "05_", "06_", "07_", "08_", "09_", "expansion")
        if whole_iteration:
            shared_steps += ("10_", "eval")
        for done in (src / ".state").iterdir():
            iteration, step = done.name.split(".")[:2]
            if (iteration, step) == ("iter0", "eval") or (iteration == "iter1" and step.startswith(shared_steps)):
                shutil.copy2(done, run_dir / ".state" / done.name)
        marker.write_text(f"{src}: iteration 0 eval and iteration 1 steps {'01-eval' if whole_iteration else '01-09'}\n")
        return True

    def causalneg(self, seed: int) -> dict:
        name = f"causalneg_s{seed}"
        reused = self.reuse_repair_stages(seed, self.out / "repair" / name)
        extra = {"NEGATIVES": "causalneg", "CN_RATIO": str(self.args.cn_ratio), "CN_EXTRA": self.args.cn_extra}
        return {**self._driver(name, seed, extra), "reused_repair_stages": reused}

    def repair_basegen(self, seed: int) -> dict:
        name = f"repair_basegen_s{seed}"
        reused = self.reuse_repair_stages(seed, self.out / "repair" / name, whole_iteration=True)
        return {**self._driver(name, seed, {"GEN_ADAPTER": "none"}), "reused_repair_stages": reused}

    def st_reference(self, seed: int) -> dict:
        folder = self.out / "train" / f"st_reference_s{seed}"
        seconds = 0.0
        if not (folder / "config.json").exists():
            seconds = run([PY, ROOT / "bench" / "st_reference_train.py", "--scifact", self.scifact, "--seed", str(seed),
                           "--output_dir", folder, "--max_length", str(self.args.max_length)],
                          self.out / "logs" / f"train_st_reference_s{seed}.log")
        return {**self.evaluate(f"st_reference_s{seed}", str(folder)), "train_seconds": round(seconds)}


def summarize(out: Path) -> str:
    rows: dict[str, list[dict]] = {}
    for f in sorted((out / "rows").glob("*.json")):
        name = f.stem.rsplit("_s", 1)[0] if "_s" in f.stem else f.stem
        rows.setdefault(name, []).append(json.loads(f.read_text()))
    lines = ["| row | runs | nDCG@10 (mean ± sd) | Recall@100 | BIOSSES ρ |", "|---|---|---|---|---|"]
    for name, results in rows.items():
        def stat(key: str) -> str:
            vals = [r[key] for r in results if r.get(key) is not None]
            if not vals:
                return "–"
            if len(vals) == 1:
                return f"{vals[0]:.4f}"
            return f"{statistics.mean(vals):.4f} ± {statistics.stdev(vals):.4f}"
        lines.append(f"| {name} | {len(results)} | {stat('ndcg@10')} | {stat('recall@100')} | {stat('biosses_spearman')} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scifact", default="../shared/data/scifact", help="BEIR SciFact folder (train + test qrels)")
    p.add_argument("--out", default="runs/quality", help="study folder (resumable: finished rows are skipped)")
    p.add_argument("--rows", nargs="+", default=["offshelf", "inbatch", "bm25", "repair"],
                   help="rows to run (see the module docstring)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="training seeds (default: %(default)s)")
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
    p.add_argument("--summarize", action="store_true", help="print the results table and exit")
    args = p.parse_args()
    out = Path(args.out)
    if args.summarize:
        print(summarize(out))
        return
    study = Study(args)
    for row in args.rows:
        for seed in ([0] if row == "offshelf" else args.seeds):
            key = row if row == "offshelf" else f"{row}_s{seed}"
            if (study.rows / f"{key}.json").exists():
                print(f"skip {key} (done)", flush=True)
                continue
            t0 = time.time()
            result = getattr(study, row)(seed)
            result["wall_seconds"] = round(time.time() - t0)
            result["settings"] = {k: v for k, v in vars(args).items() if k not in ("rows", "seeds", "summarize")}
            study.save(key, result)
    print(summarize(out))


if __name__ == "__main__":
    main()
