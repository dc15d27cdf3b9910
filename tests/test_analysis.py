"""The numbers behind the analysis pictures and tables (most active cells, keyword counts, the
bidirectional keyword rule, topic allocation, input-gate attenuation), traces that are true to the
model, and `dssm analyze` end to end with its report logged to the training run in MLflow."""

import json
import logging

import mlflow
import numpy as np
import pytest
import torch
from conftest import tiny_model, write_judged

from dssm.cli import main as dssm_main
from modeling.config import ModelConfig
from modeling.hashing import Tokenizer, Vocab
from modeling.model import TwoTower
from stages.analyze.config import KeywordRule
from stages.analyze.lstm import (
    Trace,
    keyword_counts,
    keywords,
    plot_internals,
    plot_top_cells,
    top_cells,
    trace_text,
    trace_texts,
)
from stages.analyze.topics import input_gate_by_word, keyword_rate, most_active_cells, topic_table


def test_top_cells_and_keyword_counts_on_set_values():
    y = np.array([[0.5, 0.0, 0.0, 0.1], [0.5, 0.3, 0.0, 0.1], [0.45, 0.3, 0.9, -0.2]])
    trace = Trace("a b c", "query", ["a", "b", "c"], {"y": y})
    cells = top_cells(trace, k=3)
    assert cells.tolist() == [2, 0, 1]
    # Thresholds are relative to the largest |y| of these cells over the text: 0.9.
    # word a: cell 0 jumps 0 -> 0.5; word b: cell 1 0 -> 0.3; word c: cell 2 0 -> 0.9 (cell 0 moves 0.05)
    assert keyword_counts(trace, cells, threshold=0.2).tolist() == [1, 1, 1]  # |Δ| > 0.18
    assert keyword_counts(trace, cells, threshold=0.05).tolist() == [1, 1, 2]  # |Δ| > 0.045
    assert keyword_counts(trace, cells, threshold=0.4).tolist() == [1, 0, 1]  # |Δ| > 0.36
    assert keywords(trace, KeywordRule(top=3, threshold=0.05, share=0.4)) == ["c"]  # 2 of 3 cells > 40%


def test_bidirectional_keywords_need_both_directions():
    # Forward: "pipe" and "fitting" move both top cells. Backward (read right to left, final state at
    # "copper"): "copper" and "pipe" move both of its top cells, "fitting" none.
    fw = np.array([[0.0, 0.0], [0.8, 0.6], [0.1, 0.9]])
    bw = np.array([[0.9, 0.7], [0.5, 0.5], [0.0, 0.0]])
    trace = Trace("copper pipe fitting", "query", ["copper", "pipe", "fitting"], {"y": fw, "bw_y": bw})
    assert top_cells(trace, 2, "bw_y").tolist() == [0, 1]  # by the backward output at the first word
    assert keyword_counts(trace, np.array([0, 1]), 0.2, "bw_y").tolist() == [2, 2, 0]
    assert keyword_counts(trace, np.array([0, 1]), 0.2).tolist() == [0, 2, 2]
    rule = KeywordRule(top=2, threshold=0.2, share=0.4)
    assert keywords(trace, rule) == ["pipe"]
    forward_only = Trace(trace.text, "query", trace.words, {"y": fw})
    assert keywords(forward_only, rule) == ["pipe", "fitting"]


def test_topic_table_and_input_gates_on_set_values():
    def trace(words, y, i):
        return Trace(" ".join(words), "query", words, {"y": np.array(y, float), "i": np.array(i, float)})

    # Cell 0 reads drills, cell 1 reads paint; cell 2 never ends high. "for" has the lowest input gate.
    traces = [
        trace(
            ["drill", "for", "wood"],
            [[0.8, 0.0, 0.1], [0.8, 0.0, 0.1], [0.8, 0.1, 0.1]],
            [[0.9] * 3, [0.1] * 3, [0.5] * 3],
        ),
        trace(["white", "paint"], [[0.0, 0.0, 0.1], [0.1, 0.9, 0.1]], [[0.5] * 3, [0.9] * 3]),
        trace(["cordless", "drill"], [[0.0, 0.0, 0.0], [0.9, 0.2, 0.0]], [[0.5] * 3, [0.9] * 3]),
    ]
    assert most_active_cells(traces, k=2, top=2).tolist() == [0, 1]  # 3 and 2 appearances in the top 2
    rule = KeywordRule(top=2, threshold=0.25, share=0.4)
    table = topic_table(traces, rule, k=2, shown=3)
    assert table.cells == [0, 1] and table.n_queries == 3
    by_query = {q: [table.entries[c][j] for c in range(2)] for j, q in enumerate(table.queries)}
    assert by_query["drill for wood"] == [["drill"], []]
    assert by_query["white paint"] == [[], ["paint"]]
    assert by_query["cordless drill"] == [["drill"], []]
    assert table.topics[0] == [("drill", 2)] and table.topics[1] == [("paint", 1)]
    rate, found = keyword_rate(traces, rule)
    assert found == {"drill": 2, "paint": 1} and rate == pytest.approx(3 / 7)
    gates = input_gate_by_word(traces + traces, min_count=2)
    assert gates[0] == ("for", pytest.approx(0.1), 2) and gates[-1][1] == pytest.approx(0.9)


@pytest.fixture(scope="module")
def tiny_model_and_tokenizer(tiny_data):
    vocab = Vocab.load(tiny_data / "vocab")
    torch.manual_seed(0)
    return TwoTower(vocab.size, ModelConfig(ncell=6)).eval(), Tokenizer(vocab, max_words=40)


def test_trace_is_true_to_the_model_and_plots(tiny_model_and_tokenizer, tmp_path):
    model, tokenizer = tiny_model_and_tokenizer
    trace = trace_text(model, tokenizer, "Cordless DRILL kit", "query")
    assert trace.words == ["cordless", "drill", "kit"]
    assert {"i", "c", "o", "y"} <= set(trace.series) and trace.series["y"].shape == (3, 6)
    with torch.no_grad():
        vector = model.encode_queries(tokenizer.batch(["cordless drill kit"]))[0].numpy()
    np.testing.assert_allclose(trace.series["y"][-1], vector, atol=1e-6)
    # traced in one batch of texts of other lengths, each text reads the same as alone
    texts = ["white paint", "cordless drill kit", "a b c d e f", "lamp"]
    for batched, text in zip(trace_texts(model, tokenizer, texts, "doc"), texts, strict=True):
        alone = trace_text(model, tokenizer, text, "doc")
        assert batched.words == alone.words
        for name in alone.series:
            np.testing.assert_allclose(batched.series[name], alone.series[name], atol=1e-6)
    cells = top_cells(trace, k=4)
    assert plot_internals(trace, tmp_path / "gates.png").stat().st_size > 1000
    assert plot_top_cells(trace, cells, tmp_path / "top.png").stat().st_size > 1000


def test_rnn_and_bilstm_traces(tiny_data, tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    vocab = Vocab.load(tiny_data / "vocab")
    torch.manual_seed(0)
    rnn = TwoTower(vocab.size, ModelConfig(encoder="rnn", ncell=5)).eval()
    trace = trace_text(rnn, tokenizer, "steel hammer", "query")
    assert set(trace.series) == {"y"}  # eq. (1) has no gates
    with torch.no_grad():
        vector = rnn.encode_queries(tokenizer.batch(["steel hammer"]))[0].numpy()
    np.testing.assert_allclose(trace.series["y"][-1], vector, atol=1e-6)
    bilstm = TwoTower(vocab.size, ModelConfig(encoder="bilstm", ncell=5)).eval()
    trace = trace_text(bilstm, tokenizer, "steel hammer pro", "query")
    with torch.no_grad():
        vector = bilstm.encode_queries(tokenizer.batch(["steel hammer pro"]))[0].numpy()
    # forward final state at the last word, backward final state at the first
    np.testing.assert_allclose(np.concatenate([trace.series["y"][-1], trace.series["bw_y"][0]]), vector, atol=1e-6)
    assert trace.bidirectional


def test_dssm_analyze_end_to_end_logs_to_the_training_run(tiny_data, tmp_path, caplog):
    lstm = tiny_model(tiny_data, tmp_path / "lstm", "epochs=2")
    rnn = tiny_model(tiny_data, tmp_path / "rnn", "epochs=2", "model.encoder=rnn")
    judged = write_judged(tmp_path / "judged.csv")
    out = tmp_path / "analysis"
    args = ["analyze", "--model", str(lstm), "--compare", str(rnn), "--judgments", str(judged), "--encoding", "utf-8"]
    args += ["--out", str(out), "--pairs", "2", "--topic-queries", "4"]
    assert dssm_main(args) == 0
    result = json.loads((out / "analysis.json").read_text())
    report = (out / "analysis.md").read_text()

    assert len(result["pairs"]) == 2
    first = result["pairs"][0]
    assert len(first["query"]["cells_moved"]) == len(first["query"]["words"]) == len(first["query"]["mean_input_gate"])
    assert [r["model"] for r in first["comparison"]] == ["lstm", "rnn"]
    assert first["comparison"][0]["query_counts"] == first["query"]["cells_moved"]  # same rule, same cells
    test = result["test_queries"]
    assert test["queries"] > 0 and {(k["model"], k["tower"]) for k in test["keywords"]} == {
        (m, t) for m in ("lstm", "rnn") for t in ("query", "doc")
    }
    assert len(test["topics"]["cells"]) == 5 and len(test["topics"]["queries"]) == 4
    assert set(result["cost_curves"]) == {"lstm", "rnn"}  # Fig. 7 from both training runs
    for name in ("cost-curves.png", "pair1-query-internals.png", "pair2-title-top-cells.png"):
        assert (out / name).stat().st_size > 1000 and f"({name})" in report
    assert "Table III" in report and "Tables V-VIII" in report

    # The report is an artifact of the LSTM's training run, in the store it was trained with.
    from modeling.checkpoint import read_checkpoint

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/train.db")
    run_id = read_checkpoint(lstm)["mlflow_run_id"]
    assert {a.path for a in client.list_artifacts(run_id, "analysis")} >= {
        "analysis/analysis.md",
        "analysis/analysis.json",
        "analysis/cost-curves.png",
    }
    assert client.get_run(run_id).data.tags["analysis"] == "analysis/analysis.md"
    history = client.get_metric_history(run_id, "train_loss")
    assert result["cost_curves"]["lstm"]["last"] == [history[-1].step, pytest.approx(history[-1].value)]

    caplog.set_level(logging.INFO)
    assert dssm_main(args) == 0  # same models, data and settings: nothing to do
    assert any("up to date" in r.getMessage() for r in caplog.records)


def test_dssm_analyze_bad_input_is_one_line(tiny_data, tmp_path, capsys):
    assert dssm_main(["analyze", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "a")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err
    lstm = tiny_model(tiny_data, tmp_path / "m", "max_steps=1")
    assert dssm_main(["analyze", "--model", str(lstm), "--out", str(tmp_path / "a"), "--no-mlflow"]) == 2
    assert "give --pair QUERY TITLE or --judgments" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
