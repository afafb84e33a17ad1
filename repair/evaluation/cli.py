"""Evaluate a model (+ LoRA adapter) on one benchmark of any task family:

  ir      BEIR IR folder (NFCorpus, SciFact, SciDocs, TREC-COVID)   nDCG@10, MAP@10, R@10/100, MRR@10
  qa      QA retrieval folder (iCliniq, ChemLit-QA)                  R@5, R@20, nDCG@20
  mesh    entity linking folder (MeSH)                               R@1, R@5, MRR@5
  relish  graded 0-2 folder (RELISH), judged candidates ranked       MAP, nDCG (uncut)
  sts     sentence-pair file (BIOSSES)                               Spearman (and Pearson) of cosine vs gold

The task is inferred from the folder name unless --task is given; the instruction comes from the dataset
name (repair/evaluation/instructions.py). Metrics are fractions unless --percent (the paper's Table 2 is x100).
Prints one JSON line and writes it to --output. eval_beir.py, eval_qa.py, eval_mesh.py, eval_relish.py and
eval_biosses.py are this script with the task fixed.
Example: python eval/eval_task.py --task qa --data /data/icliniq --model minilm

(The one command line behind ``eval/eval_task.py`` and its task-fixed wrappers, in the library so that every
wrapper imports it the same way.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from repair.evaluation.benchmarks import TASKS, DatasetSpec, check_dataset, dataset_name, infer_task, where_to_get
from repair.cli import add_retriever_args, fail, load_retriever, model_fields, non_negative_int, positive_int
from repair.data import write_json
from repair.evaluation.evaluate import CANDIDATES, DOC_TEXTS, STS_FORMATS, evaluate_dataset, scale_metrics
from repair.runtime import setup_logging

ROOT = Path(__file__).resolve().parents[1]

SHIPPED_BIOSSES = ROOT / "data" / "biosses" / "biosses.jsonl"


def build_parser(task: str | None = None, description: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description or __doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if task is None:
        p.add_argument("--task", choices=TASKS, default=None,
                       help="task family (default: inferred from the dataset name; 'ir' when nothing matches)")
    default_data = str(SHIPPED_BIOSSES) if task == "sts" else None
    shipped = " (default: the shipped data/biosses/biosses.jsonl)" if default_data else ""
    p.add_argument("--data", "--data_path", dest="data", default=default_data,
                   help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv); for sts a sentence-pair "
                        "JSONL/TSV file" + shipped)
    p.add_argument("--name", default=None,
                   help="dataset name used for the instruction and the report (default: the folder/file name)")
    if task != "sts":
        p.add_argument("--split", default="test", help="qrels split to evaluate (default: %(default)s)")
    p.add_argument("--instruction", default=None,
                   help="query instruction (default: the dataset name's entry in repair/evaluation/instructions.py, else the "
                        "task's benchmark entry for mesh/relish/sts, else the generic one)")
    if task in (None, "ir", "qa", "mesh", "relish"):
        p.add_argument("--top_k", type=positive_int, default=None,
                       help="documents retrieved per query (default: ir/relish 1000, qa/mesh 100)")
        p.add_argument("--doc_text", choices=DOC_TEXTS, default=None,
                       help="document text: title_text = title + ' ' + text (BEIR) or text only (default: text "
                            "for mesh, as REPAIR's eval_mesh.py; title_text otherwise)")
        p.add_argument("--candidates", choices=CANDIDATES, default=None,
                       help="corpus = search the whole corpus; judged = rank each query's judged documents only "
                            "(default: judged for relish, corpus otherwise)")
        p.add_argument("--relevance_level", type=non_negative_int, default=1,
                       help="lowest grade counted relevant by MAP/recall/MRR (nDCG uses the grades as gains; "
                            "default: %(default)s)")
    if task in (None, "sts"):
        p.add_argument("--sts_format", choices=STS_FORMATS, default="query",
                       help="format of both sentences: query (with the instruction, BMRetriever's choice) or "
                            "passage (default: %(default)s)")
    p.add_argument("--percent", action="store_true",
                   help="report metrics x100 (the paper's Table 2 convention); default: fractions")
    p.add_argument("--output", "--output_file", dest="output", default=None,
                   help="also write the result JSON to this file (folders are created)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    add_retriever_args(p)
    return p


# options a fixed-task wrapper does not offer (e.g. --split for sts) keep these values
FALLBACKS = {"split": "test", "top_k": None, "doc_text": None, "candidates": None, "relevance_level": 1,
             "sts_format": "query"}


def main(argv=None, task: str | None = None, description: str | None = None) -> dict:
    parsed = build_parser(task, description).parse_args(argv)
    args = argparse.Namespace(**{**FALLBACKS, **vars(parsed)})
    setup_logging(args.log_level)
    task = task or args.task
    if not args.data:
        fail(f"no --data (--data_path) given: {task or 'this'} data is not shipped with REPAIR. "
             + where_to_get(args.name or task or "", task or "ir"))
    name = args.name or dataset_name(args.data)
    spec = DatasetSpec(name, task or infer_task(name), Path(args.data))
    check_dataset(spec, args.split)  # before the model loads: a wrong path fails in seconds
    retriever = load_retriever(args)
    row = evaluate_dataset(retriever, spec, split=args.split, instruction=args.instruction, top_k=args.top_k,
                           candidates=args.candidates, doc_text=args.doc_text, sts_format=args.sts_format,
                           batch_size=args.batch_size, relevance_level=args.relevance_level)
    result = {**row, **model_fields(retriever), "scale": "fraction"}
    if args.percent:
        result = scale_metrics(result)
    print(json.dumps({k: v for k, v in result.items() if k != "per_query"}), flush=True)  # per query: in --output
    if args.output:
        write_json(args.output, result)
    return result
