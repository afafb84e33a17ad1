#!/usr/bin/env python
"""Growth curves of every stage (issue 41, DESIGN 7): seconds and memory as the work grows, a log-log slope
per stage, and a projection to the paper's scale (4M queries verified against 2x10^8 papers).

Every size of every stage runs in a FRESH subprocess (inputs are prepared by another subprocess first), so its
peak memory is its own: VmHWM, RssAnon and RssFile from /proc/self/status at the end of the measured call
(resource.getrusage where /proc is missing). Torch, OpenMP and BLAS get --threads threads (default 1).
All inputs are synthetic and deterministic by --seed: scientific-looking words drawn from a Zipf vocabulary,
160-word abstracts, 15-25 word queries, unit vectors around topic centres (MiniLM's width, 384).

Stages (size unit; what is timed):
  01  margins:torch         |T0| rows; normfp16 + exact top-50 + margins + thresholds on precomputed vectors.
                            T0's queries are searched against T0's own passages (stages.run_margins), so the
                            corpus grows with |T0|: n x n dot products.
      search:torch,corpus=C |T0| queries against a FIXED corpus of --corpus passages (exact top-50):
                            the search alone, as the issue's "|T0| 10^3..10^5 over a 10^5..10^6 corpus".
      encode:minilm         |T0| rows; the offline all-MiniLM-L6-v2 encodes |T0| queries + |T0| passages
                            (the part of 01 that needs the model; the vectors above stand in for its output).
  02  ccs                   |Q_conf|; read Q_conf's margin lines + CCS (Eq. 5) and C_intra (concepts given;
                            the extractor's cost is per document and not timed).
  03  finch                 |Q_conf|; exact 1-NN graph + components (FINCH partition 1, 03's default).
  04  merge                 |Q_conf| C_intra lines + |Q_conf|/5 FINCH components -> C_conf.
  06_build / 06_search      papers; the on-disk literature index (repair.expansion.sources.literature, when
                            installed) and today's bm25s LocalCorpus (up to --bm25s_max papers). The search
                            runs --search_queries queries (k 21, 06's depth) and reports queries/s.
  07  embed                 tuples (x20 candidates from a shared pool of papers); every vector in the
                            MiniLM retriever's cache, so 07's own work (read, dedupe, cache look-up, write) is
                            timed, not the encoder (that is 01's encode:minilm rate).
  08  hard_negatives        tuples; open 07's dir, load tuples, rank candidates, write the top 15.
  09  consistency           tuples; 08's output through the local-pool consistency filter (kappa 5).
  10  train:tiny-qwen2      optimizer steps of a tiny random-weight Qwen2 (global batch 16, mini batch 8,
                            64 tokens) on synthetic pairs; the data grows with the steps (one epoch).

Rows: one per measurement in --output (default docs/results/scale.json); a stage's parts (e.g. 01's search vs
its margin arithmetic) are rows of their own whose engine ends in "[part]" (same process, same memory).

  python bench/scale.py --stages 01 02 03 04 07 08 09 10 --merge      # measure (small-to-medium sizes)
  python bench/scale.py --stages 06 --large --merge                   # 06 at 10^6..10^7 papers
  python bench/scale.py --fit --project --plot docs/img/scale.png     # report the recorded rows only
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

FIELDS = ("stage", "engine", "size", "unit", "threads", "seconds", "peak_rss_mb", "rss_anon_mb", "queries_per_s")
# two more, null where they do not apply: the projection needs the index's size on disk, and issue 41 asks for
# the memory-mapped index pages (RssFile) apart from the process's own memory (RssAnon)
EXTRA_FIELDS = ("rss_file_mb", "disk_mb")
KEY = ("stage", "engine", "size", "threads")

PAPER_QUERIES = 4_000_000   # REPAIR's paper: generated queries verified ...
PAPER_PAPERS = 200_000_000  # ... against Semantic Scholar's ~2x10^8 papers
VERIFY_K = 21               # 06 searches target_k + 1 hits (repair.expansion.verification)

# What each stage's algorithm requires of its time, as the log-log slope in its size unit; a fitted slope above
# expected + SLOPE_TOLERANCE is flagged (issue 41: "a stage whose cost grows faster than its algorithm requires
# is a bug to fix"). Keys: stage, or (stage, engine kind) where a stage has engines of different algorithms.
EXPECTED_SLOPE: dict[str | tuple[str, str], tuple[float, str]] = {
    ("01", "margins"): (2.0, "T0's queries against T0's own passages: n x n dot products (exact search)"),
    ("01", "search"): (1.0, "n queries against a fixed corpus: one corpus pass per query chunk"),
    ("01", "encode"): (1.0, "one forward pass per text"),
    "02": (1.0, "one pass over each confused query's top-30 negatives, then a sort of the concepts (n log n)"),
    "03": (2.0, "exact 1-NN of every confused query against all others: n^2 dot products (an ANN graph would "
                "give ~1.1-1.3, at the cost of exactness)"),
    "04": (1.0, "a case-insensitive dedupe and a sort of the terms (n log n)"),
    "06_build": (1.0, "one streaming pass: tokenise and invert every paper once (segment merges add log n)"),
    "06_search": (1.0, "at most the posting lists of the query's terms, which grow linearly with the corpus "
                       "(block-max WAND engines skip most of them: below 1)"),
    "07": (1.0, "every text read, looked up and written once"),
    "08": (1.0, "each tuple's own 20 candidates scored and sorted"),
    "09": (1.0, "local pool: each tuple's own candidates, no global search"),
    "10": (1.0, "a step costs the same whatever the data size: total seconds linear in steps (flat per step)"),
}
SLOPE_TOLERANCE = 0.15

UNITS = {"01": "T0 rows", "02": "confused queries", "03": "confused queries", "04": "confused queries",
         "06_build": "papers", "06_search": "papers", "07": "tuples", "08": "tuples", "09": "tuples",
         "10": "steps"}

SIZES = {  # default (a quick run) and --large
    "01:margins": ([1_000, 3_000, 10_000, 30_000], [100_000]),
    "01:search": ([1_000, 3_000, 10_000, 30_000], [100_000]),
    "01:encode": ([100, 300, 1_000], [3_000, 10_000]),
    "02": ([1_000, 10_000, 100_000], [300_000, 1_000_000]),
    "03": ([1_000, 3_000, 10_000, 30_000], [100_000]),
    "04": ([1_000, 10_000, 100_000], [1_000_000]),
    "06": ([10_000, 30_000, 100_000], [1_000_000, 3_000_000, 10_000_000]),
    "07": ([1_000, 3_000, 10_000], [30_000, 100_000]),
    "08": ([1_000, 3_000, 10_000], [30_000, 100_000]),
    "09": ([1_000, 3_000, 10_000], [30_000, 100_000]),
    "10": ([10, 30, 100], [300]),
}
ALL_STAGES = ("01", "02", "03", "04", "06", "07", "08", "09", "10")


# ============================================================================================ memory
def memory_mb() -> dict[str, float | None]:
    """This process's peak resident memory (VmHWM) and its anonymous / file-backed resident pages now, in MB."""
    out: dict[str, float | None] = {"peak_rss_mb": None, "rss_anon_mb": None, "rss_file_mb": None}
    names = {"VmHWM": "peak_rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb"}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in names:
                    out[names[key]] = round(int(value.split()[0]) / 1024, 1)  # kB
    except OSError:
        pass
    if out["peak_rss_mb"] is None:  # no /proc (macOS): ru_maxrss is kB on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["peak_rss_mb"] = round(peak / (2**20 if sys.platform == "darwin" else 1024), 1)
    return out


def disk_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


# ============================================================================================ synthetic data
SYLLABLES = ("al an ar ba be bi bo ca ce chi co cy da de di do du el en er eth fe fi flu ga ge gly hy io is ka "
             "la le li lo lu ma me mi mo mu na ne ni no nu ox pa pe pha pho pi po pro py ra re ri ro ru sa se "
             "si so sul ta te ter thi ti to tri tu va ve vi vo xy zo zy").split()
SUFFIXES = ("", "", "", "ic", "ide", "ine", "ate", "ase", "ism", "ation", "ity", "al", "ene", "ium", "osis", "ite")


class TextGen:
    """Scientific-looking random words with Zipf(-Mandelbrot) frequencies, deterministic by seed.

    Texts of one call come from one vectorised draw (``searchsorted`` on the cumulative weights), so 10^7
    abstracts take minutes, not hours.
    """

    def __init__(self, vocab_size: int = 50_000, seed: int = 0, exponent: float = 1.05, shift: float = 2.7):
        rng = np.random.default_rng([seed, 7])
        words: dict[str, None] = {}
        while len(words) < vocab_size:
            parts = rng.choice(SYLLABLES, size=int(rng.integers(1, 4)))
            words.setdefault("".join(parts) + SUFFIXES[int(rng.integers(len(SUFFIXES)))], None)
        # frequent words are the short ones, as in real text: ~1.6 MiniLM tokens per word (a 160-word abstract
        # ~270 tokens, like SciFact's), not the ~4 that uniformly long made-up words would cost
        self.vocab = np.array(sorted(words, key=lambda w: (len(w), w)), dtype=object)
        weights = 1.0 / (np.arange(vocab_size) + shift) ** exponent
        self.cdf = np.cumsum(weights) / weights.sum()

    def texts(self, rng: np.random.Generator, count: int, low: int, high: int | None = None) -> list[str]:
        """``count`` texts of ``low``..``high`` words (``high`` None: exactly ``low``)."""
        lengths = np.full(count, low) if high is None else rng.integers(low, high + 1, size=count)
        idx = np.minimum(np.searchsorted(self.cdf, rng.random(int(lengths.sum()))), len(self.vocab) - 1)
        words = self.vocab[idx]
        out, pos = [], 0
        for n in lengths.tolist():
            out.append(" ".join(words[pos:pos + n]))
            pos += n
        return out

    def abstracts(self, rng, count: int) -> list[str]:
        return self.texts(rng, count, 160)

    def titles(self, rng, count: int) -> list[str]:
        return [t.capitalize() for t in self.texts(rng, count, 6, 12)]

    def queries(self, rng, count: int) -> list[str]:
        return self.texts(rng, count, 15, 25)


def chunk_rng(seed: int, tag: str, chunk: int) -> np.random.Generator:
    """One generator per (purpose, chunk): a prefix of a larger set equals the smaller set."""
    return np.random.default_rng([seed, sum(map(ord, tag)), chunk])


def write_corpus(path: Path, papers: int, seed: int, chunk: int = 10_000) -> Path:
    """Gzipped JSONL ``{id, title, abstract}`` of ``papers`` synthetic papers, streamed chunk by chunk."""
    if path.exists():
        return path
    gen = TextGen(seed=seed)
    tmp = path.with_name(path.name + ".part")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as fh:
        for c, start in enumerate(range(0, papers, chunk)):
            rng = chunk_rng(seed, "corpus", c)
            n = min(chunk, papers - start)  # a whole chunk is drawn, so a smaller corpus is a prefix
            for i, (title, abstract) in enumerate(zip(gen.titles(rng, chunk)[:n], gen.abstracts(rng, chunk)[:n])):
                fh.write(json.dumps({"id": f"p{start + i}", "title": title, "abstract": abstract}) + "\n")
    os.replace(tmp, path)
    return path


def write_vectors(folder: Path, rows: int, dim: int, seed: int, topics: int = 2000,
                  chunk: int = 50_000) -> tuple[Path, Path]:
    """``docs.npy`` = unit(topic centre + noise), ``queries.npy`` = unit(doc + noise) (row i's positive is doc i),
    float32, written chunk by chunk into memory-mapped files (T0-shaped, as bench/diagnosis.py)."""
    docs_path, queries_path = folder / "docs.npy", folder / "queries.npy"
    if docs_path.exists() and queries_path.exists():
        return docs_path, queries_path
    folder.mkdir(parents=True, exist_ok=True)
    centres = np.random.default_rng([seed, 1]).normal(size=(topics, dim)).astype(np.float32)
    docs = np.lib.format.open_memmap(folder / "docs.part.npy", "w+", np.float32, (rows, dim))
    queries = np.lib.format.open_memmap(folder / "queries.part.npy", "w+", np.float32, (rows, dim))
    for c, start in enumerate(range(0, rows, chunk)):
        rng = chunk_rng(seed, "vectors", c)
        n = min(chunk, rows - start)
        d = centres[rng.integers(0, topics, n)] + 0.8 * rng.normal(size=(n, dim)).astype(np.float32)
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        q = d + (1.0 / np.sqrt(dim)) * rng.normal(size=(n, dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        docs[start:start + n], queries[start:start + n] = d, q
    docs.flush(), queries.flush()
    del docs, queries
    os.replace(folder / "docs.part.npy", docs_path)
    os.replace(folder / "queries.part.npy", queries_path)
    return docs_path, queries_path


def distinct_draws(rng: np.random.Generator, high: int, rows: int, k: int) -> np.ndarray:
    """``rows`` x ``k`` integers in [0, high), distinct within a row (rng.choice without replacement costs
    O(high) per row: 10^5 rows over 10^5 items would take minutes)."""
    if k > high:
        raise ValueError(f"cannot draw {k} distinct integers below {high}")
    out = np.empty((rows, k), dtype=np.int64)
    for r in range(rows):
        picked: dict[int, None] = {}
        while len(picked) < k:
            picked.update(dict.fromkeys(rng.integers(high, size=k + 4).tolist()))
        out[r] = list(picked)[:k]
    return out


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


# ============================================================================================ stage inputs
def vectors_dir(work: Path, rows: int, args) -> Path:
    return work / f"vectors_{rows}_d{args.dim}_s{args.seed}"


def confused_dir(work: Path, n: int, args) -> Path:
    return work / f"confused_{n}_s{args.seed}"


def prep_confused(work: Path, n: int, args) -> Path:
    """Q_conf margin lines (01's format) for n confused queries over 3n documents, and each document's concepts
    (2-6 from a Zipf vocabulary of n concepts): 02's inputs. Also C_intra / component lists for 04."""
    folder = confused_dir(work, n, args)
    if (folder / "done").exists():
        return folder
    from repair.data import write_json, write_jsonl

    folder.mkdir(parents=True, exist_ok=True)
    docs = max(3 * n, 100)
    gen = TextGen(vocab_size=max(1000, n), seed=args.seed)
    rng = chunk_rng(args.seed, "confused", 0)
    queries = gen.queries(rng, n)

    tops = distinct_draws(rng, docs, n, 50)

    def records() -> Iterator[dict]:
        for i in range(n):
            top = tops[i]
            pos = int(rng.integers(docs))
            scores = np.sort(rng.uniform(0.2, 0.9, 50))[::-1]
            neg = next(int(d) for d in top if int(d) != pos)
            yield {"i": i, "query": queries[i], "pos_doc_index": pos, "pos_score_cos": 0.5,
                   "top1_doc_index_cos": int(top[0]), "top1_score_cos": float(scores[0]),
                   "max_neg_doc_index_cos": neg, "max_neg_score_cos": float(scores[0]),
                   "margin_cos": float(0.5 - scores[0]), "topk_doc_indices_cos": top.tolist(),
                   "topk_scores_cos": np.round(scores, 6).tolist(), "positive_doc_indices": [pos]}

    write_jsonl(folder / "confused.jsonl", records())
    counts = rng.integers(2, 7, size=docs)
    idx = np.minimum(np.searchsorted(gen.cdf, rng.random(int(counts.sum()))), len(gen.vocab) - 1)
    concepts, pos = [], 0
    for c in counts.tolist():
        concepts.append(gen.vocab[idx[pos:pos + c]].tolist())
        pos += c
    write_json(folder / "concepts.json", concepts, indent=0)
    # 04's inputs: one C_intra line per confused query, one component per 5 queries (FINCH's typical ratio)
    write_jsonl(folder / "cintra.jsonl", ({"query_i": i, "query": queries[i], "concept": concepts[3 * i][0],
                                           "CCS": 1.0} for i in range(n)))
    write_json(folder / "components.json", [
        {"component_id": k, "component_root": 5 * k, "size": 5, "avg_margin": -0.1, "min_margin": -0.2,
         "concept": concepts[(15 * k + 1) % docs][-1].upper(), "concept_count": 3, "sample_queries": []}
        for k in range(max(1, n // 5))], indent=0)
    (folder / "done").write_text("")
    return folder


def tuples_dir(work: Path, n: int, args) -> Path:
    return work / f"tuples_{n}_c{args.candidates}_s{args.seed}"


def prep_tuples(work: Path, n: int, args) -> Path:
    """06-shaped expansion lines: n tuples, each a 15-25 word query, its own positive and --candidates
    candidates from a shared pool of 5n papers (160-word abstracts: the literature repeats across queries), and
    every text's vector in the MiniLM retriever's embedding cache (07 then forwards nothing)."""
    folder = tuples_dir(work, n, args)
    if (folder / "done").exists():
        return folder
    from repair.data import write_jsonl
    from repair.encoding import Retriever, text_key

    folder.mkdir(parents=True, exist_ok=True)
    gen = TextGen(seed=args.seed)
    pool_n = max(5 * n, 2 * args.candidates)
    rng = chunk_rng(args.seed, "pool", 0)
    pool = gen.abstracts(rng, pool_n)
    retriever = Retriever.load("minilm", device="cpu", cache_dir=folder / "cache")
    dim = retriever.model.config.hidden_size

    def put(texts: list[str], kind: str, vecs: np.ndarray) -> None:
        retriever.cache.put([text_key(t) for t in retriever.format(texts, kind)], vecs)

    for s in range(0, pool_n, 50_000):
        part = pool[s:s + 50_000]
        put(part, "passage", unit_rows(rng.normal(size=(len(part), dim))))
    chunk = 5_000

    def lines() -> Iterator[dict]:
        for c, start in enumerate(range(0, n, chunk)):
            r = chunk_rng(args.seed, "tuples", c)
            m = min(chunk, n - start)
            queries, positives = gen.queries(r, m), gen.abstracts(r, m)
            topic = r.normal(size=(m, dim))
            put(queries, "query", unit_rows(topic + 0.6 * r.normal(size=(m, dim))))
            put(positives, "passage", unit_rows(topic + 1.0 * r.normal(size=(m, dim))))
            draws = distinct_draws(r, pool_n, m, args.candidates)
            for i in range(m):
                cands = draws[i]
                yield {"id": f"t{start + i}", "q_new": queries[i], "d_pos": positives[i], "concepts": ["x"],
                       "negative_candidates": [{"id": f"p{j}", "doi": None, "title": "", "abstract": pool[j]}
                                               for j in cands.tolist()], "source": "synthetic"}

    write_jsonl(folder / "expansion.jsonl", lines())
    (folder / "done").write_text("")
    return folder


def tiny_model(work: Path) -> Path:
    """A random-weight Qwen2 (hidden 64, 2 layers) with SmolLM2's tokenizer: the tests' model (tests/conftest.py)."""
    folder = work / "tiny_qwen2"
    if not (folder / "config.json").exists():
        from tests.helpers_generation import save_tiny_qwen2

        tmp = work / "tiny_qwen2.part"
        shutil.rmtree(tmp, ignore_errors=True)
        save_tiny_qwen2(tmp, "Qwen2Model", seed=0)
        os.replace(tmp, folder)
    return folder


def prep_pairs(work: Path, steps: int, args) -> Path:
    path = work / f"pairs_{steps}x{args.train_batch}_s{args.seed}.jsonl"
    if not path.exists():
        from repair.data import write_jsonl

        gen = TextGen(seed=args.seed)
        rng = chunk_rng(args.seed, "pairs", 0)
        n = steps * args.train_batch
        write_jsonl(path, ({"query": q, "positive": p} for q, p in zip(gen.queries(rng, n), gen.abstracts(rng, n))))
    tiny_model(work)
    return path


def corpus_path(work: Path, papers: int, args) -> Path:
    return work / f"corpus_{papers}_s{args.seed}.jsonl.gz"


def search_queries(work: Path, args) -> list[str]:
    """--search_queries 05-shaped queries (15-25 words of the corpus's vocabulary), the same for every size."""
    gen = TextGen(seed=args.seed)
    return gen.queries(chunk_rng(args.seed, "search", 0), args.search_queries)


def index_dir(work: Path, engine: str, papers: int, args) -> Path:
    """One index per engine and size; "tantivy:exact" searches "tantivy"'s (the mode is the reader's)."""
    return work / f"index_{engine.split(':')[0]}_{papers}_s{args.seed}"


def literature_module():
    """repair.expansion.sources.literature (issue 41's on-disk index), or None where it is not installed."""
    try:
        from repair.expansion.sources import literature
    except ImportError:
        return None
    return literature


def literature_engine() -> str:
    """The on-disk index's engine name, as its rows are labelled ("tantivy")."""
    from repair.expansion.sources.literature_format import ENGINE

    return ENGINE


# ============================================================================================ measured work
class Timer:
    """Named parts of one measurement, in order: ``with timer("search"): ...``."""

    def __init__(self):
        self.parts: dict[str, float] = {}
        self.mem: dict[str, float | None] | None = None  # memory at the end of the last part: data still alive

    def __call__(self, name: str):
        timer = self

        class _Part:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.parts[name] = timer.parts.get(name, 0.0) + time.perf_counter() - self.t0
                timer.mem = memory_mb()

        return _Part()


def run_01(work: Path, engine: str, n: int, args, timer: Timer) -> dict:
    import torch

    from repair.diagnosis import margins as dg
    from repair.search import exact_topk

    kind = engine.split(":")[0]
    if kind == "encode":
        from repair.encoding import Retriever

        gen = TextGen(seed=args.seed)
        rng = chunk_rng(args.seed, "t0", 0)
        queries, passages = gen.queries(rng, n), gen.abstracts(rng, n)
        retriever = Retriever.load("minilm", device="cpu")
        with timer("queries"):
            retriever.encode_queries(queries, show_progress=False)
        with timer("passages"):
            retriever.encode_passages(passages, show_progress=False)
        return {}
    if kind == "margins":
        docs_path, queries_path = write_vectors(vectors_dir(work, n, args), n, args.dim, args.seed)
        q = torch.from_numpy(np.array(np.load(queries_path, mmap_mode="r")[:n]))
        d = torch.from_numpy(np.array(np.load(docs_path, mmap_mode="r")[:n]))
        with timer("normfp16"):
            qf, df = dg.normalise_fp16(q).float(), dg.normalise_fp16(d).float()
        del q, d
        with timer("search"):
            topk = exact_topk(qf, df, args.top_k, backend="torch", device="cpu")
        with timer("margins"):
            res = dg.compute_margins(qf, df, args.top_k, topk=topk, device="cpu")
            thr = dg.percentile_thresholds(res.margin, [30])[30]
            dg.select_confused(res.margin, thr)
        return {}
    # search over a fixed corpus: the first n queries of the corpus's own rows (or more rows when n > corpus)
    docs_path, queries_path = write_vectors(vectors_dir(work, args.corpus, args), args.corpus, args.dim, args.seed)
    if n > args.corpus:
        queries_path = write_vectors(vectors_dir(work, n, args), n, args.dim, args.seed)[1]
    q = torch.from_numpy(np.array(np.load(queries_path, mmap_mode="r")[:n]))
    d = torch.from_numpy(np.array(np.load(docs_path, mmap_mode="r")))
    with timer("search"):
        exact_topk(q, d, args.top_k, backend="torch", device="cpu")
    return {}


def run_02(work: Path, engine: str, n: int, args, timer: Timer) -> dict:
    from repair.data import read_json
    from repair.diagnosis import margins as dg
    from repair.diagnosis.ccs import compute_ccs

    folder = confused_dir(work, n, args)
    concepts = read_json(folder / "concepts.json")
    with timer("read"):
        records = dg.read_margin_records(folder / "confused.jsonl")
    with timer("score"):
        compute_ccs(records, concepts.__getitem__, top_neg_n=30, eps=0.5, df="incidence")
    return {}


def run_03(work: Path, engine: str, n: int, args, timer: Timer) -> dict:
    from repair.diagnosis.finch import components, first_neighbours

    queries_path = write_vectors(vectors_dir(work, n, args), n, args.dim, args.seed)[1]
    x = np.array(np.load(queries_path, mmap_mode="r")[:n])
    with timer("1-NN"):
        nn_idx, _ = first_neighbours(x, show_progress=False)
    with timer("components"):
        components(nn_idx)
    return {}


def run_04(work: Path, engine: str, n: int, args, timer: Timer) -> dict:
    from repair.data import read_json, read_jsonl
    from repair.diagnosis.ccs import merge_cconf

    folder = confused_dir(work, n, args)
    cintra = read_jsonl(folder / "cintra.jsonl")
    comps = read_json(folder / "components.json")
    with timer("merge"):
        merge_cconf(cintra, comps)
    return {}


def run_06(work: Path, stage: str, engine: str, papers: int, args, timer: Timer) -> dict:
    corpus = corpus_path(work, papers, args)
    folder = index_dir(work, engine, papers, args)
    if stage == "06_build":
        shutil.rmtree(folder, ignore_errors=True)
        with timer("build"):
            if engine == "bm25s":
                from repair.expansion.sources.local_corpus import LocalCorpus

                LocalCorpus(corpus, index_dir=folder)
            else:
                literature_module().build_index([corpus], folder, threads=args.threads, progress=False)
        return {"disk_mb": disk_mb(folder)}
    queries = search_queries(work, args)
    if engine == "bm25s":
        from repair.expansion.sources.local_corpus import LocalCorpus

        source = LocalCorpus(corpus, index_dir=folder)
        with timer("search"):
            for query in queries:
                source.search(query, VERIFY_K)
    else:  # "tantivy": the engine's own ranking; "tantivy:exact": 06's default, the engine's top 50 rescored
        from repair.expansion.sources.literature_search import LiteratureIndex

        index = LiteratureIndex(folder, exact=engine.endswith(":exact"))
        with timer("search"):
            index.search_many(queries, VERIFY_K, args.threads)
    return {"queries_per_s": round(len(queries) / max(timer.parts["search"], 1e-9), 2)}


def run_07(work: Path, engine: str, n: int, args, timer: Timer, *, out: Path | None = None) -> dict:
    from repair.differentiation.embedding_dir import EmbedConfig, embed_candidates
    from repair.differentiation.tuples import load_tuples
    from repair.encoding import Retriever

    folder = tuples_dir(work, n, args)
    retriever = Retriever.load("minilm", device="cpu", cache_dir=folder / "cache")
    out = out or folder / "emb"
    shutil.rmtree(out, ignore_errors=True)
    config = EmbedConfig(input_jsonl=[str(folder / "expansion.jsonl")], output_dir=str(out), show_progress=False)
    with timer("embed"):
        meta = embed_candidates(retriever, load_tuples(folder / "expansion.jsonl"), config)
    if meta["texts_forwarded"]:
        raise RuntimeError(f"07 forwarded {meta['texts_forwarded']} texts: the cache should hold them all")
    return {}


def run_08(work: Path, engine: str, n: int, args, timer: Timer) -> dict:
    from repair.data import write_jsonl
    from repair.differentiation.embedding_dir import EmbeddingDir
    from repair.differentiation.hard_negatives import select_hard_negatives
    from repair.differentiation.tuples import load_tuples

    folder = tuples_dir(work, n, args)
    with timer("load"):
        emb = EmbeddingDir.open(folder / "emb")
        tuples = load_tuples(folder / "expansion.jsonl")
    with timer("select"):
        records, _ = select_hard_negatives(tuples, emb, top_k=15)
    with timer("write"):
        write_jsonl(folder / "hn.jsonl", records)
    return {}


def run_09(work: Path, engine: str, n: int, args, timer: Timer) -> dict:
    from repair.data import write_jsonl
    from repair.differentiation.embedding_dir import EmbeddingDir
    from repair.differentiation.hard_negatives import consistency_filter
    from repair.differentiation.tuples import load_tuples

    folder = tuples_dir(work, n, args)
    with timer("load"):
        emb = EmbeddingDir.open(folder / "emb")
        tuples = load_tuples(folder / "hn.jsonl")
    with timer("filter"):
        records, _ = consistency_filter(tuples, emb, top_k=15, consistency_k=5, pool="local", device="cpu")
    with timer("write"):
        write_jsonl(folder / "final.jsonl", records)
    return {}


def run_10(work: Path, engine: str, steps: int, args, timer: Timer) -> dict:
    from repair.data import read_jsonl
    from repair.training.config import TrainConfig
    from repair.training.trainer import train

    out = work / f"train_{steps}_s{args.seed}"
    shutil.rmtree(out, ignore_errors=True)
    cfg = TrainConfig(output_dir=str(out), model=str(tiny_model(work)),
                      train_data=[str(prep_pairs(work, steps, args))], max_length=64,
                      global_batch_size=args.train_batch, mini_batch_size=8, epochs=1, save_steps=0,
                      show_progress=False, device="cpu", logging_steps=10**9)
    t0 = time.perf_counter()
    train(cfg)
    total = time.perf_counter() - t0
    step_seconds = sum(r["seconds"] for r in read_jsonl(out / "train_log.jsonl"))
    timer.parts["steps"] = step_seconds
    timer.parts["load+data"] = total - step_seconds
    timer.mem = memory_mb()
    shutil.rmtree(out, ignore_errors=True)
    return {}


# ============================================================================================ child processes
def prepare(stage: str, engine: str, size: int, args) -> None:
    """Inputs of one measurement (untimed, in its own process): synthetic files, and earlier stages' outputs."""
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if stage == "01" and engine.startswith("margins"):
        write_vectors(vectors_dir(work, size, args), size, args.dim, args.seed)
    elif stage == "01" and engine.startswith("search"):
        write_vectors(vectors_dir(work, args.corpus, args), args.corpus, args.dim, args.seed)
        if size > args.corpus:
            write_vectors(vectors_dir(work, size, args), size, args.dim, args.seed)
    elif stage == "03":
        write_vectors(vectors_dir(work, size, args), size, args.dim, args.seed)
    elif stage in ("02", "04"):
        prep_confused(work, size, args)
    elif stage in ("07", "08", "09"):
        folder = prep_tuples(work, size, args)
        if stage in ("08", "09") and not (folder / "emb" / "meta.json").exists():
            run_07(work, engine, size, args, Timer())
        if stage == "09":
            run_08(work, engine, size, args, Timer())
    elif stage == "10":
        prep_pairs(work, size, args)
    elif stage.startswith("06"):
        write_corpus(corpus_path(work, size, args), size, args.seed)
        if stage == "06_search" and not index_dir(work, engine, size, args).exists():
            run_06(work, "06_build", engine, size, args, Timer())


def measure(stage: str, engine: str, size: int, args) -> list[dict]:
    """Run one measurement in this process (the child); returns the stage's row and one row per part."""
    import torch

    torch.set_num_threads(args.threads)
    from repair.runtime import setup_logging

    setup_logging("WARNING")
    work = Path(args.work_dir)
    runners: dict[str, Callable] = {"01": run_01, "02": run_02, "03": run_03, "04": run_04, "07": run_07,
                                    "08": run_08, "09": run_09, "10": run_10}
    runs, spent = [], 0.0
    while True:  # a call under --min_seconds is repeated and the fastest run kept (timeit's rule: noise only adds)
        timer = Timer()
        if stage.startswith("06"):
            extra = run_06(work, stage, engine, size, args, timer)
        else:
            extra = runners[stage](work, engine, size, args, timer)
        runs.append((sum(timer.parts.values()), timer, extra))
        spent += runs[-1][0]
        if spent >= args.min_seconds or len(runs) >= 20:
            break
    _, timer, extra = min(runs, key=lambda r: r[0])
    mem = memory_mb()
    if timer.mem:  # the resident pages while the stage's data was alive; the peak is the process's own
        mem = {**timer.mem, "peak_rss_mb": mem["peak_rss_mb"]}
    base = {"stage": stage, "size": size, "unit": unit_of(stage, engine, args), "threads": args.threads,
            **mem, "queries_per_s": None, "disk_mb": None}
    rows = [{**base, "engine": engine, "seconds": round(sum(timer.parts.values()), 4), **extra}]
    if len(timer.parts) > 1:
        rows += [{**base, "engine": f"{engine}[{name}]", "seconds": round(secs, 4)}
                 for name, secs in timer.parts.items()]
    return [{k: row.get(k) for k in FIELDS + EXTRA_FIELDS} for row in rows]


def unit_of(stage: str, engine: str, args) -> str:
    if stage == "01" and engine.startswith("search"):
        return f"T0 queries (corpus {args.corpus} passages)"
    if stage == "06_search":
        return f"papers ({args.search_queries} queries)"
    return UNITS[stage]


def child_argv(args, action: str, stage: str, engine: str, size: int) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--_child", action, stage, engine, str(size),
            "--threads", str(args.threads), "--seed", str(args.seed), "--work_dir", str(args.work_dir),
            "--dim", str(args.dim), "--corpus", str(args.corpus), "--top_k", str(args.top_k),
            "--candidates", str(args.candidates), "--search_queries", str(args.search_queries),
            "--train_batch", str(args.train_batch), "--min_seconds", str(args.min_seconds)]


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS"):
        env[var] = str(threads)
    # the children import this checkout's `repair` and the tests' tiny-model builder (tests.helpers_generation)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


def run_child(args, action: str, stage: str, engine: str, size: int, timeout: float | None = None) -> list[dict]:
    """One fresh process for ``action`` ("prep" or "run"); a failure raises with the child's last lines."""
    proc = subprocess.run(child_argv(args, action, stage, engine, size), capture_output=True, text=True,
                          env=child_env(args.threads), timeout=timeout)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{action} {stage} {engine} {size} failed (exit {proc.returncode}): " + " | ".join(tail))
    return json.loads(line[len("RESULT "):])


# ============================================================================================ plan
def engines_for(stage: str, args) -> list[str]:
    if stage == "01":
        return ["encode:minilm", "margins:torch", f"search:torch,corpus={args.corpus}"]
    if stage == "02":
        return ["ccs"]
    if stage == "03":
        return ["finch:exact"]
    if stage == "04":
        return ["merge"]
    if stage == "07":
        return ["embed:cache"]
    if stage == "08":
        return ["hard_negatives"]
    if stage == "09":
        return ["consistency:local"]
    if stage == "10":
        return [f"train:tiny-qwen2,gb{args.train_batch}"]
    raise ValueError(stage)


def sizes_for(stage: str, engine: str, args) -> list[int]:
    if args.sizes:
        return sorted(args.sizes)
    key = f"{stage}:{engine.split(':')[0]}" if stage == "01" else stage
    small, large = SIZES[key]
    return sorted(small + (large if args.large else []))


def plan(args) -> Iterator[tuple[str, str, list[int]]]:
    """(stage, engine, sizes) in the order they run: 07 before 08 before 09 at each size."""
    for stage in args.stages:
        if stage.startswith("06"):
            mod = literature_module()
            small, large = SIZES["06"]
            sizes = sorted(args.sizes) if args.sizes else sorted(small + (large if args.large else []))
            if mod is None:
                print("06: repair.expansion.sources.literature is not installed here; timing only bm25s "
                      f"(LocalCorpus, up to {args.bm25s_max} papers)", file=sys.stderr, flush=True)
            # "06_search" alone searches the indexes built before (e.g. again with --threads 2)
            for sub in ("06_build", "06_search") if stage == "06" else (stage,):
                if not args.engines or "bm25s" in args.engines:
                    yield sub, "bm25s", [s for s in sizes if s <= args.bm25s_max]
                if mod is not None and (not args.engines or literature_engine() in args.engines):
                    yield sub, literature_engine(), sizes
                    if sub == "06_search":  # the same index as 06 opens it: exact rescoring (bm25s' scores)
                        yield sub, f"{literature_engine()}:exact", sizes
            continue
        for engine in engines_for(stage, args):
            if not args.engines or any(engine.startswith(e) for e in args.engines):
                yield stage, engine, sizes_for(stage, engine, args)


# ============================================================================================ results
def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY)


def merge_rows(old: Sequence[dict], new: Sequence[dict]) -> list[dict]:
    """Earlier rows of other (stage, engine, size, threads) kept, rows with the same key replaced by the new
    ones; sorted by stage, engine, threads, size."""
    out = {row_key(r): r for r in old}
    for r in new:
        out[row_key(r)] = r
    return sorted(out.values(), key=lambda r: (r["stage"], r["engine"], r["threads"], r["size"]))


def load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise SystemExit(f"{path}: expected a JSON list of measurements")
    return rows


def save_rows(path: Path, rows: Sequence[dict]) -> None:
    from repair.data import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, list(rows))


def fit_slope(sizes: Sequence[float], values: Sequence[float]) -> tuple[float, float] | None:
    """Least squares on (log10 size, log10 value): (slope, intercept); None with fewer than 2 distinct sizes."""
    pts = [(math.log10(s), math.log10(v)) for s, v in zip(sizes, values) if s and v and s > 0 and v > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    slope, intercept = np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)
    return float(slope), float(intercept)


def expected_slope(stage: str, engine: str) -> tuple[float, str] | None:
    kind = engine.split(":")[0].split("[")[0]
    return EXPECTED_SLOPE.get((stage, kind)) or EXPECTED_SLOPE.get(stage)


def series(rows: Iterable[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by (stage, engine, threads), each group sorted by size."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["stage"], r["engine"], r["threads"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["size"]) for k, v in sorted(out.items())}


def dominant_part(rows: Sequence[dict], stage: str, engine: str, threads: int, size: int) -> str | None:
    parts = [r for r in rows if r["stage"] == stage and r["threads"] == threads and r["size"] == size
             and r["engine"].startswith(engine + "[")]
    if not parts:
        return None
    total = sum(r["seconds"] for r in parts) or 1.0
    top = max(parts, key=lambda r: r["seconds"])
    return f"{top['engine'][len(engine) + 1:-1]} {100 * top['seconds'] / total:.0f}%"


def report(rows: Sequence[dict], markdown: bool = False) -> str:
    """Per stage and engine: sizes vs seconds and memory, the fitted slope, and a flag where it exceeds what the
    algorithm requires (``markdown``: as the tables of docs/benchmarks.md)."""
    from repair.tables import text_table

    header = ["size", "seconds", "s/unit", "peak RSS MB", "RssAnon MB", "queries/s", "dominant part"]
    lines = []
    for (stage, engine, threads), group in series(rows).items():
        if "[" in engine:
            continue  # parts are shown as the "dominant part" column of their stage
        table = []
        for r in group:
            per_unit = r["seconds"] / r["size"]
            table.append((f"{r['size']:,}", f"{r['seconds']:.3f}", f"{per_unit:.3g}", _mb(r["peak_rss_mb"]),
                          _mb(r["rss_anon_mb"]), "-" if r.get("queries_per_s") is None else r["queries_per_s"],
                          dominant_part(rows, stage, engine, threads, r["size"]) or "-"))
        title = f"{stage} {engine}  ({group[0]['unit']}, {threads} thread{'s' * (threads != 1)})"
        if markdown:  # one line per stage and engine: docs/benchmarks.md's growth table
            if not lines:
                lines += ["| stage | engine | unit | size: seconds, peak RSS MB (dominant part) | slope | expected "
                          "| verdict |", "|---|---|---|---|---:|---:|---|"]
            cells = "<br>".join(f"{r['size']:,}: {r['seconds']:.3g} s, {_mb(r['peak_rss_mb'])} MB"
                                + (f", {r['queries_per_s']:.0f} q/s" if r.get("queries_per_s") else "")
                                + (f" ({part})" if (part := dominant_part(rows, stage, engine, threads, r["size"]))
                                   else "") for r in group)
            fit = fit_slope([r["size"] for r in group], [r["seconds"] for r in group])
            exp = expected_slope(stage, engine)
            verdict = "-" if not (fit and exp) else (
                "**faster than required**" if fit[0] > exp[0] + SLOPE_TOLERANCE else "ok")
            parts = part_slopes(rows, stage, engine, threads)
            lines.append(f"| {stage} | {engine} | {group[0]['unit']} | {cells} | "
                         f"{'-' if fit is None else f'{fit[0]:.2f}'}{f' ({parts})' if parts else ''} | "
                         f"{'-' if exp is None else exp[0]} | {verdict} |")
        else:
            parts = part_slopes(rows, stage, engine, threads)
            lines += [f"\n{title}", text_table(table, header, align="r", rule="  "),
                      "  " + slope_line(stage, engine, group) + (f"\n  slopes of its parts: {parts}" if parts else "")]
    return "\n".join(lines)


def _mb(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def part_slopes(rows: Sequence[dict], stage: str, engine: str, threads: int) -> str:
    """"part slope, ..." of a stage's parts (which part grows how), '' when it has none."""
    out = []
    for (s, e, t), group in series(rows).items():
        if s == stage and t == threads and e.startswith(engine + "["):
            fit = fit_slope([r["size"] for r in group], [r["seconds"] for r in group])
            if fit:
                out.append(f"{e[len(engine) + 1:-1]} {fit[0]:.2f}")
    return ", ".join(out)


def slope_line(stage: str, engine: str, group: Sequence[dict]) -> str:
    fit = fit_slope([r["size"] for r in group], [r["seconds"] for r in group])
    if fit is None:
        return "slope: needs two sizes"
    exp = expected_slope(stage, engine)
    text = f"slope {fit[0]:.2f} (log-log, seconds vs size, {len(group)} sizes)"
    if exp is None:
        return text
    flag = "FLAG: grows faster than its algorithm requires" if fit[0] > exp[0] + SLOPE_TOLERANCE else "ok"
    mem = fit_slope([r["size"] for r in group], [r["peak_rss_mb"] for r in group])
    mem_text = f"; peak RSS slope {mem[0]:.2f}" if mem else ""
    return f"{text}; expected {exp[0]:.1f} ({exp[1]}): {flag}{mem_text}"


def flagged(rows: Sequence[dict]) -> list[tuple[str, str, float]]:
    """(stage, engine, slope) of every series whose time slope exceeds its expected slope + tolerance."""
    out = []
    for (stage, engine, _), group in series(rows).items():
        fit = fit_slope([r["size"] for r in group], [r["seconds"] for r in group])
        exp = expected_slope(stage, engine)
        if fit and exp and "[" not in engine and fit[0] > exp[0] + SLOPE_TOLERANCE:
            out.append((stage, engine, round(fit[0], 3)))
    return out


def extrapolate(group: Sequence[dict], field: str, size: float, min_slope: float | None = None) -> float | None:
    """``field`` at ``size`` from the log-log fit of ``group`` (at least ``min_slope``, e.g. 1 for a linear
    cost that fixed overheads make look sublinear at small sizes)."""
    pts = [(r["size"], r[field]) for r in group if r.get(field)]
    fit = fit_slope([s for s, _ in pts], [v for _, v in pts])
    if fit is None:
        return None
    slope, intercept = fit
    if min_slope is not None and slope < min_slope:  # anchor the line at the largest measured size
        s_max, v_max = max(pts)
        return v_max * (size / s_max) ** min_slope
    return 10 ** (intercept + slope * math.log10(size))


def extrapolate_linear(group: Sequence[dict], field: str, size: float) -> float | None:
    """``field`` at ``size`` from a straight line (fixed part + per-item part): memory and disk add up that way,
    and a log-log fit would read the fixed ~250 MB of a Python process with torch as sublinear growth."""
    pts = [(r["size"], r[field]) for r in group if r.get(field) is not None]
    if len({s for s, _ in pts}) < 2:
        return None
    per_item, fixed = np.polyfit([s for s, _ in pts], [v for _, v in pts], 1)
    return float(max(fixed + per_item * size, max(v for _, v in pts)))


def project(rows: Sequence[dict], papers: int = PAPER_PAPERS, queries: int = PAPER_QUERIES) -> list[dict]:
    """The paper's scale from the 06 rows: index size, build time, RAM and verification wall per 10^6 queries
    at ``papers`` papers, per engine and thread count. Times: log-log fits of the measured sizes (build time at
    least linear in the papers); memory and disk: straight-line fits (:func:`extrapolate_linear`)."""
    out = []
    groups = series(rows)
    for (stage, engine, threads), build in groups.items():
        if stage != "06_build" or "[" in engine:
            continue
        search = groups.get(("06_search", engine, threads), [])
        disk = extrapolate_linear(build, "disk_mb", papers)
        build_s = extrapolate(build, "seconds", papers, min_slope=1.0)
        build_rss = extrapolate_linear(build, "peak_rss_mb", papers)
        row = {"engine": engine, "threads": threads, "papers": papers,
               "measured_up_to": max(r["size"] for r in build),
               "index_gb": None if disk is None else round(disk / 1024, 1),
               "build_hours": None if build_s is None else round(build_s / 3600, 2),
               "build_peak_rss_gb": None if build_rss is None else round(build_rss / 1024, 2)}
        if search:
            q = search[0]["unit"]
            n_queries = int(q.split("(")[1].split()[0]) if "(" in q else 1
            secs = extrapolate(search, "seconds", papers)
            anon = extrapolate_linear(search, "rss_anon_mb", papers)
            file_ = extrapolate_linear(search, "rss_file_mb", papers)
            per_million = None if secs is None else secs / n_queries * 1e6
            row.update({
                "search_rss_anon_gb": None if anon is None else round(anon / 1024, 2),
                "search_rss_file_gb": None if file_ is None else round(file_ / 1024, 2),
                "verify_hours_per_1e6_queries": None if per_million is None else round(per_million / 3600, 2),
                f"verify_days_{queries // 10**6}M_queries": None if per_million is None
                else round(per_million * queries / 1e6 / 86400, 2)})
        out.append(row)
    return out


def project_text(rows: Sequence[dict]) -> str:
    proj = project(rows)
    if not proj:
        return "projection: no 06 rows recorded (run --stages 06)"
    lines = [f"projection to {PAPER_PAPERS:.0e} papers, {PAPER_QUERIES:.0e} queries (times: log-log fits, "
             "build at least linear; memory and disk: straight-line fits):"]
    for p in proj:
        lines.append("  " + ", ".join(f"{k} {v}" for k, v in p.items()))
    # the other stages at the paper's 4M queries (one tuple per verified query at most)
    for (stage, engine, threads), group in series(rows).items():
        if stage in ("07", "08", "09") and "[" not in engine:
            secs = extrapolate(group, "seconds", PAPER_QUERIES, min_slope=1.0)
            rss = extrapolate_linear(group, "peak_rss_mb", PAPER_QUERIES)
            if secs is not None:
                lines.append(f"  {stage} {engine} at {PAPER_QUERIES:.0e} tuples: {secs / 3600:.2f} h, "
                             f"peak RSS {rss / 1024:.1f} GB ({threads} thread)")
    return "\n".join(lines)


def plot(rows: Sequence[dict], path: Path) -> None:
    """Log-log seconds and peak RSS vs size, one line per stage and engine (parts left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(15, 6.5))
    groups = [(k, g) for k, g in series(rows).items() if "[" not in k[1]]
    colours = plt.get_cmap("tab20")
    for n, ((stage, engine, threads), group) in enumerate(groups):
        sizes = [r["size"] for r in group]
        fit = fit_slope(sizes, [r["seconds"] for r in group])
        label = f"{stage} {engine} ({threads}t)" + (f" slope {fit[0]:.2f}" if fit else "")
        style = {"color": colours(n % 20), "marker": "osD^v<>"[n % 7], "linestyle": "-" if n < 10 else "--"}
        ax_t.loglog(sizes, [r["seconds"] for r in group], label=label, **style)
        ax_m.loglog(sizes, [r["peak_rss_mb"] for r in group], **style)
    ax_t.set(xlabel="size (stage's unit: T0 rows, confused queries, papers, tuples, steps)", ylabel="seconds",
             title="time as the work grows")
    ax_m.set(xlabel="size", ylabel="peak RSS (MB)", title="peak resident memory (fresh process per size)")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================================ main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", nargs="+", default=list(ALL_STAGES), choices=ALL_STAGES + ("06_build", "06_search"),
                   help="stages to measure (default: all; 06 needs its corpora on disk: see --large)")
    p.add_argument("--engines", nargs="+", default=None,
                   help="only the engines starting with these (e.g. 'search' for 01's fixed-corpus search)")
    p.add_argument("--sizes", nargs="+", type=int, default=None,
                   help="sizes for every chosen stage instead of each stage's defaults")
    p.add_argument("--large", action="store_true",
                   help="add each stage's large sizes (01/03 10^5, 02 10^6, 06 10^6..10^7 papers, 07-09 10^5)")
    p.add_argument("--max_seconds", type=float, default=120.0,
                   help="skip a stage's larger sizes once one size took longer than this (default: %(default)s)")
    p.add_argument("--min_seconds", type=float, default=1.0,
                   help="repeat a measured call (in its process) until this many seconds are spent, and keep "
                        "the fastest run: millisecond timings are otherwise noise (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch/OpenMP/BLAS threads per child (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of all synthetic data (default: %(default)s)")
    p.add_argument("--dim", type=int, default=384, help="vector width for 01/03 (default: %(default)s, MiniLM)")
    p.add_argument("--corpus", type=int, default=100_000,
                   help="01 search: fixed corpus of passages the |T0| queries are searched against "
                        "(default: %(default)s; 10^6 for the issue's upper end)")
    p.add_argument("--top_k", type=int, default=50, help="01's search depth (default: %(default)s)")
    p.add_argument("--candidates", type=int, default=20, help="07-09: candidates per tuple (default: %(default)s)")
    p.add_argument("--search_queries", type=int, default=1000, help="06_search: queries (default: %(default)s)")
    p.add_argument("--bm25s_max", type=int, default=100_000,
                   help="06: largest corpus for today's in-memory bm25s source (default: %(default)s)")
    p.add_argument("--train_batch", type=int, default=16, help="10: global batch (default: %(default)s)")
    p.add_argument("--work_dir", default=None,
                   help="synthetic inputs and indexes, kept for reruns (default: $REPAIR_CACHE/scale_bench)")
    p.add_argument("--output", default=str(ROOT / "docs" / "results" / "scale.json"),
                   help="measurements JSON (default: docs/results/scale.json)")
    p.add_argument("--merge", action="store_true",
                   help="keep the output's earlier rows; rows with the same stage/engine/size/threads are replaced")
    p.add_argument("--fit", action="store_true", help="report only: tables and slopes of the recorded rows")
    p.add_argument("--markdown", action="store_true", help="print the report's tables as markdown")
    p.add_argument("--project", action="store_true", help="print the projection to the paper's scale (06 rows)")
    p.add_argument("--plot", default=None, help="write a log-log plot here (e.g. docs/img/scale.png)")
    p.add_argument("--_child", nargs=4, metavar=("ACTION", "STAGE", "ENGINE", "SIZE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.work_dir is None:
        from repair.runtime import cache_root

        args.work_dir = str(cache_root() / "scale_bench")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._child:
        action, stage, engine, size = args._child
        if action == "prep":
            prepare(stage, engine, int(size), args)
            result: list[dict] = []
        else:
            result = measure(stage, engine, int(size), args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    out = Path(args.output)
    rows = load_rows(out) if (args.merge or args.fit) else []
    if not args.fit:
        new: list[dict] = []
        for stage, engine, sizes in plan(args):
            for size in sizes:
                t0 = time.perf_counter()
                print(f"{stage} {engine} {size:,}: preparing ...", file=sys.stderr, flush=True)
                try:
                    run_child(args, "prep", stage, engine, size)
                    got = run_child(args, "run", stage, engine, size)
                except RuntimeError as exc:
                    print(f"  {exc}", file=sys.stderr, flush=True)
                    break
                new += got
                main_row = got[0]
                print(f"  {main_row['seconds']:.3f} s, peak RSS {main_row['peak_rss_mb']:.0f} MB, RssAnon "
                      f"{main_row['rss_anon_mb']:.0f} MB ({time.perf_counter() - t0:.0f} s with preparation)",
                      file=sys.stderr, flush=True)
                rows = merge_rows(rows, got)
                save_rows(out, rows)  # after every size: an interrupted run keeps what it measured
                if main_row["seconds"] > args.max_seconds:
                    print(f"  over --max_seconds {args.max_seconds:g}: larger sizes of {stage} {engine} skipped",
                          file=sys.stderr, flush=True)
                    break
        print(f"{len(new)} rows measured -> {out}", file=sys.stderr)
    print(report(rows, markdown=args.markdown))
    for stage, engine, slope in flagged(rows):
        print(f"FLAG {stage} {engine}: slope {slope} exceeds what its algorithm requires")
    if args.project:
        print(project_text(rows))
    if args.plot:
        plot(rows, Path(args.plot))
        print(f"plot -> {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
