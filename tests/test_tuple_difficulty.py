"""bench/tuple_difficulty.py: how many of a run's final training tuples the model already ranks first, per source and
per asked query type, read from the run's last iteration (the numbers issue 30's Stage II diagnosis cites)."""

import json
import subprocess
import sys
from pathlib import Path

from repair.data import write_jsonl

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "tuple_difficulty.py"


def tuple_row(tid: str, source: str, rank: int, pos: float, negs: list[float]) -> dict:
    return {"id": tid, "query": f"q {tid}", "pos_document": "d", "hard_negatives": ["n"] * len(negs),
            "hard_negative_scores": negs, "d_neg": "n", "pos_rank": rank, "pos_score": pos, "concepts": [],
            "source": source}


def make_run(tmp_path: Path) -> Path:
    run = tmp_path / "repair_x_s1"
    (run / "report.json").parent.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps({"iterations": [{"iter": 1}]}))
    write_jsonl(run / "iter1" / "differentiation" / "final_train_data.bottom_30pct.jsonl", [
        tuple_row("d2q:a", "doc2query", 1, 0.9, [0.5, 0.7]),       # margin +0.2 (the hardest negative is the max)
        tuple_row("d2q:b", "doc2query", 1, 0.6, [0.5]),            # +0.1
        tuple_row("d2q:c", "doc2query", 3, 0.4, [0.8, 0.2]),       # -0.4
        tuple_row("t0:1", "t0_confused", 2, 0.5, [0.6]),           # -0.1
    ])
    # the main expansion file records the asked type; 06c's side files are not read (a wrong type here would show)
    write_jsonl(run / "iter1" / "expansion" / "expansion.doc2query.bottom_30pct.jsonl", [
        {"id": "d2q:a", "t0_rewrite": {"style": "mixed", "asked_style": "question"}},
        {"id": "d2q:b", "t0_rewrite": {"style": "mixed", "asked_style": "question"}},
        {"id": "d2q:c", "t0_rewrite": {"style": "mixed", "asked_style": "keywords"}}])
    write_jsonl(run / "iter1" / "expansion" / "expansion.doc2query.bottom_30pct.jsonl.status.jsonl", [
        {"id": "d2q:a", "t0_rewrite": {"style": "mixed"}}, {"id": "d2q:c", "t0_rewrite": {"asked_style": "claim"}}])
    # a stale folder of an earlier, longer run in the same place: report.json does not list it
    write_jsonl(run / "iter2" / "differentiation" / "final_train_data.bottom_30pct.jsonl",
                [tuple_row("stale", "doc2query", 1, 1.0, [0.0])])
    return run


def run_script(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def test_counts_and_margins_per_source_and_asked_type(tmp_path):
    out = run_script(make_run(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("| run | source | query type | tuples | positive first |")
    assert lines[2:] == [
        "| repair_x_s1 | doc2query | question | 2 | 2 | 1.00 | +0.150 | +0.150 |",
        "| repair_x_s1 | doc2query | keywords | 1 | 0 | 0.00 | -0.400 | -0.400 |",
        "| repair_x_s1 | t0_confused | – | 1 | 0 | 0.00 | -0.100 | -0.100 |",
    ]


def test_bad_tuple_names_file_line_and_field(tmp_path):
    run = make_run(tmp_path)
    data = run / "iter1" / "differentiation" / "final_train_data.bottom_30pct.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[1]["pos_rank"] = "first"
    write_jsonl(data, rows)
    out = run_script(run)
    assert out.returncode == 2
    assert f"{data}:2: field 'pos_rank' must be int" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_folder_without_a_report_is_refused(tmp_path):
    out = run_script(tmp_path)
    assert out.returncode == 2
    assert "report.json" in out.stderr and "Traceback" not in out.stderr


def test_stage2_funnel_per_round_with_what_09_kept(tmp_path):
    """A HARD_TUPLES=1 run's rounds recorded generated -> verified -> hard (issue 43); the last round's row adds the
    Stage II tuples 09 kept: every final tuple not from Q_conf's own claims (here the 3 doc2query ones)."""
    run = make_run(tmp_path)
    write_jsonl(run / "iter1" / "expansion" / "expansion.bottom_30pct.jsonl.funnel.jsonl", [
        {"round": 1, "generated": 288, "verified": 214, "hard": 40},
        {"round": 2, "generated": 576, "verified": 420, "hard": 81}])
    out = run_script(run)
    assert out.returncode == 0, out.stderr
    table = out.stdout.strip().split("\n\n")[1].splitlines()
    assert table[0] == "| run | round | generated (all rounds) | verified | hard | Stage II kept by 09 |"
    assert table[2:] == ["| repair_x_s1 | 1 | 288 | 214 | 40 |  |", "| repair_x_s1 | 2 | 576 | 420 | 81 | 3 |"]
