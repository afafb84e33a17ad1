"""repair.tables: the one table printer, checked against the exact text the stages, scripts and report printed
before they shared it (console tables of 08/09/06/09b, the diagnosis logs, eval_suite, the trainer's data table;
Markdown of report.md and diagnostics.md)."""

from __future__ import annotations

from repair.evaluation.evaluate import results_table
from repair.evaluation.report import counts_table, time_table
from repair.tables import markdown_table, text_table
from repair.training.data import SourceStats, TrainingData, stats_table


def test_key_value_table_of_the_scripts():
    rows = [("tuples (after merging repeats)", "3 (0 repeats merged)"), ("  removed: empty / duplicate", "0 / 1"),
            ("kept", 5)]
    assert text_table(rows, indent="  ") == ("  tuples (after merging repeats)  3 (0 repeats merged)\n"
                                             "    removed: empty / duplicate    0 / 1\n"
                                             "  kept                            5")


def test_right_aligned_log_table_with_rule():
    table = text_table([(10, 0.123456, 5), (30, -0.5, 150)], ["pct", "threshold", "confused"], align="r",
                       sep=" | ", rule="-+-")
    assert table == ("pct | threshold | confused\n"
                     "----+-----------+---------\n"
                     " 10 |  0.123456 |        5\n"
                     " 30 |      -0.5 |      150")


def test_eval_results_table_keeps_its_layout_and_cuts_trailing_blanks():
    rows = [{"dataset": "biosses", "task": "sts", "headline": "spearman", "spearman": 0.8125, "pearson": 0.84,
             "num_pairs": 100},
            {"dataset": "scifact", "task": "ir", "headline": "ndcg@10", "ndcg@10": float("nan"), "num_queries": 300}]
    assert results_table(rows) == ("dataset  task  n    headline  value   metrics\n"
                                   "-------  ----  ---  --------  ------  --------------\n"
                                   "biosses  sts   100  spearman  0.8125  pearson=0.8400\n"
                                   "scifact  ir    300  ndcg@10   nan")
    assert results_table([]).splitlines()[1] == "-------  ----  -  --------  -----  -------"


def test_training_data_table_left_then_right_aligned():
    data = TrainingData([], {}, [SourceStats("final_train_data.bottom_30pct.jsonl", 100, 90, 10, 300, 20, 1),
                                 SourceStats("t0.pt", 5, 5)])
    assert stats_table(data).splitlines() == [
        "source                               rows  kept  empty  negatives  generated  neg=pos",
        "final_train_data.bottom_30pct.jsonl   100    90     10        300         20        1",
        "t0.pt                                   5     5      0          0          0        0",
        "total                                 105    95     10        300         20        1"]


def test_markdown_table_escapes_bars_in_every_cell():
    assert markdown_table(["|T0|", "x"], [[809, "a|b"]]) == "| \\|T0\\| | x |\n|---|---|\n| 809 | a\\|b |"


def test_report_tables_as_before():
    summary = {"pct": 30, "iterations": [
        {"iter": 0, "eval": {}, "seconds": {"eval": 12.0}},
        {"iter": 1, "eval": {}, "t0": 809, "q_conf": 240, "c_conf": 30, "generated": 64, "generated_accepted": 60,
         "verified": 50, "kept": 40, "kept_rate": 0.8, "train": {"first_loss": 2.0, "last_loss": 1.0},
         "seconds": {"diagnosis": 10.0, "expansion": 100.4, "training": 50}}]}
    assert counts_table(summary).splitlines() == [
        "| iteration | \\|T0\\| | \\|Q_conf\\| | \\|C_conf\\| | generated | accepted | verified | kept | kept rate "
        "| train loss first → last |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| 1 | 809 | 240 | 30 | 64 | 60 | 50 | 40 | 0.800 | 2.0000 → 1.0000 |"]
    assert time_table(summary).splitlines() == [
        "| iteration | diagnosis | expansion | differentiation | training | eval | total |",
        "|---|---|---|---|---|---|---|",
        "| 0 | – | – | – | – | 12 s | 12 s |",
        "| 1 | 10 s | 100 s | – | 50 s | – | 160 s |"]
