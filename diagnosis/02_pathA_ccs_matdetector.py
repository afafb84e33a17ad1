#!/usr/bin/env python
"""Stage I step 2 (PathA, NER variant): Concept Confusion Scores with a token-classification model -> C_intra.

Same CCS / C_intra computation and outputs as 02_pathA_ccs_regex.py, but the concepts of each document are
the entities a Hugging Face token-classification model tags: by default MatDetector (yerim0210/MatDetector,
a MatBERT token classifier with labels O, B/I-matname, B/I-mf). Any model with B-/I- labels works (a local
folder too). Documents are split into sentences, sentences into whitespace words; whole sentences are
tokenised and classified in batches (not one word at a time, as the original did), each word takes the
majority label of its sub-tokens, and consecutive B/I words of one type form one entity (--aggregation word
emits every tagged word on its own, the original behaviour). Only documents of D+ and D-(q) are tagged.

Writes into --out_dir (default <dia_out_dir>/pathA_ccs_matdetector) the same four files as the regex path;
point 03/04 at it with --patha_out_dir to use these concepts.

Example: python diagnosis/02_pathA_ccs_matdetector.py --pct 30 --dia_out_dir runs/iter1 \\
           --model /models/MatDetector --tokenizer /models/matbert-base-cased --top_neg_n 30
"""

from __future__ import annotations

import argparse


from repair.diagnosis.concepts import TokenClassificationExtractor
from repair.diagnosis.margins import PATHA_NER_DIR
from repair.cli import positive_int, run_script
from repair.diagnosis.stages import add_pathA_args, check_pathA_args, print_summary, run_pathA
from repair.runtime import setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pathA_args(p, PATHA_NER_DIR)
    p.add_argument("--model", default="yerim0210/MatDetector",
                   help="token-classification model: HF id or local folder (default: %(default)s)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer id/folder when the model has none (MatDetector used matbert-base-cased) "
                        "(default: the model's)")
    p.add_argument("--types", nargs="+", default=None,
                   help="entity types to keep, e.g. matname mf (default: every type in the model's labels)")
    p.add_argument("--aggregation", default="span", choices=["span", "word"],
                   help="span: B I I words form one entity; word: every tagged word alone (original) "
                        "(default: %(default)s)")
    p.add_argument("--batch_size", type=positive_int, default=32,
                   help="sentences per forward pass (default: %(default)s)")
    p.add_argument("--max_length", type=positive_int, default=256,
                   help="max sub-tokens per forward row; longer sentences are cut at word boundaries "
                        "(default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    p.add_argument("--trust_remote_code", action="store_true", help="allow model code from the model folder/hub")
    args = p.parse_args(argv)
    check_pathA_args(p, args, PATHA_NER_DIR)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    extractor = TokenClassificationExtractor.load(
        args.model, args.tokenizer, device=args.device, trust_remote_code=args.trust_remote_code,
        batch_size=args.batch_size, max_length=args.max_length, types=args.types, aggregation=args.aggregation)
    summary = run_pathA(args.dia_out_dir, args.pct, args.out_dir, extractor, train_pt=args.train_pt,
                        split=args.split, top_neg_n=args.top_neg_n, eps=args.eps, df=args.df,
                        doc_text=args.doc_text, top_export=args.top_export)
    print_summary(summary)
    return summary


if __name__ == "__main__":
    run_script(main)
