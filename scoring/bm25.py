"""BM25 retrieval over a whole catalogue with bm25s (sparse matrices), PROTOCOL.md's BM25 settings.

bm25s's `lucene` method is scoring/lexical.py's BM25 (k1 1.2, b 0.75, IDF log(1 + (N - df + 0.5) /
(df + 0.5)), whitespace tokens of norm) divided by (k1 + 1), a constant per pair: rankings are the
same, and on Home Depot it reproduces PROTOCOL.md §7's BM25 row exactly (tests/test_retrieval.py).
The hand-written scorer stays for re-ranking and inside hybrids, whose saved fusion weight is on its scale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.text import words


def _bm25s():
    """bm25s, imported; it sets its logger to DEBUG at import, which would print every index build."""
    import logging

    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


class CatalogueBM25:
    """Every title indexed once; `search` ranks the whole catalogue for each query."""

    def __init__(self, titles: list[str], k1: float = 1.2, b: float = 0.75, index=None):
        bm25s = _bm25s()
        self.titles = titles
        self.k1 = k1
        if index is None:
            index = bm25s.BM25(k1=k1, b=b, method="lucene")
            index.index([words(t) for t in titles], show_progress=False)
        self.index = index

    def save(self, directory: Path) -> None:
        """The index's sparse matrices and vocabulary (not the titles: the caller keeps their order)."""
        self.index.save(str(directory), show_progress=False)

    @classmethod
    def load(cls, directory: Path, titles: list[str]) -> CatalogueBM25:
        index = _bm25s().BM25.load(str(directory), show_progress=False, verbosity=0)
        return cls(titles, index.k1, index.b, index)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every title for `query`, on scoring/lexical.py's scale."""
        tokens = [w for w in words(query) if w in self.index.vocab_dict]
        if not tokens:
            return np.zeros(len(self.titles), dtype=np.float32)
        return self.index.get_scores(tokens) * (self.k1 + 1)

    def search(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(title ids, scores) of the top k titles, best first; ties by title id."""
        scores = self.scores(query)
        top = best(scores, k)
        return top, scores[top]


def matching(scores: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k highest scores that are above 0 (titles sharing a word with the query), best
    first: BM25's candidates in a hybrid."""
    top = best(scores, k)
    return top[scores[top] > 0]


def best(scores: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k highest scores, best first, ties by id: a partition, not a sort of the catalogue."""
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k]
    return top[np.lexsort((top, -scores[top]))]
