"""What every literature source returns: :class:`Paper`, and the ``search(query, k)`` protocol."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

# The longest query text 06 sends to a source. 05 writes at most 40 new tokens (~300 characters); a longer
# "query" is a broken input line (one 50 MB line went out as a URL and got 414 on every resume, issue 18).
# URL-encoded, 512 characters stay under the 8 KB request line common servers accept even for 4-byte
# characters (512 x 4 x 3 = 6 KB).
MAX_QUERY_CHARS = 512


@dataclass
class Paper:
    """One search hit. ``abstract`` is "" when the source has none (S2 elides some; Scopus STANDARD view)."""

    id: str
    title: str
    abstract: str = ""
    doi: str | None = None
    year: int | None = None
    venue: str | None = None
    url: str | None = None
    source: str = ""
    score: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def dedup_key(self) -> str:
        """The original's de-duplication key (UPSTREAM 2.7): lowercased DOI, else the normalised title."""
        if self.doi:
            return "doi:" + self.doi.strip().lower()
        return "title:" + " ".join(self.title.lower().split())


@runtime_checkable
class LiteratureSource(Protocol):
    """A searchable literature source: ranked hits, best first; ``[]`` means "no hits" (never an error)."""

    name: str

    def search(self, query: str, k: int) -> list[Paper]: ...


def dedup_papers(papers: list[Paper]) -> list[Paper]:
    """Drop later duplicates (same DOI or same normalised title), keeping rank order."""
    seen: set[str] = set()
    out = []
    for paper in papers:
        key = paper.dedup_key()
        if key in seen:
            continue
        seen.add(key)
        out.append(paper)
    return out


def as_int(value) -> int | None:
    """Years arrive as ints (S2), strings (Scopus coverDate) or null."""
    try:
        return int(str(value)[:4]) if value not in (None, "") else None
    except ValueError:
        return None


def cap_query(text: str, limit: int = MAX_QUERY_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, at the last space when one is in the second half."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip()
