"""Word hashing (Huang et al. 2013; Palangi et al. 2016, section III): each word becomes the bag of
its letter trigrams, as ids of the `dssm vocab` trigram vocabulary (unknown trigrams: id 0).

A batch of texts travels as a `TextBatch`: the flat trigram ids of every word, the offset of each
word's bag (what `nn.EmbeddingBag` takes) and the number of words of each text. The model sums a
word's trigram embeddings (`W·l(t)`), so no dense 30k-wide hashed vector ever exists.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq
import torch

from core.artifacts import require_manifest
from core.errors import DssmError
from core.text import MAX_TEXT_CHARS, word_trigrams

if TYPE_CHECKING:
    from modeling.tokens import Texts

UNKNOWN_ID = 0
# What the model reads of a text: its first MAX_TEXT_CHARS characters (core/text.py), of those the
# first `model.max_words` words, and of each word its first MAX_WORD_TRIGRAMS letter trigrams. A query
# can be anything a client sends; these keep its cost and the caches' entries small whatever it is.
MAX_WORD_TRIGRAMS = 64  # a word's first 64 characters (real words and product codes are shorter)
# Longer words and texts are tokenised each time instead of held as cache keys.
CACHED_WORD_CHARS = 64
CACHED_TEXT_CHARS = 256


@dataclass
class TextBatch:
    """`n` texts over the batch's distinct words: `ids[offsets[u]:offsets[u+1]]` are distinct word u's
    trigram ids, `words` lists every word occurrence (text by text) as a distinct-word index, and
    text j has `lengths[j]` words. Hashing each distinct word once makes the embedding work (and its
    gradient) proportional to the distinct words, not to the word occurrences."""

    ids: torch.Tensor  # int64 (trigrams of the distinct words,)
    offsets: torch.Tensor  # int64 (distinct words,)
    words: torch.Tensor  # int64 (word occurrences,)
    lengths: torch.Tensor  # int64 (n,) >= 1
    # `lengths` on the host, kept by `to`: the packed layout is planned on the CPU, and reading the
    # lengths back from a GPU would wait for every kernel queued before it
    host: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TextBatch:
        moved = (t.to(device, non_blocking=non_blocking) for t in (self.ids, self.offsets, self.words, self.lengths))
        return TextBatch(*moved, host=self.host_lengths())

    def host_lengths(self) -> torch.Tensor:
        """`lengths` on the CPU, without a device sync where `to` kept them."""
        if self.host is not None:
            return self.host
        return self.lengths.cpu()

    def pin_memory(self) -> TextBatch:
        """The tensors in page-locked memory, so `to(cuda, non_blocking=True)` copies while the GPU works
        (a DataLoader with pin_memory=True calls this)."""
        pinned = (t.pin_memory() for t in (self.ids, self.offsets, self.words, self.lengths))
        return TextBatch(*pinned, host=self.host_lengths())

    def __len__(self) -> int:
        return int(self.lengths.numel())

    @staticmethod
    def cat(batches: list[TextBatch]) -> TextBatch:
        """One batch of all the texts of `batches`, in order (their distinct words are not merged)."""
        ids, offsets, words = [], [], []
        n_ids = n_words = 0
        for b in batches:
            ids.append(b.ids)
            offsets.append(b.offsets + n_ids)
            words.append(b.words + n_words)
            n_ids += b.ids.numel()
            n_words += b.offsets.numel()
        return TextBatch(
            torch.cat(ids),
            torch.cat(offsets),
            torch.cat(words),
            torch.cat([b.lengths for b in batches]),
            host=torch.cat([b.host_lengths() for b in batches]),
        )


def text_batch(
    texts: Texts,
    tids: np.ndarray,
    rng: np.random.Generator | None = None,
    word_dropout: float = 0.0,
    scrambled: np.ndarray | None = None,
) -> TextBatch:
    """The TextBatch of texts `tids` of a tokenised table (modeling/tokens.py), by array operations
    alone; with `rng`, words dropped and the texts flagged in `scrambled` shuffled, as `Tokenizer.batch`."""
    lengths, occurrences = texts.words.take(tids)
    if rng is not None and (word_dropout > 0 or (scrambled is not None and scrambled.any())):
        lengths, occurrences = perturbed(lengths, occurrences, rng, word_dropout, scrambled)
    # distinct words in ascending id, each occurrence as its index among them (np.unique without a sort)
    seen = np.zeros(len(texts.bags.starts) - 1, np.int64)
    seen[occurrences] = 1
    distinct = np.flatnonzero(seen)
    seen[distinct] = np.arange(len(distinct))
    sizes, ids = texts.bags.take(distinct)
    return assembled(lengths, seen[occurrences], sizes, ids)


def assembled(lengths: np.ndarray, words: np.ndarray, sizes: np.ndarray, ids: np.ndarray) -> TextBatch:
    """A TextBatch of texts of `lengths` words, each word occurrence (`words`) an index among the
    distinct words, whose token ids lie one word after another in `ids` (`sizes` each)."""
    offsets = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    lengths_t = torch.from_numpy(np.asarray(lengths, np.int64))
    return TextBatch(
        ids=torch.from_numpy(ids.astype(np.int64)),
        offsets=torch.from_numpy(offsets),
        words=torch.from_numpy(words.astype(np.int64)),
        lengths=lengths_t,
        host=lengths_t,
    )


def perturbed(
    lengths: np.ndarray,
    occurrences: np.ndarray,
    rng: np.random.Generator,
    word_dropout: float,
    scrambled: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Wieting & Gimpel 2017's regularisers on the word occurrences of texts (`lengths` each): each word
    of a text of two or more dropped with probability `word_dropout` (never a whole text), then the
    texts flagged in `scrambled` in random order."""
    text = np.repeat(np.arange(len(lengths)), lengths)
    if word_dropout > 0:
        keep = (rng.random(len(occurrences)) >= word_dropout) | (lengths[text] < 2)
        kept = np.bincount(text[keep], minlength=len(lengths))
        lost = np.flatnonzero((kept == 0) & (lengths > 0))
        if len(lost):  # one random word of each text that lost them all stays
            starts = np.cumsum(lengths) - lengths
            keep[starts[lost] + (rng.random(len(lost)) * lengths[lost]).astype(np.int64)] = True
        occurrences, text = occurrences[keep], text[keep]
        lengths = np.bincount(text, minlength=len(lengths))
    if scrambled is not None and scrambled.any():
        # within each text, order by a random key (flagged texts) or by position (the others)
        position = np.arange(len(occurrences)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        key = np.where(scrambled[text], rng.random(len(occurrences)) * lengths[text], position)
        occurrences = occurrences[np.lexsort((key, text))]
    return lengths, occurrences


class Vocab:
    """A token vocabulary: token -> id (0 = unknown), with the content hash of its `dssm vocab` output.
    `kind` trigrams (the paper's word hashing: a word is the bag of its letter trigrams) or words (a
    word is its own token).

    Checkpoints carry the token list, so a trained model loads without the vocab directory."""

    def __init__(self, tokens: list[str], sha256: str, clean_sha256: str | None = None, kind: str = "trigrams"):
        self.tokens = tokens
        self.size = len(tokens)
        self.sha256 = sha256
        self.clean_sha256 = clean_sha256
        self.kind = kind
        self.index = {tok: i for i, tok in enumerate(tokens) if i != UNKNOWN_ID}

    @classmethod
    def load(cls, root: Path | str, kind: str = "trigrams") -> Vocab:
        root = Path(root)
        manifest = require_manifest(root, "vocab")
        table = pq.read_table(root / kind, columns=["id", "token"]).sort_by("id")
        ids = table.column("id").to_pylist()
        if not ids or ids != list(range(len(ids))):
            raise DssmError(f"{root}/{kind}: ids must be 0..n-1 with 0 = <unk>; rerun `dssm vocab`")
        clean = manifest.get("inputs", {}).get("clean", {}).get("sha256")
        return cls(table.column("token").to_pylist(), manifest["content_sha256"], clean, kind)

    def word_tokens(self, word: str) -> np.ndarray:
        """The token ids one word is made of (a trigram word: its first MAX_WORD_TRIGRAMS trigrams)."""
        if self.kind == "words":
            return np.array([self.index.get(word, UNKNOWN_ID)], np.int64)
        # the first K trigrams are those of the word's first K + 1 characters, less its end boundary
        trigrams = word_trigrams(word[: MAX_WORD_TRIGRAMS + 1])[:MAX_WORD_TRIGRAMS]
        return np.fromiter((self.index.get(t, UNKNOWN_ID) for t in trigrams), np.int64, len(trigrams))


class Tokenizer:
    """Text -> word ids -> trigram ids, with words and texts cached (titles repeat a lot).

    The caches hold at most `cache_size` words and `cache_size` texts: a served model sees any
    number of distinct queries. Word ids index one shared table, so when the words outgrow the bound
    both caches are emptied together, at the end of the call that filled them (a call's ids stay
    valid until it returns). `mlflow models serve` calls predict from several threads at once: one
    call at a time numbers words and empties the caches."""

    def __init__(self, vocab: Vocab, max_words: int, cache_size: int = 100_000):
        self.vocab = vocab
        self.max_words = max_words
        self.cache_size = cache_size
        self._word_ids: dict[str, int] = {}
        self._trigrams: list[np.ndarray] = []  # per word id
        self._texts: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def __reduce__(self):  # to a worker process: the vocabulary and settings, not the caches
        return Tokenizer, (self.vocab, self.max_words, self.cache_size)

    def identity(self) -> dict[str, object]:
        """What fixes this tokenizer's output: the vocabulary and the limits (modeling/tokens.py's cache key)."""
        return {
            "vocab_sha256": self.vocab.sha256,
            "vocab_kind": self.vocab.kind,
            "vocab_size": self.vocab.size,
            "max_words": self.max_words,
            "max_word_trigrams": MAX_WORD_TRIGRAMS,
            "max_text_chars": MAX_TEXT_CHARS,
        }

    def words(self, text: str) -> list[str]:
        """The words of `text` the model reads: at most `max_words` of its first MAX_TEXT_CHARS
        characters (split no further than that); an empty text is one empty word."""
        return text[:MAX_TEXT_CHARS].split(None, self.max_words)[: self.max_words] or [""]

    def _word_id(self, word: str) -> int:
        wid = self._word_ids.get(word)
        if wid is None:
            wid = len(self._trigrams)
            self._trigrams.append(self.vocab.word_tokens(word))
            if len(word) <= CACHED_WORD_CHARS:
                self._word_ids[word] = wid
        return wid

    def _text(self, text: str) -> np.ndarray:
        """Word ids of the text's words (`words`), valid until the caches are trimmed."""
        hit = self._texts.get(text)
        if hit is None:
            words = self.words(text)
            hit = np.fromiter((self._word_id(w) for w in words), np.int64, len(words))
            if len(self._texts) < self.cache_size and len(text) <= CACHED_TEXT_CHARS:
                self._texts[text] = hit
        return hit

    def _trim(self) -> None:
        if len(self._trigrams) > self.cache_size:
            self._word_ids, self._trigrams, self._texts = {}, [], {}

    def cached(self) -> dict[str, int]:
        """How many words and texts the caches hold."""
        return {"words": len(self._trigrams), "texts": len(self._texts)}

    def trigrams(self, text: str) -> list[np.ndarray]:
        """The trigram ids of each word of the text."""
        with self._lock:
            out = [self._trigrams[w] for w in self._text(text)]
            self._trim()
        return out

    def batch(self, texts: list[str]) -> TextBatch:
        """Tokenise `texts` (a served or evaluated model's; training gathers its batches from the
        tokenised negatives, `text_batch`, with word dropout and scrambling there)."""
        with self._lock:
            parts = [self._text(t) for t in texts]
            distinct, occurrences = np.unique(np.concatenate(parts), return_inverse=True)
            bags = [self._trigrams[w] for w in distinct]
            self._trim()
        sizes = np.fromiter((len(b) for b in bags), np.int64, len(bags))
        return assembled(np.array([len(p) for p in parts]), occurrences, sizes, np.concatenate(bags))
