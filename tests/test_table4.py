"""Papers as tests: PROTOCOL.md's reference rows and our Table IV row of the LSTM-RNN on Home Depot.

The LSTM-RNN row is re-measured from the raw judged file as reproductions/homedepot_table4.py does
it (LSTM only): `dssm run --config configs/homedepot_table4/lstm.yaml` simulates click logs, cleans,
builds the vocabulary and negatives, trains with the chosen config and evaluates against BM25. To
keep the suite within its time budget it simulates 400,000 impressions instead of the table's
1,000,000 and trains 3 epochs instead of 10, and pins that run's rows, the LSTM-RNN and its hybrid
with BM25 (BENCHMARKS.md, "Table IV: CI's pinned row"); `make table4` reproduces the full table with
3 seeds. It also leaves out what no row depends on: the logs are v2 (doc ids and a catalogue; they
clean to v1's rows, tests/test_clean.py), clean writes no impressions/, so there is no propensity
stage (the config does not debias), and no index is built. The run's data stages are also the data
jobs' test on the real judgments: the protocol's test subset held out of the logs, the counts
reconciled from simulate to negatives. Skipped where ../shared/data is absent.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from core.artifacts import read_manifest
from core.judgments import read_judgments
from dssm.cli import main as dssm_main
from scoring.protocol import CUTOFFS, build_eval_set, evaluate_scores
from scoring.systems import build_baseline

pytestmark = pytest.mark.integration

REFERENCE = {"bm25": (70.1, 73.9, 88.4), "doc2vec": (67.2, 71.6, 87.3), "minilm": (71.9, 76.0, 89.2)}
# BENCHMARKS.md, "Table IV: CI's pinned row": the chosen config on 400k impressions at 3 epochs (the table: 1M
# and 10), one shared query/title tower and in-batch negatives (the defaults since issue 18), seed 1.
PINNED_LSTM = (71.74, 75.59, 89.10)
PINNED_HYBRID = (71.88, 75.67, 89.18)  # lstm+bm25, the fusion weight fit on the validation queries
CI_IMPRESSIONS, CI_EPOCHS = 400_000, 3
CHOSEN = Path(__file__).resolve().parents[1] / "configs" / "homedepot_table4" / "lstm.yaml"  # make table4's
TOLERANCE = 1.0  # seeds are fixed, but threads change float summation order in training
# Settings no pinned number depends on (the module docstring): the training rows stay `make table4`'s.
UNUSED = ["--no-index", "simulate.log_format=2", "clean.impressions=false"]
# The pinned rows are the model's and its fusion with BM25; the 3-way fusion with the bundled MiniLM would add
# ~6 minutes of MiniLM over the 53,474 titles (make search-table measures it), and the gate compares re-ranking.
PINNED_ONLY = ["evaluate.fusions=[MODEL+bm25]", "gate.metric=ndcg@10", "evaluate.retrieval=false"]
NEGATIVES = {"train_rows": 42_919, "train_queries": 8_283, "valid_rows": 5_141, "valid_queries": 997}


@pytest.fixture(scope="module")
def hd_pairs(home_depot):
    return read_judgments(home_depot)


def row(pairs, system: str) -> tuple[float, ...]:
    eval_set = build_eval_set(pairs, "homedepot", "sha")
    assert (len(eval_set.queries), eval_set.n_pairs) == (1_580, 13_065)
    queries, titles = eval_set.pairs()
    result = evaluate_scores(eval_set, system, build_baseline(system, pairs).scorer.score(queries, titles))
    return tuple(result.mean(f"ndcg@{k}") for k in CUTOFFS)


def test_bm25_reproduces_the_protocol_reference_row(hd_pairs):
    assert row(hd_pairs, "bm25") == pytest.approx(REFERENCE["bm25"], abs=0.2)


@pytest.fixture(scope="module")
def table4_run(home_depot, tmp_path_factory) -> Path:
    """The flow's work directory after the pinned run: its data stages are also the data jobs' test on Home Depot."""
    work = tmp_path_factory.mktemp("table4") / "work"
    data = ["--judgments", str(home_depot), "--workdir", str(work)]
    ci = ["--impressions", str(CI_IMPRESSIONS), "--epochs", str(CI_EPOCHS)]
    assert dssm_main(["run", "--config", str(CHOSEN), *data, *ci, *UNUSED, *PINNED_ONLY]) == 0
    return work


def test_the_data_jobs_on_home_depot_hold_out_the_test_queries_and_reconcile(table4_run, hd_pairs):
    assert len(hd_pairs) == 74_067
    work = table4_run
    # PROTOCOL.md §4: the evaluation subset of the held-out test pairs
    by_query = defaultdict(list)
    for pair in pq.read_table(work / "simulate" / "test_pairs.parquet").to_pylist():
        by_query[pair["query_norm"]].append(pair["label"])
    subset = {q: labels for q, labels in by_query.items() if len(labels) >= 5 and len(set(labels)) >= 2}
    assert (len(subset), sum(map(len, subset.values()))) == (1_580, 13_065)
    manifests = {stage: read_manifest(work / stage) for stage in ("simulate", "clean", "vocab", "negatives")}
    counts = {stage: m["counts"] for stage, m in manifests.items()}
    c = counts["clean"]
    assert c["lines_read"] == counts["simulate"]["lines"] == c["kept"] + c["rejected"]
    assert c["queries"] > 2_000 and c["titles"] > 10_000
    clicked = pq.read_table(work / "clean" / "pairs").column("query").to_pylist()
    assert not set(by_query) & set(clicked)  # no test query reaches the logs
    trigrams = counts["vocab"]["trigrams"]
    assert 5_000 < trigrams["size"] <= 50_000 and trigrams["coverage"] > 0.99
    n = counts["negatives"]
    assert n["train_rows"] + n["valid_rows"] == c["pairs"]
    for stage in ("vocab", "negatives"):
        assert manifests[stage]["inputs"]["clean"]["sha256"] == manifests["clean"]["content_sha256"]


def test_lstm_rnn_row_of_table_iv(table4_run):
    work = table4_run
    stages = {s["stage"]: s for s in json.loads((work / "report.json").read_text())["pipeline"]["stages"]}
    assert NEGATIVES.items() <= stages["negatives"]["counts"].items() and "propensity" not in stages
    report = json.loads((work / "eval" / "report.json").read_text())
    lstm, bm25, hybrid = (report["systems"][s] for s in ("lstm", "bm25", "lstm+bm25"))
    assert report["eval_queries"] == 1_580 and report["eval_pairs"] == 13_065
    assert [lstm[f"ndcg@{k}"] for k in CUTOFFS] == pytest.approx(PINNED_LSTM, abs=TOLERANCE)
    assert [hybrid[f"ndcg@{k}"] for k in CUTOFFS] == pytest.approx(PINNED_HYBRID, abs=TOLERANCE)
    for system in (lstm, hybrid):  # ahead of BM25 at every cutoff, significantly at @3 and @10 (p < 1e-3)
        assert all(system[f"ndcg@{k}"] > bm25[f"ndcg@{k}"] for k in CUTOFFS)
        assert system["p_vs_bm25"]["ndcg@3"] < 0.05 and system["p_vs_bm25"]["ndcg@10"] < 0.05
    assert hybrid["p_vs_bm25"]["ndcg@1"] < 0.05  # issue 18: the hybrid significantly ahead at every cutoff (p 0.020)
    assert [bm25[f"ndcg@{k}"] for k in CUTOFFS] == pytest.approx(REFERENCE["bm25"], abs=0.2)
    for k, doc2vec in zip(CUTOFFS, REFERENCE["doc2vec"], strict=True):
        assert lstm[f"ndcg@{k}"] - lstm["ci95"][f"ndcg@{k}"] > doc2vec  # its 95% interval is above doc2vec's row
    # Section V-A on the same model (the flow's analyze stage): the input gates attenuate function
    # words; "in" and "with" are among the 12 words with the lowest mean input gate (docs/analysis.md)
    analysis = json.loads((work / "analysis" / "analysis.json").read_text())["test_queries"]
    assert analysis["queries"] == 1_580
    assert {"in", "with"} <= {word for word, _, _ in analysis["input_gate_lowest"]}
    # Not asserted: the LSTM-RNN's own win at NDCG@1 is significant only by a hair (p = 0.043 in this
    # run, 0.049 for the 10-epoch 3-seed mean in BENCHMARKS.md), too close to 0.05 to pin.
