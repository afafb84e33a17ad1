"""Gradient caching and cross-device negatives: a contrastive loss over a batch far larger than memory allows.

GradCache (Gao et al., 2021): the loss of a batch depends on the encoder only through the embeddings, so
  1. embed every text in mini-batches without a graph (the "cache"),
  2. compute the loss on all cached embeddings, made leaves that require grad, and backpropagate to them,
  3. re-embed each mini-batch with a graph and backpropagate the cached embedding gradient through it.
The parameter gradient is exactly that of the full-batch loss (the chain rule, split by mini-batch); memory is
that of one mini-batch. Dropout (LoRA's 0.05) would draw different masks in steps 1 and 3, so the RNG state
before each mini-batch is recorded in step 1 and restored in step 3. Plain gradient accumulation is not the
same thing: it divides the batch into independent smaller losses with fewer negatives.

Under ``torchrun`` every rank embeds its share of the global batch; the cached embeddings are all-gathered so
every rank computes the same global loss over all negatives (REPAIR App. A.2: "cross-device negatives via DDP
gather"), and backpropagates into its own share only (the gather keeps the graph for the local part). Summing
the ranks' parameter gradients (all-reduce SUM) then gives the single-process full-batch gradient.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch

from repair.encoding import Retriever
from repair.training.data import BatchLayout

Objective = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]]


def length_chunks(ids: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """Row indices grouped into mini-batches of ``size`` after sorting by length (less padding per chunk)."""
    order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
    return [order[i:i + size] for i in range(0, len(order), size)]


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def autocast_context(retriever: Retriever, dtype: torch.dtype | None):
    """bf16 autocast on CUDA (App. A.2); nothing on CPU, where training stays in fp32."""
    if dtype is None or retriever.device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda", dtype=dtype)


def embed_cached(retriever: Retriever, ids: Sequence[Sequence[int]], chunks: list[list[int]],
                 autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, list[tuple]]:
    """Step 1: embeddings of all rows without a graph, and the RNG state before each chunk."""
    out = torch.zeros((len(ids), retriever.hidden_size), dtype=torch.float32, device=retriever.device)
    states = []
    with torch.no_grad():
        for rows in chunks:
            states.append(_rng_state(retriever.device))
            with autocast_context(retriever, autocast_dtype):
                emb = retriever.embed(retriever.collate([ids[i] for i in rows]))
            out[torch.as_tensor(rows, device=out.device)] = emb
    return out, states


def backward_chunks(retriever: Retriever, ids: Sequence[Sequence[int]], chunks: list[list[int]],
                    states: list[tuple], grad: torch.Tensor, autocast_dtype: torch.dtype | None = None,
                    check: torch.Tensor | None = None) -> None:
    """Step 3: re-embed each chunk with a graph (same RNG as step 1) and backpropagate its cached gradient.

    ``check`` (the step-1 embeddings) makes it assert that the replay reproduced them (a test hook).
    """
    after = _rng_state(retriever.device)
    for rows, state in zip(chunks, states):
        _set_rng_state(state, retriever.device)
        index = torch.as_tensor(rows, device=grad.device)
        with autocast_context(retriever, autocast_dtype):
            emb = retriever.embed(retriever.collate([ids[i] for i in rows]))
        if check is not None:
            torch.testing.assert_close(emb.detach(), check[index], rtol=1e-4, atol=1e-5)
        torch.autograd.backward(emb, grad_tensors=grad[index])
    _set_rng_state(after, retriever.device)


def gather_rows(local: torch.Tensor, sizes: Sequence[int], rank: int, world: int) -> torch.Tensor:
    """Every rank's rows concatenated in rank order; this rank's block is ``local`` itself, so gradients of
    the result reach ``local`` (all_gather itself carries no gradient). ``sizes`` are known to every rank."""
    if world == 1:
        return local
    width = max(sizes)
    padded = local.new_zeros((width, local.shape[1]))
    padded[:local.shape[0]] = local.detach()
    buffers = [torch.empty_like(padded) for _ in range(world)]
    torch.distributed.all_gather(buffers, padded)
    parts = [buf[:n] for buf, n in zip(buffers, sizes)]
    parts[rank] = local
    return torch.cat(parts, dim=0)


def _empty(retriever: Retriever) -> torch.Tensor:
    return torch.zeros((0, retriever.hidden_size), dtype=torch.float32, device=retriever.device)


def contrastive_step(retriever: Retriever, layout: BatchLayout, objective: Objective, *, mini_batch_size: int,
                     instruction: str | None = None, rank: int = 0, world: int = 1,
                     autocast_dtype: torch.dtype | None = None, check_replay: bool = False) -> dict:
    """Forward + backward of one global batch; parameter ``.grad`` receives this rank's share of the gradient.

    Returns the objective's statistics (identical on every rank). When this rank's queries and documents
    each fit in one mini-batch, the cache pass is skipped (same gradient, one forward fewer).
    """
    q_texts = retriever.format(layout.queries[layout.q_slices[rank]], "query", instruction)
    d_texts = retriever.format(layout.documents[layout.d_slices[rank]], "passage")
    q_ids, d_ids = retriever.tokenize(q_texts), retriever.tokenize(d_texts)
    q_sizes = [s.stop - s.start for s in layout.q_slices]
    d_sizes = [s.stop - s.start for s in layout.d_slices]
    stats: dict
    if len(q_ids) <= mini_batch_size and len(d_ids) <= mini_batch_size:
        with autocast_context(retriever, autocast_dtype):
            q_local = retriever.embed(retriever.collate(q_ids)) if q_ids else _empty(retriever)
            d_local = retriever.embed(retriever.collate(d_ids)) if d_ids else _empty(retriever)
        loss, stats = objective(gather_rows(q_local, q_sizes, rank, world), gather_rows(d_local, d_sizes, rank, world))
        if q_local.requires_grad or d_local.requires_grad:
            loss.backward()
    else:
        q_chunks, d_chunks = length_chunks(q_ids, mini_batch_size), length_chunks(d_ids, mini_batch_size)
        q_cache, q_states = embed_cached(retriever, q_ids, q_chunks, autocast_dtype)
        d_cache, d_states = embed_cached(retriever, d_ids, d_chunks, autocast_dtype)
        q_leaf, d_leaf = q_cache.requires_grad_(), d_cache.requires_grad_()
        loss, stats = objective(gather_rows(q_leaf, q_sizes, rank, world), gather_rows(d_leaf, d_sizes, rank, world))
        loss.backward()
        q_grad = q_leaf.grad if q_leaf.grad is not None else torch.zeros_like(q_leaf)
        d_grad = d_leaf.grad if d_leaf.grad is not None else torch.zeros_like(d_leaf)
        backward_chunks(retriever, q_ids, q_chunks, q_states, q_grad, autocast_dtype,
                        q_cache.detach() if check_replay else None)
        backward_chunks(retriever, d_ids, d_chunks, d_states, d_grad, autocast_dtype,
                        d_cache.detach() if check_replay else None)
    stats["tokens"] = sum(map(len, q_ids)) + sum(map(len, d_ids))
    return stats


def allreduce_gradients(params: Sequence[torch.nn.Parameter], world: int, bucket_numel: int = 1 << 24) -> None:
    """Sum each trainable parameter's gradient over ranks (every rank backpropagated its own share of the
    global loss, so the sum -- not the mean DDP's wrapper takes -- is the full-batch gradient)."""
    if world == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.nn.Parameter] = []
    size = 0
    for p in list(params) + [None]:
        if p is not None:
            bucket.append(p)
            size += p.numel()
        if bucket and (p is None or size >= bucket_numel):
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
            offset = 0
            for q in bucket:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q.grad))
                offset += q.numel()
            bucket, size = [], 0
