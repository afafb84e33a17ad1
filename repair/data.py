"""Reading and writing every file REPAIR stages exchange (DESIGN 4).

- the seed set T0 from the original ``.pt`` (list of dicts), from JSONL ``{query, positive}`` or from a
  BEIR folder + split;
- BEIR folders (``corpus.jsonl[.gz]``, ``queries.jsonl[.gz]``, ``qrels/<split>.tsv[.gz]``);
- a validating JSONL reader whose errors name the file, line and field (the record contract itself:
  :mod:`repair.records`);
- an atomic JSONL/JSON writer (temp file + rename), a flushed line appender for resumable stages and the reader
  of what it wrote (a partial last line skipped);
- the sha256 fingerprint of a file.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import logging
import os
import typing
import uuid
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

# the record contract; re-exported: every stage imports DataError and validate_record from here
from repair.records import DataError, FiniteNumber, check_unicode, json_error, validate_record

logger = logging.getLogger(__name__)

QUERY_KEYS = ("paper_Title", "query", "question")
PASSAGE_KEYS = ("paper_abstract", "passage", "positive", "abstract", "text")
LIST_CONTAINERS = ("data", "items", "records", "examples")
# The file contract owns what every triplet reader and writer (08/09, 09b, the trainer's data and QEM) must agree on:
# the values of ``negative_sources`` (SCHEMAS.md) and the one triplet schema (a line one refuses, all refuse alike).
MINED, GENERATED = "mined", "generated"
NEGATIVE_SOURCES = (MINED, GENERATED)
TRIPLET_REQUIRED = {"query": str, "pos_document": str}
# a score per hard negative; null where a negative has none (09b's generated ones)
TRIPLET_OPTIONAL = {"id": (str, int), "d_neg": str, "hard_negatives": list[str],
                    "hard_negative_scores": list[typing.Optional[FiniteNumber]],
                    "negative_sources": list[str], "negative_traces": list, "concepts": list[str], "source": str,
                    "n_candidates": int}


# ---------------------------------------------------------------------------------------------- JSONL IO
def open_text(path: str | os.PathLike, mode: str = "rt"):
    path = str(path)
    return (gzip.open if path.endswith(".gz") else open)(path, mode, encoding="utf-8")


def numbered_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file (``.gz`` allowed); bytes that are not UTF-8 or a broken gzip
    stream raise :class:`DataError` naming the file (decoding runs in blocks, so the last good line is named)."""
    lineno = 0
    with open_text(path) as fh:
        lines = iter(fh)
        while True:
            try:
                line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: not UTF-8 text{f' after line {lineno}' if lineno else ''} "
                                f"({exc.reason}: byte {exc.object[exc.start:exc.start + 1]!r})") from None
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise DataError(f"{path}: not a readable gzip file{f' after line {lineno}' if lineno else ''} "
                                f"({exc})") from None
            lineno += 1
            yield lineno, line


def iter_jsonl(path: str | os.PathLike, required: dict[str, Any] | None = None,
               optional: dict[str, Any] | None = None, skip_blank: bool = True,
               with_lineno: bool = False, skip_partial_last: bool = False,
               refuse_surrogates: bool = True) -> Iterator[Any]:
    """Yield validated objects from a JSONL file (``.gz`` allowed). Errors name file, line and field; text must be
    valid Unicode (:func:`repair.records.check_unicode`: a ``"\\ud800"`` escape is refused like a wrong type).
    ``refuse_surrogates=False`` is for third-party corpora read whole (a 10^8-record literature dump must not stop
    at one bad character): the caller replaces lone surrogates itself.

    ``with_lineno=True`` yields ``(line_number, object)`` so callers that check nested fields themselves can
    name the line too. ``skip_partial_last=True``: a last line without its newline is skipped, not parsed
    (:func:`iter_appended_jsonl`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    for lineno, line in numbered_lines(path):
        if skip_partial_last and not line.endswith("\n"):  # only the last line can lack it
            logger.info("%s:%d: skipping an incomplete last line (its writer was interrupted or is still writing)",
                        path, lineno)
            return
        if not line.strip():
            if skip_blank:
                continue
            raise DataError(f"{path}:{lineno}: blank line")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise json_error(f"{path}:{lineno}", exc) from None
        if refuse_surrogates:
            check_unicode(record, f"{path}:{lineno}", line)
        record = validate_record(record, f"{path}:{lineno}", required, optional)
        yield (lineno, record) if with_lineno else record


def read_jsonl(path: str | os.PathLike, required: dict[str, Any] | None = None,
               optional: dict[str, Any] | None = None) -> list[dict]:
    return list(iter_jsonl(path, required, optional))


def iter_appended_jsonl(path: str | os.PathLike, required: dict[str, Any] | None = None,
                        optional: dict[str, Any] | None = None, with_lineno: bool = False) -> Iterator[Any]:
    """The records of a file :class:`JsonlAppender` writes (resumable outputs, status files, a train log): a
    missing file has none, and a last line without its newline -- left by a killed run, or being written right
    now -- is skipped; every other line is validated as in :func:`iter_jsonl`. Nothing is written: the appender
    cuts that line when it reopens the file, and a reader never truncates a file another process may append to."""
    if Path(path).exists():
        yield from iter_jsonl(path, required, optional, with_lineno=with_lineno, skip_partial_last=True)


def file_sha256(path: str | os.PathLike, *, prefix: bytes = b"", chunk: int = 1 << 20) -> str:
    """sha256 of ``prefix`` + the file's bytes, read in blocks (a corpus may not fit in memory): the fingerprint a
    stage records for a file it read, and checks before it trusts one. ``prefix`` versions a fingerprint."""
    digest = hashlib.sha256(prefix)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def _atomic_target(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_write(path: str | os.PathLike, write: Callable[[Any], Any]) -> Any:
    """Call ``write(fh)`` on a temp file beside ``path``, fsync, rename: readers never see a half file. The one
    atomic writer of the project; returns what ``write`` returns."""
    path = Path(path)
    tmp = _atomic_target(path)
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            result = write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return result


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write all rows atomically (temp + rename); returns the number of rows."""
    def write(fh) -> int:
        count = 0
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
        return count
    return atomic_write(path, write)


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """Atomic text write, one line per item."""
    atomic_write(path, lambda fh: fh.writelines(line + "\n" for line in lines))


def write_json(path: str | os.PathLike, obj: Any, indent: int = 1) -> None:
    """Atomic JSON write (temp + rename)."""
    atomic_write(path, lambda fh: json.dump(obj, fh, ensure_ascii=False, indent=indent))


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise json_error(f"{path}:{exc.lineno}", exc) from None


class JsonlAppender:
    """Append one complete JSON line at a time (flushed + fsynced) for resumable API stages.

    On open, a trailing partial line left by a killed process is cut off, so the file always holds
    whole records and a resumed run can trust every line it reads back.
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._repair_tail()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _repair_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as fh:
            data = fh.read()
            if data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1
            logger.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted run",
                           self.path, len(data) - cut)
            fh.truncate(cut)

    def append(self, row: dict) -> None:
        self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "JsonlAppender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- BEIR
@dataclass
class BeirData:
    """A BEIR split: corpus ``{doc_id: {"title", "text"}}``, queries of the split, graded qrels."""

    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    name: str = ""

    def doc_text(self, doc_id: str) -> str:
        """Corpus text as BEIR/BMRetriever evaluate it: title + " " + text, stripped."""
        doc = self.corpus[doc_id]
        return (doc.get("title", "") + " " + doc.get("text", "")).strip()


def _find(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{folder}: neither {stem} nor {stem}.gz exists (is this a BEIR folder?)")


def load_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    with open_text(path) as fh:
        for lineno, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
            if not row or (lineno == 1 and row[0] == "query-id"):
                continue
            if len(row) < 3:
                raise DataError(f"{path}:{lineno}: expected 3 tab-separated columns (query-id, corpus-id, score)")
            try:
                score = int(float(row[2]))
            except ValueError:
                raise DataError(f"{path}:{lineno}: field 'score' is not a number: {row[2]!r}") from None
            qrels[row[0]][row[1]] = score
    return dict(qrels)


def load_beir(folder: str | os.PathLike, split: str = "test", load_corpus: bool = True) -> BeirData:
    """Load a BEIR folder; only queries that appear in ``qrels/<split>.tsv`` are kept."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: BEIR folder not found")
    qrels = load_qrels(_find(folder / "qrels", f"{split}.tsv"))
    queries: dict[str, str] = {}
    for rec in iter_jsonl(_find(folder, "queries.jsonl"), required={"_id": (str, int), "text": str}):
        qid = str(rec["_id"])
        if qid in qrels:
            queries[qid] = rec["text"]
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise DataError(f"{folder}: {len(missing)} qrels query ids have no query text (e.g. {missing[0]})")
    corpus: dict[str, dict[str, str]] = {}
    if load_corpus:
        for rec in iter_jsonl(_find(folder, "corpus.jsonl"), required={"_id": (str, int), "text": str},
                              optional={"title": str}):
            corpus[str(rec["_id"])] = {"title": rec.get("title") or "", "text": rec["text"]}
    return BeirData(corpus=corpus, queries=queries, qrels=qrels, name=folder.name)


# ---------------------------------------------------------------------------------------------- seed T0
@dataclass
class SeedSet:
    """T0: row i pairs query i with its positive passage i (DESIGN 4). Empty rows were dropped and counted."""

    queries: list[str]
    passages: list[str]
    source: str = ""
    dropped: int = 0
    query_ids: list[str] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    kept_rows: list[int] = field(default_factory=list)  # row numbers in the source file

    def __len__(self) -> int:
        return len(self.queries)

    def add(self, query: str, passage: str, row: int, query_id: str | None = None, doc_id: str | None = None) -> None:
        """Keep a (query, positive) row of the source, or count it as dropped when either text is empty."""
        if not query or not passage:
            self.dropped += 1
            return
        self.queries.append(query)
        self.passages.append(passage)
        if query_id is not None:
            self.query_ids.append(query_id)
            self.doc_ids.append(doc_id)
        self.kept_rows.append(row)

    def twins(self) -> list[list[int]]:
        """Rows whose passage or query text equals row i's: their passages are positives of i, never negatives.

        The original counted a duplicated passage as a negative of its twin, forcing margins <= 0
        (UPSTREAM 5.18); this is the fix every stage uses.
        """
        by_passage: dict[str, list[int]] = defaultdict(list)
        by_query: dict[str, list[int]] = defaultdict(list)
        for i, (q, p) in enumerate(zip(self.queries, self.passages)):
            by_passage[p].append(i)
            by_query[q].append(i)
        out = []
        for i, (q, p) in enumerate(zip(self.queries, self.passages)):
            group = set(by_passage[p]) | set(by_query[q])
            group.discard(i)
            out.append(sorted(group))
        return out


def _first_text(record: dict, keys: tuple[str, ...]) -> str:
    for key in keys:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _seed_from_records(records: Iterable[tuple[str, dict]], source: str) -> SeedSet:
    seed = SeedSet(queries=[], passages=[], source=source)
    for row, (where, record) in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a dict with a query and a passage, got {type(record).__name__}")
        seed.add(_first_text(record, QUERY_KEYS), _first_text(record, PASSAGE_KEYS), row)
    if seed.dropped:
        logger.info("%s: dropped %d rows with an empty query or passage", source, seed.dropped)
    return seed


def load_torch_file(path: str | os.PathLike, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """``torch.load(weights_only=True)`` (never unpickles code: DESIGN 3) whose failure names the file.

    torch's own message is a paragraph about trusting the source; the :class:`DataError` keeps its one useful
    sentence (the unsupported global or opcode). Every ``.pt`` input and checkpoint goes through here. ``mmap``: map
    the tensors' bytes instead of reading them, so checking a model's ``pytorch_model.bin`` reads only its pickle
    (torch's zip format; a legacy file is read whole).
    """
    import pickle
    import zipfile

    import torch

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        extra = {"mmap": True} if mmap and zipfile.is_zipfile(path) else {}
        return torch.load(path, map_location=map_location, weights_only=True, **extra)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        if isinstance(exc, torch.OutOfMemoryError):  # the file is fine; the device is full
            raise
        text = str(exc)
        marker = "WeightsUnpickler error:"
        if marker in text:
            text = text.split(marker, 1)[1].split("Check the documentation", 1)[0].split(" Please use", 1)[0]
        elif text.startswith("Weights only load failed"):  # torch >= 2.10: the reason is its own paragraph
            reasons = [part for part in text.split("\n\n")[1:] if part.strip()
                       and not part.strip().startswith(("Check the documentation", "Please file an issue"))]
            text = reasons[0] if reasons else text
        reason = " ".join(text.split()).rstrip(".") or type(exc).__name__
        raise DataError(f"{path}: not loadable with torch.load(weights_only=True) ({reason}): it holds objects "
                        f"other than tensors and plain containers, or is not a torch file") from None


def load_seed_pt(path: str | os.PathLike) -> SeedSet:
    """The original ``torch.save``'d list of dicts (or a dict holding it), loaded with ``weights_only=True``."""
    obj = load_torch_file(path)
    if isinstance(obj, dict):
        for key in LIST_CONTAINERS:
            if isinstance(obj.get(key), list):
                obj = obj[key]
                break
    if not isinstance(obj, list):
        raise DataError(f"{path}: expected a list of dicts (or a dict with one of {LIST_CONTAINERS})")
    return _seed_from_records(((f"{path}: item {i}", r) for i, r in enumerate(obj)), str(path))


def load_seed_jsonl(path: str | os.PathLike) -> SeedSet:
    """JSONL with one of the query keys and one of the passage keys per line (``{query, positive}``)."""
    path = Path(path)
    records = []
    for lineno, rec in enumerate(iter_jsonl(path), start=1):
        for key in QUERY_KEYS + PASSAGE_KEYS:
            if key in rec and rec[key] is not None and not isinstance(rec[key], str):
                raise DataError(f"{path}:{lineno}: field '{key}' must be a string, got {type(rec[key]).__name__}")
        if not any(k in rec for k in QUERY_KEYS):
            raise DataError(f"{path}:{lineno}: missing field 'query' (or one of {QUERY_KEYS})")
        if not any(k in rec for k in PASSAGE_KEYS):
            raise DataError(f"{path}:{lineno}: missing field 'positive' (or one of {PASSAGE_KEYS})")
        records.append((f"{path}:{lineno}", rec))
    if not records:  # an empty T0 is a broken input, never a training set of size 0
        raise DataError(f"{path}: no rows to read (an empty file)")
    return _seed_from_records(records, str(path))


def load_seed_beir(folder: str | os.PathLike, split: str = "train", all_positives: bool = False) -> SeedSet:
    """One row per query (its first positive in qrels order), or one row per (query, positive) pair.

    The passage text is title + " " + text, the same text evaluation embeds.
    """
    data = load_beir(folder, split)
    seed = SeedSet(queries=[], passages=[], source=f"{folder}:{split}")
    for qid, rels in data.qrels.items():
        positives = [d for d, s in rels.items() if s > 0]
        if not positives:
            continue
        for did in positives if all_positives else positives[:1]:
            if did not in data.corpus:
                raise DataError(f"{folder}/qrels/{split}.tsv: corpus-id {did} (query {qid}) is not in the corpus")
            seed.add(data.queries[qid].strip(), data.doc_text(did), len(seed.kept_rows) + seed.dropped, qid, did)
    return seed


def load_seed(path: str | os.PathLike, split: str = "train", all_positives: bool = False) -> SeedSet:
    """Dispatch on the path: a folder is BEIR, ``.pt``/``.pth`` the original format, else JSONL."""
    path = Path(path)
    if path.is_dir():
        return load_seed_beir(path, split, all_positives)
    if not path.exists():
        raise FileNotFoundError(f"{path}: seed training data not found")
    if path.suffix in (".pt", ".pth"):
        return load_seed_pt(path)
    return load_seed_jsonl(path)


def read_lines(path: str | os.PathLike) -> list[str]:
    """Non-empty, non-comment lines of a text file (concept lists, key files)."""
    with open(path, encoding="utf-8") as fh:
        return [ln.strip() for ln in io.StringIO(fh.read()) if ln.strip() and not ln.strip().startswith("#")]
