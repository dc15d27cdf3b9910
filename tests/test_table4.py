"""Papers as tests: PROTOCOL.md's reference rows and our Table IV row of the LSTM-RNN on Home Depot.

The LSTM-RNN row is re-measured from the raw judged file as benchmarks/homedepot_table4.py does
it (LSTM only): `dssm run` simulates 1M impressions, cleans, builds the vocabulary and negatives,
trains with the chosen config and evaluates against BM25. Skipped where ../shared/data is absent.
"""

from __future__ import annotations

import json

import pytest

from dssm.cli import main as dssm_main
from dssm.judgments import read_judgments
from evaluation.protocol import CUTOFFS, build_eval_set, evaluate_scores
from evaluation.systems import build_baseline

pytestmark = pytest.mark.integration

REFERENCE = {"bm25": (70.1, 73.9, 88.4), "doc2vec": (67.2, 71.6, 87.3), "minilm": (71.9, 76.0, 89.2)}
# BENCHMARKS.md, "Table IV on Home Depot": the LSTM-RNN row measured by the benchmark command.
PINNED_LSTM = (70.77, 74.61, 88.63)
TOLERANCE = 1.0  # seeds are fixed, but threads change float summation order in training


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


def test_lstm_rnn_row_of_table_iv(home_depot, tmp_path):
    work = tmp_path / "work"
    data = ["--judgments", str(home_depot), "--workdir", str(work), "--impressions", "1000000"]
    chosen = ["epochs=10", "loss.pair_weight=log_clicks"]  # benchmarks/homedepot_table4.py's CHOSEN
    assert dssm_main(["run", *data, "--train", *chosen]) == 0  # ends with `dssm evaluate` against BM25
    report = json.loads((work / "eval" / "report.json").read_text())
    lstm, bm25 = report["systems"]["lstm"], report["systems"]["bm25"]
    assert report["eval_queries"] == 1_580 and report["eval_pairs"] == 13_065
    assert [lstm[f"ndcg@{k}"] for k in CUTOFFS] == pytest.approx(PINNED_LSTM, abs=TOLERANCE)
    assert [bm25[f"ndcg@{k}"] for k in CUTOFFS] == pytest.approx(REFERENCE["bm25"], abs=0.2)
    for k, doc2vec in zip(CUTOFFS, REFERENCE["doc2vec"], strict=True):
        assert lstm[f"ndcg@{k}"] - lstm["ci95"][f"ndcg@{k}"] > doc2vec  # its 95% interval is above doc2vec's row
    # Not asserted, because it is not so: a significant win over BM25. The LSTM-RNN is ahead by
    # 0.2-0.7 points with p = 0.17-0.42 (BENCHMARKS.md); the bar is not met yet.
