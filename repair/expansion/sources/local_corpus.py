"""A literature source with no key and no network: BM25 (``bm25s``) over a local corpus of papers.

The default verification source (DESIGN 5 step 6). The corpus is a BEIR folder (``corpus.jsonl[.gz]``:
``_id``, ``title``, ``text``) or a JSONL of ``{id, title, abstract}`` (``_id``/``text`` accepted too). A paper
is indexed as title + abstract. The index is built once and saved under ``index_dir`` (default
``$REPAIR_CACHE/bm25/<corpus sha256>``) so later runs only load it. A hit needs a BM25 score > 0, i.e. at
least one shared non-stopword term: a query sharing nothing with the corpus has no hits and is discarded.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from repair.data import DataError, file_sha256, iter_jsonl
from repair.runtime import cache_root
from repair.expansion.sources.base import Paper

logger = logging.getLogger(__name__)

K1, B = 1.5, 0.75  # bm25s' BM25 (Lucene variant): the verification every literature source reproduces
INDEX_VERSION = "bm25s-lucene-k1.5-b0.75-en-stopwords-v1"  # part of the index fingerprint (names K1, B above)


def corpus_file(path: str | os.PathLike) -> Path:
    """The JSONL holding the papers: ``path`` itself, or ``corpus.jsonl[.gz]`` inside a BEIR folder."""
    path = Path(path)
    if path.is_dir():
        for name in ("corpus.jsonl", "corpus.jsonl.gz"):
            if (path / name).exists():
                return path / name
        raise FileNotFoundError(f"{path}: no corpus.jsonl[.gz] in this folder (expected a BEIR folder)")
    if not path.exists():
        raise FileNotFoundError(f"{path}: corpus not found")
    return path


def load_papers(path: str | os.PathLike) -> list[Paper]:
    """Papers of a BEIR corpus or ``{id, title, abstract}`` JSONL; errors name the file, line and field."""
    file = corpus_file(path)
    papers: list[Paper] = []
    for lineno, rec in enumerate(iter_jsonl(file, optional={"_id": (str, int), "id": (str, int), "title": str,
                                                            "abstract": str, "text": str, "doi": str}), start=1):
        pid = rec.get("id", rec.get("_id"))
        if pid is None:
            raise DataError(f"{file}:{lineno}: missing field 'id' (or '_id')")
        abstract = rec.get("abstract") if rec.get("abstract") is not None else rec.get("text")
        if rec.get("title") is None and abstract is None:
            raise DataError(f"{file}:{lineno}: missing field 'title' and 'abstract' (or 'text')")
        papers.append(Paper(id=str(pid), title=(rec.get("title") or "").strip(), abstract=(abstract or "").strip(),
                            doi=rec.get("doi") or None, source="local_corpus"))
    if not papers:
        raise DataError(f"{file}: the corpus holds no paper")
    return papers


def _tokenize(texts: list[str], return_ids: bool):
    import bm25s

    return bm25s.tokenize(texts, lower=True, stopwords="en", return_ids=return_ids, show_progress=False)


class LocalCorpus:
    """``search(query, k)``: BM25 top-k papers with score > 0 (and >= ``min_score``), best first (ties: lower
    corpus index). ``min_score`` makes verification stricter: a query must match a paper that well to count."""

    name = "local_corpus"

    def __init__(self, corpus: str | os.PathLike, index_dir: str | os.PathLike | None = None,
                 min_score: float = 0.0):
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self.min_score = min_score
        self.corpus_path = corpus_file(corpus)
        self.papers = load_papers(self.corpus_path)
        fingerprint = file_sha256(self.corpus_path, prefix=INDEX_VERSION.encode())
        self.index_dir = Path(index_dir) if index_dir else cache_root() / "bm25" / fingerprint[:24]
        self.built = False
        if (self.index_dir / "params.index.json").exists():
            self.retriever = bm25s.BM25.load(str(self.index_dir), show_progress=False)
            if getattr(self.retriever, "scores", {}).get("num_docs") not in (None, len(self.papers)):
                logger.warning("%s: index does not match the corpus; rebuilding", self.index_dir)
                self._build()
        else:
            self._build()

    def _build(self) -> None:
        import bm25s

        logger.info("building the BM25 index of %d papers from %s", len(self.papers), self.corpus_path)
        texts = [f"{p.title} {p.abstract}".strip() for p in self.papers]
        self.retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        self.retriever.index(_tokenize(texts, return_ids=True), show_progress=False)
        self.index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.index_dir.name}.", dir=self.index_dir.parent))
        try:
            self.retriever.save(str(tmp), show_progress=False)
            if self.index_dir.exists():
                shutil.rmtree(self.index_dir)
            os.replace(tmp, self.index_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self.built = True

    def search(self, query: str, k: int) -> list[Paper]:
        tokens = _tokenize([query], return_ids=False)
        if not tokens or not tokens[0]:
            return []
        k = min(k, len(self.papers))
        indices, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        hits = sorted(((float(s), int(i)) for i, s in zip(indices[0], scores[0])
                       if s > 0 and s >= self.min_score), key=lambda t: (-t[0], t[1]))
        out = []
        for score, i in hits:
            paper = self.papers[i]
            out.append(Paper(id=paper.id, title=paper.title, abstract=paper.abstract, doi=paper.doi,
                             source=self.name, score=score))
        return out
