"""The retriever contract (DESIGN 3): one implementation of text -> normalised vector, used everywhere.

Decoder profile (``eos``), exactly the encode recipe of the REPAIR README:
  tokenise without padding, truncate to ``max_length - 1``, append ``eos_token_id`` to every sequence,
  pad (pad = EOS and left padding when the tokenizer has no pad token), take the hidden state of the
  last real token, L2-normalise.
Encoder profile (``mean``): the tokenizer's own special tokens, truncate to ``max_length``, masked mean
  of the token states, L2-normalise (sentence-transformers' recipe for MiniLM-style models).

Training (``repair.training.trainer``) calls :meth:`Retriever.embed` on :meth:`Retriever.collate` output, the very
same path :meth:`Retriever.encode` uses under ``no_grad``, so training and inference cannot disagree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from repair.models import DEFAULT_MODEL, ModelSpec, resolve_model
from repair.runtime import default_dtype, dist_info, pick_device
from repair.text import cap_chars  # the character cap before tokenising (torch-free: every --help states it)

logger = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = "Given a query, retrieve passages that are relevant to the query."
QUERY_TEMPLATE = "{instruction}\nQuery: {text}"
PASSAGE_TEMPLATE = "Represent this passage.\nPassage: {text}"
_FIELD = re.compile(r"\{(instruction|text)\}")

@dataclass(frozen=True)
class TextFormat:
    """Templates with ``{instruction}`` and ``{text}`` fields (filled in one pass, so braces in text are safe)."""

    query: str = QUERY_TEMPLATE
    passage: str = PASSAGE_TEMPLATE
    instruction: str = DEFAULT_INSTRUCTION


EOS_FORMAT = TextFormat()
PLAIN_FORMAT = TextFormat(query="{text}", passage="{text}", instruction="")


def fill_template(template: str, text: str, instruction: str = "") -> str:
    values = {"text": text, "instruction": instruction}
    return _FIELD.sub(lambda m: values[m.group(1)], template)


def last_token_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden state of each row's last real token; correct for left and for right padding."""
    if int(mask[:, -1].sum()) == mask.shape[0]:  # every row ends with a real token (left padding / no pad)
        return hidden[:, -1]
    last = mask.sum(dim=1) - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def is_causal_model(model: torch.nn.Module) -> bool:
    """True when every attention module declares causal attention (HF decoders set ``is_causal = True``)."""
    flags = [m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)
             and "attention" in type(m).__name__.lower()]
    return bool(flags) and all(flags)


def _files_fingerprint(folder: Path, patterns: Sequence[str], content: bool) -> list:
    """Identity of the weight files in a folder: full sha256 (adapters: small) or name/size/mtime (bases)."""
    rows = []
    for pattern in patterns:
        for f in sorted(folder.glob(pattern)):
            if content:
                digest = hashlib.sha256(f.read_bytes()).hexdigest()
                rows.append([f.name, digest])
            else:
                st = f.stat()
                rows.append([f.name, st.st_size, st.st_mtime_ns])
    return rows


def model_identity(base_path: str, adapter_path: str | None, config_hash: str | None = None) -> dict:
    """What the embedding cache key says about the weights: base files (or HF id + commit) and adapter bytes."""
    base = Path(base_path)
    if base.is_dir():
        base_id = {"path": str(base.resolve()),
                   "files": _files_fingerprint(base, ["*.safetensors", "*.bin", "config.json"], content=False)}
    else:
        base_id = {"hub_id": base_path, "commit": config_hash}
    adapter_id = None
    if adapter_path:
        adapter_id = _files_fingerprint(Path(adapter_path), ["adapter_model.*", "adapter_config.json"], content=True)
    return {"base": base_id, "adapter": adapter_id}


class EmbeddingCache:
    """Append-only on-disk vector store for one model fingerprint: ``<root>/<fingerprint>/shard-*.{keys,vecs}.npy``.

    Keys are sha1 digests of the exact formatted text. A shard appears atomically (vectors renamed into
    place before keys; readers only list key files), so an interrupted encode keeps every finished shard
    and several processes (torchrun ranks) can write side by side.
    """

    def __init__(self, root: str | os.PathLike, fingerprint: str, meta: dict | None = None):
        self.dir = Path(root) / fingerprint
        self.dir.mkdir(parents=True, exist_ok=True)
        meta_file = self.dir / "meta.json"
        if meta is not None and not meta_file.exists():
            tmp = meta_file.with_suffix(f".{uuid.uuid4().hex}.tmp")
            tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(tmp, meta_file)
        self._index: dict[bytes, tuple[int, int]] = {}
        self._shards: list[Path] = []
        self._vectors: list[np.ndarray | None] = []
        self._seen: set[str] = set()
        self.refresh()

    def refresh(self) -> None:
        """Pick up shards written since the last look (e.g. by other ranks)."""
        for keys_file in sorted(self.dir.glob("shard-*.keys.npy")):
            if keys_file.name in self._seen:
                continue
            vec_file = keys_file.with_name(keys_file.name.replace(".keys.npy", ".vecs.npy"))
            if not vec_file.exists():
                continue
            keys = np.load(keys_file)
            shard_id = len(self._shards)
            self._shards.append(vec_file)
            self._vectors.append(None)
            for row, key in enumerate(keys.tolist()):
                self._index.setdefault(key, (shard_id, row))
            self._seen.add(keys_file.name)

    def wait_for(self, keys: Iterable[bytes], timeout: float) -> None:
        """Refresh until every key is present: the shards other ranks wrote may show up late on a network
        filesystem whose directory listings are cached (NFS: up to a minute), the usual case with several nodes
        (issue 42). Raises a clear error when they never do (a run folder the nodes do not share)."""
        import time

        deadline = time.monotonic() + timeout
        missing = [k for k in keys if k not in self._index]
        while missing:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.dir}: {len(missing)} vectors other ranks wrote are still not visible after "
                                   f"{timeout:g} s; every node of a multi-node run must share this folder "
                                   f"(OUT_DIR / --cache_dir on a shared filesystem)")
            time.sleep(0.5)
            self.refresh()
            missing = [k for k in missing if k not in self._index]

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def get(self, keys: Sequence[bytes]) -> np.ndarray:
        """Vectors for keys that are all present (float32), gathered shard by shard with fancy indexing."""
        if len(keys) == 0:
            return np.empty((0, 0), dtype=np.float32)
        located = np.array([self._index[k] for k in keys], dtype=np.int64).reshape(-1, 2)
        out = None
        for shard_id in np.unique(located[:, 0]).tolist():
            vecs = self._vectors[shard_id]
            if vecs is None:
                vecs = self._vectors[shard_id] = np.load(self._shards[shard_id], mmap_mode="r")
            if out is None:
                out = np.empty((len(keys), vecs.shape[1]), dtype=np.float32)
            positions = np.nonzero(located[:, 0] == shard_id)[0]
            out[positions] = vecs[np.sort(located[positions, 1])][np.argsort(np.argsort(located[positions, 1]))]
        return out

    def put(self, keys: Sequence[bytes], vectors: np.ndarray) -> None:
        if len(keys) == 0:
            return
        name = f"shard-{uuid.uuid4().hex}"
        keys_arr = np.array(list(keys), dtype="S40")
        vec_tmp, key_tmp = self.dir / f".{name}.vecs.tmp.npy", self.dir / f".{name}.keys.tmp.npy"
        np.save(vec_tmp, np.ascontiguousarray(vectors, dtype=np.float32))
        np.save(key_tmp, keys_arr)
        os.replace(vec_tmp, self.dir / f"{name}.vecs.npy")
        os.replace(key_tmp, self.dir / f"{name}.keys.npy")
        self.refresh()


def link_cache(source_root: str | os.PathLike, target_root: str | os.PathLike) -> int:
    """Hard-link every finished shard of the caches under ``source_root`` (one folder per fingerprint) into
    ``target_root``, so a second run reads vectors another already computed without encoding them again.

    Safe because shards are content-addressed and never changed once written; the target only adds shards of its
    own, which stay out of the source. Vectors are linked before keys, as ``put`` renames them, so a reader that
    lists key files never sees a shard without its vectors. Returns the number of shards linked (0 when done)."""
    source_root, target_root = Path(source_root), Path(target_root)
    linked = 0
    for keys_file in sorted(source_root.glob("*/shard-*.keys.npy")):
        vec_file = keys_file.with_name(keys_file.name.replace(".keys.npy", ".vecs.npy"))
        target = target_root / keys_file.parent.name
        if (target / keys_file.name).exists() or not vec_file.exists():
            continue
        target.mkdir(parents=True, exist_ok=True)
        if (keys_file.parent / "meta.json").exists() and not (target / "meta.json").exists():
            shutil.copy2(keys_file.parent / "meta.json", target / "meta.json")
        if not (target / vec_file.name).exists():
            os.link(vec_file, target / vec_file.name)
        os.link(keys_file, target / keys_file.name)
        linked += 1
    return linked


def text_key(text: str) -> bytes:
    """sha1 of the exact formatted text, as 40 hex bytes (fixed-width numpy 'S' arrays drop trailing NULs,
    so raw digests would not round-trip)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest().encode("ascii")


class Retriever:
    """A backbone (+ optional LoRA adapter) with its pooling profile, text formats and embedding cache."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, pooling: str = "eos", max_length: int = 512,
                 text_format: TextFormat | None = None, device: torch.device | str | None = None,
                 identity: dict | None = None, cache_dir: str | os.PathLike | None = None,
                 batch_size: int = 32, name: str = "", spec: ModelSpec | None = None):
        if pooling not in ("eos", "mean"):
            raise ValueError(f"pooling must be 'eos' or 'mean', got {pooling!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_length = int(max_length)
        self.text_format = text_format or (EOS_FORMAT if pooling == "eos" else PLAIN_FORMAT)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.batch_size = batch_size
        self.spec = spec  # where the weights came from (set by load): base, adapter, pooling
        self.name = name or (spec.name if spec else "")
        self.append_eos = pooling == "eos"
        if self.append_eos and tokenizer.eos_token_id is None:
            raise ValueError("EOS pooling needs a tokenizer with an eos_token_id")
        if tokenizer.pad_token is None:  # the README recipe: pad with EOS on the left
            tokenizer.pad_token = tokenizer.eos_token
            tokenizer.padding_side = "left"
        self.pad_id = tokenizer.pad_token_id
        self.padding_side = tokenizer.padding_side
        self._accepts_use_cache = "use_cache" in getattr(getattr(model, "config", None), "to_dict", dict)()
        # A causal decoder with right padding needs no attention mask: a real token only attends to earlier
        # (real) tokens, so its hidden state is unchanged by the pads after it. Dropping the mask lets SDPA
        # take its is_causal kernel instead of building a padded 4-D mask (bench/encode.py measures it).
        self.skip_mask = (pooling == "eos" and self.padding_side == "right" and is_causal_model(model))
        self.identity = identity
        self.cache: EmbeddingCache | None = None
        if cache_dir is not None and identity is not None:
            self.cache = EmbeddingCache(cache_dir, self.fingerprint(), meta=self.cache_meta())

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, model: str = DEFAULT_MODEL, adapter: str | None = None, *, pooling: str | None = None,
             max_length: int = 512, device: str | torch.device | None = None, dtype: torch.dtype | None = None,
             trust_remote_code: bool = False, cache_dir: str | os.PathLike | None = None,
             text_format: TextFormat | None = None, batch_size: int = 32, trainable: bool = False) -> "Retriever":
        """The one door to a retriever: base by HF id, local folder or alias (``smollm2-135m``, ``minilm``), or a LoRA
        adapter folder standing for its base, + an optional LoRA folder (:func:`repair.models.resolve_model`).

        ``dtype``: of the base weights (default bf16 on CUDA, fp32 on CPU). ``trainable``: the adapter's weights
        require grad and the model is left in train mode, with no embedding cache (its weights are about to change);
        the trainer (:func:`repair.training.trainer.build_retriever`) adds only what a fresh run needs (a new LoRA, activation
        checkpointing).
        """
        from transformers import AutoModel, AutoTokenizer

        if trainable and cache_dir is not None:
            raise ValueError("a trainable retriever cannot use an embedding cache: its weights change")
        spec: ModelSpec = resolve_model(model, pooling, trust_remote_code, adapter=adapter)
        dev = pick_device(device)
        dt = dtype or default_dtype(dev)
        tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_path, trust_remote_code=trust_remote_code)
        base = AutoModel.from_pretrained(spec.path, dtype=dt, trust_remote_code=trust_remote_code)
        if hasattr(base.config, "use_cache"):
            base.config.use_cache = False
        net = base
        if spec.adapter:
            from peft import PeftModel

            net = PeftModel.from_pretrained(base, spec.adapter, is_trainable=trainable)
        net.to(dev)
        net.train(trainable)
        identity = None
        if not trainable:
            identity = model_identity(spec.path, spec.adapter, getattr(base.config, "_commit_hash", None))
            identity["dtype"] = str(dt)
        return cls(net, tokenizer, pooling=spec.pooling, max_length=max_length, text_format=text_format,
                   device=dev, identity=identity, cache_dir=cache_dir, batch_size=batch_size, spec=spec)

    # ------------------------------------------------------------------ identity
    def cache_meta(self) -> dict:
        return {"identity": self.identity, "pooling": self.pooling, "max_length": self.max_length,
                "append_eos": self.append_eos, "padding_side": self.padding_side}

    def fingerprint(self) -> str:
        """Hash of (weights identity, pooling, max_length, EOS rule); the text format lives in each key."""
        blob = json.dumps(self.cache_meta(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:24]

    def describe(self) -> dict:
        """Model identity for meta files and reports."""
        return {"name": self.name, "pooling": self.pooling, "max_length": self.max_length,
                "fingerprint": self.fingerprint(), "text_format": self.text_format.__dict__,
                "identity": self.identity}

    # ------------------------------------------------------------------ text -> ids -> vectors
    def format(self, texts: Iterable[str], kind: str, instruction: str | None = None) -> list[str]:
        if kind == "query":
            instr = self.text_format.instruction if instruction is None else instruction
            return [fill_template(self.text_format.query, t, instr) for t in texts]
        if kind == "passage":
            return [fill_template(self.text_format.passage, t) for t in texts]
        raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")

    def tokenize(self, formatted: Sequence[str]) -> list[list[int]]:
        """Token ids without padding: truncated to max_length-1 plus EOS (decoder) or max_length (encoder).

        The one place texts enter the tokenizer: each is first cut to :func:`char_budget` characters, so a huge
        text costs no more than ``max_length`` tokens' worth of characters.
        """
        if not formatted:
            return []
        formatted = cap_chars(formatted, self.max_length)
        if self.append_eos:
            enc = self.tokenizer(list(formatted), max_length=self.max_length - 1, truncation=True,
                                 padding=False, return_attention_mask=False, return_token_type_ids=False)
            eos = self.tokenizer.eos_token_id
            return [ids + [eos] for ids in enc["input_ids"]]
        enc = self.tokenizer(list(formatted), max_length=self.max_length, truncation=True, padding=False,
                             return_attention_mask=False, return_token_type_ids=False)
        return list(enc["input_ids"])

    def collate(self, sequences: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """Pad a list of id lists into tensors on the model's device, on the tokenizer's padding side."""
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            n = len(seq)
            if self.padding_side == "left":
                ids[row, width - n:] = torch.as_tensor(seq, dtype=torch.long)
                mask[row, width - n:] = 1
            else:
                ids[row, :n] = torch.as_tensor(seq, dtype=torch.long)
                mask[row, :n] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Forward + pool + L2-normalise (float32). Differentiable: the trainer calls this directly."""
        kwargs = {"use_cache": False} if self._accepts_use_cache else {}
        mask = batch["attention_mask"]
        hidden = self.model(input_ids=batch["input_ids"], attention_mask=None if self.skip_mask else mask,
                            **kwargs).last_hidden_state
        pooled = last_token_pool(hidden, mask) if self.pooling == "eos" else mean_pool(hidden, mask)
        return F.normalize(pooled.float(), dim=-1)

    def encode(self, texts: Sequence[str], kind: str = "passage", *, instruction: str | None = None,
               batch_size: int | None = None, max_tokens: int | None = None, show_progress: bool | None = None,
               desc: str | None = None, use_cache: bool = True, flush_every: int = 2048) -> torch.Tensor:
        """Encode texts in the given kind's format; returns a float32 CPU tensor [N, H] in input order.

        Identical texts are encoded once; cached vectors are reused; the rest are sorted by token length
        (longest first) and batched by ``batch_size`` and, if given, a ``max_tokens`` padded-token budget,
        and the original order is restored. Under torch.distributed each rank encodes a share of the missing
        texts into the shared cache and every rank then reads all vectors back.
        """
        formatted = self.format(texts, kind, instruction)
        if not formatted:
            return torch.empty((0, self.hidden_size), dtype=torch.float32)
        keys = [text_key(t) for t in formatted]
        unique: dict[bytes, int] = {}
        for i, key in enumerate(keys):
            unique.setdefault(key, i)
        cache = self.cache if use_cache else None
        rank, world = dist_info()
        if cache is not None and world > 1:
            # every rank must split the same "missing" list: sync, re-read shards written meanwhile, and sync
            # again so that no rank writes a new shard before every rank has taken its snapshot (a fast rank
            # writing early made a slow rank's list shorter, and the two splits then missed texts)
            torch.distributed.barrier()
            cache.refresh()
            torch.distributed.barrier()
        todo = [k for k in unique if cache is None or k not in cache]
        if cache is not None and world > 1:
            todo = todo[rank::world]
        vectors: dict[bytes, np.ndarray] = {}
        if todo:
            fresh_keys, fresh_vecs = [], []
            for key, vec in self._encode_uncached([formatted[unique[k]] for k in todo], todo, batch_size,
                                                  max_tokens, show_progress, desc or f"encode {kind}s"):
                if cache is None:
                    vectors[key] = vec
                    continue
                fresh_keys.append(key)
                fresh_vecs.append(vec)
                if len(fresh_keys) >= flush_every:
                    cache.put(fresh_keys, np.stack(fresh_vecs))
                    fresh_keys, fresh_vecs = [], []
            if cache is not None:
                cache.put(fresh_keys, np.stack(fresh_vecs) if fresh_vecs else np.empty((0, 0)))
        if cache is not None:
            order = list(unique)
            if world > 1:
                torch.distributed.barrier()
                cache.refresh()
                cache.wait_for(order, float(os.environ.get("REPAIR_SHARED_FS_WAIT", "180")))
            table = dict(zip(order, cache.get(order)))
            vectors.update(table)
        out = np.stack([vectors[k] for k in keys]).astype(np.float32, copy=False)
        return torch.from_numpy(out)

    def encode_queries(self, texts: Sequence[str], instruction: str | None = None, **kw) -> torch.Tensor:
        return self.encode(texts, "query", instruction=instruction, **kw)

    def encode_passages(self, texts: Sequence[str], **kw) -> torch.Tensor:
        return self.encode(texts, "passage", **kw)

    @property
    def hidden_size(self) -> int:
        config = getattr(self.model, "config", None)
        return int(getattr(config, "hidden_size", 0) or 0)

    def _encode_uncached(self, formatted: list[str], keys: list[bytes], batch_size: int | None,
                         max_tokens: int | None, show_progress: bool | None, desc: str, block: int = 16384):
        """Yield (key, vector) for texts, tokenising in blocks so a corpus of millions stays in memory."""
        batch_size = batch_size or self.batch_size
        if show_progress is None:
            show_progress = len(formatted) > 4 * batch_size
        bar = tqdm(total=len(formatted), desc=desc, unit="text", disable=not show_progress, mininterval=2.0)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(formatted), block):
                ids = self.tokenize(formatted[start:start + block])
                order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
                for batch_rows in _length_batches(order, ids, batch_size, max_tokens):
                    with torch.inference_mode():
                        emb = self.embed(self.collate([ids[i] for i in batch_rows])).cpu().numpy()
                    for row, vec in zip(batch_rows, emb):
                        yield keys[start + row], vec
                    bar.update(len(batch_rows))
        finally:
            bar.close()
            if was_training:
                self.model.train()


def _length_batches(order: list[int], ids: list[list[int]], batch_size: int, max_tokens: int | None):
    """Group length-sorted rows (longest first) into batches capped by count and padded-token budget."""
    batch: list[int] = []
    for row in order:
        width = len(ids[batch[0]]) if batch else len(ids[row])
        if batch and (len(batch) >= batch_size or (max_tokens and (len(batch) + 1) * width > max_tokens)):
            yield batch
            batch = []
        batch.append(row)
    if batch:
        yield batch
