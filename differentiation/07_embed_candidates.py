#!/usr/bin/env python
"""Step 7: embed every q_new (query format) and every candidate document (passage format) of an expansion file.

Writes an embedding dir that steps 8 and 9 read without loading the model: queries.npy / documents.npy
(float32, L2-normalised), queries.jsonl / documents.jsonl ({"text"} per row), queries.sha1.npy /
documents.sha1.npy (the sha1 of each row's text: the lookup index) and meta.json (the
retriever's identity; written last, it marks a complete dir). Vectors go through the on-disk embedding
cache (default <output_dir>/cache), so a rerun with the same model and adapter runs no forward pass.

Example (README):
  python differentiation/07_embed_candidates.py --input_jsonl expansion.jsonl --output_dir embed_cache/ --num_gpus 1
Several GPUs: --num_gpus N (N worker processes), or
  torchrun --nproc_per_node N differentiation/07_embed_candidates.py ...
"""

from __future__ import annotations

import argparse
import json


from repair.cli import add_retriever_args, positive_int, run_script
from repair.differentiation.embedding_dir import EmbedConfig, launch_embedding
from repair.runtime import setup_logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_jsonl", required=True, nargs="+",
                   help="expansion JSONL (06 output); triplet JSONL (08 output) is accepted too; several files allowed")
    p.add_argument("--output_dir", required=True, help="embedding dir to write (created if missing)")
    p.add_argument("--num_gpus", type=positive_int, default=1,
                   help="worker processes, one per GPU (on CPU: gloo workers); ignored under torchrun "
                        "(default: %(default)s)")
    add_retriever_args(p, cache_help="embedding cache folder (default: <output_dir>/cache); 'none' disables it "
                                     "(one process only)")
    p.add_argument("--max_tokens", type=positive_int, default=None,
                   help="optional padded-token budget per forward pass")
    p.add_argument("--instruction", default=None,
                   help="query instruction (default: the training instruction of the retriever's text format)")
    p.add_argument("--chunk", type=positive_int, default=65536,
                   help="texts per encode call, bounds memory; a killed run keeps what the cache flushed "
                        "(default: %(default)s)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    config = EmbedConfig(input_jsonl=args.input_jsonl, output_dir=args.output_dir, model=args.model,
                         adapter=args.adapter, pooling=args.pooling, max_length=args.max_length,
                         batch_size=args.batch_size, max_tokens=args.max_tokens, device=args.device,
                         cache_dir=args.cache_dir, instruction=args.instruction,
                         trust_remote_code=args.trust_remote_code, chunk=args.chunk)
    meta = launch_embedding(config, args.num_gpus)
    if meta:  # rank 0 (other torchrun ranks return {})
        print(f"07: {meta['input']['tuples']} tuples -> {meta['n_queries']} queries + {meta['n_documents']} "
              f"documents (dim {meta['dim']}) in {args.output_dir}; forwarded {meta['texts_forwarded']} texts "
              f"(0 = all from cache) with {meta['processes']} process(es) in {meta['seconds']} s", flush=True)
        print(json.dumps({k: meta[k] for k in ("n_queries", "n_documents", "dim", "texts_forwarded", "processes")}))
    return meta


if __name__ == "__main__":
    run_script(main)
