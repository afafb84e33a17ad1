#!/usr/bin/env python
"""Passages/s of our encoder vs sentence-transformers `encode` and a naive unsorted Hugging Face loop.

Same model (default SmolLM2-135M, last-token pooling), same max_length (256), same SciFact passages (the
first --n of the corpus, formatted with our passage template for every contender), CPU fp32, no cache.
Each contender is warmed up on one full batch, then the --repeats timed runs are interleaved in a rotating
order; the best time per contender is reported.

    python bench/encode.py --data ../shared/data/scifact --n 256
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


import torch
import torch.nn.functional as F

from repair.data import load_beir
from repair.encoding import Retriever, last_token_pool
from repair.models import DEFAULT_MODEL
from repair.runtime import setup_logging


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="../shared/data/scifact", help="BEIR folder whose corpus provides passages")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model alias / folder / HF id (default: %(default)s)")
    p.add_argument("--n", type=int, default=256, help="number of passages (default: %(default)s)")
    p.add_argument("--max_length", type=int, default=256, help="max tokens (default: %(default)s)")
    p.add_argument("--batch_size", type=int, default=32, help="batch size for every contender (default: %(default)s)")
    p.add_argument("--max_tokens", type=int, default=None,
                   help="our padded-token budget per batch (default: none, batch_size only)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats per contender; best is kept")
    p.add_argument("--output", default=None, help="write the results JSON here")
    args = p.parse_args()
    setup_logging("WARNING")
    torch.manual_seed(0)

    data = load_beir(args.data, "test")
    passages = [data.doc_text(d) for d in list(data.corpus)[: args.n]]
    ours = Retriever.load(args.model, device="cpu", max_length=args.max_length, batch_size=args.batch_size)
    formatted = ours.format(passages, "passage")
    tok, model = ours.tokenizer, ours.model

    def run_ours():
        return ours.encode_passages(passages, use_cache=False, show_progress=False, max_tokens=args.max_tokens)

    @torch.inference_mode()
    def run_naive():
        """What a user writes by hand: input order, pad each batch to its longest, same EOS recipe."""
        outs = []
        for s in range(0, len(formatted), args.batch_size):
            b = tok(formatted[s:s + args.batch_size], max_length=args.max_length - 1, truncation=True)
            b = {"input_ids": [ids + [tok.eos_token_id] for ids in b["input_ids"]]}
            b = tok.pad(b, padding=True, return_attention_mask=True, return_tensors="pt")
            h = model(**b, use_cache=False).last_hidden_state
            outs.append(F.normalize(last_token_pool(h, b["attention_mask"]), dim=-1))
        return torch.cat(outs)

    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(ours.model.config._name_or_path if os.path.isdir(ours.model.config._name_or_path)
                              else args.model, max_seq_length=args.max_length)
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "lasttoken"),
                                      models.Normalize()], device="cpu")

    def run_st():
        return st.encode(formatted, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False)

    contenders = {"ours": run_ours, "sentence-transformers": run_st, "naive-hf-loop": run_naive}
    # warm-up (allocator, oneDNN kernels for a full batch's shapes) for every contender, then the timed repeats
    # interleaved in a rotating order: the first contender timed must not pay the process's warm-up alone
    # (with one unrotated repeat it did, and lost ~10% to it).
    ours.encode_passages(passages[:args.batch_size], use_cache=False, show_progress=False)
    st.encode(formatted[:args.batch_size], batch_size=args.batch_size)
    best = {name: float("inf") for name in contenders}
    vectors = {}
    names = list(contenders)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            vectors[name] = contenders[name]()
            best[name] = min(best[name], time.perf_counter() - t0)
    results = {name: {"seconds": round(best[name], 3), "passages_per_s": round(len(passages) / best[name], 2)}
               for name in names}
    results["naive-hf-loop"]["max_abs_diff_vs_ours"] = float((vectors["naive-hf-loop"] - vectors["ours"]).abs().max())
    base = results["ours"]["passages_per_s"]
    summary = {
        "model": args.model, "n": len(passages), "max_length": args.max_length, "batch_size": args.batch_size,
        "max_tokens": args.max_tokens, "threads": torch.get_num_threads(), "results": results,
        "speedup_vs_sentence_transformers": round(base / results["sentence-transformers"]["passages_per_s"], 3),
        "speedup_vs_naive": round(base / results["naive-hf-loop"]["passages_per_s"], 3),
    }
    print(f"{'contender':<24}{'seconds':>10}{'passages/s':>12}")
    for name, r in results.items():
        print(f"{name:<24}{r['seconds']:>10.2f}{r['passages_per_s']:>12.2f}")
    print(f"ours / sentence-transformers = {summary['speedup_vs_sentence_transformers']:.2f}x; "
          f"ours / naive loop = {summary['speedup_vs_naive']:.2f}x")
    print(json.dumps(summary))
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
