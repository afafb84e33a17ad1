#!/usr/bin/env python
"""The CausalNeg paper's negative diagnostics (Sec. 2.3 / 4.3, Table 5; Sec. 2.4, Fig. 3, Table 3), per negative
source, on triplet files written by differentiation/09b_counterfactual_negatives.py (or any triplet JSONL).

Embedding space (a frozen retriever, default all-MiniLM-L6-v2): mean query similarity, similarity-range and histogram
overlap with mined negatives, intra-negative diversity, template-pattern ratio, HDBSCAN pure-cluster ratio.
Training (optional): per-source softmax weight over steps from a run's train_log.jsonl (--train_log), and the
per-negative gradient-norm ratio generated / mined at every checkpoint of a run (--probe).

Writes <out_dir>/diagnostics.md, diagnostics.json, similarities.png, clusters.png (and dynamics.png).

Example:
  python bench/negative_diagnostics.py --triplets neg/mixture.jsonl neg/causalneg.jsonl --model minilm \\
      --train_log mixture=runs/mixture/train_log.jsonl --train_log causalneg=runs/causalneg/train_log.jsonl \\
      --probe mixture=runs/mixture --probe causalneg=runs/causalneg --out_dir diag/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


from repair.cli import add_retriever_args, fail, load_retriever
from repair.data import DataError
from repair.differentiation.causalneg.diagnostics import (diagnose, diagnostics_table, dump, embed_set, plot_clusters,
                                          plot_similarities, read_negative_sets)
from repair.training.causalneg_dynamics import plot_dynamics, probe_run, read_train_log, weight_dynamics
from repair.runtime import setup_logging


def _named(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            fail(f"{flag} expects NAME=PATH, got {v!r}")
        out[name] = path
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--triplets", nargs="+", required=True,
                   help="triplet JSONL files; negatives are grouped by trace method (bm25/input -> mined, random, "
                        "vanilla, cot) and deduplicated across files")
    p.add_argument("--max_queries", type=int, default=None, help="use only the first N distinct queries")
    add_retriever_args(p, default_model="minilm")
    p.add_argument("--instruction", default=None, help="query instruction (default: the retriever's own)")
    p.add_argument("--min_cluster_size", type=int, default=5, help="HDBSCAN min_cluster_size (default: %(default)s)")
    p.add_argument("--min_samples", type=int, default=None, help="HDBSCAN min_samples (default: min_cluster_size)")
    p.add_argument("--pca_dims", type=int, default=None,
                   help="reduce the joint embeddings to this many PCA dimensions before HDBSCAN (default: off)")
    p.add_argument("--template_words", type=int, default=4,
                   help="opening words compared by the template-pattern ratio (default: %(default)s)")
    p.add_argument("--train_log", action="append", default=[],
                   help="NAME=train_log.jsonl of a training run: per-source softmax weights over steps; repeatable")
    p.add_argument("--windows", type=int, default=10, help="step windows of the weight dynamics (default: %(default)s)")
    p.add_argument("--probe", action="append", default=[],
                   help="NAME=RUN_DIR of a training run: gradient-norm ratio generated / mined at every checkpoint, "
                        "on the first --probe_size lines of the run's triplets with both sources; repeatable")
    p.add_argument("--probe_size", type=int, default=16, help="queries in the gradient probe batch (default: %(default)s)")
    p.add_argument("--out_dir", required=True, help="folder for diagnostics.md/.json and the PNG plots")
    p.add_argument("--seed", type=int, default=0, help="seed of PCA in plots and clustering (default: %(default)s)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    p.add_argument("--no_progress", action="store_true", help="hide progress bars")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup_logging(args.log_level)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    logs, probes = _named(args.train_log, "--train_log"), _named(args.probe, "--probe")
    t0 = time.time()
    try:
        data = read_negative_sets(args.triplets, args.max_queries)
    except (DataError, FileNotFoundError) as exc:
        fail(str(exc))
    retriever = load_retriever(args)
    emb = embed_set(data, retriever, args.instruction, show_progress=not args.no_progress)
    res = diagnose(emb, min_cluster_size=args.min_cluster_size, min_samples=args.min_samples,
                   pca_dims=args.pca_dims, template_words=args.template_words, seed=args.seed)
    plot_similarities(res, out_dir / "similarities.png")
    plot_clusters(res, out_dir / "clusters.png", seed=args.seed)
    dynamics: dict[str, dict] = {}
    for name, path in logs.items():
        dynamics.setdefault(name, {})["weights"] = weight_dynamics(read_train_log(path), args.windows)
    if probes:
        for name, run_dir in probes.items():
            dynamics.setdefault(name, {})["probes"] = probe_run(run_dir, args.probe_size, device=args.device)
    if dynamics:
        plot_dynamics(dynamics, out_dir / "dynamics.png")
    md = [f"# Negative diagnostics\n", f"Triplets: {', '.join(args.triplets)}; {res['n_queries']} queries; "
          f"retriever {args.model}; mean cos(q, d+) = {res['positive_similarity']:.3f}.\n",
          diagnostics_table(res["rows"]), ""]
    for name, run in dynamics.items():
        if run.get("weights"):
            md += [f"\n## Softmax weight per negative, {name}\n", diagnostics_table(run["weights"], (
                ("step_from", "from step", "{}"), ("step_to", "to step", "{}"),
                ("weight_mined", "weight mined", "{:.3g}"), ("weight_generated", "weight generated", "{:.3g}"),
                ("weight_ratio", "gen / mined", "{:.3g}"), ("sim_mined", "sim mined", "{:.3f}"),
                ("sim_generated", "sim generated", "{:.3f}")))]
        if run.get("probes"):
            md += [f"\n## Gradient probe, {name}\n", diagnostics_table(run["probes"], (
                ("step", "checkpoint step", "{}"), ("grad_norm_ratio", "grad-norm ratio gen / mined", "{:.3g}"),
                ("align_pos_generated", "cos(g+, g_gen)", "{:.3f}"), ("align_pos_mined", "cos(g+, g_mined)", "{:.3f}"),
                ("weight_ratio", "weight ratio gen / mined", "{:.3g}")))]
    (out_dir / "diagnostics.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    summary = {"triplets": args.triplets, "retriever": retriever.describe(), "n_queries": res["n_queries"],
               "positive_similarity": res["positive_similarity"], "table": res["rows"], "dynamics": dynamics,
               "settings": {"min_cluster_size": args.min_cluster_size, "min_samples": args.min_samples,
                            "pca_dims": args.pca_dims, "template_words": args.template_words},
               "seconds": round(time.time() - t0, 1)}
    dump(out_dir / "diagnostics.json", summary)
    print(diagnostics_table(res["rows"]), file=sys.stderr)
    print(json.dumps({"out_dir": str(out_dir), "groups": [r["group"] for r in res["rows"]],
                      "seconds": summary["seconds"]}))
    return summary


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
