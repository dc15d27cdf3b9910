import json
from collections import Counter

import pyarrow.parquet as pq

from core.text import word_trigrams
from stages.vocab.job import UNKNOWN, build_vocab, trigram_counts, word_counts


def reference_texts(clean_dir):
    queries = {p["query"] for p in pq.read_table(clean_dir / "pairs").to_pylist()}
    titles = [t["title"] for t in pq.read_table(clean_dir / "titles").to_pylist()]
    return sorted(queries) + titles


def test_trigram_and_word_counts_match_the_python_reference(spark, pipeline):
    texts = reference_texts(pipeline["clean"])
    expected_grams = Counter(g for t in texts for w in t.split() for g in word_trigrams(w))
    expected_words = Counter(w for t in texts for w in t.split())
    df = spark.createDataFrame([(t,) for t in texts], "text string")
    assert {r["token"]: r["count"] for r in trigram_counts(df).collect()} == expected_grams
    assert {r["token"]: r["count"] for r in word_counts(df).collect()} == expected_words


def test_ids_are_deterministic_with_unknown_at_zero(spark):
    counts = spark.createDataFrame([("b", 5), ("a", 5), ("c", 9), ("d", 1), ("e", 2)], "token string, count long")
    rows = [tuple(r) for r in build_vocab(counts, min_count=2, max_size=4).orderBy("id").collect()]
    # c (9), then a/b tied on 5 in token order; e is cut by max_size, d by min_count: <unk> holds 2 + 1.
    assert rows == [(0, UNKNOWN, 3), (1, "c", 9), (2, "a", 5), (3, "b", 5)]


def test_vocab_output_and_summary(pipeline):
    vocab_dir = pipeline["vocab"]
    grams = pq.read_table(vocab_dir / "trigrams").to_pylist()
    assert [g["id"] for g in grams] == list(range(len(grams)))
    assert grams[0]["token"] == UNKNOWN
    assert all(len(g["token"]) == 3 for g in grams[1:])
    counts = [g["count"] for g in grams[1:]]
    assert counts == sorted(counts, reverse=True)
    summary = json.loads((vocab_dir / "summary.json").read_text())
    assert summary["trigrams"]["size"] == len(grams)
    assert 0.9 < summary["trigrams"]["coverage"] <= 1.0
    assert pq.read_table(vocab_dir / "words").num_rows == summary["words"]["size"]
