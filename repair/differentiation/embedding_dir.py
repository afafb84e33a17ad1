"""The embedding dir and step 7 that writes it: every query and document of a :class:`~repair.differentiation.tuples.TupleSet`
embedded once with the current retriever, so steps 8 and 9 score without loading a model.

Layout: ``queries.npy`` / ``documents.npy`` (float32 rows), one text per row in ``queries.jsonl`` /
``documents.jsonl``, the sha1 of each row's text in ``queries.sha1.npy`` / ``documents.sha1.npy`` (the index
steps 8/9 look texts up in), and ``meta.json``, written last, which marks a complete dir. Step 7 runs in one
process, in N spawned workers (``--num_gpus``) or under torchrun; the process group comes from
:func:`repair.runtime.process_group`.

Separate from the tuple reader (:mod:`repair.differentiation.tuples`) and the scoring (:mod:`repair.differentiation.hard_negatives`) because
this is the only Stage III code that touches a model, torch or several processes; 08 and 09 only open its output.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from repair.data import DataError, file_sha256, iter_jsonl, read_json, write_json, write_jsonl
from repair.models import DEFAULT_MODEL
from repair.runtime import cache_dir_flag, dist_info, free_port, process_group, setup_logging
from repair.differentiation.tuples import TupleSet, load_tuples

logger = logging.getLogger(__name__)

EMBEDDING_DIR_FORMAT = "repair-embedding-dir"
EMBEDDING_DIR_VERSION = 1
QUERIES, DOCUMENTS = "queries", "documents"
META_FILE = "meta.json"


def text_sha1(text: str) -> str:
    """Row key of the embedding dir: sha1 of the raw (stripped) text, independent of the model's format."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def write_embedding_dir(out_dir: str | os.PathLike, queries: Sequence[str], documents: Sequence[str],
                        encode: Callable[[list[str], str], np.ndarray], *, chunk: int = 65536,
                        write: bool = True) -> int:
    """Encode texts chunk by chunk (``encode(texts, "query"|"passage")``) into ``queries.npy``/``documents.npy``.

    Rows follow the given text order; ``<name>.jsonl`` holds ``{"text"}`` per row and ``<name>.sha1.npy`` the
    sha1 of each text (:func:`text_sha1`; the index steps 8/9 look texts up in). Vectors stream into
    a memory-mapped temp file renamed into place, so a corpus larger than RAM works and a killed run never
    leaves a half array. ``meta.json`` is removed first and written last (:func:`write_embedding_meta`): it
    marks a complete dir. With ``write=False`` (torch.distributed ranks > 0) only ``encode`` is called.
    Returns the vector width.
    """
    out = Path(out_dir)
    if write:
        out.mkdir(parents=True, exist_ok=True)
        (out / META_FILE).unlink(missing_ok=True)
    dim = 0
    for name, texts, kind in ((QUERIES, queries, "query"), (DOCUMENTS, documents, "passage")):
        tmp = out / f".{name}.npy.tmp"
        array = None
        for start in range(0, len(texts), chunk):
            vecs = np.asarray(encode(list(texts[start:start + chunk]), kind), dtype=np.float32)
            if dim and vecs.shape[1] != dim:
                raise ValueError(f"encoder returned width {vecs.shape[1]} for {name}, {dim} before")
            dim = vecs.shape[1]
            if write:
                if array is None:
                    array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(len(texts), dim))
                array[start:start + len(vecs)] = vecs
        if write:
            if array is None:
                with open(tmp, "wb") as fh:
                    np.save(fh, np.empty((0, dim), dtype=np.float32))
            else:
                array.flush()
                del array
            os.replace(tmp, out / f"{name}.npy")
            digests = [text_sha1(t) for t in texts]
            write_jsonl(out / f"{name}.jsonl", ({"text": t} for t in texts))
            sha_tmp = out / f".{name}.sha1.npy.tmp"
            with open(sha_tmp, "wb") as fh:
                np.save(fh, np.array(digests, dtype="S40"))
            os.replace(sha_tmp, out / f"{name}.sha1.npy")
    return dim


def write_embedding_meta(out_dir: str | os.PathLike, meta: dict) -> None:
    write_json(Path(out_dir) / META_FILE, {"format": EMBEDDING_DIR_FORMAT, "version": EMBEDDING_DIR_VERSION, **meta})


@dataclass
class EmbeddingDir:
    """A complete step-7 output opened read-only (vectors memory-mapped)."""

    path: Path
    meta: dict
    queries: np.ndarray
    documents: np.ndarray
    query_index: dict[str, int]
    document_index: dict[str, int]
    _document_texts: list[str] | None = None

    @classmethod
    def open(cls, path: str | os.PathLike) -> "EmbeddingDir":
        path = Path(path)
        if not (path / META_FILE).exists():
            raise FileNotFoundError(f"{path}: no {META_FILE}; not a complete embedding dir "
                                    f"(run differentiation/07_embed_candidates.py, or let it finish)")
        meta = read_json(path / META_FILE)
        if meta.get("format") != EMBEDDING_DIR_FORMAT or meta.get("version") != EMBEDDING_DIR_VERSION:
            raise DataError(f"{path / META_FILE}: not a {EMBEDDING_DIR_FORMAT} v{EMBEDDING_DIR_VERSION} meta file")
        arrays, indexes = {}, {}
        for name in (QUERIES, DOCUMENTS):
            arrays[name] = np.load(path / f"{name}.npy", mmap_mode="r")
            digests = np.load(path / f"{name}.sha1.npy")
            if arrays[name].shape[0] != len(digests):
                raise DataError(f"{path}: {name}.npy has {arrays[name].shape[0]} rows but {name}.sha1.npy "
                                f"lists {len(digests)} texts")
            index: dict[str, int] = {}
            for row, digest in enumerate(digests.tolist()):
                index.setdefault(digest.decode("ascii"), row)
            indexes[name] = index
        return cls(path, meta, arrays[QUERIES], arrays[DOCUMENTS], indexes[QUERIES], indexes[DOCUMENTS])

    @property
    def fingerprint(self) -> str:
        return str(self.meta.get("retriever", {}).get("fingerprint", ""))

    def document_texts(self) -> list[str]:
        if self._document_texts is None:
            self._document_texts = [r["text"] for r in iter_jsonl(self.path / f"{DOCUMENTS}.jsonl",
                                                                  required={"text": str})]
        return self._document_texts

    def align(self, tuples: TupleSet) -> tuple[np.ndarray, np.ndarray]:
        """Embedding rows of every tuple-set query and document; a clear error names a tuple with a missing text."""
        q_map = np.array([self.query_index.get(text_sha1(t), -1) for t in tuples.queries.texts], dtype=np.int64)
        d_map = np.array([self.document_index.get(text_sha1(t), -1) for t in tuples.documents.texts], dtype=np.int64)
        if len(tuples) == 0:
            return q_map, d_map
        for what, rows in (("query", q_map[tuples.query_rows]), ("positive document", d_map[tuples.pos_rows])):
            bad = np.flatnonzero(rows < 0)
            if len(bad):
                self._missing(tuples, int(bad[0]), what, len(bad))
        if len(tuples.cand_rows):
            bad = np.flatnonzero(d_map[tuples.cand_rows] < 0)
            if len(bad):
                t = int(np.searchsorted(tuples.cand_offsets, bad[0], side="right") - 1)
                pos = int(bad[0] - tuples.cand_offsets[t])
                self._missing(tuples, t, f"negative candidate #{pos}", len(bad))
        return q_map, d_map

    def _missing(self, tuples: TupleSet, t: int, what: str, n: int) -> None:
        built_from = self.meta.get("input", {}).get("paths")
        raise DataError(f"{self.path}: no vector for the {what} of tuple '{tuples.ids[t]}' ({tuples.where[t]}); "
                        f"{n} such texts are missing. This embedding dir was built from {built_from}: rerun "
                        f"differentiation/07_embed_candidates.py on this input")

    def check_input(self, paths: Sequence[str | os.PathLike]) -> None:
        """Log whether the input is the file the dir was built from (texts are checked by :meth:`align`)."""
        built = self.meta.get("input", {})
        same = [str(p) for p in paths] == built.get("paths") and \
            [file_sha256(p) for p in paths] == built.get("sha256")
        logger.info("embedding dir %s: retriever %s (fingerprint %s), %s", self.path,
                    self.meta.get("retriever", {}).get("name"), self.fingerprint,
                    "built from this input" if same else f"built from {built.get('paths')}; checking texts")


# ---------------------------------------------------------------------------------------------- step 7
@dataclass
class EmbedConfig:
    """Everything step 7 needs, picklable so spawned worker processes receive it."""

    input_jsonl: list[str]
    output_dir: str
    model: str = DEFAULT_MODEL
    adapter: str | None = None
    pooling: str | None = None
    max_length: int = 512
    batch_size: int = 32
    max_tokens: int | None = None
    device: str | None = None
    cache_dir: str | None = None
    instruction: str | None = None
    trust_remote_code: bool = False
    chunk: int = 65536
    show_progress: bool | None = None


def embed_candidates(retriever, tuples: TupleSet, config: EmbedConfig) -> dict:
    """Step 7 with a loaded retriever: write the embedding dir; returns its meta (rank 0) or {} (other ranks).

    Every rank calls :meth:`Retriever.encode`, which (with a cache, under torch.distributed) encodes a share
    of the missing texts and reads all back; rank 0 alone writes. ``texts_forwarded`` counts texts that went
    through the model on all ranks (0 on a rerun with the same model: everything came from the cache).
    """
    import torch

    rank, world = dist_info()
    if len(tuples) == 0:
        raise DataError(f"{config.input_jsonl}: no tuples to embed")
    if world > 1 and retriever.cache is None:
        raise ValueError("several processes need the embedding cache (cache_dir) to share their work")
    forwarded = [0]

    def count(_module, args, kwargs):
        ids = kwargs.get("input_ids") if kwargs else None
        forwarded[0] += int((ids if ids is not None else args[0]).shape[0])

    hook = retriever.model.register_forward_pre_hook(count, with_kwargs=True)
    t0 = time.perf_counter()
    try:
        def encode(texts: list[str], kind: str) -> np.ndarray:
            if world > 1:
                # every rank must have refreshed its cache view before any rank adds shards: the share of
                # missing texts each rank takes is computed from that view (repair.encoding.Retriever.encode)
                torch.distributed.barrier()
            return retriever.encode(texts, kind, instruction=config.instruction if kind == "query" else None,
                                    batch_size=config.batch_size, max_tokens=config.max_tokens,
                                    show_progress=config.show_progress, desc=f"07 encode {kind}s").numpy()

        dim = write_embedding_dir(config.output_dir, tuples.queries.texts, tuples.documents.texts, encode,
                                  chunk=config.chunk, write=rank == 0)
    finally:
        hook.remove()
    total = torch.tensor([forwarded[0]], dtype=torch.long, device=retriever.device)
    if world > 1:
        torch.distributed.all_reduce(total)
    if rank != 0:
        return {}
    instruction = retriever.text_format.instruction if config.instruction is None else config.instruction
    meta = {"retriever": retriever.describe(), "query_instruction": instruction,
            "dim": dim, "n_queries": len(tuples.queries), "n_documents": len(tuples.documents),
            "input": {"paths": [str(p) for p in config.input_jsonl],
                      "sha256": [file_sha256(p) for p in config.input_jsonl], "tuples": len(tuples)},
            "load": asdict(tuples.stats), "texts_forwarded": int(total.item()), "processes": world,
            "seconds": round(time.perf_counter() - t0, 3)}
    write_embedding_meta(config.output_dir, meta)
    return meta


def run_embedding(config: EmbedConfig) -> dict:
    """Load the tuples and the retriever (on this rank's device) and run step 7."""
    from repair.encoding import Retriever

    rank, world = dist_info()
    tuples = load_tuples(config.input_jsonl)
    cache_dir = cache_dir_flag(config.cache_dir, Path(config.output_dir) / "cache")
    device = config.device
    if world > 1 and (device is None or device.startswith("cuda")):
        import torch

        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", rank))
            device = f"cuda:{local}"
            torch.cuda.set_device(local)
    retriever = Retriever.load(config.model, config.adapter, pooling=config.pooling, max_length=config.max_length,
                               device=device, cache_dir=cache_dir, trust_remote_code=config.trust_remote_code,
                               batch_size=config.batch_size)
    if rank == 0:
        logger.info("07: %d tuples, %d distinct queries, %d distinct documents; retriever %s (%s) on %s, "
                    "%d process(es)", len(tuples), len(tuples.queries), len(tuples.documents), retriever.name,
                    retriever.fingerprint(), retriever.device, world)
    return embed_candidates(retriever, tuples, config)


def _spawned_worker(rank: int, world: int, port: int, config: EmbedConfig) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    import torch

    if not torch.cuda.is_available() or (config.device or "").startswith("cpu"):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # CPU workers share the cores

    setup_logging("INFO" if rank == 0 else "WARNING")
    distributed_embedding(config)


def distributed_embedding(config: EmbedConfig) -> dict:
    """Run step 7 in a torch.distributed group from the environment (torchrun or a spawned worker)."""
    with process_group(config.device):
        return run_embedding(config)


def launch_embedding(config: EmbedConfig, nprocs: int) -> dict:
    """``--num_gpus N``: N processes (torch.multiprocessing spawn), one per GPU (or CPU workers with gloo).

    Under torchrun (WORLD_SIZE set) the launcher already made the processes; each joins the group instead.
    Returns the meta written by rank 0 (read back from the dir in the parent of spawned workers).
    """
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if max(world, nprocs) > 1 and cache_dir_flag(config.cache_dir, Path(config.output_dir) / "cache") is None:
        raise ValueError(f"--cache_dir {config.cache_dir}: {max(world, nprocs)} processes share their work through "
                         f"the embedding cache; drop --cache_dir none or run one process")
    if world > 1:
        return distributed_embedding(config)
    if nprocs <= 1:
        return run_embedding(config)
    if torch.cuda.is_available() and (config.device is None or config.device.startswith("cuda")):
        if nprocs > torch.cuda.device_count():
            raise ValueError(f"--num_gpus {nprocs} but only {torch.cuda.device_count()} CUDA devices are visible")
    torch.multiprocessing.spawn(_spawned_worker, args=(nprocs, free_port(), config), nprocs=nprocs, join=True)
    return read_json(Path(config.output_dir) / META_FILE)
