"""The negatives tokenised once (modeling/tokens.py) and the batches gathered from them (modeling/data.py):
the same tokens as the per-text tokenisers, one cache per vocabulary and tokenizer, never unpickled."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from conftest import write_tiny_dataset

from core.artifacts import read_manifest
from core.errors import DssmError
from modeling.config import DataConfig
from modeling.data import ClickBatches, train_files
from modeling.hashing import Tokenizer, Vocab, perturbed
from modeling.tokens import load_or_build, tokens_dir


def tokenised(data, tokenizer, n: int = 4):
    negatives = data / "negatives"
    return load_or_build(negatives, read_manifest(negatives)["content_sha256"], tokenizer, n)


def texts_of(batch) -> list[list[tuple[int, ...]]]:
    """Each text of a TextBatch as its words' token ids, in order."""
    ids, offsets = batch.ids.tolist(), batch.offsets.tolist() + [len(batch.ids)]
    bags = [tuple(ids[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    words = iter(batch.words.tolist())
    return [[bags[next(words)] for _ in range(n)] for n in batch.lengths.tolist()]


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_dataset(tmp_path / "data")


def test_a_batch_holds_each_texts_tokens_as_the_serving_tokenizer_gives_them(tiny):
    import pyarrow.parquet as pq

    tokenizer = Tokenizer(Vocab.load(tiny / "vocab"), max_words=40)
    files = train_files(tiny / "negatives")
    batches = ClickBatches(tokenised(tiny, tokenizer), files, 0, 1, DataConfig(16), 4, 1)
    index = np.array([0, 5, 30, 95])  # rows of the shards in file order, as the cache numbers them
    queries, docs, *_ = batches.batch(batches.tokenised.train, index, None, 4, False)
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    titles = iter(texts_of(docs))
    for i, query in zip(index, texts_of(queries), strict=True):
        assert query == [tuple(t) for t in tokenizer.trigrams(rows[i]["query"])]
        for text in [rows[i]["positive"], *rows[i]["negatives"]]:
            assert next(titles) == [tuple(t) for t in tokenizer.trigrams(text)]


def test_word_pieces_are_the_tokenizers_padded_batch(tiny):
    from modeling.transformer import WordPieceTokenizer, token_batch

    tokenizer = WordPieceTokenizer(max_tokens=8)
    cached = tokenised(tiny, tokenizer)
    texts = ["cordless drill with 2 batteries and a charger for home use", "rug", ""]
    from modeling.tokens import tokenise

    table = tokenise(texts, tokenizer)
    got, expected = token_batch(table, np.arange(3)), tokenizer.batch(texts)
    assert torch.equal(got.ids, expected.ids) and torch.equal(got.mask, expected.mask)
    assert cached.texts.pieces is not None and cached.texts.words is None


def test_the_cache_is_written_once_per_vocabulary_and_reused_memory_mapped(tiny):
    import pickle

    vocab = Vocab.load(tiny / "vocab")
    first = tokenised(tiny, Tokenizer(vocab, max_words=40))
    written = (first.path / "texts.keys.npy").stat().st_mtime_ns
    again = tokenised(tiny, Tokenizer(vocab, max_words=40))
    assert again.path == first.path and (first.path / "texts.keys.npy").stat().st_mtime_ns == written
    assert isinstance(again.texts.words.values, np.memmap)  # mapped: ranks and loader workers share its pages
    np.testing.assert_array_equal(again.texts.words.values, first.texts.words.values)
    shorter = tokenised(tiny, Tokenizer(vocab, max_words=2))  # another limit: another entry
    assert shorter.path != first.path and shorter.texts.words.lengths(np.arange(5)).max() <= 2
    assert sorted(p.name for p in tokens_dir(tiny / "negatives").iterdir() if p.is_dir()) == sorted(
        [first.path.name, shorter.path.name]
    )
    sent = pickle.dumps(again)  # what a spawned loader worker receives: the entry, mapped again there
    assert len(sent) < 1000 and isinstance(pickle.loads(sent).train.query, np.memmap)
    np.testing.assert_array_equal(pickle.loads(sent).train.query, first.train.query)


def test_a_damaged_or_planted_cache_is_rebuilt_and_never_unpickled(tiny, caplog):
    tokenizer = Tokenizer(Vocab.load(tiny / "vocab"), max_words=40)
    good = tokenised(tiny, tokenizer)
    expected = good.texts.keys.copy()
    (good.path / "texts.keys.npy").write_bytes(b"not an npy")
    assert np.array_equal(tokenised(tiny, tokenizer).texts.keys, expected)
    # an object array needs pickle to load: refused, then rebuilt
    np.save(good.path / "texts.keys.npy", np.array([object()], dtype=object), allow_pickle=True)
    caplog.clear()
    assert np.array_equal(tokenised(tiny, tokenizer).texts.keys, expected)
    assert "unreadable token cache" in caplog.text and "Python objects" in caplog.text


def test_a_planted_cache_of_the_right_name_and_shape_is_refused_and_rebuilt(tiny, caplog):
    """Issue 74's probe planted caches that load: ids beyond the vocabulary (a bare IndexError in training)
    and rows permuted (used silently: validation loss 1.48 against 1.07). Each entry carries a digest of its
    arrays keyed by what it caches (the negatives, the tokenizer, the code), so neither is read."""
    tokenizer = Tokenizer(Vocab.load(tiny / "vocab"), max_words=40)
    good = tokenised(tiny, tokenizer)
    keys, queries = np.array(good.texts.keys), np.array(good.train.query)  # copies: the files are planted over
    arrays = {p.name: np.load(p) for p in good.path.glob("*.npy")}
    names = [k for k in arrays if k.endswith(".values.npy") and arrays[k].dtype.kind in "iu" and arrays[k].size]
    for plant in ("beyond", "permuted"):
        planted = {k: v.copy() for k, v in arrays.items()}
        if plant == "beyond":
            planted[names[0]][0] = 10**6  # an id no vocabulary has
        else:
            planted["train.query.npy"] = planted["train.query.npy"][::-1].copy()  # the rows of another order
        for name, array in planted.items():
            np.save(good.path / name, array)
        caplog.clear()
        again = tokenised(tiny, tokenizer)
        assert "do not match their digest" in caplog.text
        assert np.array_equal(again.texts.keys, keys) and np.array_equal(again.train.query, queries)


def test_a_work_dir_where_the_cache_cannot_go_tokenises_for_the_run_alone(tiny, caplog):
    folder = tokens_dir(tiny / "negatives")
    shutil.rmtree(folder, ignore_errors=True)
    folder.write_text("a file where the cache's folder would be")  # unwritable, even for root
    result = tokenised(tiny, Tokenizer(Vocab.load(tiny / "vocab"), max_words=40))
    assert result.path is None and len(result.train) == 96 and "cannot cache tokens" in caplog.text


def test_perturbed_words_drop_never_a_whole_text_and_scramble_only_flagged_texts():
    rng = np.random.default_rng(0)
    lengths = np.array([1, 5, 3, 6])
    occurrences = np.arange(lengths.sum())
    kept_lengths, kept = perturbed(lengths, occurrences, rng, 0.9, None)
    assert (kept_lengths >= 1).all() and kept_lengths[0] == 1 and len(kept) == kept_lengths.sum()
    flags = np.array([False, True, False, True])
    same_lengths, order = perturbed(lengths, occurrences, np.random.default_rng(1), 0.0, flags)
    texts = np.split(order, np.cumsum(same_lengths)[:-1])
    assert list(texts[0]) == [0] and list(texts[2]) == [6, 7, 8]  # unflagged: in order
    assert sorted(texts[1]) == [1, 2, 3, 4, 5] and sorted(texts[3]) == list(range(9, 15))
    assert list(texts[1]) != [1, 2, 3, 4, 5] or list(texts[3]) != list(range(9, 15))


def test_negatives_per_row_scores_the_first_k_and_validation_all(tiny):
    tokenizer = Tokenizer(Vocab.load(tiny / "vocab"), max_words=40)
    cached, files = tokenised(tiny, tokenizer), train_files(tiny / "negatives")
    for k, titles in ((0, 1), (2, 3), (-1, 5)):
        batches = ClickBatches(cached, files, 0, 1, DataConfig(16, negatives_per_row=k), 4, 1)
        queries, docs, *_ = next(batches.steps(0, 1))
        assert len(docs) == titles * len(queries)
        _, (v_queries, v_docs, *_) = next(batches.valid(8))
        assert len(v_docs) == 5 * len(v_queries)  # every sampled negative, whatever k
    with pytest.raises(DssmError, match="carry 4"):
        ClickBatches(cached, files, 0, 1, DataConfig(16, negatives_per_row=5), 4, 1)
