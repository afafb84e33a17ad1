"""Bad input fails fast and the same way in every script (repair.cli.run_script): one ``error:`` line on stderr that
names the file, line and field, exit status 2, no traceback, and the traceback back with ``--debug``.

Every case runs the real script as a subprocess on a real malformed file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
IR_TINY = ROOT / "tests" / "fixtures" / "eval" / "ir-tiny"


def run(script: str, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line a refused run ends with; nothing else on stderr may look like a failure."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines and lines[-1].startswith("error: "), proc.stderr[-3000:]
    assert sum(ln.startswith("error: ") for ln in lines) == 1, proc.stderr[-3000:]
    return lines[-1]


def flag_error(proc: subprocess.CompletedProcess, script: str) -> str:
    """The one line argparse ends a refused flag with (``<script>: error: argument --flag: ...``, after the usage),
    exit status 2, no traceback; returned without the script's name."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    prefix = f"{Path(script).name}: error: "
    assert lines and lines[-1].startswith(prefix), proc.stderr[-3000:]
    assert sum("error:" in ln for ln in lines) == 1, proc.stderr[-3000:]
    return lines[-1].removeprefix(prefix)


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD_T0 = json.dumps({"query": "what is TiO2", "positive": "TiO2 is titanium dioxide."})
GOOD_EXPANSION = json.dumps({"id": "x1", "q_new": "query", "d_pos": "positive text",
                             "negative_candidates": [{"id": "n1", "title": "t", "abstract": "negative text"}]})


def test_malformed_input_is_one_line_exit_2_in_every_script(tmp_path, tiny_model_dir):
    """06, 08 and 10 used to print 12-23-line tracebacks (exit 1); every script now names file, line and field."""
    model = ["--model", str(tiny_model_dir), "--device", "cpu"]
    bad_t0 = write(tmp_path / "t0.jsonl", [GOOD_T0, json.dumps({"query": "q", "positive": 3})])
    bad_json = write(tmp_path / "exp.jsonl", [GOOD_EXPANSION, '{"q_new": "q", "d_pos": "no closing quote'])
    bad_field = write(tmp_path / "exp2.jsonl", [GOOD_EXPANSION, json.dumps(
        {"id": "x2", "q_new": "q", "d_pos": "d", "negative_candidates": [{"id": "n", "abstract": 7}]})])
    bad_generated = write(tmp_path / "05.jsonl", ['{"query": "no closing quote'])
    bad_corpus = tmp_path / "beir"
    for name in ("queries.jsonl", "qrels"):
        src = IR_TINY / name
        (bad_corpus / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            (bad_corpus / name).mkdir()
            for f in src.iterdir():
                (bad_corpus / name / f.name).write_bytes(f.read_bytes())
        else:
            (bad_corpus / name).write_bytes(src.read_bytes())
    write(bad_corpus / "corpus.jsonl", [json.dumps({"_id": "d1", "text": "fine"}), json.dumps({"_id": "d2"})])
    env = {"REPAIR_CACHE": str(tmp_path / "cache")}
    cases = [
        ("diagnosis/01_diagnosis_margin.py", ["--train_pt", str(bad_t0), "--out_dir", str(tmp_path / "dia"), *model],
         f"{bad_t0}:2: field 'positive' must be a string, got int"),
        ("expansion/06_local_corpus.py", ["--generated_jsonl", str(bad_generated), "--corpus", str(IR_TINY),
                                          "--out_jsonl", str(tmp_path / "06.jsonl"), "--no_progress"],
         f"{bad_generated}:1: invalid JSON"),
        ("differentiation/07_embed_candidates.py", ["--input_jsonl", str(bad_field), "--output_dir",
                                                    str(tmp_path / "emb"), *model],
         f"{bad_field}:2: field 'negative_candidates[0].abstract' must be str or null, got int"),
        ("differentiation/08_hard_negative_selection.py", ["--input_jsonl", str(bad_json), "--embedding_dir",
                                                           str(tmp_path / "emb"), "--output_jsonl",
                                                           str(tmp_path / "hn.jsonl")],
         # json's reason already ends in "at" ("Invalid control character at"): no "at at column" any more
         f"{bad_json}:2: invalid JSON (Invalid control character at column 42)"),
        ("differentiation/09b_counterfactual_negatives.py", ["--input", str(bad_t0), "--output_jsonl",
                                                             str(tmp_path / "cf.jsonl"), "--method", "none"],
         f"{bad_t0}:2: field 'positive' must be a string"),
        ("training/10_train_lora.py", ["--train_data", str(bad_t0), "--output_dir", str(tmp_path / "adapter"),
                                       *model, "--max_steps", "1", "--no_progress"],
         f"{bad_t0}:2: field 'positive' must be a string"),
        ("eval/eval_beir.py", ["--data", str(bad_corpus), *model, "--cache_dir", "none"],
         f"{bad_corpus / 'corpus.jsonl'}:2: missing field 'text'"),
    ]
    wrong = []
    for script, args, expected in cases:
        proc = run(script, *args, "--log_level", "WARNING", env=env)
        try:
            line = error_line(proc)
            assert line.startswith(f"error: {expected}"), line
        except AssertionError as exc:
            wrong.append(f"{script}: {exc}")
    assert not wrong, "\n".join(wrong)
    assert not (tmp_path / "hn.jsonl").exists() and not (tmp_path / "adapter" / "adapter_config.json").exists()


def test_debug_flag_and_env_show_the_traceback(tmp_path):
    bad = tmp_path / "exp.jsonl"
    bad.write_text('{"q_new": "q", "d_pos": "unterminated')  # no newline: json says "starting at"
    args = ["--input_jsonl", str(bad), "--embedding_dir", str(tmp_path / "emb"), "--output_jsonl",
            str(tmp_path / "hn.jsonl")]
    for proc in (run("differentiation/08_hard_negative_selection.py", "--debug", *args),
                 run("differentiation/08_hard_negative_selection.py", *args, env={"REPAIR_DEBUG": "1"})):
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback (most recent call last)" in proc.stderr and "repair.records.DataError" in proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == f"error: {bad}:1: invalid JSON (Unterminated string " \
                                                       f"starting at column 25)"
    assert "Traceback" not in run("differentiation/08_hard_negative_selection.py", *args).stderr


def test_empty_input_to_08_is_an_error_not_an_empty_file(tmp_path):
    empty = write(tmp_path / "06.jsonl", [])
    proc = run("differentiation/08_hard_negative_selection.py", "--input_jsonl", str(empty), "--embedding_dir",
               str(tmp_path / "emb"), "--output_jsonl", str(tmp_path / "hn.jsonl"))
    assert error_line(proc) == f"error: {empty}: no tuples to read (0 lines); the stage that writes this input " \
                               f"produced nothing"
    assert not (tmp_path / "hn.jsonl").exists()


def test_merge_with_an_impossible_pct_names_the_flag(tmp_path):
    """04 --pct 150 said "run 02 with --pct 150", which 02 rejects; the flag's type refuses it (issue 44)."""
    proc = run("diagnosis/04_merge_cconf.py", "--pct", "150", "--dia_out_dir", str(tmp_path))
    assert flag_error(proc, "04_merge_cconf.py") == "argument --pct: must be in 1..100, got 150"


def test_unknown_eval_task_is_named(tmp_path):
    """EVAL_DATA=scifact:irr:PATH blamed the folder 'scifact:irr:PATH'; the task is what is wrong."""
    proc = run("eval/eval_suite.py", "--data", f"scifact:irr:{IR_TINY}", "--model", "minilm")
    assert error_line(proc) == (f"error: dataset 'scifact:irr:{IR_TINY}': unknown task 'irr' in NAME:TASK:PATH "
                                f"(expected one of ir, qa, mesh, relish, sts)")


def test_embed_candidates_cache_dir_none_creates_no_folder(tmp_path, tiny_model_dir):
    """07 --cache_dir none used to create a folder named 'none' (in the working directory)."""
    data = write(tmp_path / "06.jsonl", [GOOD_EXPANSION])
    proc = subprocess.run([sys.executable, str(ROOT / "differentiation" / "07_embed_candidates.py"), "--input_jsonl",
                           str(data), "--output_dir", str(tmp_path / "emb"), "--model", str(tiny_model_dir),
                           "--device", "cpu", "--cache_dir", "none"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "none").exists() and not (tmp_path / "emb" / "cache").exists()
    meta = json.loads((tmp_path / "emb" / "meta.json").read_text())
    assert meta["n_queries"] == 1 and meta["n_documents"] == 2 and meta["texts_forwarded"] == 3


def test_unknown_model_says_what_a_model_can_be(tmp_path):
    """MODEL=does-not-exist ended in a 90-line traceback about connecting to the hub."""
    proc = run("eval/eval_beir.py", "--data", str(IR_TINY), "--model", "does-not-exist", "--device", "cpu",
               env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    line = error_line(proc)
    assert line.startswith("error: model 'does-not-exist' is neither an alias (")
    assert "a local folder nor a Hugging Face hub id in the local cache" in line


def test_cached_hub_id_still_loads_offline(tmp_path, tiny_model_dir):
    """Resolving the name first must not break a hub id that is only in the local Hugging Face cache."""
    snapshot = tmp_path / "hf" / "hub" / "models--repair-test--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    proc = run("eval/eval_beir.py", "--data", str(IR_TINY), "--model", "repair-test/tiny", "--device", "cpu",
               "--cache_dir", "none", "--max_length", "64",
               env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["model"] == "repair-test/tiny" and row["num_queries"] == 3 and 0.0 <= row["ndcg@10"] <= 1.0
