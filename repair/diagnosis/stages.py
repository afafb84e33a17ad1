"""The four diagnosis stages as functions (scripts 01-04 are argparse wrappers around these).

Each stage reads the previous stage's files, checks they come from the same diagnosis run and percentile
(:mod:`repair.diagnosis.margins` provenance helpers), computes, writes its files atomically and returns a summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from repair.cli import non_negative_int, percentile, positive_float, positive_int
from repair.diagnosis import margins as dg
from repair.diagnosis.ccs import compute_ccs, merge_cconf, referenced_docs
from repair.data import DataError, file_sha256, load_seed, read_json, read_jsonl, write_json, write_jsonl, write_lines
from repair.diagnosis.finch import finch
from repair.tables import text_table

logger = logging.getLogger(__name__)

PATHA_PRODUCER = "diagnosis/02_pathA_ccs_regex.py (or 02_pathA_ccs_matdetector.py)"
PATHB_PRODUCER = "diagnosis/03_pathB_finch.py"


def patha_rank_name(pct: int) -> str:
    return f"pathA.entities.rank.train.{dg.pct_tag(pct)}.json"


def patha_top_name(pct: int, n: int = 200) -> str:
    return f"pathA.entities.top{n}.train.{dg.pct_tag(pct)}.jsonl"


def cintra_name(pct: int) -> str:
    return f"cintra.{dg.pct_tag(pct)}.jsonl"


def per_query_name(pct: int) -> str:
    return f"per_query_neg_concepts.{dg.pct_tag(pct)}.json"


def assignments_name(pct: int) -> str:
    return f"pathB_finch_train.assignments.{dg.pct_tag(pct)}.jsonl"


def components_name(pct: int) -> str:
    return f"pathB_finch_train.components.{dg.pct_tag(pct)}.json"


def final_terms_name(pct: int, ext: str) -> str:
    return f"final_terms.{dg.pct_tag(pct)}.{ext}"


def _record(path: Path, **extra) -> dict:
    return {"path": path.name, "sha256": file_sha256(path), **extra}


def _rel(path: Path, base: Path) -> str:
    """Path as stored in a meta file: relative to ``base`` when inside it (the run folder can move)."""
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path.resolve())


def write_text_atomic(path: Path, lines: Sequence[str]) -> None:
    """One line per item, atomically (the project's single writer, ``repair.data.atomic_write``)."""
    write_lines(path, lines)


def table(rows: Sequence[Sequence], header: Sequence[str]) -> str:
    """The stages' log tables: right-aligned columns under a ``-+-`` rule (:func:`repair.tables.text_table`)."""
    return text_table(rows, header, align="r", sep=" | ", rule="-+-")


# ------------------------------------------------------------------------------------------ 01 margins
def run_margins(retriever, train_pt: str | os.PathLike, out_dir: str | os.PathLike, pcts: Sequence[int], *,
                split: str = "train", top_k: int = 50, instruction: str | None = None,
                cache_dir: str | os.PathLike | None = None, search_backend: str = "auto",
                device: str | None = None, force: bool = False) -> dict:
    """Stage 1: embeddings (reused when cached), exact top-k, margins, thresholds, Q_conf files, meta."""
    out_dir = Path(out_dir)
    cache_dir = Path(cache_dir) if cache_dir else out_dir / "cache"
    pcts = sorted({dg.check_pct(p) for p in pcts})
    seed = load_seed(train_pt, split)
    n = len(seed)
    if n < 2:
        raise DataError(f"{train_pt}: {n} usable (query, passage) rows; margins need at least 2")
    twins = seed.twins()
    t0 = dg.seed_digest(seed)
    instr = retriever.text_format.instruction if instruction is None else instruction
    fingerprint = retriever.fingerprint()
    embed_key = dg.short_hash({"fingerprint": fingerprint, "format": retriever.text_format.__dict__,
                               "instruction": instr, "t0": t0})
    run_key = dg.short_hash({"embed_key": embed_key, "top_k": int(top_k), "positives": "row+twins"})
    qpath, dpath = cache_dir / dg.query_cache_name(embed_key), cache_dir / dg.doc_cache_name(embed_key)
    started = time.time()

    reused_reps, forward_texts = False, 0
    if not force and qpath.exists() and dpath.exists():
        qn, qinfo = dg.load_reps(qpath)
        dn, dinfo = dg.load_reps(dpath)
        reused_reps = (qn.shape[0] == n and dn.shape[0] == n and qinfo.get("embed_key") == embed_key
                       and dinfo.get("embed_key") == embed_key)
        if not reused_reps:
            logger.warning("%s / %s do not match this run; re-encoding", qpath.name, dpath.name)
    if not reused_reps:
        before = len(retriever.cache) if retriever.cache is not None else 0
        q = retriever.encode_queries(seed.queries, instruction=instr, desc="encode T0 queries")
        d = retriever.encode_passages(seed.passages, desc="encode T0 passages")
        forward_texts = (len(retriever.cache) - before) if retriever.cache is not None else 2 * n
        qn, dn = dg.normalise_fp16(q), dg.normalise_fp16(d)
        del q, d
        info = {"embed_key": embed_key, "fingerprint": fingerprint, "num_rows": n, "t0_sha256": t0}
        dg.save_tensor_file(qpath, {"reps": qn, "kind": "query", **info})
        dg.save_tensor_file(dpath, {"reps": dn, "kind": "passage", **info})
        write_json(cache_dir / f"cache.train_norm_meta.{embed_key}.json",
                   {"cache_key": embed_key, "dtype": "float16", "num_docs": n, "num_queries": n,
                    "fingerprint": fingerprint, "model": retriever.describe(), "instruction": instr,
                    "query_cache": qpath.name, "doc_cache": dpath.name})
    qf, df = qn.float(), dn.float()
    del qn, dn

    topk_path = cache_dir / dg.topk_cache_name(run_key)
    cached_topk = None if force else dg.load_topk(topk_path, n)
    reused_search = cached_topk is not None
    if cached_topk is None:
        from repair.search import exact_topk

        scores, indices = exact_topk(qf, df, top_k, backend=search_backend, device=device)
        dg.save_topk(topk_path, scores, indices)
        cached_topk = (scores, indices)
    result = dg.compute_margins(qf, df, top_k, twins, topk=cached_topk, device=device)
    del qf, df
    thresholds = dg.percentile_thresholds(result.margin, pcts)

    meta_path = out_dir / dg.META_FILE
    old = read_json(meta_path) if meta_path.exists() else {}
    same_run = old.get("run_key") == run_key and not force
    margins_path = out_dir / dg.MARGINS_FILE
    old_margins = (old.get("outputs") or {}).get("all_margins")
    if not (same_run and margins_path.exists() and old_margins
            and file_sha256(margins_path) == old_margins.get("sha256")):
        write_jsonl(margins_path, dg.margin_records(result, seed.queries, range(n), twins))
    percentiles: dict[str, dict] = {}
    if same_run:  # percentiles asked for earlier in this very run stay valid
        for key, entry in (old.get("percentiles") or {}).items():
            path = out_dir / entry.get("output_jsonl", "")
            if path.is_file() and file_sha256(path) == entry.get("sha256"):
                percentiles[key] = entry
    rows = []
    for p in pcts:
        path = out_dir / dg.confused_name(p)
        chosen = dg.select_confused(result.margin, thresholds[p])
        entry = percentiles.get(str(p))
        if entry is None or entry.get("confused") != len(chosen):
            write_jsonl(path, dg.margin_records(result, seed.queries, chosen, twins))
            entry = {"threshold": thresholds[p], "confused": int(len(chosen)), "ratio": len(chosen) / n,
                     "output_jsonl": path.name, "sha256": file_sha256(path)}
        percentiles[str(p)] = entry
        rows.append((p, f"{entry['threshold']:.6f}", entry["confused"], f"{entry['ratio']:.3f}"))
    stale = sorted(f.name for f in out_dir.glob("confused_train_queries.bottom_*pct.cos.jsonl")
                   if f.name not in {e["output_jsonl"] for e in percentiles.values()})
    if stale:
        logger.warning("not from this run (later stages will refuse them): %s", ", ".join(stale))
    meta = {
        "task": "REPAIR stage I: cosine margins (Eq. 1) of T0 queries and the low-margin set Q_conf",
        "run_key": run_key, "embed_key": embed_key, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "train_pt": str(Path(train_pt).resolve()), "split": split,
        "t0": {"rows": n, "dropped": seed.dropped, "sha256": t0},
        "num_queries": n, "num_docs": n,
        "model": retriever.describe(), "fingerprint": fingerprint, "instruction": instr,
        "search": {"top_k": int(top_k), "backend": search_backend,
                   "similarity": "cosine: dot product of the L2-normalised fp16 caches, computed in float32"},
        "margin": "s(q,d+) - best score in the top-k over documents that are not positives of q; positives "
                  "are d+ and its twins (rows with the same passage or query text, SeedSet.twins)",
        "duplicates": {"rows_with_twins": sum(1 for t in twins if t),
                       "rows_searched_past_top_k": result.fallback_rows,
                       "note": "twins are never negatives (fixes UPSTREAM 5.18); their indices are in each "
                               "line's positive_doc_indices"},
        "thresholds": "numpy.quantile(margins, p/100), linear interpolation; Q_conf = margin <= threshold "
                      "(ties included)",
        "score_decimals": dg.SCORE_DECIMALS,
        "margin_stats": dg.margin_stats(result.margin),
        "percentiles": dict(sorted(percentiles.items(), key=lambda kv: int(kv[0]))),
        "outputs": {"all_margins": _record(margins_path, lines=n)},
        "caches": {"query": _rel(qpath, out_dir), "doc": _rel(dpath, out_dir), "topk": _rel(topk_path, out_dir),
                   "embeddings": _rel(cache_dir, out_dir)},
        "pathB": {"train_query_cache": _rel(qpath, out_dir)},
        "reuse": {"embeddings": reused_reps, "forward_texts": int(forward_texts),
                  "search": reused_search},
    }
    write_json(meta_path, meta)
    logger.info("margins of %d queries (top-%d)\n%s", n, top_k,
                table(rows, ["pct", "threshold", "confused", "ratio"]))
    return {"stage": "01_diagnosis_margin", "queries": n, "top_k": int(top_k), "run_key": run_key,
            "fingerprint": fingerprint, "forward_texts": int(forward_texts), "reused_embeddings": reused_reps,
            "reused_search": reused_search,
            "confused": {str(p): percentiles[str(p)]["confused"] for p in pcts},
            "thresholds": {str(p): thresholds[p] for p in pcts}, "out_dir": str(out_dir),
            "seconds": round(time.time() - started, 2)}


# ------------------------------------------------------------------------------------------ 02 PathA
def run_pathA(dia_out_dir: str | os.PathLike, pct: int, out_dir: str | os.PathLike, extractor, *,
              train_pt: str | None = None, split: str | None = None, top_neg_n: int = 30, eps: float = 0.5,
              df: str = "incidence", doc_text: str = "passage", top_export: int = 200) -> dict:
    """Stage 2: concepts of D+ and D-(q), CCS (Eq. 5), C_intra, per-query D- concepts (PathB's input)."""
    if top_neg_n < 1:
        raise ValueError("--top_neg_n must be >= 1")
    dia_out_dir, out_dir = Path(dia_out_dir), Path(out_dir)
    run = dg.open_confused_run(dia_out_dir, pct, train_pt, split)
    meta, cpath, records, seed, train_pt = run.meta, run.path, run.records, run.seed, run.train_pt
    if doc_text not in ("passage", "title_passage"):
        raise ValueError(f"doc_text must be 'passage' or 'title_passage', got {doc_text!r}")
    docs = referenced_docs(records, top_neg_n)

    def text_of(j: int) -> str:
        return seed.passages[j] if doc_text == "passage" else f"{seed.queries[j]}\n{seed.passages[j]}"

    concepts = dict(zip(docs, extractor([text_of(j) for j in docs])))
    res = compute_ccs(records, concepts, top_neg_n=top_neg_n, eps=eps, df=df)
    if res.short_negatives:
        logger.warning("%d confused queries had fewer than %d negatives in their top-%d list",
                       res.short_negatives, top_neg_n, meta["search"]["top_k"])
    out_dir.mkdir(parents=True, exist_ok=True)
    pq_path, ci_path = out_dir / per_query_name(pct), out_dir / cintra_name(pct)
    top_path = out_dir / patha_top_name(pct, top_export)
    write_json(pq_path, {str(i): v for i, v in res.per_query.items()})
    write_jsonl(ci_path, res.cintra)
    write_jsonl(top_path, res.entities[:top_export])
    rank = {
        "pct": int(pct), "confused_queries": len(records), "top_neg_n": top_neg_n, "eps_pos": eps, "df": df,
        "num_train_docs": len(seed), "docs_extracted": len(docs),
        "docs_with_concepts": sum(1 for c in concepts.values() if c), "doc_text": doc_text,
        "input_confused_jsonl": str(cpath.resolve()), "train_pt": str(Path(train_pt).resolve()),
        "out_dir": str(out_dir.resolve()), "diagnosis_run_key": meta["run_key"],
        "diagnosis_meta": str((dia_out_dir / dg.META_FILE).resolve()),
        "confused_sha256": file_sha256(cpath), "extractor": extractor.describe(),
        "note": ("CCS(e) = df(e; D-) / (df(e; D+) + eps) (Eq. 5). df='incidence' counts (confused query, "
                 "document) pairs, as the original; df='unique' counts distinct documents. D-(q) = the first "
                 "top_neg_n hits of q that are not positives (d+ or its twins). C_intra(q) = the concept of "
                 "D-(q) with the highest CCS; ties: higher df(e; D-), then the string."),
        "outputs": {"per_query_neg_concepts": _record(pq_path), "cintra": _record(ci_path, lines=len(res.cintra)),
                    "top": _record(top_path)},
        "entities": res.entities,
    }
    write_json(out_dir / patha_rank_name(pct), rank)
    top = [(e["entity"], f"{e['CCS']:.2f}", e["freq_neg"], e["freq_pos"]) for e in res.entities[:10]]
    if top:
        logger.info("top concepts by CCS\n%s", table(top, ["concept", "CCS", "df(D-)", "df(D+)"]))
    return {"stage": "02_pathA", "pct": int(pct), "extractor": extractor.describe()["extractor"],
            "confused_queries": len(records), "docs_extracted": len(docs), "entities": len(res.entities),
            "cintra_lines": len(res.cintra), "cintra_unique": len({r["concept"].lower() for r in res.cintra}),
            "out_dir": str(out_dir)}


def add_pathA_args(p: argparse.ArgumentParser, default_out: str) -> None:
    """The flags both PathA scripts share (the original README's names)."""
    p.add_argument("--pct", type=percentile, default=30,
                   help="percentile whose confused file to read (default: %(default)s)")
    p.add_argument("--dia_out_dir", default=os.environ.get("DIA_OUT_DIR"),
                   help="folder of 01's outputs (default: $DIA_OUT_DIR)")
    p.add_argument("--train_pt", default=None,
                   help="seed training set T0 (default: the one recorded in 01's meta; must be the same data)")
    p.add_argument("--split", default=None, help="BEIR split when --train_pt is a folder (default: 01's)")
    p.add_argument("--out_dir", default="", help=f"output folder (default: <dia_out_dir>/{default_out})")
    p.add_argument("--top_neg_n", type=positive_int, default=30,
                   help="D-(q) = the first N non-positive hits of each confused query (paper and driver: 30; "
                        "original script default 10) (default: %(default)s)")
    p.add_argument("--eps", type=positive_float, default=0.5,
                   help="eps in CCS = df(e; D-) / (df(e; D+) + eps) (original regex path 0.5, MatDetector 1e-6) "
                        "(default: %(default)s)")
    p.add_argument("--df", default="incidence", choices=["incidence", "unique"],
                   help="document frequency: 'incidence' counts (confused query, document) pairs, as the original "
                        "(a document in ten D-(q) counts ten times); 'unique' counts distinct documents "
                        "(default: %(default)s)")
    p.add_argument("--doc_text", default="passage", choices=["passage", "title_passage"],
                   help="text concepts are taken from: the passage that was embedded, or the original's "
                        "'title\\npassage' where the title is that row's query (default: %(default)s)")
    p.add_argument("--top_export", type=non_negative_int, default=200,
                   help="concepts in the pathA.entities.top*.jsonl file "
                                                              "(default: %(default)s)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")


def check_pathA_args(p: argparse.ArgumentParser, args: argparse.Namespace, default_out: str) -> None:
    if not args.dia_out_dir:
        p.error("--dia_out_dir is required (or set $DIA_OUT_DIR)")
    args.out_dir = args.out_dir or str(Path(args.dia_out_dir) / default_out)


# ------------------------------------------------------------------------------------------ 03 PathB
def load_patha(patha_out_dir: Path, meta: dict, pct: int) -> tuple[dict, Path]:
    """PathA's rank JSON after checking it is from this diagnosis run and percentile."""
    rank_path = patha_out_dir / patha_rank_name(pct)
    if not rank_path.exists():
        raise FileNotFoundError(f"{rank_path}: PathA output missing; run {PATHA_PRODUCER} with --pct {pct} "
                                f"--out_dir {patha_out_dir}")
    rank = read_json(rank_path)
    dg.check_same_run(rank, meta, pct, rank_path, PATHA_PRODUCER)
    return rank, rank_path


def run_pathB(dia_out_dir: str | os.PathLike, pct: int, out_dir: str | os.PathLike,
              patha_out_dir: str | os.PathLike, *, train_query_cache: str | None = None,
              device: str | None = None, levels: int | None = 1, cinter_level: int = 1, samples: int = 5,
              chunk: int = 4096, doc_chunk: int = 65536) -> dict:
    """Stage 3: FINCH clusters of Q_conf's query embeddings; C_inter = each cluster's top D- concept."""
    dia_out_dir, out_dir, patha_out_dir = Path(dia_out_dir), Path(out_dir), Path(patha_out_dir)
    if cinter_level < 1 or (levels is not None and cinter_level > levels):
        raise ValueError(f"--cinter_level {cinter_level} must be between 1 and --levels ({levels})")
    meta, cpath = dg.check_confused(dia_out_dir, pct)
    records = dg.read_margin_records(cpath)
    if train_query_cache:
        cache_path = Path(train_query_cache)
    else:
        recorded = (meta.get("pathB") or {}).get("train_query_cache")
        if not recorded:
            raise DataError(f"{dia_out_dir / dg.META_FILE}: no pathB.train_query_cache recorded; pass "
                            f"--train_query_cache")
        cache_path = dia_out_dir / recorded
    reps, info = dg.load_reps(cache_path)
    if reps.ndim != 2 or reps.shape[0] != meta["num_queries"]:
        raise dg.RunMismatchError(f"{cache_path}: {tuple(reps.shape)} rows, but diagnosis run {meta['run_key']} "
                                  f"has {meta['num_queries']} queries; pass the cache 01 recorded")
    if info.get("embed_key") and info["embed_key"] != meta.get("embed_key"):
        raise dg.RunMismatchError(f"{cache_path}: embeddings of model/run {info['embed_key']} (fingerprint "
                                  f"{info.get('fingerprint')}), but the confused file comes from "
                                  f"{meta.get('embed_key')} (fingerprint {meta.get('fingerprint')})")
    if not info:
        logger.warning("%s is a bare tensor: only its row count can be checked against the run", cache_path)
    rank, rank_path = load_patha(patha_out_dir, meta, pct)
    pq_path = patha_out_dir / per_query_name(pct)
    dg.check_recorded_file(pq_path, rank["outputs"].get("per_query_neg_concepts"), PATHA_PRODUCER)
    per_query = {int(k): v for k, v in read_json(pq_path).items()}

    rows = [int(r["i"]) for r in records]
    x = reps[rows].float() if rows else reps[:0].float()
    parts = finch(x, levels=levels, chunk=chunk, doc_chunk=doc_chunk, device=device)
    if cinter_level > len(parts):
        raise ValueError(f"FINCH stopped after {len(parts)} level(s); --cinter_level {cinter_level} does not "
                         f"exist for this data")
    labels = parts[cinter_level - 1]
    members: dict[int, list[int]] = {}
    for pos, lab in enumerate(labels.tolist()):
        members.setdefault(lab, []).append(pos)
    clusters = []
    for lab, pos_list in members.items():
        margins = [records[p]["margin_cos"] for p in pos_list]
        counts: Counter = Counter()
        for p in pos_list:  # Counter keeps first-seen order, so most_common breaks ties by first sight
            counts.update(per_query.get(rows[p], []))
        concept, concept_count = counts.most_common(1)[0] if counts else ("", 0)
        clusters.append({"label": lab, "component_root": rows[pos_list[0]], "size": len(pos_list),
                         "avg_margin": float(np.mean(margins)), "min_margin": float(np.min(margins)),
                         "concept": concept, "concept_count": int(concept_count),
                         "sample_queries": [records[p]["query"] for p in pos_list[:samples]]})
    clusters.sort(key=lambda c: (c["avg_margin"], -c["size"], c["component_root"]))
    cid = {}
    for k, c in enumerate(clusters):
        cid[c.pop("label")] = k
        c["component_id"] = k
    out_dir.mkdir(parents=True, exist_ok=True)
    asg_path = out_dir / assignments_name(pct)

    def assignment_rows():
        for pos, rec in enumerate(records):
            c = clusters[cid[int(labels[pos])]]
            row = {"i": rows[pos], "query": rec["query"], "margin_cos": rec["margin_cos"],
                   "component_root": c["component_root"], "component_id": c["component_id"],
                   "concept": c["concept"]}
            if len(parts) > 1:
                row["finch_levels"] = [int(p[pos]) for p in parts]
            yield row

    write_jsonl(asg_path, assignment_rows())
    order = ["component_id", "component_root", "size", "avg_margin", "min_margin", "concept", "concept_count",
             "sample_queries"]
    comps = {
        "pct": int(pct), "confused_queries": len(records),
        "clustering": f"FINCH partition-{cinter_level} (Sarfraz et al., 2019)",
        "levels": [{"level": k + 1, "num_clusters": int(p.max()) + 1 if p.size else 0} for k, p in enumerate(parts)],
        "cinter_level": cinter_level, "device": str(device or "cpu"), "train_query_cache": str(cache_path.resolve()),
        "patha_out_dir": str(patha_out_dir.resolve()), "diagnosis_run_key": meta["run_key"],
        "patha": {"rank_json": rank_path.name, "per_query_neg_concepts_sha256": file_sha256(pq_path)},
        "num_clusters": len(clusters), "num_cinter_concepts": len({c["concept"] for c in clusters if c["concept"]}),
        "note": ("exact cosine 1-NN of each confused query (self excluded, ties -> lower index), undirected "
                 "1-NN graph, connected components; C_inter = the most frequent D- concept of the members "
                 "(ties: first seen, members in ascending i). Sorted by (avg_margin asc, size desc, root)."),
        "outputs": {"assignments": _record(asg_path, lines=len(records))},
        "components_sorted_by_avg_margin_asc": [{k: c[k] for k in order} for c in clusters],
    }
    write_json(out_dir / components_name(pct), comps)
    sizes = Counter(c["size"] for c in clusters)
    logger.info("FINCH levels: %s; cluster sizes (size: count) %s",
                [lv["num_clusters"] for lv in comps["levels"]], dict(sorted(sizes.items())[:10]))
    return {"stage": "03_pathB_finch", "pct": int(pct), "confused_queries": len(records),
            "num_clusters": len(clusters), "levels": [lv["num_clusters"] for lv in comps["levels"]],
            "num_cinter_concepts": comps["num_cinter_concepts"], "out_dir": str(out_dir)}


# ------------------------------------------------------------------------------------------ 04 merge
def run_merge(dia_out_dir: str | os.PathLike, pct: int, patha_out_dir: str | os.PathLike,
              pathb_out_dir: str | os.PathLike, out_dir: str | os.PathLike, *, top_a: int | None = None,
              top_comp: int | None = None) -> dict:
    """Stage 4: C_conf = C_intra ∪ C_inter (case-insensitive) with provenance."""
    pct = dg.check_pct(pct)  # before any file name is built from it (a bad one would blame a missing file)
    dia_out_dir, out_dir = Path(dia_out_dir), Path(out_dir)
    patha_out_dir, pathb_out_dir = Path(patha_out_dir), Path(pathb_out_dir)
    meta = dg.read_diagnosis_meta(dia_out_dir)
    rank, rank_path = load_patha(patha_out_dir, meta, pct)
    ci_path = patha_out_dir / cintra_name(pct)
    dg.check_recorded_file(ci_path, rank["outputs"].get("cintra"), PATHA_PRODUCER)
    comp_path = pathb_out_dir / components_name(pct)
    if not comp_path.exists():
        raise FileNotFoundError(f"{comp_path}: PathB output missing; run {PATHB_PRODUCER} with --pct {pct}")
    comps = read_json(comp_path)
    dg.check_same_run(comps, meta, pct, comp_path, PATHB_PRODUCER)
    used = (comps.get("patha") or {}).get("per_query_neg_concepts_sha256")
    if used != rank["outputs"]["per_query_neg_concepts"]["sha256"]:
        raise dg.RunMismatchError(f"{comp_path}: computed from other PathA concepts than {patha_out_dir}; "
                                  f"rerun {PATHB_PRODUCER} with --patha_out_dir {patha_out_dir}")
    cintra = read_jsonl(ci_path, required={"query_i": int, "concept": str}, optional={"CCS": float})
    merged = merge_cconf(cintra, comps["components_sorted_by_avg_margin_asc"], top_a=top_a, top_comp=top_comp)
    out_dir.mkdir(parents=True, exist_ok=True)
    txt_path, json_path = out_dir / final_terms_name(pct, "txt"), out_dir / final_terms_name(pct, "json")
    write_text_atomic(txt_path, [t["term"] for t in merged["terms"]])
    write_json(json_path, {
        "pct": int(pct), "diagnosis_run_key": meta["run_key"],
        "inputs": {"cintra": str(ci_path.resolve()), "components": str(comp_path.resolve())},
        "params": {"top_a": top_a, "top_comp": top_comp},
        "counts": merged["counts"],
        "notes": "C_conf = C_intra (A, PathA) ∪ C_inter (B, PathB FINCH). Terms are merged case-insensitively "
                 "(lowercase key), sorted by that key; the casing shown is A's when A has the term. "
                 "from = which side produced it; A.queries / B.components = how often.",
        "terms": merged["terms"],
    })
    c = merged["counts"]
    logger.info("C_conf\n%s", table([(c["A_raw"], c["A_unique"], c["B_raw"], c["B_unique"], c["overlap"],
                                      c["union_total"])],
                                     ["A raw", "A unique", "B raw", "B unique", "overlap", "union"]))
    return {"stage": "04_merge_cconf", "pct": int(pct), **c, "txt": str(txt_path)}


def print_summary(summary: dict) -> None:
    """The one-line summary every diagnosis script ends with (JSON, stdout)."""
    print(json.dumps(summary, ensure_ascii=False), flush=True)
