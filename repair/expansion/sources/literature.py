"""The literature on the user's own disk: an on-disk BM25 index (tantivy) built by one streaming pass, and the
verification source 06 searches in it (issue 41, DESIGN 7).

``build_index`` streams BEIR folders (``corpus.jsonl[.gz]``), ``{id, title, abstract}`` JSONL(.gz) and Semantic
Scholar Datasets release shards (``papers`` + ``abstracts``, gzipped JSONL joined on ``corpusid``; read by
:mod:`repair.expansion.sources.literature_inputs`) into ``<index>/tantivy``; no corpus is ever held in memory.
The S2 join loads the ``abstracts`` shards first into a disk-backed map (``<index>/s2_abstracts.sqlite``, one
transaction per shard) and looks each ``papers`` record's abstract up there: memory stays at sqlite's page cache
whatever the release size (10^8 abstracts), at the price of disk (the map holds the abstracts zlib-compressed;
delete it once no ``papers`` shard is left to add).
Resumable per input file: each file is one tantivy commit, and ``manifest.json`` records the commit it expects
(``pending``) before making it, so a killed build knows on restart whether that file's commit landed (the
index's document count says) and redoes only the unfinished file. Building again with the same inputs does
nothing (an input is known by its sha256; path, size and mtime skip the hashing of unchanged files).

:class:`LiteratureIndex` opens the index read-only (tantivy memory-maps its files, so the pages are shared by every
process that opens it and count as RssFile, not RssAnon) and reads each hit's paper from the index's own store.
``search`` releases the GIL inside tantivy; ``search_many`` runs a batch on threads.

Agreement with :mod:`repair.expansion.sources.local_corpus` (bm25s, the small-corpus source): the same text
(title + " " + abstract), the same analyzer (bm25s' default token pattern ``(?u)\\b\\w\\w+\\b``, lowercase, the
33-word Lucene English stopword list that is bm25s' ``"en"`` list; no stemming) and the same BM25 family (Lucene's
idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``, a query term counted once per occurrence). Two differences remain,
both tantivy's fixed choices: k1 = 1.2 (bm25s here: 1.5; b = 0.75 in both) and document lengths stored in
tantivy's one-byte field-norm code (exact up to ~40 tokens, within a few percent above). On a recorded run's 05
queries they made the top hit differ for 8.4% of queries, so by default (``exact=True``) the engine only proposes:
its top ``max(k, pool)`` papers are rescored with bm25s' own formula (k1 = 1.5, each paper's exact length and term
counts from its stored text analysed again, idf from the engine's document frequencies, the engine's average
length) and the best ``k`` of them returned, ties by build order. The engine's ranking is what is approximate, the
returned scores are bm25s' exactly (up to float rounding), so ``min_score`` means the same thing in both.
``exact=False`` returns the engine's ranking with its scores divided by 1 + k1 (Lucene's / bm25s' scale).
``bench/literature_agreement.py`` measures how often the two agree (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from repair.data import DataError, file_sha256, read_json, write_json
from repair.expansion.sources.base import Paper, as_int
from repair.expansion.sources.bm25_rescore import explained_average_length, lucene_bm25, lucene_idf
from repair.expansion.sources.literature_inputs import (MAX_TEXT_CHARS, S2_ABSTRACTS, S2_PAPERS, AbstractsMap, Input,
                                                        expand_inputs, input_kind, iter_jsonl_papers, iter_s2_papers)

logger = logging.getLogger(__name__)

FORMAT = "repair-literature-index/1"  # bumped when the layout or the stored record changes
ENGINE = "tantivy"
MANIFEST = "manifest.json"
ENGINE_DIR = "tantivy"
ABSTRACTS_DB = "s2_abstracts.sqlite"
TOKENIZER_NAME = "repair_bm25s_en"
# Lucene's English stop words (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET): bm25s' stopwords="en" list, which
# LocalCorpus uses; tests/test_literature_index.py checks the two lists are equal.
STOPWORDS_EN = ("a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no",
                "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this",
                "to", "was", "will", "with")
TOKEN_PATTERN = r"(?u)\b\w\w+\b"  # bm25s.tokenize's default
K1, B = 1.2, 0.75  # tantivy's BM25 constants (not settable)
EXACT_K1 = 1.5  # LocalCorpus' k1 (bm25s, method "lucene"): what exact rescoring computes
RESCORE_POOL = 50  # papers the engine proposes per query for exact rescoring (at least k)
ANALYZER = {"tokenizer": "regex", "pattern": TOKEN_PATTERN, "filters": ["lowercase", "stopwords"],
            "stopwords": list(STOPWORDS_EN), "stemmer": None, "text": "title + ' ' + abstract",
            "max_text_chars": MAX_TEXT_CHARS}
BM25 = {"k1": K1, "b": B, "idf": "ln(1 + (N - df + 0.5) / (df + 0.5))", "length": "tantivy field-norm code",
        "reported_score": "tantivy score / (1 + k1): Lucene's and bm25s' scale"}
# (what an index was built with, compared on open; exact rescoring is the reader's choice, not recorded there)
HEAP_MB_PER_THREAD = 256  # tantivy's indexing buffer per thread (its minimum is ~15 MB)


class LiteratureIndexError(DataError):
    """An index that cannot be used as it is (missing, corrupt, unfinished, or built by another engine, format or
    analyzer): one line naming the folder and what to do (a user error: exit status 2)."""


def engine_version() -> tuple[str, int | None]:
    """(tantivy's version, its on-disk index format) of the installed engine."""
    import tantivy

    text = str(getattr(tantivy, "__version__", ""))  # "tantivy v0.27.0, index_format v7"
    version, index_format = "", None
    for part in text.replace(",", " ").split():
        if part.startswith("v") and part[1:2].isdigit():
            if version:
                index_format = as_int(part[1:])
            else:
                version = part[1:]
    if not version:
        from importlib.metadata import version as dist_version

        version = dist_version("tantivy")
    return version, index_format


def _analyzer():
    import tantivy

    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(TOKEN_PATTERN))
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(list(STOPWORDS_EN)))
            .build())


def _schema():
    import tantivy

    sb = tantivy.SchemaBuilder()
    # positions are not needed for BM25 over terms: "freq" keeps the index smaller
    sb.add_text_field("text", stored=False, tokenizer_name=TOKENIZER_NAME, index_option="freq")
    sb.add_bytes_field("paper", stored=True)  # the paper as compact JSON, read back for each hit
    sb.add_unsigned_field("ord", fast=True)  # build order: ties rank the earlier paper first, as in LocalCorpus
    return sb.build()


# ------------------------------------------------------------------------------------------ manifest
def _new_manifest() -> dict:
    version, index_format = engine_version()
    return {"format": FORMAT, "engine": {"name": ENGINE, "version": version, "index_format": index_format},
            "analyzer": ANALYZER, "bm25": BM25, "papers": 0, "inputs": [], "pending": None, "complete": False}


def read_manifest(index_dir: str | os.PathLike) -> dict:
    """The manifest of a built index; :class:`LiteratureIndexError` (one line) when it is missing or unreadable."""
    path = Path(index_dir) / MANIFEST
    if not Path(index_dir).is_dir():
        raise LiteratureIndexError(f"{index_dir}: no such literature index folder (build one with: python -m "
                          "repair.expansion.sources.literature build CORPUS... --index DIR)")
    if not path.exists():
        raise LiteratureIndexError(f"{index_dir}: not a literature index (no {MANIFEST}; build one with: python -m "
                          "repair.expansion.sources.literature build CORPUS... --index DIR)")
    try:
        manifest = read_json(path)
    except (DataError, UnicodeDecodeError) as exc:
        raise LiteratureIndexError(f"{path}: corrupt index manifest ({' '.join(str(exc).split())}); rebuild the "
                                   "index") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("inputs"), list):
        raise LiteratureIndexError(f"{path}: corrupt index manifest (not an index manifest object); rebuild the index")
    return manifest


def check_compatible(manifest: dict, where: str | os.PathLike) -> None:
    """Refuse (one line) an index of another format, engine, on-disk index format, analyzer or BM25 setting: its
    scores would not be this code's. Another tantivy version with the same index format is accepted."""
    version, index_format = engine_version()
    engine = manifest.get("engine") or {}
    if manifest.get("format") != FORMAT:
        raise LiteratureIndexError(f"{where}: index format {manifest.get('format')!r}, this code reads {FORMAT!r}; "
                                   "rebuild the index into a new folder")
    if engine.get("name") != ENGINE or engine.get("index_format") != index_format:
        raise LiteratureIndexError(f"{where}: built by {engine.get('name')} {engine.get('version')} (index format "
                          f"{engine.get('index_format')}), this reader is {ENGINE} {version} (index format "
                          f"{index_format}); rebuild the index or install the engine that built it")
    for key, ours in (("analyzer", ANALYZER), ("bm25", BM25)):
        if manifest.get(key) != ours:
            theirs = manifest.get(key) or {}
            diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k)) if isinstance(
                theirs, dict) else [key]
            raise LiteratureIndexError(f"{where}: built with another {key} (differs in {', '.join(diff)}); rebuild "
                                       "the index into a new folder")
    if engine.get("version") != version:
        logger.info("%s: built by tantivy %s, read by %s (same index format %s)", where, engine.get("version"),
                    version, index_format)


def _num_docs(index) -> int:
    index.reload()
    return index.searcher().num_docs


def _open_engine(folder: Path, create: bool):
    """The tantivy index in ``folder`` with the analyzer registered; engine errors become one line."""
    import tantivy

    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
            index = tantivy.Index(_schema(), path=str(folder), reuse=True)
        else:
            index = tantivy.Index.open(str(folder))
    except (ValueError, OSError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise LiteratureIndexError(f"{folder}: the index cannot be opened ({reason}); the index is damaged: rebuild "
                                   "it into a new folder") from None
    index.register_tokenizer(TOKENIZER_NAME, _analyzer())
    return index


# ------------------------------------------------------------------------------------------ build
def _identify(files: list[Path], manifest: dict) -> tuple[list[Input], list[Input]]:
    """(done, todo) inputs. A file is done when an input of the manifest has its path, size and mtime, or its
    sha256; a path indexed before whose content changed is an error (the index holds the old papers)."""
    by_path = {e["path"]: e for e in manifest["inputs"]}
    by_sha = {e["sha256"]: e for e in manifest["inputs"]}
    done, todo, seen = [], [], set()
    for path in files:
        inp = Input(path.resolve())
        entry = by_path.get(str(inp.path))
        size, mtime = inp.stat_key()
        if entry and (entry.get("size"), entry.get("mtime_ns")) == (size, mtime):
            inp.sha256, inp.kind = entry["sha256"], entry["kind"]
        else:
            inp.sha256 = file_sha256(inp.path)
            if entry and entry["sha256"] != inp.sha256:
                raise DataError(f"{inp.path}: changed since it was indexed into this index (sha256 "
                                f"{entry['sha256'][:12]}... -> {inp.sha256[:12]}...); build into a new --index folder")
        if inp.sha256 in seen:
            logger.info("%s: the same file as an earlier input (sha256); indexed once", inp.path)
            continue
        seen.add(inp.sha256)
        if inp.sha256 in by_sha:
            inp.kind = by_sha[inp.sha256]["kind"]
            done.append(inp)
        else:
            inp.kind = input_kind(inp.path)
            todo.append(inp)
    return done, todo


def _entry(inp: Input, papers: int, skipped: int = 0, **extra) -> dict:
    size, mtime = inp.stat_key()
    return {"path": str(inp.path), "kind": inp.kind, "sha256": inp.sha256, "size": size, "mtime_ns": mtime,
            "papers": papers, "skipped": skipped, **extra}


def _reconcile(index_dir: Path, manifest: dict, index) -> None:
    """After a killed build: whether the pending file's commit landed (the document count says so)."""
    count = _num_docs(index)
    pending = manifest.get("pending")
    if pending and count == pending["docs_before"] + pending["entry"]["papers"] and pending["entry"]["papers"]:
        manifest["inputs"].append(pending["entry"])
        manifest["papers"] = count
        logger.info("%s: the last build committed %s before it stopped; kept", index_dir, pending["entry"]["path"])
    elif count != manifest["papers"]:
        raise LiteratureIndexError(f"{index_dir}: the index holds {count} papers, its manifest says "
                                   f"{manifest['papers']}; the index is damaged: rebuild it into a new folder")
    manifest["pending"] = None


def build_index(inputs: list[str | Path], index_dir: str | Path, *, threads: int = 1, progress: bool = True,
                heap_mb: int | None = None) -> dict:
    """Stream ``inputs`` (BEIR folders, ``{id, title, abstract}`` JSONL, S2 ``papers``/``abstracts`` shards or
    folders of them) into the index at ``index_dir``; return the build's statistics (``papers``: in the index,
    ``added``: by this call, ``seconds`` ...).

    One tantivy commit per input file, recorded in the manifest (see the module docstring): a killed build resumes
    at the unfinished file and ends equal to an uninterrupted one; the same inputs again do nothing. ``threads``
    are tantivy's indexing threads (the JSON parsing stays on this one); ``heap_mb`` its buffer (default
    :data:`HEAP_MB_PER_THREAD` per thread)."""
    from tqdm import tqdm

    t0 = time.time()
    index_dir = Path(index_dir).expanduser()
    files = expand_inputs(inputs)
    if (index_dir / MANIFEST).exists():
        manifest = read_manifest(index_dir)
        check_compatible(manifest, index_dir)
    elif index_dir.exists() and any(index_dir.iterdir()):
        raise LiteratureIndexError(f"{index_dir}: the folder exists and holds no literature index ({MANIFEST}); "
                                   "choose an empty or new --index folder")
    else:
        index_dir.mkdir(parents=True, exist_ok=True)
        manifest = _new_manifest()
        write_json(index_dir / MANIFEST, manifest)
    if (index_dir / ENGINE_DIR / "meta.json").exists():  # a killed build: did its last commit land?
        _reconcile(index_dir, manifest, _open_engine(index_dir / ENGINE_DIR, create=False))
        write_json(index_dir / MANIFEST, manifest)
    done, todo = _identify(files, manifest)
    stats = {"index": str(index_dir), "inputs": len(done) + len(todo), "inputs_done_before": len(done), "added": 0,
             "skipped": 0, "abstracts_loaded": 0, "papers_without_abstract": 0}
    if not todo and not manifest.get("pending") and manifest.get("complete"):
        logger.info("%s: all %d inputs are indexed already (%d papers); nothing to do", index_dir, len(done),
                    manifest["papers"])
        return {**stats, "papers": manifest["papers"], "seconds": round(time.time() - t0, 3),
                "index_bytes": _folder_bytes(index_dir)}
    index = _open_engine(index_dir / ENGINE_DIR, create=True)
    try:
        writer = index.writer(heap_size=(heap_mb or HEAP_MB_PER_THREAD * max(1, threads)) * 1_000_000,
                              num_threads=max(1, threads))
    except ValueError as exc:  # another build holds the writer lock
        reason = " ".join(str(exc).split())[:200]
        raise LiteratureIndexError(f"{index_dir}: cannot write the index ({reason}); is another build running on "
                                   "it?") from None
    writer.garbage_collect_files()  # segments a killed build wrote and never committed
    manifest["complete"] = False
    write_json(index_dir / MANIFEST, manifest)
    done_kinds = {e["kind"] for e in manifest["inputs"]}

    abstracts_in = [i for i in todo if i.kind == S2_ABSTRACTS]
    papers_in = [i for i in todo if i.kind != S2_ABSTRACTS]
    amap = None
    if abstracts_in or S2_ABSTRACTS in done_kinds or any(i.kind == S2_PAPERS for i in papers_in):
        if abstracts_in and S2_PAPERS in done_kinds:
            raise DataError(f"{abstracts_in[0].path}: an S2 abstracts shard added after papers shards were indexed "
                            "(those papers would miss its abstracts); give every abstracts shard with the papers "
                            "shards, in a new --index folder")
        amap = AbstractsMap(index_dir / ABSTRACTS_DB)
    try:
        if abstracts_in:
            loaded = amap.loaded()
            bar = tqdm(desc="abstracts", unit="abstract", disable=not progress, dynamic_ncols=True)
            for inp in abstracts_in:
                n = loaded[inp.sha256][1] if inp.sha256 in loaded else amap.load(inp, bar)
                stats["abstracts_loaded"] += n
                manifest["inputs"].append(_entry(inp, 0, abstracts=n))
                write_json(index_dir / MANIFEST, manifest)
            bar.close()
        if any(i.kind == S2_PAPERS for i in papers_in) and S2_ABSTRACTS not in {e["kind"] for e in manifest["inputs"]}:
            logger.warning("S2 papers shards without any abstracts shard: their papers are indexed by title only")
        bar = tqdm(desc="index", unit="paper", disable=not progress, dynamic_ncols=True)
        for inp in papers_in:
            bar.set_postfix_str(inp.path.name, refresh=False)
            added, skipped, no_abstract = _index_file(writer, inp, manifest["papers"], amap, bar)
            entry = _entry(inp, added, skipped)
            manifest["pending"] = {"docs_before": manifest["papers"], "entry": entry}
            write_json(index_dir / MANIFEST, manifest)
            writer.commit()
            manifest["inputs"].append(entry)
            manifest["papers"] += added
            manifest["pending"] = None
            write_json(index_dir / MANIFEST, manifest)
            stats["added"] += added
            stats["skipped"] += skipped
            stats["papers_without_abstract"] += no_abstract
            if skipped:
                logger.warning("%s: %d records with neither title nor abstract skipped", inp.path, skipped)
        bar.close()
    finally:
        if amap is not None:
            amap.close()
    writer.wait_merging_threads()
    count = _num_docs(index)
    if count != manifest["papers"]:
        raise LiteratureIndexError(f"{index_dir}: the index holds {count} papers after the build, its manifest says "
                          f"{manifest['papers']}; rebuild it into a new folder")
    manifest["complete"] = True
    write_json(index_dir / MANIFEST, manifest)
    seconds = time.time() - t0
    logger.info("%s: %d papers (%d added from %d files) in %.1f s", index_dir, count, stats["added"], len(todo),
                seconds)
    return {**stats, "papers": count, "seconds": round(seconds, 3), "index_bytes": _folder_bytes(index_dir)}


def _index_file(writer, inp: Input, ord0: int, amap: AbstractsMap | None, bar) -> tuple[int, int, int]:
    """Add one input's papers (``ord`` numbered from ``ord0``); (added, skipped, without abstract)."""
    import tantivy

    # tests only: die (uncommitted) once the index would hold that many papers, as a kill would
    crash_after = int(os.environ.get("REPAIR_LITERATURE_TEST_CRASH_AFTER", "0")) - ord0
    papers = iter_s2_papers(inp.path, amap) if inp.kind == S2_PAPERS else iter_jsonl_papers(inp.path)
    added = skipped = no_abstract = 0
    for paper in papers:
        if paper is None:
            skipped += 1
            continue
        doc = tantivy.Document()
        doc.add_text("text", _text(paper))
        doc.add_bytes("paper", json.dumps(paper, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        doc.add_unsigned("ord", ord0 + added)
        writer.add_document(doc)
        added += 1
        no_abstract += not paper["abstract"]
        if added % 1024 == 0:
            bar.update(1024)
        if added == crash_after:
            os._exit(17)
    bar.update(added % 1024)
    return added, skipped, no_abstract


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ search
class LiteratureIndex:
    """``search(query, k)`` over a built index: the top-k papers with score > 0 and >= ``min_score`` (Lucene's /
    bm25s' scale), best first, ties by build order (as :class:`LocalCorpus`: lower corpus index first). Read-only;
    any number of processes may open one index (memory-mapped pages shared). ``search`` releases the GIL in the
    engine; ``search_many`` runs a batch on threads."""

    name = "literature_index"

    def __init__(self, index_dir: str | os.PathLike, min_score: float = 0.0, *, exact: bool = True,
                 pool: int = RESCORE_POOL):
        import tantivy

        self.index_dir = Path(index_dir).expanduser()
        self.min_score = min_score
        self.exact = exact
        self.pool = pool
        self.manifest = read_manifest(self.index_dir)
        check_compatible(self.manifest, self.index_dir)
        if self.manifest.get("pending") or not self.manifest.get("complete"):
            raise LiteratureIndexError(f"{self.index_dir}: the build of this index did not finish; rerun the build "
                                       "command (it resumes)")
        self.index = _open_engine(self.index_dir / ENGINE_DIR, create=False)
        self.searcher = self.index.searcher()
        if self.searcher.num_docs != self.manifest["papers"]:
            raise LiteratureIndexError(f"{self.index_dir}: the index holds {self.searcher.num_docs} papers, its "
                                       f"manifest says {self.manifest['papers']}; the index is damaged: rebuild it")
        self._schema = self.index.schema
        self._analyzer = _analyzer()
        self._tantivy = tantivy
        self._avgdl = self._average_length() if exact and len(self) else 0.0

    def _average_length(self) -> float:
        """The engine's average document length in tokens (exact in tantivy), read once from the score explanation
        of the first term of one paper."""
        Query = self._tantivy.Query
        address = self.searcher.search(Query.all_query(), 1).hits[0][1]
        tokens = self._analyzer.analyze(_text(self._record(address)))
        avgdl = None
        if tokens:
            term = Query.term_query(self._schema, "text", tokens[0])
            avgdl = explained_average_length(json.loads(term.explain(self.searcher, address).to_json()))
        if not avgdl:
            raise LiteratureIndexError(f"{self.index_dir}: cannot read the average document length from tantivy "
                                       f"{self.manifest['engine'].get('version')}; open it with exact=False")
        return avgdl

    def _record(self, address) -> dict:
        """A hit's paper, from the index's own store."""
        return json.loads(self.searcher.doc(address)["paper"][0])

    def __len__(self) -> int:
        return self.searcher.num_docs

    def _query(self, tokens: list[str]):
        Query, Occur = self._tantivy.Query, self._tantivy.Occur
        if not tokens:
            return None
        terms = [Query.term_query(self._schema, "text", t) for t in tokens]  # a repeated word counts each time
        return terms[0] if len(terms) == 1 else Query.boolean_query([(Occur.Should, q) for q in terms])

    def _ranked(self, query, k: int) -> list[tuple[float, int, Any]]:
        """(score, ord, address) of the top ``k``, ties by ``ord``: asks the engine for more hits until none tied
        with the k-th can be missing (the engine breaks ties its own way)."""
        n = k + 8
        while True:
            hits = self.searcher.search(query, n, count=False).hits
            if len(hits) < n or hits[-1][0] < hits[k - 1][0]:
                break
            n *= 4
        ords = self.searcher.fast_field_values("ord", [addr for _, addr in hits])
        ranked = sorted(((score, o, addr) for (score, addr), o in zip(hits, ords)), key=lambda t: (-t[0], t[1]))
        return ranked[:k]

    def _rescored(self, tokens: list[str], candidates: list[tuple[float, int, Any]],
                  k: int) -> list[tuple[float, int, dict]]:
        """The best ``k`` candidates by bm25s' score (k1 = EXACT_K1, each paper's stored text analysed again for its
        exact length and term counts), ties by build order: (score, ord, record)."""
        idf = lucene_idf({t: self.searcher.doc_freq("text", t) for t in set(tokens)}, len(self))
        scored = []
        for _, order, addr in candidates:
            rec = self._record(addr)
            score = lucene_bm25(tokens, self._analyzer.analyze(_text(rec)), idf, self._avgdl, k1=EXACT_K1, b=B)
            scored.append((score, order, rec))
        return sorted(scored, key=lambda t: (-t[0], t[1]))[:k]

    def search(self, query: str, k: int) -> list[Paper]:
        tokens = self._analyzer.analyze(query)
        q = self._query(tokens)
        if q is None or k <= 0:
            return []
        k = min(k, len(self))
        if self.exact:  # the engine proposes its top max(k, pool); bm25s' formula decides
            ranked = self._rescored(tokens, self._ranked(q, min(max(k, self.pool), len(self))), k)
        else:
            ranked = [(score / (1.0 + K1), order, self._record(addr)) for score, order, addr in self._ranked(q, k)]
        out = []
        for score, _, rec in ranked:
            if score <= 0 or score < self.min_score:
                continue
            out.append(Paper(id=rec["id"], title=rec.get("title", ""), abstract=rec.get("abstract", ""),
                             doi=rec.get("doi"), year=rec.get("year"), venue=rec.get("venue"), url=rec.get("url"),
                             source=self.name, score=score))
        return out

    def search_many(self, queries: list[str], k: int, threads: int = 1) -> list[list[Paper]]:
        """``search`` of each query, in order, on ``threads`` threads (the engine runs them in parallel)."""
        if threads <= 1 or len(queries) <= 1:
            return [self.search(q, k) for q in queries]
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(lambda q: self.search(q, k), queries))


def _text(paper: dict) -> str:
    """The text a paper was indexed under (as ``_index_file`` adds it)."""
    return f"{paper.get('title') or ''} {paper.get('abstract') or ''}".strip()


def is_literature_index(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a built literature index (what 06's ``--corpus`` may name)."""
    return (Path(path).expanduser() / MANIFEST).is_file()


# ------------------------------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    from repair.cli import positive_int
    from repair.runtime import setup_logging

    p = argparse.ArgumentParser(prog="python -m repair.expansion.sources.literature",
                                description="Build or query an on-disk literature index (tantivy BM25) for 06's "
                                            "verification (issue 41). Build: streams its inputs, resumable per input "
                                            "file, idempotent.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="stream corpora into an index (resumes a killed build; same inputs: no-op)")
    b.add_argument("inputs", nargs="+", help="BEIR folders (corpus.jsonl[.gz]), {id, title, abstract} JSONL(.gz), "
                                             "Semantic Scholar Datasets papers/abstracts shards or folders of them")
    b.add_argument("--index", required=True, help="the index folder (created; an existing index is extended)")
    b.add_argument("--threads", type=positive_int, default=1, help="tantivy indexing threads (default: %(default)s)")
    b.add_argument("--heap_mb", type=positive_int, default=None,
                   help=f"tantivy's indexing buffer in MB (default: {HEAP_MB_PER_THREAD} per thread)")
    b.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    s = sub.add_parser("search", help="print the top hits of each query")
    s.add_argument("queries", nargs="+", help="query texts")
    s.add_argument("--index", required=True, help="the index folder")
    s.add_argument("--k", type=positive_int, default=5, help="hits per query (default: %(default)s)")
    i = sub.add_parser("info", help="print the index's manifest (what built it)")
    i.add_argument("--index", required=True, help="the index folder")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    if args.command == "build":
        stats = build_index(args.inputs, args.index, threads=args.threads, progress=not args.no_progress,
                            heap_mb=args.heap_mb)
        print(json.dumps(stats))
    elif args.command == "search":
        index = LiteratureIndex(args.index)
        for query, hits in zip(args.queries, index.search_many(args.queries, args.k)):
            print(f"# {query}")
            for rank, hit in enumerate(hits, 1):
                print(f"{rank}\t{hit.score:.4f}\t{hit.id}\t{hit.title[:100]}")
    else:
        manifest = read_manifest(args.index)
        check_compatible(manifest, args.index)
        print(json.dumps({k: manifest[k] for k in ("format", "engine", "papers", "complete", "bm25")} |
                         {"inputs": len(manifest["inputs"])}, indent=1))
    return 0


if __name__ == "__main__":
    from repair.cli import run_script

    run_script(main)
