#!/usr/bin/env python
"""Write the run report of run_repair.sh ($OUT_DIR/report.md + report.json + PNG plots) from the files the
stages wrote, and print the metrics table (before vs after every iteration).

    python eval/run_report.py --run_dir runs/demo              # PCT from runs/demo/settings.json
    python eval/run_report.py --run_dir runs/demo --print_only # print the tables, write nothing

A rewrite that would lose numbers the existing report has (e.g. read under another PCT) is refused unless
--force. The driver also pipes each step's output through `--console STEP`, which passes it to the console
and shows each JSON summary line as a short "summary:" line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from repair.cli import percentile, run_script
from repair.driver.model_card import refresh_run_cards
from repair.models import adapter_base
from repair.evaluation.report import (
    ReportError,
    collect,
    counts_table,
    metrics_table,
    recorded_pct,
    relay_step_output,
    write_report,
)


def final_retriever_line(folder: Path) -> str:
    """The run's last model as a user loads it: an adapter names its base (README: loading an adapter)."""
    if (folder / "adapter_config.json").exists():
        base = adapter_base(folder)
        return f"final retriever: ADAPTER={folder} on BASE={base} (README: loading an adapter)"
    return f"final retriever: the model folder {folder}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run_dir", help="the driver's OUT_DIR (holds iter0/, iter1/, ...)")
    p.add_argument("--pct", type=percentile, default=None,
                   help="the PCT the run used, for file names (default: the run's settings.json, else 30)")
    p.add_argument("--print_only", action="store_true", help="print the tables; write nothing")
    p.add_argument("--force", action="store_true", help="rewrite the report even if it loses numbers it had")
    p.add_argument("--console", metavar="STEP",
                   help="relay stdin to stdout for the driver, JSON summary lines shortened (no report)")
    p.add_argument("--final_retriever", metavar="FOLDER",
                   help="print how to load the run's final retriever (a LoRA adapter folder or a model folder)")
    args = p.parse_args(argv)
    if args.final_retriever:
        print(final_retriever_line(Path(args.final_retriever)))
        return
    if args.console:
        relay_step_output(args.console, sys.stdin.buffer, sys.stdout.buffer)
        return
    if not args.run_dir:
        p.error("--run_dir is required")
    run_dir = Path(args.run_dir)
    if not (run_dir / "iter0").exists() and not (run_dir / "iter1").exists():
        raise SystemExit(f"error: {run_dir}: no iter0/ or iter1/ folder: not a run_repair.sh run folder")
    recorded = recorded_pct(run_dir)
    if args.pct is not None and recorded is not None and args.pct != recorded:
        raise SystemExit(f"error: --pct {args.pct}, but {run_dir}/settings.json says the run used PCT={recorded}")
    pct = args.pct if args.pct is not None else (recorded if recorded is not None else 30)
    if args.print_only:
        summary = collect(run_dir, pct)
        path = run_dir / "report.md"
    else:
        try:
            path, summary = write_report(run_dir, pct, overwrite=args.force)
        except ReportError as exc:
            raise SystemExit(f"error: {exc}") from None
        # the trained folders' model cards get the metrics the evaluations wrote since training (README: publishing)
        for card in refresh_run_cards(run_dir):
            print(f"model card: {card}")
    print(metrics_table(summary))
    print()
    print(counts_table(summary))
    print(f"\nreport: {path}")


if __name__ == "__main__":
    run_script(main)
