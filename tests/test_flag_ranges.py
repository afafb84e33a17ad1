"""Issue 44: every number a user gives is finite and bounded, stated once (repair.cli's flag types, the driver's
settings table), and every input text is valid Unicode. Each case below failed on 8ad13db: a traceback, a silent
wrong result or output files a rerun would trust; each is now argparse's (or the loader's) one line and exit 2,
before any work. The scripts run as subprocesses, as a user runs them."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repair.cli import (COUNT_MAX, SEED_MAX, any_float, bounded_int, non_negative_int, percentile, positive_int,
                        positive_share, probability, seed_int, share_below_one)
from repair.data import TRIPLET_OPTIONAL, TRIPLET_REQUIRED, DataError, iter_jsonl, load_seed
from tests.test_cli_errors import error_line, flag_error, run, write

ROOT = Path(__file__).resolve().parents[1]
IR_TINY = ROOT / "tests" / "fixtures" / "eval" / "ir-tiny"
# the scripts a user runs, and the library modules that build parts of their parsers
SCRIPT_DIRS = ("diagnosis", "expansion", "differentiation", "training", "eval")
PARSER_MODULES = ("repair/cli.py", "repair/diagnosis/stages.py", "repair/expansion/cli.py",
                  "repair/expansion/generation.py", "repair/evaluation/cli.py",
                  # library modules with a command line of their own (python -m ...)
                  "repair/expansion/sources/s2_datasets.py", "repair/expansion/sources/literature.py")


def refusal(flag_type, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        flag_type(text)
    return str(err.value)


def test_the_shared_flag_types_take_their_range_and_refuse_the_rest_saying_it():
    assert (positive_int("1"), positive_int(str(COUNT_MAX)), seed_int("0"), seed_int(str(SEED_MAX))) == (
        1, COUNT_MAX, 0, SEED_MAX)
    assert refusal(positive_int, "0") == "must be in 1..2147483647, got 0"
    assert refusal(positive_int, "-5") == "must be in 1..2147483647, got -5"
    assert refusal(positive_int, "99999999999999999999") == "must be in 1..2147483647, got 99999999999999999999"
    assert refusal(positive_int, "1.5") == "must be an integer, got '1.5'"
    assert refusal(non_negative_int, "-1") == "must be in 0..2147483647, got -1"
    assert refusal(bounded_int(-1), "-2") == "must be in -1..2147483647, got -2"
    assert refusal(percentile, "150") == "must be in 1..100, got 150"
    assert refusal(seed_int, str(2**32)) == "must be in 0..4294967295, got 4294967296"
    assert (probability("0"), probability("1"), positive_share("1"), share_below_one("0")) == (0, 1, 1, 0)
    for flag_type in (probability, positive_share, share_below_one, any_float):
        for text in ("nan", "inf", "-inf", "1e999"):
            assert refusal(flag_type, text) == f"must be a finite number, got {text!r}"
    assert refusal(probability, "-0.5") == "must be in [0, 1], got -0.5"
    assert refusal(positive_share, "0") == "must be in (0, 1], got 0"
    assert refusal(share_below_one, "1") == "must be in [0, 1), got 1"
    assert refusal(any_float, "x") == "must be a number, got 'x'"
    assert any_float("-0.25") == -0.25


def _bare_numeric_flags(path: Path) -> list[str]:
    """``add_argument(..., type=int|float)`` calls without ``choices`` (a closed set is bounded already)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(kw.get("type"), ast.Name) and kw["type"].id in ("int", "float") and "choices" not in kw:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_script_flag_takes_a_bare_int_or_float():
    """One place states each flag's range: every numeric flag of the scripts (and of the library parts that build
    their parsers) takes one of repair.cli's types, never Python's unbounded int or NaN-accepting float."""
    files = [p for d in SCRIPT_DIRS for p in sorted((ROOT / d).glob("*.py"))] + [ROOT / m for m in PARSER_MODULES]
    assert len(files) > 25
    assert [hit for f in files for hit in _bare_numeric_flags(f)] == []


def test_out_of_range_flags_stop_each_script_in_one_line_before_any_output(tmp_path):
    """The trials of issue 44, each a traceback or a silent wrong result on 8ad13db: 01 --max_length 0 (a traceback
    with a decoder, a run on empty texts with an encoder), 08 --top_k 99999999999999999999 (OverflowError), 08
    --fn_pct nan / --fn_margin nan (the false-negative guard silently off), 08 --fn_pct -0.5 (every candidate
    dropped, exit 0), 05 --seed 2**64 (refused after creating its output files), 10 --seed 2**64 (refused naming no
    flag, the output folder left), 10 --warmup_ratio 5 (trained)."""
    t0 = write(tmp_path / "t0.jsonl", [json.dumps({"query": f"q{i}", "positive": f"p{i}"}) for i in range(4)])
    tuples = write(tmp_path / "06.jsonl", [json.dumps({"id": "x1", "q_new": "q", "d_pos": "d",
                                                      "negative_candidates": [{"id": "n", "abstract": "n"}]})])
    concepts = write(tmp_path / "concepts.txt", ["TiO2", "perovskite"])
    out = tmp_path / "out"
    huge_seed = str(2**64)
    cases = [
        ("diagnosis/01_diagnosis_margin.py", ["--train_pt", str(t0), "--out_dir", str(out), "--max_length", "0"],
         "--max_length", "must be in 1..2147483647, got 0"),
        *[("differentiation/08_hard_negative_selection.py",
           ["--input_jsonl", str(tuples), "--embedding_dir", str(tmp_path / "emb"), "--output_jsonl", str(out),
            flag, value], flag, message)
          for flag, value, message in [
              ("--top_k", "99999999999999999999", "must be in 1..2147483647, got 99999999999999999999"),
              ("--fn_pct", "nan", "must be a finite number, got 'nan'"),
              ("--fn_margin", "nan", "must be a finite number, got 'nan'"),
              ("--fn_pct", "-0.5", "must be in (0, 1], got -0.5")]],
        ("expansion/05_query_generation.py", ["--concept_txt", str(concepts), "--out_jsonl", str(out), "--seed",
                                              huge_seed], "--seed", f"must be in 0..4294967295, got {huge_seed}"),
        ("training/10_train_lora.py", ["--train_data", str(t0), "--output_dir", str(out), "--seed", huge_seed],
         "--seed", f"must be in 0..4294967295, got {huge_seed}"),
        ("training/10_train_lora.py", ["--train_data", str(t0), "--output_dir", str(out), "--warmup_ratio", "5"],
         "--warmup_ratio", "must be in [0, 1), got 5"),
    ]
    wrong = []
    for script, args, flag, message in cases:
        proc = run(script, *args, timeout=120)
        try:
            assert flag_error(proc, script) == f"argument {flag}: {message}"
            assert not out.exists() and not list(tmp_path.glob("out*")), "an output was left behind"
        except AssertionError as exc:
            wrong.append(f"{script} {flag}: {exc}")
    assert not wrong, "\n".join(wrong)


def test_the_library_command_lines_refuse_out_of_range_numbers_in_one_line(tmp_path):
    """``python -m repair.expansion.sources.literature`` and ``... .s2_datasets`` take repair.cli's flag types too: a
    zero thread count, a negative k, zero workers or a NaN timeout is argparse's one line and exit 2, before any
    folder is made or any request sent (the API URL points at a closed port)."""
    out = tmp_path / "out"
    corpus = write(tmp_path / "papers.jsonl", ['{"id": "p1", "title": "Graphene", "abstract": "a"}'])
    lit, s2 = "repair.expansion.sources.literature", "repair.expansion.sources.s2_datasets"
    cases = [(lit, ["build", str(corpus), "--index", str(out), "--threads", "0"], "--threads",
              "must be in 1..2147483647, got 0"),
             (lit, ["search", "graphene", "--index", str(out), "--k", "-1"], "--k", "must be in 1..2147483647, got -1"),
             (s2, ["download", "--out", str(out), "--workers", "0", "--max_retries", "0"], "--workers",
              "must be in 1..2147483647, got 0"),
             (s2, ["download", "--out", str(out), "--timeout", "nan", "--max_retries", "0"], "--timeout",
              "must be a finite number, got 'nan'"),
             (s2, ["list", "--max_retries", "-1"], "--max_retries", "must be in 0..2147483647, got -1")]
    env = {k: v for k, v in os.environ.items() if k != "S2_API_KEY"}
    env |= {"S2_DATASETS_API_URL": "http://127.0.0.1:9", "OMP_NUM_THREADS": "1"}
    wrong = []
    for module, args, flag, message in cases:
        proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=120)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        try:
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
            assert lines[-1].endswith(f": error: argument {flag}: {message}"), proc.stderr[-2000:]
            assert sum("error:" in ln for ln in lines) == 1, proc.stderr[-2000:]
            assert not out.exists(), "a folder was made"
        except (AssertionError, IndexError) as exc:
            wrong.append(f"{module} {flag}: {exc}")
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------------------------------- text and scores
def test_a_lone_surrogate_is_refused_naming_file_line_and_field(tmp_path):
    """JSON can escape half a UTF-16 pair ("\\ud800"); it decoded into a str that failed only when a tokenizer encoded
    it, in an error naming no file or line. The one JSONL reader now refuses it, so every input (T0, BEIR corpus and
    queries, every stage's JSONL) does; a whole pair (an emoji written as two escapes) is valid text."""
    t0 = tmp_path / "t0.jsonl"
    t0.write_text('{"query": "an emoji \\ud83d\\ude00", "positive": "p1"}\n{"query": "q2 \\ud800", "positive": "p2"}\n')
    with pytest.raises(DataError) as err:
        load_seed(t0)
    assert str(err.value) == f"{t0}:2: field 'query' is not valid Unicode text: it holds \\ud800, half of a UTF-16 " \
                             f"surrogate pair"
    nested = tmp_path / "06.jsonl"
    nested.write_text('{"id": "x", "negative_candidates": [{"abstract": "ok"}, {"abstract": "\\udfff!"}]}\n')
    with pytest.raises(DataError, match=r"06.jsonl:1: field 'negative_candidates\[1\].abstract' is not valid Unicode"):
        list(iter_jsonl(nested))
    fine = tmp_path / "fine.jsonl"
    fine.write_text('{"query": "\\ud83d\\ude00 and \\u00e9", "positive": "p"}\n')
    assert load_seed(fine).queries == ["\U0001F600 and \u00e9"]
    # the driver reads T0 in its up-front check: the run stops there, naming the setting, the file and the line
    from tests.test_settings import _resolve

    proc = _resolve({"TRAIN_DATA": str(t0), "LOCAL_CORPUS": str(IR_TINY), "OUT_DIR": str(tmp_path / "run")})
    assert (proc.returncode, proc.stderr) == (2, f"TRAIN_DATA: {err.value}\n")


def test_hard_negative_scores_must_be_finite_numbers_in_09b_and_10(tmp_path, tiny_model_dir):
    """09b copied any list as hard_negative_scores into its output and 10 trained on it; the one triplet schema
    (repair.data.TRIPLET_OPTIONAL, read by 09, 09b and 10) now wants a finite number per negative (null where 09b
    generated one): not a string, a bool or NaN (which Python's json reads)."""
    line = {"query": "q", "pos_document": "d", "hard_negatives": ["a", "b"]}
    for scores in ([0.5, 1], [0.5, None]):
        f = write(tmp_path / "good.jsonl", [json.dumps({**line, "hard_negative_scores": scores})])
        assert [r["hard_negative_scores"] for r in iter_jsonl(f, TRIPLET_REQUIRED, TRIPLET_OPTIONAL)] == [scores]
    expected = "field 'hard_negative_scores' must be list[finite number or null], got list"
    for scores in (["high", "low"], [float("nan"), 0.5], [True, 0.5]):
        f = write(tmp_path / "bad.jsonl", [json.dumps({**line, "hard_negative_scores": scores})])
        with pytest.raises(DataError) as err:
            list(iter_jsonl(f, TRIPLET_REQUIRED, TRIPLET_OPTIONAL))
        assert str(err.value).startswith(f"{f}:1: {expected}")
    triplets = write(tmp_path / "final.jsonl", [json.dumps({**line, "hard_negative_scores": ["high", "low"]})])
    cn = run("differentiation/09b_counterfactual_negatives.py", "--input", str(triplets), "--output_jsonl",
             str(tmp_path / "cn.jsonl"), "--config", "mined", "--corpus", str(IR_TINY),
             env={"REPAIR_CACHE": str(tmp_path / "cache")})
    assert error_line(cn).startswith(f"error: {triplets}:1: {expected}")
    assert not (tmp_path / "cn.jsonl").exists()
    train = run("training/10_train_lora.py", "--triplets", str(triplets), "--output_dir", str(tmp_path / "adapter"),
                "--model", str(tiny_model_dir), "--max_steps", "1", "--device", "cpu")
    assert error_line(train).startswith(f"error: {triplets}:1: {expected}")
    assert not (tmp_path / "adapter" / "adapter_config.json").exists()
