"""Text normalisation, letter-trigram word hashing and the query split of PROTOCOL.md.

These Python definitions are the reference; the Spark jobs either call them (on executors) or
mirror them with column expressions that tests check against them.
"""

from __future__ import annotations

import hashlib

WORD_BOUNDARY = "#"
# A trained model reads no further into a text than this (modeling/hashing.py: also at most
# `model.max_words` words): a served query of any length costs no more than this one.
MAX_TEXT_CHARS = 8192


def norm(text: str) -> str:
    """PROTOCOL.md §2: lower-case and collapse whitespace; numbers and punctuation kept."""
    return " ".join(text.lower().split())


def words(text: str) -> list[str]:
    """Whitespace tokens of the normalised text."""
    return norm(text).split()


def word_trigrams(word: str) -> list[str]:
    """Letter trigrams of one word with '#' boundaries: 'good' -> #go, goo, ood, od#."""
    padded = f"{WORD_BOUNDARY}{word}{WORD_BOUNDARY}"
    return [padded[i : i + 3] for i in range(len(padded) - 2)]


def letter_trigrams(text: str) -> list[list[str]]:
    """Per word of the normalised text, its letter trigrams (the paper's word hashing)."""
    return [word_trigrams(w) for w in words(text)]


def is_test_query(query: str) -> bool:
    """PROTOCOL.md §3: a query is a test query iff md5(norm(q)) % 5 == 0."""
    return int(hashlib.md5(norm(query).encode("utf-8")).hexdigest(), 16) % 5 == 0
