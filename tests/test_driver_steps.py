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
