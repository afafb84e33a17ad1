"""FINCH clustering (Sarfraz et al., CVPR 2019) with exact, chunked first neighbours.

First partition: every point links to its first (nearest) neighbour by cosine, excluding itself; the
clusters are the connected components of that undirected 1-NN graph. Further levels repeat the same step
on the cluster means. The 1-NN search is exact and chunked (a [chunk, doc_chunk] score block at a time), so
10^6 queries need only the embeddings plus one block in memory; ties go to the lower index, as
``argmin`` does in the reference implementation (``finch-clust``).

Level rule, matching ``finch-clust`` 0.2.3: level k+1 clusters the means of level k's clusters (means of the
rows as given) and is kept only if it merges at least two clusters and leaves more than one. Its
``ensure_early_exit`` distance filter has no effect there (it zeroes entries of a CSR matrix, and scipy's
connected components still count stored zeros as edges), so there is no distance filter here either.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)


def _unit_rows(x, chunk: int = 200_000) -> torch.Tensor:
    """float32 copy with unit rows (zero rows stay zero)."""
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    out = torch.empty(t.shape, dtype=torch.float32)
    for s in range(0, t.shape[0], chunk):
        out[s:s + chunk] = torch.nn.functional.normalize(t[s:s + chunk].float(), dim=-1)
    return out


def first_neighbours(x, *, chunk: int = 4096, doc_chunk: int = 65536, device: str | torch.device | None = None,
                     normalise: bool = True, show_progress: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Index and cosine of each row's nearest other row (exact; ties -> lower index).

    Scans [chunk, doc_chunk] blocks of X Xᵀ with the diagonal masked, keeping a running (max, argmax);
    blocks are visited in increasing column order and a later block wins only with a strictly higher score,
    so the lowest index wins ties. With one row, its neighbour is itself (a singleton cluster).
    """
    xs = _unit_rows(x) if normalise else torch.as_tensor(x).float()
    n = xs.shape[0]
    if n <= 1:
        return np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.float32)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    xd = xs.to(dev)
    nn_idx = np.empty(n, dtype=np.int64)
    nn_sim = np.empty(n, dtype=np.float32)
    blocks = (n + chunk - 1) // chunk
    show = n >= 50_000 if show_progress is None else show_progress
    for qs in tqdm(range(0, n, chunk), total=blocks, desc="FINCH 1-NN", unit="block", disable=not show,
                   mininterval=2.0):
        q = xd[qs:qs + chunk]
        rows = torch.arange(q.shape[0], device=dev)
        best = torch.full((q.shape[0],), -float("inf"), device=dev)
        arg = torch.zeros(q.shape[0], dtype=torch.long, device=dev)
        for ds in range(0, n, doc_chunk):
            block = q @ xd[ds:ds + doc_chunk].T
            diag = rows + qs - ds  # column of each query's own row inside this block
            inside = (diag >= 0) & (diag < block.shape[1])
            block[rows[inside], diag[inside]] = -float("inf")
            val, col = block.max(dim=1)  # first maximal column on ties
            better = val > best
            best = torch.where(better, val, best)
            arg = torch.where(better, col + ds, arg)
        nn_idx[qs:qs + q.shape[0]] = arg.cpu().numpy()
        nn_sim[qs:qs + q.shape[0]] = best.cpu().numpy()
    return nn_idx, nn_sim


def components(nn_idx: np.ndarray) -> np.ndarray:
    """Connected components of the undirected graph {i - nn(i)}; labels numbered by smallest member."""
    n = len(nn_idx)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    graph = csr_matrix((np.ones(n, dtype=np.int8), (np.arange(n), nn_idx)), shape=(n, n))
    _, labels = connected_components(graph, directed=True, connection="weak")
    return canonical_labels(labels)


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel so clusters are numbered 0.. in order of their first (smallest-index) member."""
    labels = np.asarray(labels)
    if labels.size == 0:
        return labels.astype(np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def cluster_means(x, labels: np.ndarray) -> np.ndarray:
    """Mean of the rows of each cluster (float32), as one sparse [k, n] x [n, H] product (finch-clust's rule)."""
    data = np.asarray(x.float().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float32)
    labels = np.asarray(labels)
    k = int(labels.max()) + 1
    member = csr_matrix((np.ones(len(labels), dtype=np.float32), (labels, np.arange(len(labels)))),
                        shape=(k, len(labels)))
    counts = np.bincount(labels, minlength=k).astype(np.float32)
    return np.asarray(member @ data) / counts[:, None]


def finch(x, levels: int | None = 1, **nn_kw) -> list[np.ndarray]:
    """FINCH partitions of the rows of ``x``: ``[first partition, level 2, ...]`` (labels per row).

    ``levels`` caps how many partitions to return (``None``: until FINCH stops). Keyword arguments go to
    :func:`first_neighbours` (chunk, doc_chunk, device).
    """
    n = len(x)
    if n == 0:
        return [np.zeros(0, dtype=np.int64)]
    nn_idx, _ = first_neighbours(x, **nn_kw)
    labels = components(nn_idx)
    parts = [labels]
    while levels is None or len(parts) < levels:
        k = int(labels.max()) + 1
        if k <= 2:
            break
        means = cluster_means(x, labels)
        merged = components(first_neighbours(means, **{**nn_kw, "show_progress": False})[0])
        k_new = int(merged.max()) + 1
        if k_new == 1 or k - k_new <= 1:  # finch-clust's exit rule: no real merge, or everything merged
            break
        labels = canonical_labels(merged[labels])
        parts.append(labels)
    return parts
