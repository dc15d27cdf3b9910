"""A `dssm negatives` output tokenised once, as integer arrays: what a training step builds its batch from.

Tokenising texts in the step cost more than the model's own work on a GPU (issue 61: 8.5k examples/s
whatever the batch size). Here every distinct text of the negatives (queries, clicked titles, sampled
negatives, shown lists) is tokenised once, and each shard's rows become text ids. A step then gathers
integer arrays (modeling/data.py; the batches themselves: `hashing.text_batch`, `transformer.token_batch`).

`Tokenised` holds:
- `texts`: per distinct text its key (`core.array_cache.text_key`, for the losses' collision masks) and its tokens, as
  its encoder reads them. Word hashing: its words (`words`, global word ids) and each word's trigram
  (or word) ids (`bags`). Word pieces: its pieces, [CLS] ... [SEP] (`pieces`).
- `train`, `valid`: the rows of each split's shards in file order (`Rows`).

It is cached as an entry of the project's array cache (core/array_cache.py: numpy files, never
unpickled, checked against a digest keyed by what they cache) in `NEGATIVES/../tokens/`, named by the
sha256 of the negatives' content hash, the tokenizer's identity and this code's fingerprint: another
vocabulary, tokenizer, limit or code makes another entry. Written atomically under the cache's lock, so
DDP ranks starting together tokenise once, and read memory-mapped, so the ranks and their loader
workers share one copy of the arrays.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.array_cache import ArrayCache, text_keys
from core.artifacts import code_fingerprint
from core.errors import DssmError
from core.schemas import NEGATIVES

log = logging.getLogger("dssm.train")

MAX_BYTES = 8 << 30  # the token caches kept per tokens/ folder (least recently used dropped first)
SPLITS = ("train", "valid")


@dataclass
class Ragged:
    """Variable-length items: item i is `values[starts[i]:starts[i + 1]]`."""

    starts: np.ndarray  # int64 (items + 1,)
    values: np.ndarray

    @classmethod
    def of(cls, lengths: np.ndarray, values: np.ndarray) -> Ragged:
        starts = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        return cls(starts, values)

    def lengths(self, index: np.ndarray) -> np.ndarray:
        return self.starts[index + 1] - self.starts[index]

    def take(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(each item's length, the items' values one after another)."""
        index = np.asarray(index, np.int64)
        begin = self.starts[index]
        lengths = self.starts[index + 1] - begin
        return lengths, self.values[spans(begin, lengths)]


def spans(begin: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions begin[i], ..., begin[i] + lengths[i] - 1 of every i, one after another."""
    ends = np.cumsum(lengths)
    return np.repeat(begin - ends + lengths, lengths) + np.arange(ends[-1] if len(ends) else 0)


@dataclass
class Texts:
    """Every distinct text: its key and its tokens (`words` + `bags` for word hashing, else `pieces`)."""

    keys: np.ndarray  # int64 (texts,)
    words: Ragged | None = None  # per text: global word ids (int32)
    bags: Ragged | None = None  # per word: token ids (int32)
    pieces: Ragged | None = None  # per text: word-piece ids (int32)


@dataclass
class Rows:
    """The rows of one split's shards, file after file (`shard_starts`), as text ids and numbers."""

    shard_starts: np.ndarray  # int64 (shards + 1,)
    query: np.ndarray  # int32 (rows,)
    positive: np.ndarray  # int32 (rows,)
    negatives: np.ndarray  # int32 (rows, n)
    clicks: np.ndarray  # float32
    impressions: np.ndarray  # float32
    debiased_clicks: np.ndarray  # float32
    shown: Ragged  # per row: the text ids of its shown list (empty without one)
    relevance: Ragged  # per row: float32, aligned with `shown`

    def __len__(self) -> int:
        return len(self.query)


@dataclass
class Tokenised:
    texts: Texts
    train: Rows
    valid: Rows
    path: Path | None = None  # the cache entry it was read from or written to

    def __reduce__(self):
        """Sent to another process (a spawned loader worker) as its cache entry, which that process maps:
        the token arrays stay one copy in memory however many processes read them."""
        if self.path is None:
            return (Tokenised, (self.texts, self.train, self.valid, None))
        return (reopened, (self.path,))


# --- building ------------------------------------------------------------------------------------


def _split_files(negatives: Path, split: str) -> list[Path]:
    return sorted((negatives / split).glob("*.parquet"))


def parquet_file(path: Path) -> pq.ParquetFile:
    """An open shard, or an error that names the damaged file."""
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DssmError(f"{path}: not a readable Parquet file ({e}); rebuild it: `dssm negatives --force`") from None


def _read_split(files: list[Path], n: int) -> tuple[list[pa.ChunkedArray], dict[str, Any]]:
    """The split's text columns (flattened) and its other columns, files in order."""
    tables = []
    for f in files:
        tables.append(parquet_file(f).read(columns=NEGATIVES.names))
    table = pa.concat_tables(tables) if tables else NEGATIVES.empty_table()
    counts = pc.list_value_length(table["negatives"]).to_numpy(zero_copy_only=False)
    if len(counts) and (counts != n).any():
        raise DssmError(f"a row has {int(counts[counts != n][0])} negatives, the manifest says {n}")
    shown_lengths = pc.list_value_length(table["shown"]).to_numpy(zero_copy_only=False)
    relevance_lengths = pc.list_value_length(table["relevance"]).to_numpy(zero_copy_only=False)
    if (shown_lengths != relevance_lengths).any():
        raise DssmError(f"{files[0].parent}: a row's shown and relevance lists differ in length; rebuild the negatives")
    texts = [table["query"], table["positive"], pc.list_flatten(table["negatives"]), pc.list_flatten(table["shown"])]
    numbers = {
        "shard_starts": np.concatenate([[0], np.cumsum([t.num_rows for t in tables])]).astype(np.int64),
        "clicks": table["clicks"].to_numpy().astype(np.float32),
        "impressions": table["impressions"].to_numpy().astype(np.float32),
        "debiased_clicks": table["debiased_clicks"].to_numpy().astype(np.float32),
        "shown_lengths": shown_lengths.astype(np.int64),
        "relevance": pc.list_flatten(table["relevance"]).to_numpy(zero_copy_only=False).astype(np.float32),
        "rows": table.num_rows,
    }
    return texts, numbers


def build(negatives: Path, tokenizer, n: int) -> Tokenised:
    """Tokenise every text of `negatives` (train and valid) with `tokenizer` once."""
    splits = {s: _read_split(_split_files(negatives, s), n) for s in SPLITS}
    columns = [c for texts, _ in splits.values() for c in texts]
    chunks = [chunk.cast(pa.large_string()) for c in columns for chunk in c.chunks]
    encoded = pa.chunked_array(chunks, pa.large_string()).combine_chunks().dictionary_encode()
    ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    distinct = encoded.dictionary.to_pylist()
    texts = tokenise(distinct, tokenizer)
    position, out = 0, {}
    for split, (text_columns, numbers) in splits.items():
        sizes = [len(c) for c in text_columns]
        query, positive, negs, shown = np.split(ids[position : position + sum(sizes)], np.cumsum(sizes)[:-1])
        position += sum(sizes)
        out[split] = Rows(
            shard_starts=numbers["shard_starts"],
            query=query,
            positive=positive,
            negatives=negs.reshape(numbers["rows"], n),
            clicks=numbers["clicks"],
            impressions=numbers["impressions"],
            debiased_clicks=numbers["debiased_clicks"],
            shown=Ragged.of(numbers["shown_lengths"], shown),
            relevance=Ragged.of(numbers["shown_lengths"], numbers["relevance"]),
        )
    return Tokenised(texts, out["train"], out["valid"])


def tokenise(texts: list[str], tokenizer) -> Texts:
    """Keys and tokens of distinct texts: word hashing's words and bags, or a transformer's pieces."""
    keys = text_keys(texts)
    if hasattr(tokenizer, "pieces"):  # a transformer's WordPieceTokenizer
        lengths, values = tokenizer.pieces(texts)
        return Texts(keys, pieces=Ragged.of(lengths, values))
    word_ids: dict[str, int] = {}
    bags: list[np.ndarray] = []
    per_text: list[int] = []
    lengths = np.empty(len(texts), np.int64)
    for i, text in enumerate(texts):
        words = tokenizer.words(text)
        lengths[i] = len(words)
        for w in words:
            wid = word_ids.get(w)
            if wid is None:
                wid = word_ids[w] = len(bags)
                bags.append(tokenizer.vocab.word_tokens(w))
            per_text.append(wid)
    bag_lengths = np.fromiter((len(b) for b in bags), np.int64, len(bags))
    flat = np.concatenate(bags).astype(np.int32) if bags else np.zeros(0, np.int32)
    return Texts(keys, words=Ragged.of(lengths, np.array(per_text, np.int32)), bags=Ragged.of(bag_lengths, flat))


# --- the cache -----------------------------------------------------------------------------------


def cache_key(negatives_sha256: str, tokenizer, n: int) -> str:
    """What the cached arrays depend on: the negatives, the tokenizer's identity, and the code of this
    module and of the tokenizer's."""
    code = [code_fingerprint(m) for m in ("modeling.tokens", type(tokenizer).__module__)]
    blob = json.dumps({"negatives": negatives_sha256, "tokenizer": tokenizer.identity(), "n": n, "code": code})
    return hashlib.sha256(blob.encode()).hexdigest()


def tokens_dir(negatives: Path) -> Path:
    """Where the caches of a negatives output live: `tokens/` beside it (WORKDIR/tokens in a work dir)."""
    return Path(negatives).resolve().parent / "tokens"


def load_or_build(negatives: Path, negatives_sha256: str, tokenizer, n: int) -> Tokenised:
    """The negatives tokenised by `tokenizer`: from the cache when it holds them (memory-mapped: the ranks
    and their loader workers share one copy), else built and cached. A directory that cannot be written is
    no error: the arrays are then built for this run alone."""
    cache = ArrayCache(tokens_dir(negatives), MAX_BYTES)
    key = cache_key(negatives_sha256, tokenizer, n)
    try:
        with cache.locked():  # ranks starting together: one tokenises, the others read what it wrote
            try:
                arrays = cache.get(key[:32], key)
                if arrays is not None:
                    return _tokenised(arrays, cache.path(key[:32]))
            except ValueError as e:  # damaged, planted, an object array: never trusted
                log.warning("%s: unreadable token cache (%s); rebuilding it", cache.path(key[:32]), e)
            tokenised = build(Path(negatives), tokenizer, n)
            try:
                path = cache.put(key[:32], arrays_of(tokenised), key)
            except OSError as e:
                log.warning("%s: could not write the token cache (%s); tokenised for this run only", cache.folder, e)
                return tokenised
            return reopened(path)  # the written files mapped, as the other ranks map them: one copy, not two
    except OSError as e:
        log.warning("%s: cannot cache tokens here (%s); tokenising for this run only", cache.folder, e)
        return build(Path(negatives), tokenizer, n)


def _arrays(prefix: str, obj: Any) -> dict[str, np.ndarray]:
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Ragged):
            out[f"{prefix}{f.name}.starts"], out[f"{prefix}{f.name}.values"] = value.starts, value.values
        elif isinstance(value, np.ndarray):
            out[f"{prefix}{f.name}"] = value
    return out


def arrays_of(tokenised: Tokenised) -> dict[str, np.ndarray]:
    """Every array of `tokenised`, by dotted name (texts.keys, train.shown.values, ...)."""
    return _arrays("texts.", tokenised.texts) | _arrays("train.", tokenised.train) | _arrays("valid.", tokenised.valid)


def _object(cls, prefix: str, arrays) -> Any:
    values = {}
    for f in fields(cls):
        name = f"{prefix}{f.name}"
        if f"{name}.starts" in arrays:
            values[f.name] = Ragged(arrays[f"{name}.starts"], arrays[f"{name}.values"])
        elif name in arrays:
            values[f.name] = arrays[name]
    return cls(**values)


def _tokenised(arrays: dict[str, np.ndarray], path: Path | None) -> Tokenised:
    texts = _object(Texts, "texts.", arrays)
    return Tokenised(texts, _object(Rows, "train.", arrays), _object(Rows, "valid.", arrays), path)


def reopened(path: Path) -> Tokenised:
    """A cache entry mapped again by a process another one handed it to (a spawned loader worker): the
    same pages, not a copy; its digest was checked by the process that read it first."""
    return _tokenised(ArrayCache(path.parent).get(path.name, "", verify=False) or {}, path)
