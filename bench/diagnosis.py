#!/usr/bin/env python
"""Benchmark of stage I's heavy parts on synthetic T0-shaped embeddings: margins and FINCH.

Data: N passages d_i = unit(topic centre + noise) around --topics centres in --dim dimensions, and N queries
q_i = unit(d_i + noise), so row i's positive is passage i (T0's shape). Each case runs in a fresh child
process, which reports its wall seconds and its peak resident memory (ru_maxrss) next to the memory it held
before the measured call (data loaded), so the figures are per case.

Cases:
  margins/torch    normfp16 caches + exact top-k (torch matmul, running top-k) + margins + thresholds (ours)
  margins/faiss    the same with faiss IndexFlatIP as the search (the original's preferred backend)
  finch/ours       exact chunked 1-NN FINCH on all N queries (every level)
  finch/finch-clust  finch-clust 0.2.3 on the same N queries: above 20k rows it needs an ANN
                   (pynndescent is not installed here, so its faiss HNSW path: approximate 1-NN)
  subset: ours vs finch-clust's exact regime (pairwise distances) on the first --finch_exact_n queries

Example: python bench/diagnosis.py --n 100000 --dim 576
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np



def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_data(n: int, dim: int, topics: int, seed: int, folder: Path, query_noise: float = 1.0) -> None:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(topics, dim)).astype(np.float32)
    docs = centres[rng.integers(0, topics, n)] + 0.8 * rng.normal(size=(n, dim)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    # noise of norm ~query_noise around the unit positive: cos(q_i, d_i) ~ 1/sqrt(1 + query_noise^2)
    queries = docs + (query_noise / np.sqrt(dim)) * rng.normal(size=(n, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    np.save(folder / "docs.npy", docs)
    np.save(folder / "queries.npy", queries)


def case_margins(folder: str, backend: str, top_k: int, pct: int) -> dict:
    import torch

    from repair.diagnosis import margins as dg

    torch.set_num_threads(os.cpu_count() or 1)
    q = torch.from_numpy(np.load(Path(folder) / "queries.npy"))
    d = torch.from_numpy(np.load(Path(folder) / "docs.npy"))
    before = rss_mb()
    t = time.perf_counter()
    qn, dn = dg.normalise_fp16(q), dg.normalise_fp16(d)
    res = dg.compute_margins(qn.float(), dn.float(), top_k, backend=backend, device="cpu")
    thr = dg.percentile_thresholds(res.margin, [pct])[pct]
    confused = dg.select_confused(res.margin, thr)
    secs = time.perf_counter() - t
    np.save(Path(folder) / f"confused_{backend}.npy", confused)
    np.save(Path(folder) / f"topk_{backend}.npy", res.topk_indices)
    np.save(Path(folder) / f"margin_{backend}.npy", res.margin)
    return {"seconds": secs, "rss_before_mb": before, "peak_mb": peak_mb(), "confused": int(len(confused)),
            "threshold": thr}


def case_finch_ours(folder: str, rows: int | None, tag: str) -> dict:
    import torch

    from repair.diagnosis.finch import finch

    torch.set_num_threads(os.cpu_count() or 1)
    x = np.load(Path(folder) / "queries.npy")[:rows]
    before = rss_mb()
    t = time.perf_counter()
    parts = finch(x, levels=None)
    secs = time.perf_counter() - t
    np.save(Path(folder) / f"finch_ours_{tag}.npy", np.stack(parts, axis=1))
    return {"seconds": secs, "rss_before_mb": before, "peak_mb": peak_mb(),
            "clusters": [int(p.max()) + 1 for p in parts]}


def case_finch_clust(folder: str, rows: int | None, tag: str, exact: bool) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from finch import FINCH
    x = np.load(Path(folder) / "queries.npy")[:rows]
    before = rss_mb()
    t = time.perf_counter()
    kw = {"ann_threshold": len(x) + 1} if exact else {"ann_threshold": 0, "faiss_threshold": 1, "random_state": 0}
    c, num_clust, _ = FINCH(x, distance="cosine", verbose=False, **kw)
    secs = time.perf_counter() - t
    np.save(Path(folder) / f"finch_clust_{tag}.npy", c)
    return {"seconds": secs, "rss_before_mb": before, "peak_mb": peak_mb(), "clusters": [int(v) for v in num_clust]}


def _child(fn, args, queue) -> None:
    try:
        queue.put(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def run_case(fn, *args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(fn, args, queue))
    proc.start()
    proc.join()
    return queue.get() if not queue.empty() else {"error": f"child exited with {proc.exitcode}"}


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    from repair.diagnosis.finch import canonical_labels

    return bool((canonical_labels(a) == canonical_labels(b)).all())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="T0 rows (queries = passages) (default: %(default)s)")
    p.add_argument("--dim", type=int, default=576, help="embedding width (default: %(default)s, SmolLM2-135M)")
    p.add_argument("--topics", type=int, default=2000,
                   help="topic centres of the synthetic corpus (default: %(default)s)")
    p.add_argument("--top_k", type=int, default=50, help="diagnosis top-k (default: %(default)s)")
    p.add_argument("--pct", type=int, default=30, help="Q_conf percentile (default: %(default)s)")
    p.add_argument("--finch_exact_n", type=int, default=20_000,
                   help="rows for the exact finch-clust comparison (its pairwise matrix is n^2 float64) "
                        "(default: %(default)s)")
    p.add_argument("--skip", nargs="*", default=[], choices=["margins_faiss", "finch_clust_ann"],
                   help="cases to leave out")
    p.add_argument("--query_noise", type=float, default=1.0,
                   help="relative noise of a query around its positive (default: %(default)s: cos ~0.71)")
    p.add_argument("--seed", type=int, default=0, help="data seed (default: %(default)s)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    results = {"n": args.n, "dim": args.dim, "top_k": args.top_k, "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_data(args.n, args.dim, args.topics, args.seed, folder, args.query_noise)
        cases = [("margins/torch", case_margins, (tmp, "torch", args.top_k, args.pct))]
        if "margins_faiss" not in args.skip:
            cases.append(("margins/faiss", case_margins, (tmp, "faiss", args.top_k, args.pct)))
        cases.append(("finch/ours", case_finch_ours, (tmp, None, "all")))
        if "finch_clust_ann" not in args.skip:
            cases.append(("finch/finch-clust (faiss HNSW)", case_finch_clust, (tmp, None, "all", False)))
        m = min(args.finch_exact_n, args.n)
        cases.append((f"finch/ours first {m}", case_finch_ours, (tmp, m, "sub")))
        cases.append((f"finch/finch-clust exact first {m}", case_finch_clust, (tmp, m, "sub", True)))
        for name, fn, fargs in cases:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results[name] = run_case(fn, *fargs)
            print(f"  {results[name]}", file=sys.stderr, flush=True)
        checks = {}
        if (folder / "topk_faiss.npy").exists():
            a, b = np.load(folder / "topk_faiss.npy"), np.load(folder / "topk_torch.npy")
            checks["margins: rows whose faiss top-k list == torch's"] = f"{int((a == b).all(axis=1).sum())}/{len(a)}"
            checks["margins: rows whose top-k set == torch's"] = (
                f"{sum(set(x) == set(y) for x, y in zip(a.tolist(), b.tolist()))}/{len(a)}")
            checks["margins: max |margin faiss - margin torch|"] = float(
                np.abs(np.load(folder / "margin_faiss.npy") - np.load(folder / "margin_torch.npy")).max())
            checks["margins: same Q_conf"] = bool(
                np.array_equal(np.load(folder / "confused_faiss.npy"), np.load(folder / "confused_torch.npy")))
        ours_all = np.load(folder / "finch_ours_all.npy")
        if (folder / "finch_clust_all.npy").exists():
            from sklearn.metrics import adjusted_rand_score

            theirs = np.load(folder / "finch_clust_all.npy")
            checks["finch all: first partition identical to finch-clust ANN"] = same_partition(
                ours_all[:, 0], theirs[:, 0])
            checks["finch all: ARI first partition vs finch-clust ANN"] = round(
                float(adjusted_rand_score(ours_all[:, 0], theirs[:, 0])), 4)
        ours_sub, theirs_sub = np.load(folder / "finch_ours_sub.npy"), np.load(folder / "finch_clust_sub.npy")
        checks["finch subset: same number of levels"] = ours_sub.shape[1] == theirs_sub.shape[1]
        checks["finch subset: every level identical to exact finch-clust"] = ours_sub.shape == theirs_sub.shape and all(
            same_partition(ours_sub[:, j], theirs_sub[:, j]) for j in range(ours_sub.shape[1]))
        results["checks"] = checks
    print(f"\n{'case':42s} {'seconds':>9s} {'RSS before MB':>14s} {'peak MB':>9s}  result")
    for name, r in results.items():
        if isinstance(r, dict) and "seconds" in r:
            extra = {k: v for k, v in r.items() if k not in ("seconds", "rss_before_mb", "peak_mb")}
            print(f"{name:42s} {r['seconds']:9.1f} {r['rss_before_mb']:14.0f} {r['peak_mb']:9.0f}  {extra}")
        elif isinstance(r, dict) and "error" in r:
            print(f"{name:42s} failed: {r['error']}")
    for k, v in results["checks"].items():
        print(f"check: {k}: {v}")
    print(json.dumps(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
