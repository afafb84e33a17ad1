"""Elsevier Scopus Search (``/content/search/scopus``) with abstracts (API_FACTS D.2).

- Abstracts (``dc:description``) come only with ``view=COMPLETE``, which needs an entitled key/IP. With
  ``view="auto"`` the client asks for COMPLETE, and when Elsevier refuses the view (401/403
  ``AUTHORIZATION_ERROR``) it switches to STANDARD and fetches each hit's abstract through Abstract
  Retrieval (``/content/abstract/scopus_id/{id}``). The original kept STANDARD and lost every abstract
  (UPSTREAM 5.21).
- An empty result is ``totalResults "0"`` with one entry ``{"error": "Result set was empty"}``: not a paper.
- ``429`` with ``X-ELS-Status: QUOTA_EXCEEDED`` retires the key (handled by the HTTP core).
- A generated query is natural language; Scopus needs its query syntax. ``query_mode="keywords"`` turns it
  into ``TITLE-ABS-KEY(w1 AND w2 ...)`` over its content words, then the OR form if that finds nothing
  (like the original's list of tried variants); ``"raw"`` sends the text unchanged.
"""

from __future__ import annotations

import logging
import os

from repair.text import content_words
from repair.expansion.sources.base import Paper, as_int, dedup_papers
from repair.expansion.sources.cache import ResponseCache
from repair.expansion.sources.http import ApiClient, AuthError, KeyPool, SourceError, check_key, load_keys

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://api.elsevier.com"
URL_ENV, KEY_ENV, INSTTOKEN_ENV = "ELSEVIER_API_URL", "ELSEVIER_API_KEY", "ELSEVIER_INSTTOKEN"
MAX_COUNT = {"COMPLETE": 25, "STANDARD": 200}
MAX_START = 5000  # non-subscribers cannot page past 5,000 results
MAX_QUERY_WORDS = 10

# Words too generic to constrain a Scopus search, on top of the English stopwords.
_GENERIC = {"effect", "effects", "role", "study", "novel", "new", "based", "toward", "towards", "using", "via"}
_OPERATORS = {"and", "or", "not", "and_not", "w", "pre"}


def keyword_queries(text: str, max_words: int = MAX_QUERY_WORDS) -> list[str]:
    """Scopus queries for a natural-language query: content words ANDed, then ORed (both in TITLE-ABS-KEY)."""
    words: list[str] = []
    for token in content_words(text):
        low = token.lower()
        if low in _GENERIC or low in _OPERATORS or low in (w.lower() for w in words):
            continue
        words.append(token)
        if len(words) >= max_words:
            break
    if not words:
        return []
    strict = "TITLE-ABS-KEY(" + " AND ".join(words) + ")"
    loose = "TITLE-ABS-KEY(" + " OR ".join(words) + ")"
    return [strict] if len(words) == 1 else [strict, loose]


def _elsevier_key_rejected(resp) -> bool:
    """401/403 AUTHORIZATION_ERROR = not entitled to this view/resource (the key itself is fine)."""
    try:
        code = resp.json()["service-error"]["status"]["statusCode"]
    except (ValueError, KeyError, TypeError):
        return True
    return code != "AUTHORIZATION_ERROR"


class ElsevierScopus:
    """``search(query, k)``: Scopus hits with abstracts (COMPLETE view, else Abstract Retrieval per hit)."""

    name = "elsevier"

    def __init__(self, api_url: str | None = None, keys: list[str] | None = None, *, key_file: str | None = None,
                 insttoken: str | None = None, view: str = "auto", query_mode: str = "keywords",
                 rate: float = 9.0, fetch_abstracts: bool = True, cache: ResponseCache | None = None,
                 timeout: float = 30.0, **client_kw):
        if keys is None:
            keys = load_keys(key_file, KEY_ENV)
        if not keys:
            raise AuthError(self.name, None, f"an API key is required: set ${KEY_ENV} or pass --key_file")
        view = view.upper() if view.lower() != "auto" else "auto"
        if view not in ("auto", "COMPLETE", "STANDARD"):
            raise ValueError(f"view must be auto, COMPLETE or STANDARD, got {view!r}")
        if query_mode not in ("keywords", "raw"):
            raise ValueError(f"query_mode must be keywords or raw, got {query_mode!r}")
        self.view, self.auto_view = ("COMPLETE", True) if view == "auto" else (view, False)
        self.query_mode, self.fetch_abstracts = query_mode, fetch_abstracts
        token_source = "--insttoken" if insttoken is not None else f"${INSTTOKEN_ENV}"
        insttoken = (insttoken if insttoken is not None else os.environ.get(INSTTOKEN_ENV, "")).strip()
        headers = {"Accept": "application/json"}
        if insttoken:
            headers["X-ELS-Insttoken"] = check_key(insttoken, token_source)  # a secret too: same rules
        base = api_url or os.environ.get(URL_ENV) or DEFAULT_URL
        source = f"key file {key_file}" if key_file else f"${KEY_ENV}"
        common = dict(auth_header="X-ELS-APIKey", headers=headers, cache=cache, timeout=timeout, key_env=KEY_ENV,
                      key_rejected=_elsevier_key_rejected, secrets=[insttoken], **client_kw)
        # Search and Abstract Retrieval have separate throttles and weekly quotas: separate key pools.
        self.search_client = ApiClient(self.name, base, keys=KeyPool(keys, rate, self.name, source), **common)
        self.abstract_client = ApiClient(self.name, base, keys=KeyPool(keys, rate, self.name, source), **common)

    # -- search
    def _queries(self, text: str) -> list[str]:
        return [text] if self.query_mode == "raw" else keyword_queries(text)

    def search_page(self, scopus_query: str, start: int, count: int) -> tuple[list[Paper], int]:
        params = {"query": scopus_query, "start": start, "count": min(count, MAX_COUNT[self.view]),
                  "view": self.view, "sort": "relevancy"}
        try:
            resp = self.search_client.get_json("content/search/scopus", params)
        except SourceError as exc:
            if exc.status in (401, 403) and not exc.fatal:
                if self.auto_view and self.view == "COMPLETE":
                    logger.warning("elsevier: COMPLETE view refused (%s); switching to STANDARD + Abstract "
                                   "Retrieval", exc.message)
                    self.view = "STANDARD"
                    return self.search_page(scopus_query, start, count)
                raise AuthError(self.name, exc.status, f"access refused: {exc.message}", code=exc.code) from None
            raise
        results = (resp.data or {}).get("search-results") if isinstance(resp.data, dict) else None
        if not isinstance(results, dict):
            return [], 0
        total = int(results.get("opensearch:totalResults") or 0)
        papers = [self._paper(e) for e in results.get("entry") or [] if isinstance(e, dict) and "error" not in e]
        return [p for p in papers if p.title], total

    def search(self, query: str, k: int) -> list[Paper]:
        """Up to ``k`` hits in Scopus relevance order, abstracts filled in; ``[]`` when no variant hits."""
        for scopus_query in self._queries(query):
            papers: list[Paper] = []
            start = 0
            while len(papers) < k and start < MAX_START:
                page, total = self.search_page(scopus_query, start, k - len(papers))
                papers = dedup_papers(papers + page)
                start += len(page)
                if not page or start >= total:
                    break
            if papers:
                papers = papers[:k]
                if self.fetch_abstracts:
                    for paper in papers:
                        if not paper.abstract:
                            paper.abstract = self.abstract(paper.id)
                return papers
        return []

    def abstract(self, scopus_id: str) -> str:
        """Abstract Retrieval for one Scopus id / EID; "" when Elsevier has none."""
        if not scopus_id:
            return ""
        path = (f"content/abstract/eid/{scopus_id}" if scopus_id.startswith("2-s2.0-")
                else f"content/abstract/scopus_id/{scopus_id}")
        resp = self.abstract_client.get_json(path, {"view": "META_ABS"})
        if resp.status == 404 or not isinstance(resp.data, dict):
            return ""
        core = (resp.data.get("abstracts-retrieval-response") or {}).get("coredata") or {}
        return (core.get("dc:description") or "").strip()

    def _paper(self, entry: dict) -> Paper:
        ident = entry.get("dc:identifier") or ""
        scopus_id = ident.split(":", 1)[1] if ident.upper().startswith("SCOPUS_ID:") else ""
        url = None
        for link in entry.get("link") or []:
            if isinstance(link, dict) and link.get("@ref") in ("scopus", "self"):
                url = link.get("@href") or url
        return Paper(id=scopus_id or entry.get("eid") or "", title=(entry.get("dc:title") or "").strip(),
                     abstract=(entry.get("dc:description") or "").strip(), doi=entry.get("prism:doi") or None,
                     year=as_int(entry.get("prism:coverDate")), venue=entry.get("prism:publicationName") or None,
                     url=url, source=self.name)
