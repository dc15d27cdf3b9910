"""Bag-of-words baselines over whitespace tokens of norm(text): BM25, a unigram language model
with Dirichlet smoothing (ULM) and PLSA. Each is fitted on the judged set's whole title collection
(each distinct title one document), which PROTOCOL.md allows for unsupervised baselines.
"""

from __future__ import annotations

import logging
import math
from collections import Counter

import numpy as np
from scipy import sparse

from core.text import words

log = logging.getLogger(__name__)


class Collection:
    """Distinct titles as documents: term ids, per-document term counts, collection statistics."""

    def __init__(self, titles: list[str]):
        self.docs: dict[str, int] = {}
        self.terms: dict[str, int] = {}
        counts: list[Counter] = []
        for title in titles:
            key = " ".join(words(title))
            if key in self.docs:
                continue
            self.docs[key] = len(counts)
            counts.append(Counter(self.terms.setdefault(w, len(self.terms)) for w in key.split()))
        self.counts = counts
        self.n_docs = len(counts)  # documents the statistics count; titles seen later add none
        self.lengths = np.array([sum(c.values()) for c in counts], dtype=np.float64)
        self.df = np.zeros(len(self.terms))
        self.cf = np.zeros(len(self.terms))
        for c in counts:
            for t, n in c.items():
                self.df[t] += 1
                self.cf[t] += n

    def doc(self, title: str) -> int:
        """The document id of a title, adding it (with no effect on the statistics) if unseen."""
        key = " ".join(words(title))
        if key not in self.docs:
            self.docs[key] = len(self.counts)
            self.counts.append(Counter(self.terms.get(w, -1) for w in key.split()))
            self.lengths = np.append(self.lengths, len(key.split()))
        return self.docs[key]

    def query_terms(self, query: str) -> list[int]:
        """Term ids of the query's tokens, repeats kept; tokens no title has get -1."""
        return [self.terms.get(w, -1) for w in words(query)]

    def matrix(self) -> sparse.csr_matrix:
        rows, cols, vals = [], [], []
        for d, c in enumerate(self.counts):
            for t, n in c.items():
                if t >= 0:
                    rows.append(d)
                    cols.append(t)
                    vals.append(n)
        return sparse.csr_matrix((vals, (rows, cols)), shape=(len(self.counts), len(self.terms)))


class BM25:
    """Okapi BM25 with Lucene's non-negative IDF: log(1 + (N - df + 0.5) / (df + 0.5)).

    A pair's score needs only the per-term IDF and the average title length, so `to_dict()` is
    everything a saved model needs to score the same way in another process (scoring/hybrid.py)."""

    def __init__(self, idf: dict[str, float], avgdl: float, k1: float = 1.2, b: float = 0.75):
        self.idf, self.avgdl, self.k1, self.b = idf, avgdl, k1, b

    @classmethod
    def fit(cls, collection: Collection, k1: float = 1.2, b: float = 0.75) -> BM25:
        n = collection.n_docs
        idf = np.log1p((n - collection.df + 0.5) / (collection.df + 0.5))
        terms = sorted(collection.terms, key=collection.terms.get)
        return cls(dict(zip(terms, idf.tolist(), strict=True)), float(collection.lengths[:n].mean()), k1, b)

    def to_dict(self) -> dict:
        return {"k1": self.k1, "b": self.b, "avgdl": self.avgdl, "idf": self.idf}

    @classmethod
    def from_dict(cls, d: dict) -> BM25:
        return cls(d["idf"], d["avgdl"], d["k1"], d["b"])

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        out = np.zeros(len(queries))
        docs: dict[str, tuple[Counter, float]] = {}
        for i, (q, t) in enumerate(zip(queries, titles, strict=True)):
            if t not in docs:
                tokens = words(t)
                docs[t] = Counter(tokens), 1 - self.b + self.b * len(tokens) / self.avgdl
            tf, norm_len = docs[t]
            for term in words(q):
                f = tf.get(term, 0)
                if f and term in self.idf:
                    out[i] += self.idf[term] * f * (self.k1 + 1) / (f + self.k1 * norm_len)
        return out


class UnigramLM:
    """Query likelihood under the title's unigram model, Dirichlet-smoothed with the collection model.

    Query tokens no title contains add the same term to every title's score, so they are skipped."""

    def __init__(self, collection: Collection, mu: float = 100.0):
        self.c, self.mu = collection, mu
        self.p_collection = collection.cf / collection.cf.sum()

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        out = np.zeros(len(queries))
        for i, (q, t) in enumerate(zip(queries, titles, strict=True)):
            d = self.c.doc(t)
            tf, dl = self.c.counts[d], self.c.lengths[d]
            for term in self.c.query_terms(q):
                if term >= 0:
                    out[i] += math.log((tf.get(term, 0) + self.mu * self.p_collection[term]) / (dl + self.mu))
        return out


class PLSA:
    """Probabilistic latent semantic analysis (Hofmann 1999) fitted by EM on the title collection.

    Score: log P(q|d) = Σ_w log(λ Σ_z P(w|z) P(z|d) + (1 - λ) P(w|C)); the collection term keeps
    a query word that no topic of the title explains from zeroing the score."""

    def __init__(self, collection: Collection, topics: int = 50, iterations: int = 30, seed: int = 0, lam=0.7):
        self.c, self.lam = collection, lam
        m = collection.matrix().tocoo()
        rng = np.random.default_rng(seed)
        n_docs, n_terms = m.shape
        p_w_z = rng.random((topics, n_terms)) + 0.1
        p_w_z /= p_w_z.sum(1, keepdims=True)
        p_z_d = rng.random((n_docs, topics)) + 0.1
        p_z_d /= p_z_d.sum(1, keepdims=True)
        nnz = np.arange(m.nnz)
        by_doc = sparse.csr_matrix((m.data, (m.row, nnz)), shape=(n_docs, m.nnz))  # sums cells per doc
        by_term = sparse.csr_matrix((m.data, (m.col, nnz)), shape=(n_terms, m.nnz))
        for it in range(iterations):
            # E-step only on the non-zero (d, w) cells: P(z|d,w) ∝ P(w|z) P(z|d)
            joint = p_z_d[m.row] * p_w_z[:, m.col].T  # (nnz, topics)
            joint /= joint.sum(1, keepdims=True)
            p_w_z = np.asarray(by_term @ joint).T  # M-step: expected counts n(d,w) P(z|d,w)
            p_w_z /= p_w_z.sum(1, keepdims=True) + 1e-12
            p_z_d = np.asarray(by_doc @ joint)
            p_z_d /= p_z_d.sum(1, keepdims=True) + 1e-12
            if it % 10 == 9:
                log.debug("plsa iteration %d", it + 1)
        self.p_w_z, self.p_z_d = p_w_z, p_z_d
        self.p_collection = collection.cf / collection.cf.sum()
        self.uniform = np.full(topics, 1.0 / topics)

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        out = np.zeros(len(queries))
        for i, (q, t) in enumerate(zip(queries, titles, strict=True)):
            d = self.c.doc(t)
            topics = self.p_z_d[d] if d < len(self.p_z_d) else self.uniform
            for term in self.c.query_terms(q):
                if term >= 0:
                    p = self.lam * float(topics @ self.p_w_z[:, term]) + (1 - self.lam) * self.p_collection[term]
                    out[i] += math.log(p)
        return out
