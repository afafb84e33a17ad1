#!/usr/bin/env python
"""Write the run report of run_repair.sh ($OUT_DIR/report.md + report.json + PNG plots) from the files the
stages wrote, and print the metrics table (before vs after every iteration).

    python eval/run_report.py --run_dir runs/demo --pct 30
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repair.report import counts_table, metrics_table, write_report  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run_dir", required=True, help="the driver's OUT_DIR (holds iter0/, iter1/, ...)")
    p.add_argument("--pct", type=int, default=30, help="the PCT the run used, for file names (default: %(default)s)")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not (run_dir / "iter0").exists() and not (run_dir / "iter1").exists():
        raise SystemExit(f"error: {run_dir}: no iter0/ or iter1/ folder: not a run_repair.sh run folder")
    path, summary = write_report(run_dir, args.pct)
    print(metrics_table(summary))
    print()
    print(counts_table(summary))
    print(f"\nreport: {path}")


if __name__ == "__main__":
    main()
