#!/usr/bin/env python
"""Dense retrieval evaluation of a model (+ LoRA adapter) on a BEIR-format folder.

Prints one JSON line with nDCG@10 (headline), MAP@10, Recall@10/100, MRR@10 and writes it to --output.
Example: python eval/eval_beir.py --model minilm --data ../shared/data/scifact --split test --max_length 256
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repair.data import load_beir, write_json  # noqa: E402
from repair.encoding import Retriever  # noqa: E402
from repair.evaluation import evaluate_beir  # noqa: E402
from repair.instructions import instruction_for  # noqa: E402
from repair.runtime import cache_root, setup_logging  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m",
                   help="base model: HF id, local folder, or alias smollm2-135m | minilm (default: %(default)s)")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder to apply on the base model")
    p.add_argument("--data", required=True, help="BEIR folder (corpus.jsonl[.gz], queries.jsonl, qrels/)")
    p.add_argument("--split", default="test", help="qrels split to evaluate (default: %(default)s)")
    p.add_argument("--max_length", type=int, default=512, help="max tokens per text incl. EOS (default: %(default)s)")
    p.add_argument("--batch_size", type=int, default=32, help="texts per forward pass (default: %(default)s)")
    p.add_argument("--top_k", type=int, default=1000, help="documents retrieved per query (default: %(default)s)")
    p.add_argument("--instruction", default=None,
                   help="query instruction; default: BMRetriever's for the dataset (folder name), else the generic one")
    p.add_argument("--pooling", default=None, choices=["eos", "mean"], help="override the model's pooling profile")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    p.add_argument("--cache_dir", default=None,
                   help="embedding cache folder (default: $REPAIR_CACHE/embeddings); 'none' disables it")
    p.add_argument("--trust_remote_code", action="store_true", help="allow model code from the model folder/hub")
    p.add_argument("--output", default=None, help="write the metrics JSON here as well")
    p.add_argument("--log_level", default="INFO")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    cache_dir = None if (args.cache_dir or "").lower() == "none" else (args.cache_dir or cache_root() / "embeddings")
    data = load_beir(args.data, args.split)
    instruction = instruction_for(Path(args.data).resolve().name, args.instruction)
    retriever = Retriever.load(args.model, args.adapter, pooling=args.pooling, max_length=args.max_length,
                               device=args.device, cache_dir=cache_dir, trust_remote_code=args.trust_remote_code,
                               batch_size=args.batch_size)
    metrics = evaluate_beir(retriever, data, instruction, top_k=args.top_k, batch_size=args.batch_size)
    result = {"dataset": data.name, "split": args.split, "model": args.model, "adapter": args.adapter,
              "pooling": retriever.pooling, "max_length": args.max_length, "instruction": instruction, **metrics}
    line = json.dumps(result)
    print(line, flush=True)
    if args.output:
        write_json(args.output, result)
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
