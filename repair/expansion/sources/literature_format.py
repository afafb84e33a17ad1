"""What a literature index on disk is (issue 41): its folder layout, manifest, engine (tantivy) and analyzer, shared by
the build (:mod:`repair.expansion.sources.literature`) and the reader (:mod:`repair.expansion.sources.literature_search`).
An index records what built it, and a reader refuses one built differently (one line, exit 2)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from repair.data import DataError, read_json
from repair.expansion.sources.base import as_int
from repair.expansion.sources.literature_inputs import MAX_TEXT_CHARS

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
ANALYZER = {"tokenizer": "regex", "pattern": TOKEN_PATTERN, "filters": ["lowercase", "stopwords"],
            "stopwords": list(STOPWORDS_EN), "stemmer": None, "text": "title + ' ' + abstract",
            "max_text_chars": MAX_TEXT_CHARS}
BM25 = {"k1": K1, "b": B, "idf": "ln(1 + (N - df + 0.5) / (df + 0.5))", "length": "tantivy field-norm code",
        "reported_score": "tantivy score / (1 + k1): Lucene's and bm25s' scale"}
# (what an index was built with, compared on open; exact rescoring is the reader's choice, not recorded there)


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


def analyzer():
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
def new_manifest() -> dict:
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


def num_docs(index) -> int:
    index.reload()
    return index.searcher().num_docs


def open_engine(folder: Path, create: bool):
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
    index.register_tokenizer(TOKENIZER_NAME, analyzer())
    return index


def paper_text(paper: dict) -> str:
    """The text a paper is indexed under (title + " " + abstract), and rescored on (``literature_search``)."""
    return f"{paper.get('title') or ''} {paper.get('abstract') or ''}".strip()


def is_literature_index(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a built literature index (what 06's ``--corpus`` may name)."""
    return (Path(path).expanduser() / MANIFEST).is_file()
