"""Semantic Scholar Academic Graph API, relevance search ``GET /paper/search`` (API_FACTS D.1).

Facts the client is built on: ``limit`` <= 100 per page and ``offset + limit`` <= 1000 (the original asked
for offset 900 + 100 pages, UPSTREAM 5.20); no hits is ``{"total": 0, "offset": 0}`` with no ``data``;
``abstract`` may be null; the key goes in the ``x-api-key`` header; 1 request/second per key.
"""

from __future__ import annotations

import logging
import os

from repair.expansion.sources.base import Paper, as_int, dedup_papers
from repair.expansion.sources.cache import ResponseCache
from repair.expansion.sources.http import ApiClient, KeyPool, load_keys

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://api.semanticscholar.org/graph/v1"
URL_ENV, KEY_ENV = "S2_API_URL", "S2_API_KEY"
FIELDS = "paperId,title,abstract,externalIds,year,venue,url"
MAX_LIMIT = 100
MAX_RESULTS = 1000  # offset + limit must stay <= 1000 for /paper/search


class SemanticScholar:
    """``search(query, k)`` over ``/paper/search``, paging until ``k`` de-duplicated hits or the 1000 cap."""

    name = "semantic_scholar"

    def __init__(self, api_url: str | None = None, keys: list[str] | None = None, *, key_file: str | None = None,
                 rate: float = 1.0, page_limit: int = MAX_LIMIT, cache: ResponseCache | None = None,
                 timeout: float = 30.0, **client_kw):
        if keys is None:
            keys = load_keys(key_file, KEY_ENV)
        source = f"key file {key_file}" if key_file else f"${KEY_ENV}"
        self.page_limit = max(1, min(int(page_limit), MAX_LIMIT))
        self.client = ApiClient(self.name, api_url or os.environ.get(URL_ENV) or DEFAULT_URL,
                                keys=KeyPool(keys, rate, self.name, source), auth_header="x-api-key",
                                cache=cache, timeout=timeout, key_env=KEY_ENV, **client_kw)

    def search_page(self, query: str, offset: int, limit: int) -> tuple[list[Paper], int, int | None]:
        """One page: (papers, total, next offset or None)."""
        limit = min(limit, MAX_LIMIT, MAX_RESULTS - offset)
        if limit <= 0:
            return [], 0, None
        resp = self.client.get_json("paper/search", {"query": query, "offset": offset, "limit": limit,
                                                     "fields": FIELDS})
        body = resp.data if isinstance(resp.data, dict) else {}
        if resp.status == 404:
            return [], 0, None
        papers = [self._paper(item) for item in body.get("data") or [] if isinstance(item, dict)]
        nxt = body.get("next")
        return [p for p in papers if p.title], int(body.get("total") or 0), (int(nxt) if nxt is not None else None)

    def search(self, query: str, k: int) -> list[Paper]:
        """Up to ``k`` hits in relevance order; ``[]`` when S2 has none."""
        papers: list[Paper] = []
        offset = 0
        while len(papers) < k and offset < MAX_RESULTS:
            page, total, nxt = self.search_page(query, offset, min(self.page_limit, k - len(papers)))
            papers = dedup_papers(papers + page)
            if nxt is None or nxt <= offset or not page or nxt >= total:
                break
            offset = nxt
        return papers[:k]

    def _paper(self, item: dict) -> Paper:
        ext = item.get("externalIds") or {}
        return Paper(id=str(item.get("paperId") or ""), title=(item.get("title") or "").strip(),
                     abstract=(item.get("abstract") or "").strip(), doi=ext.get("DOI") or None,
                     year=as_int(item.get("year")), venue=item.get("venue") or None, url=item.get("url") or None,
                     source=self.name)
