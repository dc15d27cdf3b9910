"""Wieting & Gimpel's setting: sentence-pair files through the Spark jobs, the margin loss with
in-batch negatives, `dssm train --objective paraphrase` and `dssm sts` against a real MLflow store."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import mlflow
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_ATTRIBUTES, TINY_PRODUCTS
from scipy import stats

from core.sentence_pairs import SentencePair, parse_line, read_pairs, sentence_norm
from dssm.cli import main as dssm_main
from modeling.checkpoint import load_model, read_checkpoint
from modeling.hashing import Tokenizer, Vocab
from modeling.model import paraphrase_loss
from scoring.neural import TwoTowerEmbedder
from stages.negatives.config import NegativesConfig
from stages.negatives.job import negatives
from stages.paraphrase.job import paraphrase
from stages.sts.job import sts_files
from stages.vocab.job import vocab


def test_line_formats_and_sentence_norm():
    assert parse_line("A cat.\tThe cat!\n", "pairs") == SentencePair("A cat.", "The cat!", None)
    assert parse_line("3.6\tA cat.\tA dog.", "sts") == SentencePair("A cat.", "A dog.", 3.6)
    assert parse_line("\tA cat.\tA dog.", "sts") == "no_score"  # 2015/2016 distractors have no gold score
    stsb = "main-captions\tMSRvid\t2012test\t0024\t2.500\tA girl is styling her hair.\tA girl is brushing her hair."
    assert parse_line(stsb, "stsb") == SentencePair("A girl is styling her hair.", "A girl is brushing her hair.", 2.5)
    assert parse_line("6\tA boy.\tA kid.\t3.3\tNEUTRAL", "sick") == SentencePair("A boy.", "A kid.", 3.3)
    assert parse_line("only one field", "pairs") == "malformed"
    assert parse_line("  \tsecond", "pairs") == "empty_sentence"
    assert sentence_norm("A cat, on tree-branches. It's 5.5 m!") == "a cat , on tree-branches . it's 5.5 m !"


def write_pairs(path: Path) -> Path:
    """Paraphrase pairs of the tiny domain ("ATTRIBUTE PRODUCT kit" ~ "PRODUCT in ATTRIBUTE"), a
    duplicate, and four unusable lines."""
    rng = random.Random(3)
    lines = []
    for product in TINY_PRODUCTS:
        for attribute in TINY_ATTRIBUTES:
            lines.append(f"The {attribute.upper()} {product} kit.\tA {product} in {attribute}")
    rng.shuffle(lines)
    lines += [lines[0], "no tab here", "\tempty first", "", "x\t  "]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def paraphrase_data(spark, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("para")
    source = write_pairs(work / "pairs.tsv")
    paraphrase(spark, str(source), work / "clean")
    vocab(spark, work / "clean", work / "vocab")
    negatives(spark, work / "clean", work / "negatives", NegativesConfig(n=0, shards=2, valid_fraction=0.2))
    return work


def test_the_spark_jobs_prepare_pairs_like_click_pairs(spark, paraphrase_data):
    manifest = json.loads((paraphrase_data / "clean" / "manifest.json").read_text())
    c = manifest["counts"]
    assert manifest["stage"] == "clean" and manifest["kind"] == "paraphrase"
    assert c["lines_read"] == 85 == c["kept"] + c["rejected"] and c["kept"] == 81  # 80 pairs + 1 duplicate
    assert c["rejected_by_reason"] == {"blank": 1, "empty_sentence": 2, "malformed": 1}
    pairs = pq.read_table(paraphrase_data / "clean" / "pairs").to_pylist()
    assert len(pairs) == 80 and sum(p["clicks"] for p in pairs) == 81
    assert any(p["query"] == "the white lamp kit ." and p["title"] == "a lamp in white" for p in pairs)
    rejects = pq.read_table(paraphrase_data / "clean" / "rejects").to_pylist()
    assert sorted(r["reason"] for r in rejects) == ["blank", "empty_sentence", "empty_sentence", "malformed"]
    rows = pq.read_table(paraphrase_data / "negatives" / "train").to_pylist()
    rows += pq.read_table(paraphrase_data / "negatives" / "valid").to_pylist()
    assert len(rows) == 80 and all(r["negatives"] == [] for r in rows)
    # rerun: up to date, nothing rewritten
    from core.spark import LazySpark

    lazy = LazySpark()
    again = paraphrase(lazy, str(paraphrase_data / "pairs.tsv"), paraphrase_data / "clean")
    assert again == manifest | {"skipped": True}
    assert lazy._session is None


def test_paraphrase_loss_by_hand():
    s1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    s2 = torch.tensor([[1.0, 0.2], [0.1, 1.0], [1.0, 0.9]])
    groups = torch.tensor([0, 1, 2])
    a, b = F.normalize(s1, dim=1), F.normalize(s2, dim=1)
    cands = torch.cat([a, b])
    expected = 0.0
    for i in range(3):
        others = [j for j in range(6) if j % 3 != i]
        pos = float(a[i] @ b[i])
        t1 = max(float(a[i] @ cands[j]) for j in others)
        t2 = max(float(b[i] @ cands[j]) for j in others)
        expected += max(0.0, 0.4 - pos + t1) + max(0.0, 0.4 - pos + t2)
    assert float(paraphrase_loss(s1, s2, groups, 0.4)) == pytest.approx(expected / 3, abs=1e-6)
    # rows 0 and 2 share their first sentence: they are no negatives of each other
    masked = float(paraphrase_loss(s1, s2, torch.tensor([0, 1, 0]), 0.4))
    assert masked != pytest.approx(expected / 3)
    assert float(paraphrase_loss(s1[:1], s2[:1], groups[:1], 0.4)) == 0.0  # no negative in a batch of one


def test_word_tokens_are_one_id_per_word(paraphrase_data):
    words = Vocab.load(paraphrase_data / "vocab", "words")
    tokenizer = Tokenizer(words, max_words=10)
    ids = [tokenizer.trigrams(t) for t in ["a lamp in white", "a zebra"]]
    assert all(len(w) == 1 for text in ids for w in text)
    assert ids[1][1].tolist() == [0] and ids[0][1].tolist() == [words.index["lamp"]]


# gran also with every regulariser of Wieting & Gimpel's section 4.2 on
REGULARISED = ["model.dropout=0.1", "data.word_dropout=0.1", "data.scramble=0.3", "loss.l2_composition=1e-5"]
REGULARISED += ["loss.l2_embeddings=1e-4"]


@pytest.mark.parametrize("encoder,tokens,extra", [("gran", "trigrams", REGULARISED), ("avg", "words", [])])
def test_train_objective_paraphrase_and_sts(paraphrase_data, tmp_path, encoder, tokens, extra):
    run = tmp_path / "run"
    args = ["train", "--workdir", str(paraphrase_data), "--objective", "paraphrase", f"model.encoder={encoder}"]
    args += [f"model.tokens={tokens}", "model.ncell=8", "data.batch_size=16", "epochs=8", "optim.name=adam", *extra]
    args += ["optim.lr=0.01", "threads=1", f"out={run}", f"mlflow_uri=sqlite:///{tmp_path}/m.db"]
    assert dssm_main(args) == 0
    model, tokenizer, cfg = load_model(run)
    assert cfg.loss.objective == "paraphrase" and model.query_encoder is model.doc_encoder  # one encoder g
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    run_id = read_checkpoint(run)["mlflow_run_id"]
    losses = [m.value for m in client.get_metric_history(run_id, "train_loss")]
    assert losses[-1] < losses[0]
    penalties = [m.value for m in client.get_metric_history(run_id, "regulariser")]
    assert (len(penalties) == len(losses) and min(penalties) > 0) if extra else not penalties

    # warm start (init_from): a two-tower click model of the same encoder starts from g in both towers,
    # embedding rows matched by token across the two vocabularies
    if encoder == "avg":
        from modeling.checkpoint import warm_start
        from modeling.config import ModelConfig
        from modeling.model import TwoTower

        vocab = Vocab(["<unk>", "zebra", *reversed(tokenizer.vocab.tokens[1:])], "other", kind="words")
        click = TwoTower(vocab.size, ModelConfig(encoder="avg", ncell=8, tokens="words"))
        assert warm_start(click, vocab, run) == {"tensors": 0, "embedding_rows": 2 * (tokenizer.vocab.size)}
        lamp = tokenizer.vocab.index["lamp"]
        for tower in (click.query_encoder, click.doc_encoder):
            torch.testing.assert_close(tower.bag.weight[vocab.index["lamp"]], model.query_encoder.bag.weight[lamp])

    # `dssm sts` on a tiny STS layout: Pearson of the model's cosines against gold, per file and year
    data = tmp_path / "data"
    (data / "semeval-sts-2012-2016" / "2014").mkdir(parents=True)
    rows = []
    for i, product in enumerate(TINY_PRODUCTS):
        other = TINY_PRODUCTS[(i + 3) % len(TINY_PRODUCTS)]
        rows += [
            f"5\tThe steel {product} kit.\tA {product} in steel",
            f"0.5\tThe steel {product} kit.\tA {other} in brass",
        ]
    rows += ["\tunscored\tdistractor"]
    (data / "semeval-sts-2012-2016" / "2014" / "tiny.test.tsv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "sts"
    assert dssm_main(["sts", "--model", str(run), "--data", str(data), "--out", str(out)]) == 0
    report = json.loads((out / "sts.json").read_text())
    (system,) = report["systems"]
    pairs, skipped = read_pairs(data / "semeval-sts-2012-2016" / "2014" / "tiny.test.tsv", "sts")
    assert skipped == {"no_score": 1} and [f.suite for f in sts_files(data)] == ["STS14"]
    embed = TwoTowerEmbedder(run / "last.pt")
    a = embed.embed([sentence_norm(p.s1) for p in pairs])
    b = embed.embed([sentence_norm(p.s2) for p in pairs])
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    expected = 100 * stats.pearsonr(cos, [p.score for p in pairs]).statistic
    result = report["systems"][system]
    assert result["files"]["STS14/tiny"]["pearson"] == pytest.approx(expected, abs=1e-4)
    assert result["suites"]["STS14"] == result["suites"]["STS avg"] == pytest.approx(expected, abs=1e-4)
    assert math.isfinite(result["files"]["STS14/tiny"]["spearman"]) and result["files"]["STS14/tiny"]["n"] == 20
    sts_run = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(result["mlflow_run_id"])
    assert sts_run.data.tags["dataset"] == "sts" and sts_run.data.tags["system"] == system
    assert sts_run.data.metrics["pearson_sts14_tiny"] == pytest.approx(expected, abs=1e-4)
    assert [(i.dataset.name, i.dataset.digest) for i in sts_run.inputs.dataset_inputs] == [
        ("sts", report["dataset_sha256"][:32])
    ]
    assert f"| {system} |" in (out / "sts.md").read_text()


def test_paraphrase_objective_needs_one_encoder(paraphrase_data, tmp_path, capsys):
    args = ["train", "--workdir", str(paraphrase_data), "loss.objective=paraphrase", f"out={tmp_path / 'r'}"]
    assert dssm_main([*args, "model.shared_towers=false"]) == 2
    assert "model.shared_towers=true" in capsys.readouterr().err


def test_scrambling_shuffles_both_sentences_of_a_pair(paraphrase_data):
    from modeling.config import DataInputs
    from modeling.data import ClickBatches, train_files
    from modeling.tokens import Ragged, Rows, Tokenised, tokenise

    tokenizer = Tokenizer(Vocab.load(paraphrase_data / "vocab"), max_words=40)
    words = "one two three four five six seven eight nine".split()
    texts = tokenise([" ".join(words), " ".join(reversed(words))], tokenizer)
    files = train_files(paraphrase_data / "negatives")
    sizes = [pq.ParquetFile(f).metadata.num_rows for f in files]
    n, none = sum(sizes), np.zeros(sum(sizes), np.int64)
    rows = Rows(  # as many rows as the shards hold, each the same pair: sentence 0 and sentence 1
        np.concatenate([[0], np.cumsum(sizes)]),
        *(np.zeros(n, np.int32), np.ones(n, np.int32), np.zeros((n, 0), np.int32)),
        *(np.ones(n, np.float32) for _ in range(3)),
        Ragged.of(none, np.zeros(0, np.int32)),
        Ragged.of(none, np.zeros(0, np.float32)),
    )
    batches = ClickBatches(Tokenised(texts, rows, rows), files, 0, 1, DataInputs(batch_size=2, scramble=0.5), 0, seed=1)

    def word_orders(batch):
        return [tuple(x) for x in torch.split(batch.words, batch.lengths.tolist())]

    every = np.arange(40)
    plain_q, plain_d, *_ = batches.batch(rows, every, None, 0, False)
    queries, docs, *_ = batches.batch(rows, every, np.random.default_rng(0), 0, False)
    q_moved = [a != b for a, b in zip(word_orders(queries), word_orders(plain_q), strict=True)]
    d_moved = [a != b for a, b in zip(word_orders(docs), word_orders(plain_d), strict=True)]
    assert q_moved == d_moved and 5 < sum(q_moved) < 35  # whole pairs, about half of them


def test_regularisers_by_hand():
    from modeling.config import LossConfig, ModelConfig
    from modeling.model import TwoTower, embedding_tables, regulariser

    torch.manual_seed(0)
    model = TwoTower(30, ModelConfig(encoder="gran", ncell=4, shared_towers=True))
    initial = {n: p.detach().clone() for n, p in embedding_tables(model).items()}
    assert list(initial) == ["query_encoder.rnn.bag.weight"]  # one shared table, counted once
    assert regulariser(model, initial, LossConfig()) is None
    composition = sum(float(p.pow(2).sum()) for n, p in model.named_parameters() if "bag" not in n)
    value = regulariser(model, initial, LossConfig(l2_composition=0.1, l2_embeddings=2.0))
    assert float(value) == pytest.approx(0.05 * composition, rel=1e-5)  # embeddings still at step 0
    with torch.no_grad():
        model.query_encoder.rnn.bag.weight[3, :2] += 0.5
    assert float(regulariser(model, initial, LossConfig(l2_embeddings=2.0))) == pytest.approx(0.5, rel=1e-5)
