#!/usr/bin/env python
"""Which offline generator writes usable queries, and how fast? (issue 16, lever 1)

A fixed sample of 16 concept sets (2-3 concepts each, drawn with ``--seed`` from the SciFact-style concept
list below) is sent, with greedy decoding, to each configuration ``BACKEND:ALIAS[:BATCH]``:
  hf:ALIAS:B      transformers on the converted fp32 folder (HFGenerator, batches of B prompts)
  server:ALIAS    llama.cpp's OpenAI-compatible server on the Q4 GGUF (llama-cpp-python[server]), through the
                  project's OpenAIGenerator; skipped with a note when llama_cpp is not installed
  ct2:ALIAS:B:Q   CTranslate2 (repair.expansion.ct2_generation.CT2Generator) on the folder converted once with weights Q
                  (int8 | float32), batches of B prompts (issue 33)
with ALIAS one of smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, and each prompt of ``--prompts``:
  paper           the prompt 05 sends (repair.expansion.query_generation.build_prompt, App. A.2.1 wording), one user turn
  example         system turn + one worked example + "write one research question" (GENERATORS.md)

"Usable" is mechanical: ``clean_query`` accepts the completion (not empty / an echo of the prompt / too short /
not text / repetitive / vague); the cleaned query has 5-30 words; it mentions at least one of its concepts (a
content word of the concept, >= 3 letters, starts a word of the query); and it is not the worked example
again (word-set Jaccard with the example < 0.6). Greedy decoding makes every row repeatable; identical
prompts inside a configuration are generated once (none repeat in the default sample). Tokens are counted
with the model's own tokenizer; tokens/s = generated tokens / generation wall time (prefill included).

Each configuration runs in its own child process (``--threads`` may list several counts: each is one more
run), so its peak RSS is its own; every result also records the prefill time per query (up to 8 prompts of the
first batch with max_new_tokens=1, after an untimed one-prompt call that pages the weights in; CTranslate2 is
then reloaded so the timed run starts with a cold prefix cache), queries/s, and the load average before and
after. ``--export_json`` writes one object per result with ``ratio_vs_hf``: its queries/s over the best ``hf``
row's at the same threads and prompt (transformers at its best batch size).

Resumable: each finished configuration is stored in ``--out`` and skipped when the script runs again.
    OMP_NUM_THREADS=1 python bench/generators.py --out runs/bench_generators.json
    python bench/generators.py --out runs/bench_generators.json --table      # the table only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import random
import re
import sys
import time
from pathlib import Path


from repair.expansion.generation import DEFAULT_SAMPLING, HFGenerator, OpenAIGenerator
from repair.expansion.query_generation import build_prompt, clean_query, sample_concepts
from repair.runtime import setup_logging
from repair.tables import markdown_table
from repair.text import content_words

logger = logging.getLogger("bench.generators")

# Biomedical concepts of the kind SciFact's claims mix (the shipped demo slice data/demo/scifact-demo).
CONCEPTS = [
    "ALDH1", "breast cancer", "sudden infant death syndrome", "ovarian reserve", "Caenorhabditis elegans",
    "CD44v6", "insulin resistance", "adipose tissue inflammation", "T regulatory cells", "microRNA",
    "p53", "autophagy", "tuberculosis", "statins", "cardiovascular mortality", "DNA methylation",
    "hematopoietic stem cells", "malaria", "gut microbiota", "obesity", "vitamin D", "Alzheimer's disease",
    "mitochondrial dysfunction", "PD-1 blockade",
]
N_SETS = 16

EXAMPLE_CONCEPTS = "insulin resistance; adipose tissue inflammation"
EXAMPLE_QUERY = "How does chronic adipose tissue inflammation contribute to insulin resistance in obese adults?"
EXAMPLE_SYSTEM = "You write search queries for a scientific literature search engine."
EXAMPLE_ASK = ("Concepts: {concepts}\nWrite one specific research question (at most 20 words) that a scientist "
               "would type into a literature search engine to find papers linking these concepts. Use each "
               "concept correctly. Output only the question.")


def concept_sets(seed: int, n: int = N_SETS) -> list[list[str]]:
    """The fixed sample: ``n`` sets of 2-3 distinct concepts, with the 05 stage's own sampler."""
    rng = random.Random(seed)
    return [sample_concepts(CONCEPTS, rng, 2, 3) for _ in range(n)]


def make_prompt(concepts: list[str], kind: str) -> str | list[dict]:
    if kind == "paper":
        return build_prompt(concepts, template="paper")
    if kind == "example":
        return [{"role": "system", "content": EXAMPLE_SYSTEM},
                {"role": "user", "content": EXAMPLE_ASK.format(concepts=EXAMPLE_CONCEPTS)},
                {"role": "assistant", "content": EXAMPLE_QUERY},
                {"role": "user", "content": EXAMPLE_ASK.format(concepts="; ".join(concepts))}]
    raise ValueError(f"unknown prompt kind {kind!r}")


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _mentioned(query: str, concept: str) -> bool:
    """A content word (>= 3 letters) of the concept starts a word of the query ("microRNA" is mentioned by
    "microRNAs"; "statins" is not by "statin")."""
    qwords = _words(query)
    return any(len(w) >= 3 and any(q.startswith(w) for q in qwords)
               for w in (x.lower() for x in (content_words(concept) or _words(concept))))


def mentions_concept(query: str, concepts: list[str]) -> bool:
    return any(_mentioned(query, c) for c in concepts)


def mentions_all(query: str | None, concepts: list[str]) -> bool:
    """The stricter column: every concept of the set is mentioned."""
    return bool(query) and all(_mentioned(query, c) for c in concepts)


def judge(raw: str, prompt: str | list[dict], concepts: list[str]) -> tuple[str | None, str]:
    """(cleaned query or None, "ok" or the reason it is not usable); the definition is in the docstring."""
    prompt_text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    query, reason = clean_query(raw, prompt_text)
    if query is None:
        return None, reason
    words = _words(query)
    if not 5 <= len(words) <= 30:
        return query, "length"
    if not mentions_concept(query, concepts):
        return query, "no_concept"
    example = set(_words(EXAMPLE_QUERY))
    if len(set(words) & example) / len(set(words) | example) >= 0.6:
        return query, "example_echo"
    return query, "ok"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


class _Run:
    """One configuration: the generator, the tokenizer that counts its tokens, and a cleanup."""

    def __init__(self, backend: str, alias: str, batch: int, threads: int, quantization: str = "int8"):
        from transformers import AutoTokenizer

        from repair.model_packages import LlamaServer, gguf_path
        from repair.models import resolve_model

        self.server = None
        t0 = time.perf_counter()
        if backend == "hf":
            self.generator = HFGenerator(alias, device="cpu", batch_size=batch)
            self.tokenizer = self.generator.tokenizer
        elif backend == "ct2":
            from repair.expansion.ct2_generation import CT2Generator

            self.generator = CT2Generator(alias, device="cpu", batch_size=batch, quantization=quantization,
                                          threads=threads)
            self.tokenizer = self.generator.tokenizer
        elif backend == "server":
            gguf = gguf_path(alias)
            self.server = LlamaServer(gguf, model_alias=alias, n_threads=threads,
                                      n_ctx=2048).__enter__()
            # llama.cpp's sampler option is repeat_penalty; send the HF runs' value under its name.
            self.generator = OpenAIGenerator(self.server.base_url, alias, concurrency=1,
                                             send_repetition_penalty=False,
                                             extra_body={"repeat_penalty": DEFAULT_SAMPLING["repetition_penalty"]})
            self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(alias, pooling="eos").path)
        else:
            raise ValueError(f"unknown backend {backend!r} (hf, ct2 or server)")
        self.load_s = time.perf_counter() - t0

    def close(self) -> None:
        if self.server is not None:
            self.server.__exit__(None, None, None)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def peak_rss_mb() -> float:
    """This process's peak resident set (each configuration runs in its own process)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def row_name(r: dict) -> str:
    return f"ct2-{r['quantization']}" if r["backend"] == "ct2" else r["backend"]


def export_rows(results: dict[str, dict]) -> list[dict]:
    """One object per result, with ``ratio_vs_hf``: queries/s over the best hf row's (any batch size) at the same
    threads, model and prompt (None where no hf row was measured)."""
    best_hf: dict[tuple, float] = {}
    for r in results.values():
        if r["backend"] == "hf" and "queries_per_s" in r:
            k = (r["model"], r["threads"], r["prompt"])
            best_hf[k] = max(best_hf.get(k, 0.0), r["queries_per_s"])
    rows = []
    for r in results.values():
        if "queries_per_s" not in r:
            continue
        hf = best_hf.get((r["model"], r["threads"], r["prompt"]))
        rows.append({"backend": row_name(r), "alias": r["model"], "threads": r["threads"], "batch": r["batch"],
                     "prompt": r["prompt"], "queries_per_s": r["queries_per_s"], "tokens_per_s": r["tokens_per_s"],
                     "prefill_s_per_query": r["prefill_s_per_query"], "usable": round(r["usable"] / r["n"], 4),
                     "usable_n": f"{r['usable']}/{r['n']}", "peak_rss_mb": r["peak_rss_mb"],
                     "ratio_vs_hf": round(r["queries_per_s"] / hf, 2) if hf else None,
                     "load_avg_before_after": f"{r['load_avg_before']} / {r['load_avg_after']}"})
    return rows


def result_key(config: str, kind: str, threads: int) -> str:
    """``BACKEND:ALIAS[:BATCH][@Nt]|PROMPT``: one stored result (the thread count only when it is not 1)."""
    return f"{config}{'' if threads == 1 else f'@{threads}t'}|{kind}"


def run_config(key: str, prompts_kind: list[str], sets: list[list[str]], threads: int,
               max_new_tokens: int) -> dict[str, dict]:
    """Generate the sample with one configuration for each prompt kind; one result per (config, prompt)."""
    parts = key.split(":")
    backend, alias = parts[0], parts[1]
    batch = int(parts[2]) if len(parts) > 2 else (1 if backend == "server" else 8)
    quantization = parts[3] if len(parts) > 3 else "int8"
    run = _Run(backend, alias, batch, threads, quantization)
    results = {}
    greedy = dict(n=1, seed=0, repetition_penalty=DEFAULT_SAMPLING["repetition_penalty"], do_sample=False)
    try:
        for kind in prompts_kind:
            prompts = [make_prompt(c, kind) for c in sets]
            unique: dict[str, str | list[dict]] = {}
            for p in prompts:
                unique.setdefault(json.dumps(p), p)
            load_before = load_average()
            first_batch = list(unique.values())[:min(batch, 8)]
            # untimed: the first forward pages the memory-mapped weights in, which is load, not prefill
            run.generator.generate(first_batch[:1], max_new_tokens=1, **greedy)
            t0 = time.perf_counter()
            run.generator.generate(first_batch, max_new_tokens=1, **greedy)
            prefill = time.perf_counter() - t0
            if hasattr(run.generator, "reload"):  # CTranslate2: time the run with a cold prefix cache
                run.generator.reload()
            t0 = time.perf_counter()
            outs = run.generator.generate(list(unique.values()), max_new_tokens=max_new_tokens, **greedy)
            wall = time.perf_counter() - t0
            by_prompt = dict(zip(unique, outs))
            raws = [by_prompt[json.dumps(p)] for p in prompts]
            rows = []
            for concepts, prompt, raw in zip(sets, prompts, raws):
                query, verdict = judge(raw, prompt, concepts)
                rows.append({"concepts": concepts, "raw": raw, "query": query, "verdict": verdict})
            tokens = sum(run.count_tokens(r) for r in by_prompt.values())
            rkey = result_key(key, kind, threads)
            results[rkey] = {
                "backend": backend, "model": alias, "batch": batch, "prompt": kind, "threads": threads,
                "load_s": round(run.load_s, 1), "wall_s": round(wall, 1), "generated_tokens": tokens,
                "tokens_per_s": round(tokens / wall, 2), "s_per_query": round(wall / len(sets), 2),
                "queries_per_s": round(len(sets) / wall, 4), "prefill_s": round(prefill, 2),
                "prefill_s_per_query": round(prefill / len(first_batch), 2),
                "peak_rss_mb": round(peak_rss_mb()), "quantization": quantization if backend == "ct2" else None,
                "usable": sum(r["verdict"] == "ok" for r in rows), "n": len(rows),
                "load_avg_before": load_before, "load_avg_after": load_average(),
                "generator": run.generator.describe(), "rows": rows}
            logger.info("%s: %d/%d usable, %.2f tok/s, %.1f s/query", rkey, results[rkey]["usable"], len(rows),
                        tokens / wall, wall / len(sets))
    finally:
        run.close()
    return results


def table(results: dict[str, dict]) -> str:
    ratios = {(e["backend"], e["alias"], e["threads"], e["batch"], e["prompt"]): e["ratio_vs_hf"]
              for e in export_rows(results)}
    rows = []
    for r in results.values():
        full = sum(row["verdict"] == "ok" and mentions_all(row["query"], row["concepts"]) for row in r["rows"])
        ratio = ratios.get((row_name(r), r["model"], r["threads"], r["batch"], r["prompt"]))
        rows.append([r["model"], row_name(r), r["batch"], r["threads"], r["prompt"],
                     f"{r['queries_per_s']:.3f}" if "queries_per_s" in r else "", f"{r['tokens_per_s']:.2f}",
                     f"{r['prefill_s_per_query']:.2f}" if "prefill_s_per_query" in r else "", f"{r['s_per_query']:.1f}",
                     f"{r['usable']}/{r['n']}", f"{full}/{r['n']}",
                     f"{r['peak_rss_mb']}" if "peak_rss_mb" in r else "", "" if ratio is None else f"{ratio:.2f}",
                     f"{r['load_avg_before']} / {r['load_avg_after']}"])
    return markdown_table(["model", "backend", "batch", "threads", "prompt", "queries/s", "tok/s", "prefill s/query",
                           "s/query", "usable", "usable, all concepts", "peak RSS MB", "ratio vs best hf",
                           "load avg (before/after)"], rows)


DEFAULT_CONFIGS = ["hf:smollm2-135m:8", "server:smollm2-135m", "hf:qwen2.5-coder-0.5b:8", "server:qwen2.5-coder-0.5b",
                   "server:qwen2.5-coder-1.5b", "hf:qwen2.5-coder-1.5b:8"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="results JSON (read first: finished configurations are skipped)")
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="BACKEND:ALIAS[:BATCH] (default: all)")
    p.add_argument("--prompts", nargs="+", choices=["paper", "example"], default=["paper", "example"])
    p.add_argument("--seed", type=int, default=16, help="seed of the concept-set sample (default: %(default)s)")
    p.add_argument("--max_new_tokens", type=int, default=48, help="(default: %(default)s)")
    p.add_argument("--threads", type=int, nargs="+", default=[int(os.environ.get("OMP_NUM_THREADS") or 1)],
                   help="CPU thread counts for torch, CTranslate2 and the llama.cpp server; each count is one run "
                        "of every configuration (default: $OMP_NUM_THREADS or 1)")
    p.add_argument("--n_sets", type=int, default=N_SETS, help="concept sets in the sample (default: %(default)s)")
    p.add_argument("--in_process", action="store_true",
                   help="run the configurations in this process (default: one child process each, so that the "
                        "peak RSS is the configuration's own)")
    p.add_argument("--export_json", default=None,
                   help="also write one object per result (backend, alias, threads, queries_per_s, tokens_per_s, "
                        "usable, peak_rss_mb, ratio_vs_hf, ...) to this JSON file")
    p.add_argument("--table", action="store_true", help="print the table of --out and exit")
    args = p.parse_args(argv)
    setup_logging("INFO")
    out = Path(args.out)
    results: dict[str, dict] = json.loads(out.read_text()) if out.exists() else {}
    if not args.table:
        sets = concept_sets(args.seed, args.n_sets)
        for threads in args.threads:
            for key in args.configs:
                todo = [k for k in args.prompts if result_key(key, k, threads) not in results]
                if not todo:
                    continue
                if key.startswith("server:") and importlib.util.find_spec("llama_cpp") is None:
                    logger.warning("skipping %s: llama_cpp is not installed (pip install 'llama-cpp-python[server]')",
                                   key)
                    continue
                if not args.in_process:
                    _run_child(args, key, todo, threads)
                    results = json.loads(out.read_text()) if out.exists() else {}
                    continue
                import torch

                torch.set_num_threads(threads)
                results.update(run_config(key, todo, sets, threads, args.max_new_tokens))
                _write_json(out, results)
    if args.export_json:
        _write_json(Path(args.export_json), export_rows(results))
    print(table(results))
    return 0


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _run_child(args, key: str, prompts: list[str], threads: int) -> None:
    """One configuration in a fresh process with ``threads`` threads; it adds its results to ``--out``."""
    import subprocess

    cmd = [sys.executable, __file__, "--out", args.out, "--configs", key, "--prompts", *prompts, "--seed",
           str(args.seed), "--n_sets", str(args.n_sets), "--max_new_tokens", str(args.max_new_tokens), "--threads",
           str(threads), "--in_process"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    logger.info("%s at %d thread(s), load average %s", key, threads, load_average())
    subprocess.run(cmd, check=True, env=env)


if __name__ == "__main__":
    sys.exit(main())
