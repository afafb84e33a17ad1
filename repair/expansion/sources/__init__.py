"""Literature and grounding sources for Stage II (DESIGN 5 steps 5-6, DESIGN 6).

Every literature source has ``name`` and ``search(query, k) -> list[Paper]`` (best first, ``[]`` = no hits);
every remote one goes through the HTTP core in :mod:`repair.expansion.sources.http`. ``make_source`` builds one by
name from plain options, so the three ``06_*.py`` scripts share one implementation.
"""

from __future__ import annotations

import os

from repair.expansion.sources.base import LiteratureSource, Paper, dedup_papers
from repair.expansion.sources.cache import ResponseCache
from repair.expansion.sources.http import ApiClient, AuthError, KeyPool, QuotaExceeded, RateLimiter, SourceError, load_keys, scrub

SOURCE_NAMES = ("local_corpus", "semantic_scholar", "elsevier")

__all__ = ["ApiClient", "AuthError", "KeyPool", "LiteratureSource", "Paper", "QuotaExceeded", "RateLimiter",
           "ResponseCache", "SOURCE_NAMES", "SourceError", "dedup_papers", "load_keys", "make_cache",
           "make_source", "scrub"]


def make_cache(cache_dir: str | os.PathLike | None) -> ResponseCache | None:
    """``None``/"none" disables the response cache; "" means the default ``$REPAIR_CACHE/http``."""
    from repair.runtime import cache_root

    if cache_dir is not None and str(cache_dir).lower() == "none":
        return None
    return ResponseCache(cache_dir or cache_root() / "http")


def make_source(name: str, *, api_url: str | None = None, key_file: str | None = None,
                cache: ResponseCache | None = None, timeout: float = 30.0, rate: float | None = None,
                corpus: str | None = None, index_dir: str | None = None, min_score: float = 0.0,
                view: str = "auto",
                insttoken: str | None = None, query_mode: str = "keywords", page_limit: int = 100,
                max_retries: int = 5, backoff_base: float = 1.0) -> LiteratureSource:
    """Build the literature source ``name`` (one of :data:`SOURCE_NAMES`). For ``local_corpus``, ``corpus`` is a
    BEIR folder or JSONL (bm25s in memory, small corpora) or a folder built by ``python -m
    repair.expansion.sources.literature build`` (the on-disk index, any size)."""
    retry = dict(max_retries=max_retries, backoff_base=backoff_base)
    if name == "local_corpus":
        from repair.expansion.sources.literature_format import is_literature_index
        from repair.expansion.sources.literature_search import LiteratureIndex
        from repair.expansion.sources.local_corpus import LocalCorpus

        if not corpus:
            raise ValueError("the local corpus source needs a corpus (a BEIR folder or a JSONL of papers)")
        if is_literature_index(corpus):  # a built on-disk index (issue 41): searched where it is, never copied
            if index_dir:
                raise ValueError(f"--index_dir is the bm25s cache of a corpus file; {corpus} is a built literature "
                                 "index, opened where it is")
            return LiteratureIndex(corpus, min_score=min_score)
        return LocalCorpus(corpus, index_dir=index_dir, min_score=min_score)
    if name == "semantic_scholar":
        from repair.expansion.sources.semantic_scholar import SemanticScholar

        return SemanticScholar(api_url, key_file=key_file, rate=1.0 if rate is None else rate,
                               page_limit=page_limit, cache=cache, timeout=timeout, **retry)
    if name == "elsevier":
        from repair.expansion.sources.elsevier import ElsevierScopus

        return ElsevierScopus(api_url, key_file=key_file, insttoken=insttoken, view=view, query_mode=query_mode,
                              rate=9.0 if rate is None else rate, cache=cache, timeout=timeout, **retry)
    raise ValueError(f"unknown source {name!r}; expected one of {SOURCE_NAMES}")
