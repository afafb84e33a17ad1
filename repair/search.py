"""Exact top-k inner-product search with bounded memory and backend-independent results.

Every backend returns the same (scores, indices): sorted by score descending, ties broken by the lower
document index. The corpus is scanned in chunks with a running top-k, so the score matrix is never held
whole (a corpus of millions fits). faiss ``IndexFlatIP`` (GPU when available) or torch matmul do the
scoring; the tie rule is enforced after the fact (see :func:`_exact_chunk_topk` and :func:`_faiss_topk`).
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import torch

logger = logging.getLogger(__name__)

Backend = Literal["auto", "faiss", "torch"]

# Measured on the 2-core CPU of this project (bench/search.py, docs/benchmarks.md): torch matmul with the
# running top-k beat faiss IndexFlatIP at these sizes, so "auto" picks torch on CPU and faiss on GPU.
CPU_DEFAULT: Backend = "torch"


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _as_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float32)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def _exact_chunk_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of each row of ``scores`` with ties at the cut resolved to the lowest column, sorted (-score, col).

    Fast path: one torch.topk for k+1 columns. A row whose k-th and (k+1)-th scores differ has a unique top-k
    set, and only its order needs the tie rule (a sort of k entries). Rows tied at the cut (rare with real
    scores) go through :func:`_tied_chunk_topk`. Same result as the slow path alone, at about the cost of
    the topk (the full-width passes of the slow path cost ~3x the matmul on CPU; bench/differentiation.py).
    """
    n = scores.shape[1]
    k = min(k, n)
    if k == n:
        return _tied_chunk_topk(scores, k)
    vals, cols = torch.topk(scores, k + 1, dim=1, sorted=True)
    tied = vals[:, k - 1] == vals[:, k]
    vals, cols = vals[:, :k], cols[:, :k]
    cols, by_col = torch.sort(cols, dim=1)
    vals = torch.gather(vals, 1, by_col)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices  # stable: lower column first
    vals, cols = torch.gather(vals, 1, order), torch.gather(cols, 1, order)
    if bool(tied.any()):
        rows = tied.nonzero(as_tuple=True)[0]
        vals[rows], cols[rows] = _tied_chunk_topk(scores[rows], k)
    return vals, cols


def _tied_chunk_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact tie rule for any row: take the k-th value v, keep every column > v and then the
    lowest-index columns == v until k are kept (torch.topk leaves tie order unspecified). All passes are
    O(columns) per row.
    """
    n = scores.shape[1]
    k = min(k, n)
    kth = torch.topk(scores, k, dim=1, sorted=False).values.min(dim=1, keepdim=True).values
    above = scores > kth
    equal = scores == kth
    need = k - above.sum(dim=1, keepdim=True)
    keep = above | (equal & (torch.cumsum(equal.to(torch.int32), dim=1) <= need))
    cols = keep.nonzero(as_tuple=False)[:, 1].view(scores.shape[0], k)  # row-major, columns ascending
    vals = torch.gather(scores, 1, cols)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices  # stable: lower column first
    return torch.gather(vals, 1, order), torch.gather(cols, 1, order)


def _merge(run_s: torch.Tensor | None, run_i: torch.Tensor | None, new_s: torch.Tensor, new_i: torch.Tensor,
           k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two sorted top-k lists; ``run`` holds lower indices than ``new``, so a stable sort keeps the rule."""
    if run_s is None:
        return new_s, new_i
    s = torch.cat([run_s, new_s], dim=1)
    i = torch.cat([run_i, new_i], dim=1)
    order = torch.sort(s, dim=1, descending=True, stable=True).indices[:, :k]
    return torch.gather(s, 1, order), torch.gather(i, 1, order)


def _torch_topk(q: torch.Tensor, d: torch.Tensor, k: int, query_chunk: int, doc_chunk: int,
                device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    out_s = np.empty((q.shape[0], k), dtype=np.float32)
    out_i = np.empty((q.shape[0], k), dtype=np.int64)
    for qs in range(0, q.shape[0], query_chunk):
        qb = q[qs:qs + query_chunk].to(device)
        run_s = run_i = None
        for ds in range(0, d.shape[0], doc_chunk):
            db = d[ds:ds + doc_chunk].to(device)
            s, i = _exact_chunk_topk(qb @ db.T, k)
            run_s, run_i = _merge(run_s, run_i, s, i + ds, k)
        out_s[qs:qs + qb.shape[0]] = run_s.cpu().numpy()
        out_i[qs:qs + qb.shape[0]] = run_i.cpu().numpy()
    return out_s, out_i


def _faiss_topk(q: torch.Tensor, d: torch.Tensor, k: int, query_chunk: int, doc_chunk: int,
                use_gpu: bool) -> tuple[np.ndarray, np.ndarray]:
    """faiss flat IP search for k+1 hits; rows whose k-th and (k+1)-th scores tie are redone exactly."""
    import faiss

    n = d.shape[0]
    fetch = min(k + 1, n)
    index = faiss.IndexFlatIP(d.shape[1])
    if use_gpu:
        index = faiss.index_cpu_to_all_gpus(index)
    scores = np.empty((q.shape[0], fetch), dtype=np.float32)
    ids = np.empty((q.shape[0], fetch), dtype=np.int64)
    # faiss keeps the whole corpus in the index; chunk the corpus by adding it in slices and merging.
    qn = q.numpy()
    for qs in range(0, qn.shape[0], query_chunk):
        qb = np.ascontiguousarray(qn[qs:qs + query_chunk])
        run_s = run_i = None
        for ds in range(0, n, doc_chunk):
            index.reset()
            index.add(np.ascontiguousarray(d[ds:ds + doc_chunk].numpy()))
            s, i = index.search(qb, min(fetch, index.ntotal))
            s_t, i_t = torch.from_numpy(s), torch.from_numpy(i + ds)
            # faiss orders ties arbitrarily: re-sort each row by (-score, index)
            i_t, perm = torch.sort(i_t, dim=1, stable=True)
            s_t = torch.gather(s_t, 1, perm)
            order = torch.sort(s_t, dim=1, descending=True, stable=True).indices
            run_s, run_i = _merge(run_s, run_i, torch.gather(s_t, 1, order), torch.gather(i_t, 1, order), fetch)
        scores[qs:qs + qb.shape[0]] = run_s.numpy()
        ids[qs:qs + qb.shape[0]] = run_i.numpy()
    if fetch > k:
        tied = np.nonzero(scores[:, k - 1] == scores[:, k])[0]
        if len(tied):
            fix_s, fix_i = _torch_topk(q[tied], d, k, query_chunk, doc_chunk, torch.device("cpu"))
            scores[tied, :k], ids[tied, :k] = fix_s, fix_i
    return scores[:, :k], ids[:, :k]


def exact_topk(queries, docs, k: int, *, backend: Backend = "auto", query_chunk: int = 1024,
               doc_chunk: int = 65536, device: str | torch.device | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` documents of every query by inner product. Returns float32 scores and int64 indices [Q, k'].

    ``k' = min(k, n_docs)``. Inputs are [Q, H] and [N, H] arrays or tensors (normalise them first for cosine).
    """
    q, d = _as_tensor(queries), _as_tensor(docs)
    if q.ndim != 2 or d.ndim != 2 or q.shape[1] != d.shape[1]:
        raise ValueError(f"queries {tuple(q.shape)} and docs {tuple(d.shape)} must be 2-D with the same width")
    k = min(int(k), d.shape[0])
    if k <= 0 or q.shape[0] == 0:
        return np.empty((q.shape[0], 0), np.float32), np.empty((q.shape[0], 0), np.int64)
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if backend == "auto":
        backend = "faiss" if dev.type == "cuda" and faiss_available() else CPU_DEFAULT
    if backend == "faiss":
        if not faiss_available():
            raise RuntimeError("backend 'faiss' requested but faiss is not installed (pip install faiss-cpu)")
        import faiss

        use_gpu = dev.type == "cuda" and hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0
        if use_gpu and k > 2048:  # faiss GPU flat search caps k at 2048
            use_gpu = False
        return _faiss_topk(q, d, k, query_chunk, doc_chunk, use_gpu)
    if backend == "torch":
        return _torch_topk(q, d, k, query_chunk, doc_chunk, dev)
    raise ValueError(f"unknown search backend {backend!r} (auto, faiss, torch)")
