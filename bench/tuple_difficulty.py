#!/usr/bin/env python
"""How hard a driver run's final training tuples are for the model that picked their negatives (step 07's scores).

Why: a tuple whose positive the model already ranks first in its pool, by a wide margin, carries little InfoNCE
gradient; at equal optimizer steps it takes a batch slot from a claim the model gets wrong. This is how issue 30 found
that Stage II's doc2query claims restate their document's title (90 of 96 ranked first, margin +0.233) while T0's
confused claims do not (34 of 130, margin -0.041).

Reads, for each run folder, its last iteration (report.json) ``differentiation/final_train_data.*.jsonl`` (fields
``source``, ``pos_rank``, ``pos_score``, ``hard_negative_scores``) and, to split Stage II's tuples by the query type
the generator was asked for (``QUERY_STYLE=mixed``), 06c's output ``expansion/expansion.<form>.bottom_PPpct.jsonl``'s
``t0_rewrite.asked_style`` (else its ``style``) by tuple id. Prints one Markdown row per (run, source[, query type]): tuples, positive ranked first (count
and share), mean and median margin (positive score minus the hardest negative's). For a run whose rounds recorded a
funnel (``expansion/*.funnel.jsonl``, issue 43's HARD_TUPLES=1 runs) it then prints Stage II's funnel per round:
generated -> verified -> hard, and the Stage II tuples 09 kept (every final tuple not from Q_conf's own claims).

Example:
  python bench/tuple_difficulty.py runs/quality/repair/repair_conf_d2q_s1 runs/quality/repair/repair_conf_d2q_mixed_s1
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from repair.cli import run_script
from repair.data import DataError, iter_jsonl
from repair.diagnosis.confused_tuples import SOURCE as CONFUSED_SOURCE
from repair.evaluation.report import final_iteration
from repair.tables import markdown_table

TUPLE_FIELDS = {"id": str, "source": str, "pos_rank": int, "pos_score": float, "hard_negative_scores": list}


def asked_styles(expansion_dir: Path) -> dict[str, str]:
    """Tuple id -> the query type its generator was asked for (Stage II files only; T0's own claims have none)."""
    styles: dict[str, str] = {}
    # only 06c's own outputs, expansion.<form>.bottom_PPpct.jsonl (report.collect finds them by the same name); its
    # side files (<output>.status.jsonl, .sources.jsonl) extend that name and are not what 07 embedded
    for path in sorted(expansion_dir.glob("expansion.*.bottom_*pct.jsonl")) if expansion_dir.is_dir() else []:
        for record in iter_jsonl(path, optional={"id": str, "t0_rewrite": dict}):
            trace = record.get("t0_rewrite") or {}
            style = trace.get("asked_style") or trace.get("style")  # asked: QUERY_STYLE=mixed's type for this one
            if record.get("id") and style:
                styles[record["id"]] = style
    return styles


def tuple_difficulty(run_dir: Path) -> list[dict]:
    """One summary per (source, query type) of ``run_dir``'s final training tuples, in first-seen order."""
    iteration = final_iteration(run_dir)
    files = sorted((iteration / "differentiation").glob("final_train_data.*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{iteration / 'differentiation'}: no final_train_data.*.jsonl")
    styles = asked_styles(iteration / "expansion")
    groups: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for path in files:
        for lineno, record in iter_jsonl(path, required=TUPLE_FIELDS, with_lineno=True):
            scores = record["hard_negative_scores"]
            if not scores or not all(isinstance(s, (int, float)) for s in scores):
                raise DataError(f"{path}:{lineno}: field 'hard_negative_scores' must be a non-empty list of numbers")
            key = (record["source"], styles.get(record["id"], "–"))
            groups[key].append((record["pos_rank"], record["pos_score"] - max(scores)))
    return [{"run": run_dir.name, "source": source, "query_type": style, "tuples": len(items),
             "ranked_first": sum(rank == 1 for rank, _ in items),
             "mean_margin": statistics.mean(m for _, m in items),
             "median_margin": statistics.median(m for _, m in items)}
            for (source, style), items in groups.items()]


def stage2_funnel(run_dir: Path) -> list[dict]:
    """One row per expansion round of the run's last iteration (its ``*.funnel.jsonl``), the last one with the Stage II
    tuples that 09 kept; [] for a run without a funnel file."""
    iteration = final_iteration(run_dir)
    files = sorted((iteration / "expansion").glob("*.funnel.jsonl"))
    if not files:
        return []
    rounds = list(iter_jsonl(files[0], required={"round": int, "generated": int, "verified": int}))
    kept = sum(1 for path in sorted((iteration / "differentiation").glob("final_train_data.*.jsonl"))
               for record in iter_jsonl(path, required={"source": str}) if record["source"] != CONFUSED_SOURCE)
    return [{"run": run_dir.name, **r, "kept_by_09": kept if i == len(rounds) - 1 else None}
            for i, r in enumerate(rounds)]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="driver run folders (the folder holding report.json)")
    args = p.parse_args(argv)
    rows = [summary for run in args.runs for summary in tuple_difficulty(run)]
    print(markdown_table(
        ["run", "source", "query type", "tuples", "positive first", "share", "mean margin", "median margin"],
        [[r["run"], r["source"], r["query_type"], r["tuples"], r["ranked_first"],
          f"{r['ranked_first'] / r['tuples']:.2f}", f"{r['mean_margin']:+.3f}", f"{r['median_margin']:+.3f}"]
         for r in rows]))
    funnel = [row for run in args.runs for row in stage2_funnel(run)]
    if funnel:
        print()
        print(markdown_table(["run", "round", "generated (all rounds)", "verified", "hard", "Stage II kept by 09"],
                             [[r["run"], r["round"], r["generated"], r["verified"], r.get("hard", "–"),
                               "" if r["kept_by_09"] is None else r["kept_by_09"]] for r in funnel]))


if __name__ == "__main__":
    run_script(main)
