#!/usr/bin/env python
"""Evaluate one model (+ LoRA adapter) on a list of benchmarks of any task family, loading the model once.

Each --data entry is PATH (task inferred from the folder/file name: biosses -> sts, mesh -> mesh,
icliniq/chemlit -> qa, relish -> relish, anything else -> ir), TASK:PATH, or NAME:TASK:PATH (NAME picks the
instruction from repair/evaluation/instructions.py). Every path is checked before the model loads; a missing one stops
the run with a message saying where that benchmark comes from (or is skipped with --skip_missing).
Prints one JSON line per dataset, then a table; --output gets {model..., "results": [...], "summary":
{dataset: headline}} after every dataset, so an interrupted run keeps what it finished (and the embedding
cache makes the rerun cheap). The driver calls this before and after training each iteration.
Example: python eval/eval_suite.py --model minilm --data data/biosses ../shared/data/scifact --output eval.json
"""

from __future__ import annotations

import argparse
import json
import logging


from repair.evaluation.benchmarks import check_dataset, parse_dataset_spec
from repair.cli import add_retriever_args, fail, load_retriever, model_fields, positive_int, run_script
from repair.data import write_json
from repair.evaluation.evaluate import STS_FORMATS, evaluate_dataset, results_table, scale_metrics
from repair.runtime import setup_logging

logger = logging.getLogger("eval_suite")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", required=True, metavar="[NAME:][TASK:]PATH",
                   help="benchmarks: PATH, TASK:PATH or NAME:TASK:PATH; TASK in ir, qa, mesh, relish, sts")
    p.add_argument("--split", default="test", help="qrels split of every BEIR folder (default: %(default)s)")
    p.add_argument("--top_k", type=positive_int, default=None,
                   help="documents retrieved per query, all retrieval sets (default: per task, ir 1000, qa/mesh 100)")
    p.add_argument("--sts_format", choices=STS_FORMATS, default="query",
                   help="sentence format for sts sets (default: %(default)s, with the instruction)")
    p.add_argument("--skip_missing", action="store_true",
                   help="warn about and skip benchmarks whose data is missing instead of stopping")
    p.add_argument("--percent", action="store_true",
                   help="report metrics x100 (the paper's Table 2 convention); default: fractions")
    p.add_argument("--output", default=None, help="write all results as one JSON file here (folders are created)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    add_retriever_args(p)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    specs = [parse_dataset_spec(text) for text in args.data]
    ready = []
    for spec in specs:  # every path checked before the model loads
        try:
            check_dataset(spec, args.split)
            ready.append(spec)
        except (FileNotFoundError, ValueError) as exc:
            if not args.skip_missing:
                fail(str(exc))
            logger.warning("skipping %s: %s", spec.name, exc)
    if not ready:
        fail("no benchmark left to evaluate")
    retriever = load_retriever(args)
    model = model_fields(retriever)
    report = {**model, "scale": "percent" if args.percent else "fraction",
              "split": args.split, "results": [], "summary": {},
              "skipped": [s.name for s in specs if s not in ready]}
    for spec in ready:
        logger.info("evaluating %s (%s) from %s", spec.name, spec.task, spec.path)
        row = evaluate_dataset(retriever, spec, split=args.split, top_k=args.top_k, sts_format=args.sts_format,
                               batch_size=args.batch_size)
        row = {**row, "model": model["model"], "adapter": model["adapter"], "scale": "fraction"}
        if args.percent:
            row = scale_metrics(row)
        print(json.dumps({k: v for k, v in row.items() if k != "per_query"}), flush=True)  # per query: in --output
        report["results"].append(row)
        key = spec.name if spec.name not in report["summary"] else f"{spec.name}#{len(report['results'])}"
        report["summary"][key] = {row["headline"]: row[row["headline"]]}
        if args.output:
            write_json(args.output, report)
    print(results_table(report["results"]), flush=True)
    label = model["model"] + (f" + {model['adapter']}" if model["adapter"] else "")
    print(f"evaluated {len(report['results'])} benchmark(s) with {label}"
          + (f"; results in {args.output}" if args.output else ""), flush=True)
    return report


if __name__ == "__main__":
    run_script(main)
