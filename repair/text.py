"""Small text helpers shared by query cleaning (generation), keyword queries (Elsevier), the "same text" key of
query cleaning and CausalNeg, the prompt clipping of every generating step (06c, 09b), and the character cap every
text gets before a tokenizer (torch-free, so a script's ``--help`` can state it)."""

from __future__ import annotations

import re
from typing import Sequence

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


def mentions_any(text: str, terms: Sequence[str]) -> bool:
    """Whether ``text`` contains one of ``terms`` as a whole term (case-insensitive): the concept check of 06's
    ``--require_concept`` and of the hard-tuple guard's measurement (a concept "BCL-2" is not found in "BCL-20")."""
    lowered = text.lower()
    return any(re.search(r"(?<!\w)" + re.escape(t.lower()) + r"(?!\w)", lowered) for t in terms if t.strip())


def clip_text(text: str, max_chars: int) -> str:
    """Cut a long text at a word boundary (prompt budget for small-context generators)."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars].rsplit(" ", 1)[0]
    return cut + " ..."


# Character budget per token. A tokenizer reads the whole string before truncating it, so one 50 MB line cost
# 6 GB and 136 s in stage 01. Every text is cut to ``max_tokens * MAX_CHARS_PER_TOKEN`` characters before it
# reaches a tokenizer: ordinary prose runs at 4-5 characters per token, the longest token of SmolLM2's BPE
# vocabulary is 81 characters and WordPiece looks at words of at most 100, so the cut never changes the first
# ``max_tokens`` ids of a text unless they average more than 100 characters each (long runs of characters the
# tokenizer drops), and tokenising costs at most ~100 x max_length characters per text.
MAX_CHARS_PER_TOKEN = 100


def char_budget(max_tokens: int) -> int:
    """Characters of a text that can matter for its first ``max_tokens`` tokens (:data:`MAX_CHARS_PER_TOKEN`)."""
    return int(max_tokens) * MAX_CHARS_PER_TOKEN


def cap_chars(texts: Sequence[str], max_tokens: int) -> list[str]:
    """Each text cut to :func:`char_budget` characters: what may go into a tokenizer that keeps ``max_tokens``."""
    budget = char_budget(max_tokens)
    return [t if len(t) <= budget else t[:budget] for t in texts]


def char_cap_help(flag: str = "--max_length") -> str:
    """The sentence every encoding script's ``--help`` states about the cap (one wording, from the constant)."""
    return (f"each text is first cut to {flag} x {MAX_CHARS_PER_TOKEN} characters before tokenising, so tokenising "
            f"one huge text (a 50 MB line) costs no more than that")
