"""Small text helpers shared by query cleaning (generation), keyword queries (Elsevier), the "same text" key of
query cleaning and CausalNeg, and the prompt clipping of every generating step (06c, 09b)."""

from __future__ import annotations

import re

# English function words plus question/filler words that carry no topic in a research query.
STOPWORDS = frozenset("""a an and are as at be been being but by can could did do does doing for from had has have
how i if in into is it its itself just may me might more most my no nor not of on once only or other our out over
own same she should so some such than that the their them then there these they this those through to too under
until up very was we were what when where which while who whom why will with within without would you your
about across between during here yes""".split())


def content_words(text: str) -> list[str]:
    """Words of 2+ characters that are not stopwords, in order (case kept, hyphens and dots inside kept)."""
    tokens = re.findall(r"[A-Za-z0-9][A-Za-z0-9\-\.]*[A-Za-z0-9]|[A-Za-z0-9]", text)
    return [t for t in tokens if len(t) >= 2 and t.lower() not in STOPWORDS]


def word_key(text: str) -> str:
    """A text's lowercased words (``\\w+``) joined by single spaces: two texts with the same key are the same text
    up to case, punctuation and spacing (a query echoing its prompt; a generated negative copying a positive)."""
    return " ".join(re.findall(r"\w+", text.lower()))


def clip_text(text: str, max_chars: int) -> str:
    """Cut a long text at a word boundary (prompt budget for small-context generators)."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars].rsplit(" ", 1)[0]
    return cut + " ..."
