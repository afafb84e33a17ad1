"""Stage I diagnosis: margins (Eq. 1), percentile thresholds, Q_conf, and the stage's file contracts.

The margin of query i is ``s(q_i, d_i) - max_{d in TopK(q_i), d not a positive of i} s(q_i, d)`` (paper Eq. 1-2)
with s = cosine of the L2-normalised embeddings. Positives of i are d_i and every row whose passage or query
text equals row i's (:meth:`repair.data.SeedSet.twins`): the original counted a duplicated passage as a
negative of its twin, which forces margin <= 0 (UPSTREAM 5.18).

File names keep the original ones (UPSTREAM 2.1) and every stage records which diagnosis run it read, so a
later stage refuses an input left over from another run or percentile (UPSTREAM 5.9, 5.10).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from repair.data import DataError, SeedSet, file_sha256, iter_jsonl, load_seed, load_torch_file, read_json
from repair.search import exact_topk

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------ file names
MARGINS_FILE = "01.train_all_query_margins.cos.jsonl"
META_FILE = "01.train_diagnosis_meta.cos_percentile.json"
PATHA_DIR = "pathA_ccs_train"
PATHA_NER_DIR = "pathA_ccs_matdetector"
PATHB_DIR = "pathB_finch_train"
MERGE_DIR = "PathAB_terms"
SCORE_DECIMALS = 7  # scores and margins are written rounded to 1e-7 (float32 resolution near 1.0)

MARGIN_FIELDS = {
    "i": int, "query": str, "pos_doc_index": int, "pos_score_cos": float, "top1_doc_index_cos": int,
    "top1_score_cos": float, "max_neg_doc_index_cos": int, "max_neg_score_cos": float, "margin_cos": float,
    "topk_doc_indices_cos": list[int], "topk_scores_cos": list[float],
}
MARGIN_OPTIONAL = {"positive_doc_indices": list[int]}


def pct_tag(pct: int) -> str:
    """``bottom_{pp}pct`` tag of a percentile (zero-padded to two digits, as the original names)."""
    return f"bottom_{int(pct):02d}pct"


def confused_name(pct: int) -> str:
    return f"confused_train_queries.{pct_tag(pct)}.cos.jsonl"


def query_cache_name(embed_key: str) -> str:
    return f"cache.train_query_reps.normfp16.{embed_key}.pt"


def doc_cache_name(embed_key: str) -> str:
    return f"cache.train_doc_reps.normfp16.{embed_key}.pt"


def topk_cache_name(run_key: str) -> str:
    return f"cache.train_topk.{run_key}.npz"


def check_pct(pct: int) -> int:
    """A ``--pct`` value (1..100); every stage checks it before reading files named after it."""
    pct = int(pct)
    if not 0 < pct <= 100:
        raise ValueError(f"--pct must be a percentile in 1..100, got {pct}")
    return pct


class RunMismatchError(RuntimeError):
    """An input file belongs to another diagnosis run or percentile than the one asked for."""


# ------------------------------------------------------------------------------------------ margins
@dataclass
class MarginResult:
    """Per-query margin components; arrays are aligned with the query rows."""

    pos_score: np.ndarray       # float32 [N]  s(q_i, d_i)
    top1_index: np.ndarray      # int64 [N]
    top1_score: np.ndarray      # float32 [N]
    max_neg_index: np.ndarray   # int64 [N]   best non-positive document
    max_neg_score: np.ndarray   # float32 [N]
    margin: np.ndarray          # float32 [N]  pos_score - max_neg_score (Eq. 1)
    topk_indices: np.ndarray    # int64 [N, k] raw top-k (positives included), score desc, ties -> lower index
    topk_scores: np.ndarray     # float32 [N, k]
    fallback_rows: int = 0      # rows whose top-k held only positives and were searched deeper


def row_dot(a: torch.Tensor, b: torch.Tensor, chunk: int = 65536) -> np.ndarray:
    """s(q_i, d_i) for aligned rows, in float32, without a [N, H] temporary for the whole set."""
    out = np.empty(a.shape[0], dtype=np.float32)
    for s in range(0, a.shape[0], chunk):
        out[s:s + chunk] = (a[s:s + chunk].float() * b[s:s + chunk].float()).sum(dim=1).numpy()
    return out


def positive_sets(n: int, twins: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """Positives of each row: the row itself plus its twins (sorted)."""
    if twins is None:
        return [[i] for i in range(n)]
    if len(twins) != n:
        raise ValueError(f"twins has {len(twins)} rows, expected {n}")
    return [sorted({i, *twins[i]}) for i in range(n)]


def _first_negative(indices: np.ndarray, positives: list[list[int]], rows: np.ndarray) -> np.ndarray:
    """Column of the first non-positive entry of each row of ``indices`` (-1 when every entry is positive)."""
    is_pos = indices == rows[:, None]
    for r, i in enumerate(rows):
        if len(positives[i]) > 1:
            is_pos[r] |= np.isin(indices[r], positives[i])
    col = np.argmax(~is_pos, axis=1)
    col[is_pos.all(axis=1)] = -1
    return col


def compute_margins(queries, docs, top_k: int = 50, twins: Sequence[Sequence[int]] | None = None, *,
                    backend: str = "auto", query_chunk: int = 4096, doc_chunk: int = 65536,
                    device: str | torch.device | None = None,
                    topk: tuple[np.ndarray, np.ndarray] | None = None) -> MarginResult:
    """Margins of every query against all documents; query i's positive is document i (DESIGN 5.1).

    ``queries``/``docs`` are [N, H] normalised embeddings (or any vectors: scores are inner products).
    ``topk`` = precomputed ``(scores, indices)`` of :func:`repair.search.exact_topk` (a cache) skips the search.
    A row whose top-k holds only positives (many duplicates) is searched deeper until a negative appears.
    """
    q, d = torch.as_tensor(queries).float(), torch.as_tensor(docs).float()
    n = q.shape[0]
    if d.shape[0] != n:
        raise ValueError(f"{n} queries but {d.shape[0]} documents: row i's positive is document i")
    if n < 2:
        raise ValueError("margins need at least 2 (query, passage) rows")
    positives = positive_sets(n, twins)
    if topk is None:
        scores, indices = exact_topk(q, d, top_k, backend=backend, query_chunk=query_chunk,
                                     doc_chunk=doc_chunk, device=device)
    else:
        scores, indices = topk
        if scores.shape[0] != n:
            raise ValueError(f"cached top-k has {scores.shape[0]} rows, expected {n}")
    rows = np.arange(n)
    col = _first_negative(indices, positives, rows)
    max_neg_index = np.where(col >= 0, indices[rows, np.maximum(col, 0)], -1).astype(np.int64)
    max_neg_score = np.where(col >= 0, scores[rows, np.maximum(col, 0)], np.nan).astype(np.float32)
    deep = np.nonzero(col < 0)[0]
    for i in deep:  # rare: every hit of the top-k is a duplicate of the positive
        k2 = min(n, len(positives[i]) + 1)
        if k2 <= len(positives[i]):
            raise DataError(f"row {i}: every passage of the seed set is a positive of this query "
                            f"(duplicates); there is no negative to compute a margin against")
        s2, i2 = exact_topk(q[i:i + 1], d, k2, backend="torch", device="cpu")
        c2 = _first_negative(i2, positives, np.array([i]))[0]
        max_neg_index[i], max_neg_score[i] = i2[0, c2], s2[0, c2]
    pos_score = row_dot(q, d)
    return MarginResult(pos_score=pos_score, top1_index=indices[:, 0].astype(np.int64),
                        top1_score=scores[:, 0].astype(np.float32), max_neg_index=max_neg_index,
                        max_neg_score=max_neg_score, margin=(pos_score - max_neg_score).astype(np.float32),
                        topk_indices=indices.astype(np.int64), topk_scores=scores.astype(np.float32),
                        fallback_rows=len(deep))


def percentile_thresholds(margins: np.ndarray, pcts: Iterable[int]) -> dict[int, float]:
    """thr_p = the p-th percentile of the margins, linear interpolation (torch.quantile's rule, any N)."""
    m = np.asarray(margins, dtype=np.float64)
    return {int(p): float(np.quantile(m, check_pct(p) / 100.0)) for p in pcts}


def select_confused(margins: np.ndarray, threshold: float) -> np.ndarray:
    """Q_conf = {i : margin_i <= thr} (ties included, so the set can exceed p%). Ascending row order."""
    return np.nonzero(np.asarray(margins, dtype=np.float64) <= threshold)[0]


def margin_stats(margins: np.ndarray) -> dict[str, float]:
    m = np.asarray(margins, dtype=np.float64)
    qs = {f"p{int(p):02d}": float(np.quantile(m, p / 100.0)) for p in (1, 5, 10, 25, 50, 75, 90, 95, 99)}
    return {"count": int(m.size), "min": float(m.min()), "max": float(m.max()), "mean": float(m.mean()),
            "std": float(m.std()), **qs}


def _r(x) -> float:
    return round(float(x), SCORE_DECIMALS)


def margin_records(result: MarginResult, queries: Sequence[str], rows: Iterable[int],
                   twins: Sequence[Sequence[int]] | None = None) -> Iterator[dict]:
    """One output line per query row (SCHEMAS: diagnosis), plus ``positive_doc_indices`` (i and its twins)."""
    for i in rows:
        i = int(i)
        yield {
            "i": i, "query": queries[i], "pos_doc_index": i,
            "pos_score_cos": _r(result.pos_score[i]),
            "top1_doc_index_cos": int(result.top1_index[i]), "top1_score_cos": _r(result.top1_score[i]),
            "max_neg_doc_index_cos": int(result.max_neg_index[i]),
            "max_neg_score_cos": _r(result.max_neg_score[i]),
            "margin_cos": _r(result.margin[i]),
            "topk_doc_indices_cos": result.topk_indices[i].tolist(),
            "topk_scores_cos": np.round(result.topk_scores[i].astype(np.float64), SCORE_DECIMALS).tolist(),
            "positive_doc_indices": sorted({i, *(twins[i] if twins is not None else ())}),
        }


def read_margin_records(path: str | os.PathLike) -> list[dict]:
    """Read a margins/confused JSONL, checking every field the later stages use."""
    return list(iter_jsonl(path, required=MARGIN_FIELDS, optional=MARGIN_OPTIONAL))


# ------------------------------------------------------------------------------------------ identity
def seed_digest(seed: SeedSet) -> str:
    """Content hash of T0 (row order, queries and passages): what "the same training set" means."""
    digest = hashlib.sha256(str(len(seed)).encode())
    for q, p in zip(seed.queries, seed.passages):
        digest.update(b"\x00q" + q.encode("utf-8") + b"\x00p" + p.encode("utf-8"))
    return digest.hexdigest()


def short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def normalise_fp16(x: torch.Tensor, chunk: int = 200_000) -> torch.Tensor:
    """Row-L2-normalise in float32 chunks and store fp16 (the original's ``normfp16`` caches)."""
    out = torch.empty(x.shape, dtype=torch.float16)
    for s in range(0, x.shape[0], chunk):
        out[s:s + chunk] = torch.nn.functional.normalize(x[s:s + chunk].float(), dim=-1).half()
    return out


def save_tensor_file(path: Path, obj: dict) -> None:
    """torch.save to a temp file and rename: a killed run never leaves a half cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_reps(path: str | os.PathLike) -> tuple[torch.Tensor, dict]:
    """A normfp16 cache: our dict ``{"reps": fp16 [N,H], "embed_key", ...}`` or the original's bare tensor."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: embedding cache not found")
    obj = load_torch_file(path)
    if isinstance(obj, torch.Tensor):
        return obj, {}
    if isinstance(obj, dict) and isinstance(obj.get("reps"), torch.Tensor):
        return obj["reps"], {k: v for k, v in obj.items() if k != "reps"}
    raise DataError(f"{path}: expected a tensor or a dict with a 'reps' tensor")


def save_topk(path: Path, scores: np.ndarray, indices: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp.npz")
    try:
        np.savez(tmp, scores=scores, indices=indices)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_topk(path: Path, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    if not path.exists():
        return None
    with np.load(path) as z:
        scores, indices = z["scores"], z["indices"]
    if scores.shape[0] != n or indices.shape != scores.shape:
        logger.warning("%s: %s rows, expected %d; searching again", path, scores.shape, n)
        return None
    return scores, indices


# ------------------------------------------------------------------------------------------ provenance
def read_diagnosis_meta(dia_out_dir: str | os.PathLike) -> dict:
    path = Path(dia_out_dir) / META_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no diagnosis meta; run diagnosis/01_diagnosis_margin.py with "
                                f"--out_dir {dia_out_dir} first")
    meta = read_json(path)
    for key in ("run_key", "percentiles", "num_queries"):
        if key not in meta:
            raise DataError(f"{path}: missing field '{key}' (not written by 01_diagnosis_margin.py?)")
    return meta


def check_confused(dia_out_dir: str | os.PathLike, pct: int) -> tuple[dict, Path]:
    """The confused file of ``pct`` and the diagnosis meta, after checking they belong to the same run."""
    pct = check_pct(pct)
    dia_out_dir = Path(dia_out_dir)
    meta = read_diagnosis_meta(dia_out_dir)
    path = dia_out_dir / confused_name(pct)
    entry = meta["percentiles"].get(str(pct))
    if entry is None:
        have = sorted(int(p) for p in meta["percentiles"])
        raise RunMismatchError(
            f"{path}: percentile {pct} is not part of the diagnosis run recorded in {dia_out_dir / META_FILE} "
            f"(run {meta['run_key']}, percentiles {have}); rerun 01_diagnosis_margin.py with --pct {pct}")
    if not path.exists():
        raise FileNotFoundError(f"{path}: confused-query file missing (recorded by run {meta['run_key']})")
    if file_sha256(path) != entry.get("sha256"):
        raise RunMismatchError(f"{path}: content differs from what diagnosis run {meta['run_key']} wrote "
                               f"(edited, or left by another run); rerun 01_diagnosis_margin.py")
    return meta, path


@dataclass
class ConfusedRun:
    """What a stage after 01 reads of one diagnosis run at one percentile, checked to belong together."""

    meta: dict            # 01's meta
    path: Path            # the confused-query file of the percentile
    records: list[dict]   # its margin records
    seed: SeedSet         # T0, the training set the run diagnosed (the documents its indices point to)
    train_pt: str
    split: str


def open_confused_run(dia_out_dir: str | os.PathLike, pct: int, train_pt: str | None = None,
                      split: str | None = None) -> ConfusedRun:
    """The confused queries of ``pct`` (:func:`check_confused`) and T0; ``train_pt``/``split`` default to the ones
    01 recorded, and another training set is refused: the records' document indices would not line up."""
    meta, path = check_confused(dia_out_dir, pct)
    records = read_margin_records(path)
    train_pt = train_pt or meta.get("train_pt")
    split = split or meta.get("split", "train")
    seed = load_seed(train_pt, split)
    if seed_digest(seed) != meta["t0"]["sha256"]:
        raise RunMismatchError(f"{train_pt}: not the training set diagnosis run {meta['run_key']} used "
                               f"({meta.get('train_pt')}); document indices would not line up")
    return ConfusedRun(meta, path, records, seed, train_pt, split)


def check_recorded_file(path: Path, recorded: dict | None, producer: str) -> None:
    """Refuse ``path`` unless it exists and matches the sha256 that ``producer`` recorded for it."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; run {producer} first")
    if not recorded or file_sha256(path) != recorded.get("sha256"):
        raise RunMismatchError(f"{path}: not the file {producer} recorded in its meta (edited or from "
                               f"another run); rerun {producer}")


def check_same_run(found: dict, meta: dict, pct: int, where: Path, producer: str) -> None:
    """``found`` (a later stage's meta) must name the same percentile and diagnosis run as ``meta``."""
    if int(found.get("pct", -1)) != int(pct):
        raise RunMismatchError(f"{where}: written for percentile {found.get('pct')}, not {pct}; "
                               f"rerun {producer} with --pct {pct}")
    if found.get("diagnosis_run_key") != meta["run_key"]:
        raise RunMismatchError(f"{where}: written from diagnosis run {found.get('diagnosis_run_key')}, but "
                               f"the current run is {meta['run_key']}; rerun {producer}")
