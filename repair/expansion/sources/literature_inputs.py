"""Reading the corpora an on-disk literature index is built from (issue 41), one paper at a time: BEIR folders
(``corpus.jsonl[.gz]``), ``{id, title, abstract}`` JSONL(.gz), and Semantic Scholar Datasets release shards --
``papers`` (``corpusid``, ``title``, ``externalids.DOI``, ``year``, ``venue``, ``url``) and ``abstracts``
(``corpusid``, ``abstract``), gzipped JSONL joined on ``corpusid`` through :class:`AbstractsMap`, a map on disk
(sqlite), so neither dataset is ever held in memory. Every text is capped (:data:`MAX_TEXT_CHARS`) and made valid
UTF-8 before it reaches the engine. :mod:`repair.expansion.sources.literature` builds and searches the index.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from repair.data import DataError, iter_jsonl, json_error, numbered_lines
from repair.expansion.sources.base import as_int
from repair.text import char_budget

logger = logging.getLogger(__name__)

# A title or abstract is cut to this many characters before it is stored or analysed (the project's character
# cap, repair.text.char_budget, at 4096 tokens: ~400k characters, far beyond any abstract), so one 50 MB line
# costs the build its JSON parse and no more.
MAX_TEXT_CHARS = char_budget(4096)
S2_PAPERS, S2_ABSTRACTS, JSONL = "s2_papers", "s2_abstracts", "jsonl"
JSONL_OPTIONAL = {"_id": (str, int), "id": (str, int), "title": str, "abstract": str, "text": str, "doi": str,
                  "year": (int, str), "venue": str, "url": str}
S2_PAPERS_OPTIONAL = {"title": str, "externalids": dict, "year": (int, str), "venue": str, "url": str}


@dataclass
class Input:
    """One input file of a build, with what identifies it."""

    path: Path
    kind: str = ""
    sha256: str = ""

    def stat_key(self) -> tuple[int, int]:
        st = self.path.stat()
        return st.st_size, st.st_mtime_ns


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """The files of the inputs, in order: a BEIR folder gives its ``corpus.jsonl[.gz]``, another folder all its
    ``*.jsonl`` / ``*.gz`` files (recursively, sorted by path: a downloaded S2 release folder), a file itself."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{path}: input not found")
        if path.is_file():
            files.append(path)
            continue
        beir = [path / n for n in ("corpus.jsonl", "corpus.jsonl.gz") if (path / n).exists()]
        if beir:
            files.append(beir[0])
            continue
        found = sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                       p.relative_to(path).parts) and p.name.endswith((".jsonl", ".gz")))
        if not found:
            raise FileNotFoundError(f"{path}: no corpus.jsonl[.gz] and no *.jsonl or *.gz file in this folder")
        files.extend(found)
    return files


def _first_record(path: Path) -> tuple[int, dict] | None:
    for lineno, line in numbered_lines(path):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise json_error(f"{path}:{lineno}", exc) from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            return lineno, record
    return None


def input_kind(path: Path) -> str:
    """``s2_papers`` (has ``corpusid`` and ``title``), ``s2_abstracts`` (``corpusid`` and ``abstract``, no title)
    or ``jsonl`` (BEIR / ``{id, title, abstract}``), from the file's first record."""
    first = _first_record(path)
    if first is None:
        return JSONL
    _, rec = first
    if "corpusid" in rec:
        if "title" in rec:
            return S2_PAPERS
        if "abstract" in rec:
            return S2_ABSTRACTS
        raise DataError(f"{path}:{first[0]}: a Semantic Scholar record (corpusid) with neither 'title' (papers "
                        "dataset) nor 'abstract' (abstracts dataset)")
    return JSONL


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: Any) -> str:
    """A stored/indexed text: stripped, capped (:data:`MAX_TEXT_CHARS`), lone surrogates (valid JSON, not UTF-8)
    replaced so the engine and every later JSONL writer accept it."""
    if not text:
        return ""
    text = str(text)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS]
    text = text.strip()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # JSON's "\ud800" decodes to a lone surrogate: U+FFFD, as a UTF-8 decoder would
        text = _SURROGATE.sub("\ufffd", text)
    return text


def _paper_record(pid: Any, title: Any, abstract: Any, doi: Any = None, year: Any = None, venue: Any = None,
                  url: Any = None) -> dict:
    rec = {"id": str(pid), "title": _clean(title), "abstract": _clean(abstract)}
    for key, value in (("doi", doi), ("venue", venue), ("url", url)):
        if value:
            rec[key] = _clean(value)
    if as_int(year) is not None:
        rec["year"] = as_int(year)
    return rec


def iter_jsonl_papers(path: Path) -> Iterator[dict | None]:
    """Papers of a BEIR corpus / ``{id, title, abstract}`` JSONL; None for a record with neither title nor text."""
    for lineno, rec in iter_jsonl(path, optional=JSONL_OPTIONAL, with_lineno=True, refuse_surrogates=False):
        pid = rec.get("id", rec.get("_id"))
        if pid is None:
            raise DataError(f"{path}:{lineno}: missing field 'id' (or '_id')")
        abstract = rec.get("abstract") if rec.get("abstract") is not None else rec.get("text")
        paper = _paper_record(pid, rec.get("title"), abstract, rec.get("doi"), rec.get("year"), rec.get("venue"),
                              rec.get("url"))
        yield paper if (paper["title"] or paper["abstract"]) else None


def iter_s2_papers(path: Path, abstracts: "AbstractsMap | None", batch: int = 1024) -> Iterator[dict | None]:
    """Papers of an S2 ``papers`` shard, each with its abstract from the ``abstracts`` map (looked up a batch at a
    time); DOI from ``externalids.DOI``, year and venue kept."""
    pending: list[tuple[int, dict]] = []

    def flush() -> Iterator[dict | None]:
        found = abstracts.get_many([cid for cid, _ in pending]) if abstracts else {}
        for cid, rec in pending:
            ext = rec.get("externalids") or {}
            paper = _paper_record(cid, rec.get("title"), found.get(cid), ext.get("DOI") or ext.get("doi"),
                                  rec.get("year"), rec.get("venue"), rec.get("url"))
            yield paper if (paper["title"] or paper["abstract"]) else None
        pending.clear()

    for rec in iter_jsonl(path, required={"corpusid": int}, optional=S2_PAPERS_OPTIONAL,
                          refuse_surrogates=False):
        pending.append((rec["corpusid"], rec))
        if len(pending) >= batch:
            yield from flush()
    yield from flush()


class AbstractsMap:
    """corpusid -> abstract on disk (sqlite, zlib-compressed text): the S2 join without the papers or abstracts in
    memory. A shard is loaded in one transaction that also records its sha256, so a killed load is redone whole."""

    def __init__(self, path: Path):
        self.path = path
        self.db = sqlite3.connect(str(path))
        self.db.execute("PRAGMA cache_size = -65536")  # 64 MB of page cache, whatever the map's size
        self.db.execute("CREATE TABLE IF NOT EXISTS abstracts (corpusid INTEGER PRIMARY KEY, abstract BLOB)")
        self.db.execute("CREATE TABLE IF NOT EXISTS loaded (sha256 TEXT PRIMARY KEY, path TEXT, records INTEGER)")
        self.db.commit()

    def loaded(self) -> dict[str, tuple[str, int]]:
        return {sha: (path, n) for sha, path, n in self.db.execute("SELECT sha256, path, records FROM loaded")}

    def load(self, shard: Input, bar=None, chunk: int = 4096) -> int:
        n = 0
        rows: list[tuple[int, bytes]] = []
        with self.db:  # one transaction: the shard and its 'loaded' row land together or not at all
            for rec in iter_jsonl(shard.path, required={"corpusid": int}, optional={"abstract": str},
                                  refuse_surrogates=False):
                text = _clean(rec.get("abstract"))
                if not text:
                    continue
                rows.append((rec["corpusid"], zlib.compress(text.encode("utf-8"), 1)))
                if len(rows) >= chunk:
                    self.db.executemany("INSERT OR REPLACE INTO abstracts VALUES (?, ?)", rows)
                    n += len(rows)
                    if bar is not None:
                        bar.update(len(rows))
                    rows.clear()
            self.db.executemany("INSERT OR REPLACE INTO abstracts VALUES (?, ?)", rows)
            n += len(rows)
            if bar is not None:
                bar.update(len(rows))
            self.db.execute("INSERT OR REPLACE INTO loaded VALUES (?, ?, ?)", (shard.sha256, str(shard.path), n))
        return n

    def get_many(self, ids: list[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        for i in range(0, len(ids), 900):  # under sqlite's bound-parameter limit
            part = ids[i:i + 900]
            marks = ",".join("?" * len(part))
            for cid, blob in self.db.execute(f"SELECT corpusid, abstract FROM abstracts WHERE corpusid IN ({marks})",
                                             part):
                out[cid] = zlib.decompress(blob).decode("utf-8")
        return out

    def close(self) -> None:
        self.db.close()
