"""The verification source 06 searches in an on-disk literature index (issue 41, DESIGN 7; the index and its build:
:mod:`repair.expansion.sources.literature`).

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

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from repair.expansion.sources.base import Paper
from repair.expansion.sources.bm25_rescore import explained_average_length, lucene_bm25, lucene_idf
from repair.expansion.sources.literature_format import (ENGINE_DIR, K1, LiteratureIndexError, analyzer,
                                                        check_compatible, open_engine, paper_text, read_manifest)
from repair.expansion.sources.local_corpus import B as EXACT_B
from repair.expansion.sources.local_corpus import K1 as EXACT_K1  # what exact rescoring computes: LocalCorpus' BM25

RESCORE_POOL = 50  # papers the engine proposes per query for exact rescoring (at least k)


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
        self.index = open_engine(self.index_dir / ENGINE_DIR, create=False)
        self.searcher = self.index.searcher()
        if self.searcher.num_docs != self.manifest["papers"]:
            raise LiteratureIndexError(f"{self.index_dir}: the index holds {self.searcher.num_docs} papers, its "
                                       f"manifest says {self.manifest['papers']}; the index is damaged: rebuild it")
        self._schema = self.index.schema
        self._analyzer = analyzer()
        self._tantivy = tantivy
        self._avgdl = self._average_length() if exact and len(self) else 0.0

    def _average_length(self) -> float:
        """The engine's average document length in tokens (exact in tantivy), read once from the score explanation
        of the first term of one paper."""
        Query = self._tantivy.Query
        address = self.searcher.search(Query.all_query(), 1).hits[0][1]
        tokens = self._analyzer.analyze(paper_text(self._record(address)))
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
            score = lucene_bm25(tokens, self._analyzer.analyze(paper_text(rec)), idf, self._avgdl, k1=EXACT_K1,
                                b=EXACT_B)
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
