#!/usr/bin/env python
"""Benchmark of steps 07-09 on synthetic tuples vs sentence-transformers' mine_hard_negatives (CPU).

Data: --tuples synthetic expansion tuples, each with --candidates distinct negative candidates (all texts
distinct), and synthetic L2-normalised vectors of width --dim (topic + noise, so d+ usually outscores most
candidates). Both sides get the *same vectors precomputed* and run no forward pass:
  ours: the vectors are put in the Retriever's embedding cache (MiniLM fingerprint); 07 then loads the
        tuples, finds every text in the cache and writes the embedding dir; 08 ranks each tuple's candidates;
        09 applies the consistency filter with the README's local pool, and again with the original's
        global pool (every document, exact top-k search) at top_k 5 = kappa (the least top_k kappa 5
        allows; the search depth max(top_k, kappa) + 1 is the same as at top_k 1) and compares its d-;
  peer: the vectors are written as mine_hard_negatives' own cache files (cache_folder), and it mines the
        top-1 negative of every query over the same corpus (all positives + candidates), excluding the
        positive: the same selection as our global pool's d- (its top-1). Its model's encode is replaced by a
        function that raises, proving no encoding happens.
Rates are candidates/s = tuples x candidates / wall seconds of the stage.

  python bench/differentiation.py --tuples 10000 --candidates 20 --output bench_differentiation.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


from repair.data import write_json, write_jsonl
from repair.differentiation.embedding_dir import EmbedConfig, EmbeddingDir, embed_candidates
from repair.differentiation.hard_negatives import consistency_filter, select_hard_negatives
from repair.encoding import Retriever, text_key
from repair.runtime import setup_logging
from repair.differentiation.tuples import load_tuples


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tuples", type=int, default=10000, help="synthetic tuples (default: %(default)s)")
    p.add_argument("--candidates", type=int, default=20, help="negative candidates per tuple (default: %(default)s)")
    p.add_argument("--dim", type=int, default=384, help="vector width; 384 = MiniLM (default: %(default)s)")
    p.add_argument("--model", default="minilm", help="retriever whose cache holds the vectors (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--work_dir", default=None, help="scratch folder (default: a temporary folder)")
    p.add_argument("--skip_peer", action="store_true", help="do not run sentence-transformers' mine_hard_negatives")
    p.add_argument("--skip_global", action="store_true", help="do not run our global-pool step 9 (and the peer)")
    p.add_argument("--output", default=None, help="write the results JSON here too")
    return p.parse_args(argv)


def synthetic(n: int, c: int, dim: int, seed: int):
    """Texts and vectors: query and d+ share a topic; candidates lean to it with a random strength."""
    rng = np.random.default_rng(seed)

    def unit(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    topics = rng.normal(size=(n, dim))
    q_vec = unit(topics + 0.6 * rng.normal(size=(n, dim)))
    p_vec = unit(topics + 1.0 * rng.normal(size=(n, dim)))
    lean = rng.uniform(0.0, 1.1, size=(n, c, 1))
    c_vec = unit(lean * topics[:, None, :] + rng.normal(size=(n, c, dim)))
    queries = [f"synthetic query {i} about material {i % 997}" for i in range(n)]
    positives = [f"synthetic positive abstract {i}: results on material {i % 997} and its properties" for i in range(n)]
    cands = [[f"synthetic candidate abstract {i}-{j}: another study of material {(i + j) % 997}" for j in range(c)]
             for i in range(n)]
    return queries, positives, cands, q_vec, p_vec, c_vec


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_ours(work: Path, args, data) -> dict:
    queries, positives, cands, q_vec, p_vec, c_vec = data
    n_cand = args.tuples * args.candidates
    expansion = work / "expansion.jsonl"
    write_jsonl(expansion, ({"id": f"t{i}", "q_new": queries[i], "d_pos": positives[i], "concepts": ["x"],
                             "negative_candidates": [{"id": f"{i}-{j}", "doi": None, "title": "", "abstract": t}
                                                     for j, t in enumerate(cands[i])], "source": "synthetic"}
                            for i in range(args.tuples)))
    (retriever, t_load_model) = timed(lambda: Retriever.load(args.model, device="cpu", cache_dir=work / "cache"))
    # the vectors go into the retriever's own cache, keyed exactly as encode() keys them
    retriever.cache.put([text_key(t) for t in retriever.format(queries, "query")], q_vec)
    docs = positives + [t for row in cands for t in row]
    retriever.cache.put([text_key(t) for t in retriever.format(docs, "passage")],
                        np.concatenate([p_vec, c_vec.reshape(-1, args.dim)]))
    config = EmbedConfig(input_jsonl=[str(expansion)], output_dir=str(work / "emb"), show_progress=False)

    def step7():
        meta = embed_candidates(retriever, load_tuples(expansion), config)
        assert meta["texts_forwarded"] == 0, "the bench must run from the cache"
        return meta

    _, t7 = timed(step7)

    def step8():
        emb = EmbeddingDir.open(work / "emb")
        records, stats = select_hard_negatives(load_tuples(expansion), emb, top_k=15)
        write_jsonl(work / "hn.jsonl", records)
        return stats

    stats8, t8 = timed(step8)

    def step9(pool: str, top_k: int, inp: Path):
        emb = EmbeddingDir.open(work / "emb")
        records, stats = consistency_filter(load_tuples(inp), emb, top_k=top_k, consistency_k=5, pool=pool,
                                            device="cpu")
        write_jsonl(work / f"final.{pool}.jsonl", records)
        return stats

    stats9, t9 = timed(lambda: step9("local", 15, work / "hn.jsonl"))
    result = {}
    if not args.skip_global:
        stats9g, t9g = timed(lambda: step9("global", 5, expansion))  # top_k >= kappa 5; d- is still the top-1
        result = {"09_global_top1_s": round(t9g, 2), "09_global_top1_candidates_per_s": round(n_cand / t9g),
                  "kept_global": stats9g["kept"],
                  "global_top1": {r["id"]: r["d_neg"] for r in _read(work / "final.global.jsonl")}}
    return {**result, "model_load_s": round(t_load_model, 2),
            "07_s": round(t7, 2), "07_candidates_per_s": round(n_cand / t7),
            "08_s": round(t8, 2), "08_candidates_per_s": round(n_cand / t8),
            "09_local_s": round(t9, 2), "09_local_candidates_per_s": round(n_cand / t9),
            "07_08_09_local_s": round(t7 + t8 + t9, 2),
            "07_08_09_local_candidates_per_s": round(n_cand / (t7 + t8 + t9)),
            "kept_local": stats9["kept"], "written_08": stats8["written"]}


def _read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def run_peer(work: Path, args, data) -> dict:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from repair.models import resolve_model

    queries, positives, cands, q_vec, p_vec, c_vec = data
    n_cand = args.tuples * args.candidates
    model = SentenceTransformer(resolve_model(args.model, None, False).path, device="cpu")

    def no_encoding(*_a, **_k):
        raise RuntimeError("the peer must run from its cache")

    model.encode_query = model.encode_document = model.encode = no_encoding
    corpus = [t for row in cands for t in row]
    # mine_hard_negatives' cache files: its corpus is dict.fromkeys(corpus + positives), queries deduplicated
    st_corpus = list(dict.fromkeys(corpus + positives))
    vec_of = dict(zip(positives, p_vec)) | dict(zip(corpus, c_vec.reshape(-1, args.dim)))
    model_name = model.model_card_data.base_model or ""
    cache = work / "st_cache"
    cache.mkdir(exist_ok=True)
    q_hash = hashlib.sha256(repr((model_name, None, None, queries)).encode()).hexdigest()
    c_hash = hashlib.sha256(repr((model_name, None, None, st_corpus)).encode()).hexdigest()
    np.save(cache / f"query_embeddings_{q_hash}.npy", q_vec)
    np.save(cache / f"corpus_embeddings_{c_hash}.npy", np.stack([vec_of[t] for t in st_corpus]))
    dataset = Dataset.from_dict({"query": queries, "positive": positives})

    def mine():
        return mine_hard_negatives(dataset, model, corpus=corpus, num_negatives=1, output_format="triplet",
                                   cache_folder=str(cache), use_faiss=False, verbose=False)

    out, t = timed(mine)
    return {"mine_hard_negatives_s": round(t, 2), "mine_hard_negatives_candidates_per_s": round(n_cand / t),
            "top1": dict(zip(out["query"], out["negative"]))}


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging("WARNING")
    import torch

    torch.set_num_threads(min(torch.get_num_threads(), os.cpu_count() or 1))
    data = synthetic(args.tuples, args.candidates, args.dim, args.seed)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        work = Path(tmp)
        ours = run_ours(work, args, data)
        peer = {} if args.skip_peer or args.skip_global else run_peer(work, args, data)
    same = None
    if peer:
        queries = data[0]
        ours_top1 = [ours["global_top1"].get(f"t{i}") for i in range(args.tuples)]
        peer_top1 = [peer["top1"].get(q) for q in queries]
        same = sum(a == b for a, b in zip(ours_top1, peer_top1) if a is not None) / max(
            1, sum(a is not None for a in ours_top1))
    result = {"tuples": args.tuples, "candidates_per_tuple": args.candidates, "dim": args.dim,
              "threads": torch.get_num_threads(),
              **{k: v for k, v in ours.items() if k != "global_top1"},
              **{k: v for k, v in peer.items() if k != "top1"}, "global_top1_agreement_on_kept": same}
    print(f"{'stage':<48}{'seconds':>10}{'candidates/s':>15}")
    rows = [("ours 07 embed (all from cache)", "07_s", "07_candidates_per_s"),
            ("ours 08 hard negatives (top 15)", "08_s", "08_candidates_per_s"),
            ("ours 09 consistency, local pool (README)", "09_local_s", "09_local_candidates_per_s"),
            ("ours 07+08+09 (local)", "07_08_09_local_s", "07_08_09_local_candidates_per_s"),
            ("ours 09 global pool, top-1 (original)", "09_global_top1_s", "09_global_top1_candidates_per_s"),
            ("peer mine_hard_negatives, top-1 (global)", "mine_hard_negatives_s",
             "mine_hard_negatives_candidates_per_s")]
    for label, s_key, r_key in rows:
        if s_key in result:
            print(f"{label:<48}{result[s_key]:>10}{result[r_key]:>15}")
    print(json.dumps(result))
    if args.output:
        write_json(args.output, result)
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
