"""repair.driver.steps' output records: a finished step lists the files it wrote (what a reuse of the run copies),
including what a killed first attempt wrote, and nothing it did not write."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from repair.driver.steps import StepRunner, step_outputs

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> None:
    """The calls run_repair.sh's step() makes."""
    subprocess.run([sys.executable, "-m", "repair.driver.steps", *args], check=True, cwd=ROOT)


def test_a_step_records_its_files_across_a_killed_attempt_and_nothing_else(tmp_path):
    run, state = tmp_path / "run", tmp_path / "run" / ".state"
    for folder in (state, run / "logs", run / "cache" / "embeddings", run / "iter1" / "diagnosis"):
        folder.mkdir(parents=True)
    earlier = run / "iter1" / "diagnosis" / "from_an_earlier_step.jsonl"
    earlier.write_text("x")
    an_hour_ago = time.time() - 3600
    os.utime(earlier, (an_hour_ago, an_hour_ago))
    cli("begin", str(state), "iter1.08_hardneg")
    time.sleep(0.05)  # a step's command starts a process before it writes: never in the stamp's clock tick
    first_attempt = run / "iter1" / "differentiation" / "hard_negatives.jsonl"
    first_attempt.parent.mkdir()
    first_attempt.write_text("half")
    # killed here: no record; the rerun's begin keeps the first attempt's stamp
    time.sleep(0.05)
    cli("begin", str(state), "iter1.08_hardneg")
    (run / "iter1" / "differentiation" / "hard_negatives.stats.json").write_text("{}")
    for not_an_output in (run / "logs" / "iter1.08_hardneg.log", run / "cache" / "embeddings" / "shard-0.npy",
                          run / "report.json"):
        not_an_output.write_text("y")
    assert step_outputs(state, "iter1.08_hardneg") is None
    cli("record", str(state), "iter1.08_hardneg")
    assert step_outputs(state, "iter1.08_hardneg") == ["iter1/differentiation/hard_negatives.jsonl",
                                                       "iter1/differentiation/hard_negatives.stats.json"]
    assert not (state / "iter1.08_hardneg.started").exists()
    # FORCE=1 (--fresh) restamps: only what the forced run writes is its output
    time.sleep(0.05)
    cli("begin", str(state), "iter1.08_hardneg", "--fresh")
    time.sleep(0.05)
    (run / "iter1" / "differentiation" / "hard_negatives.stats.json").write_text("{ }")
    cli("record", str(state), "iter1.08_hardneg")
    assert step_outputs(state, "iter1.08_hardneg") == ["iter1/differentiation/hard_negatives.stats.json"]


def test_the_python_step_runner_records_what_its_command_wrote(tmp_path):
    run = tmp_path / "run"
    (run / ".state").mkdir(parents=True)
    (run / "logs").mkdir()
    target = run / "iter1" / "expansion" / "generated.jsonl"
    runner = StepRunner(run / ".state", run / "logs")
    runner.run("iter1.05_generate.r1", [sys.executable, "-c",
                                        f"import pathlib; p = pathlib.Path({str(target)!r}); "
                                        "p.parent.mkdir(parents=True); p.write_text('q')"])
    assert (run / ".state" / "iter1.05_generate.r1.done").exists()
    assert step_outputs(run / ".state", "iter1.05_generate.r1") == ["iter1/expansion/generated.jsonl"]


def test_force_clears_every_marker_and_step_output_before_any_step(tmp_path):
    """FORCE=1 (issue 44) starts the run folder over before its first step: a step cleared only when reached left
    the later steps' markers and files (a trained adapter) of the old settings, which a FORCE run killed midway and
    then rerun plainly would skip or resume. The settings record, the logs and the content-keyed caches stay."""
    run = tmp_path / "run"
    made = {".state/iter1.10_train.done": "3", ".state/iter1.10_train.outputs": "", "iter0/adapter/a.safetensors": "w",
            "iter1/adapter/checkpoints/step-1/state.json": "{}", "iter12/eval/eval.json": "{}",
            "t0_negatives/t0_bm25.jsonl": "{}", "report.md": "r", "report.json": "{}", "train_loss.png": "p",
            "settings.json": "{}", "logs/iter1.10_train.log": "l", "cache/embeddings/x/meta.json": "{}",
            "iteration_notes/mine.txt": "a user's", "notes.md": "a user's"}
    for rel, text in made.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    proc = subprocess.run([sys.executable, "-m", "repair.driver.steps", "clear", str(run)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert "FORCE=1: removed the earlier run's markers and outputs (.state, iter0, iter1, iter12, report.json, " \
           "report.md, t0_negatives, train_loss.png)" in proc.stdout
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    assert left == ["cache/embeddings/x/meta.json", "iteration_notes/mine.txt", "logs/iter1.10_train.log", "notes.md",
                    "settings.json"]
    assert (run / ".state").is_dir() and not any((run / ".state").iterdir())


def test_a_file_written_in_the_start_stamps_clock_tick_is_not_the_steps(tmp_path):
    """File times come from a coarse clock: the driver's own write just before a step starts (a Stage II round's
    funnel line) can carry the stamp's exact time. It is not the step's output, whichever way the tick fell."""
    run, state = tmp_path / "run", tmp_path / "run" / ".state"
    state.mkdir(parents=True)
    funnel = run / "iter2" / "expansion" / "expansion.jsonl.funnel.jsonl"
    funnel.parent.mkdir(parents=True)
    funnel.write_text("{}\n")
    cli("begin", str(state), "iter2.05_generate.r2")
    stamp_ns = (state / "iter2.05_generate.r2.started").stat().st_mtime_ns
    os.utime(funnel, ns=(stamp_ns, stamp_ns))  # the same tick
    generated = run / "iter2" / "expansion" / "generated.jsonl"
    generated.write_text("q\n")
    os.utime(generated, ns=(stamp_ns + 1, stamp_ns + 1))  # the next instant the clock can tell apart
    cli("record", str(state), "iter2.05_generate.r2")
    assert step_outputs(state, "iter2.05_generate.r2") == ["iter2/expansion/generated.jsonl"]
