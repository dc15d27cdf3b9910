"""Text normalisation, letter-trigram word hashing and the query split of PROTOCOL.md.

These Python definitions are the reference; the Spark jobs either call them (on executors) or
mirror them with column expressions that tests check against them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from core.errors import DssmError

WORD_BOUNDARY = "#"
# The words of a query that search, the retriever and the served models read. BM25 adds a term's
# weight once per repeat in the query, so without a cap a hybrid's score grows with the query's
# length (16,667 copies of one word scored 5407.9); 64 is well past any real query and past the
# 40 words a model reads by default (model.max_words).
MAX_QUERY_WORDS = 64
# The longest query a served model accepts (the pyfunc retriever; `dssm serve`'s serve.max_query_chars by
# default): a real query is tens of characters, and a megabyte one cost the server its memory.
MAX_QUERY_CHARS = 1000
# A trained model reads no further into a text than this (modeling/hashing.py: also at most
# `model.max_words` words): a served query of any length costs no more than this one.
MAX_TEXT_CHARS = 8192


def norm(text: str) -> str:
    """PROTOCOL.md §2: lower-case and collapse whitespace; numbers and punctuation kept."""
    return " ".join(text.lower().split())


def words(text: str) -> list[str]:
    """Whitespace tokens of the normalised text."""
    return norm(text).split()


def capped_query(query: str) -> str:
    """The query's first MAX_QUERY_WORDS words, normalised: what BM25 and the model read of it."""
    return " ".join(words(query)[:MAX_QUERY_WORDS])


def checked_texts(values: Iterable[object], what: str) -> list[str]:
    """`values` when each is text with a word; otherwise a DssmError naming the first that is null,
    not text, or empty (or whitespace only). Such a value used to be scored as the empty text: two
    nulls scored 1.0 and an empty search returned titles, answers that say nothing about the input."""
    values = list(values)
    for i, value in enumerate(values):
        if isinstance(value, str):
            if value.split():
                continue
            problem = "empty" if not value else "whitespace only"
        elif value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and math.isnan(value)):
            problem = "null"
        else:
            kind = "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__
            problem = f"a {kind} ({str(value)[:40]}), not text"
        raise DssmError(f"{what} {i + 1} of {len(values)} is {problem}: give text with at least one word")
    return values


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
