"""MiniLM's vectors kept on disk by text (scoring/vector_store.py): any order, batching or process reads them back."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from scoring import neural
from scoring.vector_store import VectorStore

TITLES = [f"{a} {b}" for a in ("cordless drill", "steel hammer", "white paint", "brass faucet") for b in ("kit", "set")]


def shards(folder):
    return [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]


def test_the_store_reads_each_text_from_whichever_shard_holds_it_and_passes_over_a_damaged_one(tmp_path, caplog):
    store = VectorStore(tmp_path / "store")
    assert store.read(TITLES) == {}  # no folder yet
    first, second = np.arange(12, dtype=np.float32).reshape(3, 4), -np.ones((2, 4), np.float32)
    store.write(TITLES[:3], first)
    store.write(TITLES[3:5], second)
    found = store.read([TITLES[4], "never stored", TITLES[1]])
    assert set(found) == {TITLES[4], TITLES[1]}
    np.testing.assert_array_equal(found[TITLES[1]], first[1])
    np.testing.assert_array_equal(found[TITLES[4]], second[1])
    assert not list((tmp_path / "store").glob(".*.tmp"))  # no temporary folder left

    (damaged,) = [p / "vectors.npy" for p in shards(tmp_path / "store") if np.load(p / "keys.npy").shape[0] == 3]
    damaged.write_bytes(damaged.read_bytes()[:-8])
    (tmp_path / "store" / "empty").mkdir()  # what a crash before the data reached the disk leaves
    (tmp_path / "store" / "empty" / "keys.npy").write_bytes(b"")
    fresh = VectorStore(tmp_path / "store")  # another process: its own index
    with caplog.at_level(logging.WARNING):
        found = fresh.read(TITLES)
    assert set(found) == set(TITLES[3:5]) and caplog.text.count("unreadable") == 2
    assert fresh.read(TITLES, width=4).keys() == found.keys() and fresh.read(TITLES, width=384) == {}  # another width


def test_many_small_writers_leave_few_shards_and_a_warm_read_opens_no_key_file(tmp_path, monkeypatch):
    """The fault probe's 2,000 shards made a read 80x slower: every read scanned every shard's keys. Writers
    now merge past MAX_SHARDS, and a process reads each shard's keys once."""
    from scoring import vector_store

    store = VectorStore(tmp_path / "store")
    texts = [f"title {i}" for i in range(3 * vector_store.MAX_SHARDS)]
    for i in range(0, len(texts), 2):  # a writer per two texts, as a search service's odd batches would
        store.write(texts[i : i + 2], np.full((2, 4), i, np.float32))
    assert len(shards(tmp_path / "store")) <= vector_store.MAX_SHARDS
    reader = VectorStore(tmp_path / "store")
    assert sorted(reader.read(texts)) == sorted(texts) and reader.read(texts)["title 5"][0] == 4
    opened = []
    original = np.load
    monkeypatch.setattr(np, "load", lambda path, *a, **k: opened.append(str(path)) or original(path, *a, **k))
    assert len(reader.read(texts[:4])) == 4
    assert not [p for p in opened if p.endswith("keys.npy")] and len(opened) <= 2  # one shard's vectors (two: merged)


def test_minilm_embeds_a_text_once_across_orders_batches_and_embedders(tmp_path, monkeypatch):
    """As evaluate embeds a catalogue and the index stage embeds it again in Spark's batches, in another order."""
    monkeypatch.setenv("DSSM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(neural, "CACHED_AT_LEAST", 4)
    monkeypatch.setattr(neural, "READ_AT_LEAST", 2)
    encoded: list[str] = []

    class Counted(neural.MiniLMEmbedder):
        def _encode(self, texts):
            encoded.extend(texts)
            return super()._encode(texts)

    whole = Counted().embed(TITLES)
    assert sorted(encoded) == sorted(TITLES)
    encoded.clear()
    batches = [TITLES[::-1][:5], TITLES[::-1][5:]]  # another process's batches (a new embedder: an empty memo)
    again = np.concatenate([Counted().embed(batch) for batch in batches])[::-1]
    assert encoded == []
    np.testing.assert_allclose(again, whole, atol=1e-6)
    assert Counted().embed([*TITLES[:3], "a new title"]).shape == (4, 384) and encoded == ["a new title"]

    monkeypatch.setenv("DSSM_CACHE", "off")
    encoded.clear()
    Counted().embed(TITLES[:4])
    assert encoded == TITLES[:4]


def test_a_store_that_cannot_be_written_costs_only_time(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        VectorStore(blocked / "store").write(TITLES[:2], np.zeros((2, 4), np.float32))
    assert "not written" in caplog.text and VectorStore(blocked / "store").read(TITLES) == {}


@pytest.mark.parametrize("value", ["off", "0"])
def test_dssm_cache_off_turns_the_store_off(monkeypatch, value):
    monkeypatch.setenv("DSSM_CACHE", value)
    assert VectorStore.for_release("minilm", neural.RELEASE) is None


def test_a_shard_of_the_right_shape_with_nan_vectors_is_passed_over(tmp_path, caplog):
    """A damaged shard whose shapes still fit (NaN in its vectors) used to reach evaluate and index unchecked."""
    store = VectorStore(tmp_path / "store")
    store.write(TITLES[:2], np.ones((2, 4), np.float32))
    (shard,) = (tmp_path / "store").glob("*/vectors.npy")
    vectors = np.load(shard)
    vectors[1, 2] = np.nan
    np.save(shard, vectors)
    with caplog.at_level(logging.WARNING):
        assert store.read(TITLES[:2]) == {}
    assert "not finite" in caplog.text
