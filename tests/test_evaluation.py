"""PROTOCOL.md metrics by hand, the lexical baselines, and the report files."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.errors import DssmError
from core.judgments import JudgedPair
from core.text import is_test_query
from scoring.lexical import BM25, PLSA, Collection, UnigramLM
from scoring.protocol import (
    build_eval_set,
    evaluate_scores,
    ndcg,
    paired_test,
    pairs_in_order,
    reciprocal_rank_and_ap,
)
from stages.evaluate.report import markdown, summarise, write_trec


def test_ndcg_by_hand_with_stable_ties():
    labels = np.array([1.0, 3.0, 2.0])  # rel 0, 2, 1 → gains 0, 3, 1
    ideal3 = 3 + 1 / math.log2(3)
    assert ndcg(labels, np.array([0.1, 0.9, 0.5]), 3, 1.0) == pytest.approx(1.0)
    assert ndcg(labels, np.array([0.9, 0.1, 0.5]), 3, 1.0) == pytest.approx((0 + 1 / math.log2(3) + 3 / 2) / ideal3)
    # all scores tied: file order (0, 1, 2) → gains 0, 3, 1
    assert ndcg(labels, np.zeros(3), 1, 1.0) == 0.0
    assert ndcg(labels, np.zeros(3), 3, 1.0) == pytest.approx((3 / math.log2(3) + 1 / 2) / ideal3)
    # k beyond the list is the full list
    assert ndcg(labels, np.zeros(3), 10, 1.0) == ndcg(labels, np.zeros(3), 3, 1.0)


def test_pairs_in_order_by_hand_with_stable_ties():
    labels = np.array([3.0, 1.0, 2.0, 2.0])  # 5 pairs with different labels (the two 2s tie)
    assert pairs_in_order(labels, np.array([4.0, 1.0, 3.0, 2.0])) == 1.0
    assert pairs_in_order(labels, np.array([1.0, 4.0, 2.0, 3.0])) == 0.0
    # ranked 3, 1, 2, 2: 3 above everything (3 right), 1 above both 2s (2 wrong)
    assert pairs_in_order(labels, np.array([4.0, 3.0, 2.0, 1.0])) == pytest.approx(3 / 5)
    assert pairs_in_order(labels, np.zeros(4)) == pytest.approx(3 / 5)  # all tied: file order
    assert pairs_in_order(np.array([2.0, 2.0]), np.array([1.0, 0.0])) is None
    # only the pairs across groups of ranked 3a, 1b, 2a, 2b: 3a-1b and 3a-2b right, 1b-2a wrong, 2a-2b tied
    groups = np.array(["a", "b", "a", "b"])
    assert pairs_in_order(labels, np.array([4.0, 3.0, 2.0, 1.0]), groups) == pytest.approx(2 / 3)
    assert pairs_in_order(labels, np.array([4.0, 3.0, 2.0, 1.0]), np.zeros(4)) is None


def test_rr_and_ap():
    relevant = np.array([False, True, False, True])
    rr, ap = reciprocal_rank_and_ap(relevant, np.array([4.0, 3.0, 2.0, 1.0]))
    assert rr == 0.5 and ap == pytest.approx((1 / 2 + 2 / 4) / 2)


def judged(rows: list[tuple[str, str, float]]) -> list[JudgedPair]:
    return [JudgedPair(i, q, t, label) for i, (q, t, label) in enumerate(rows)]


def find_queries(test: bool, count: int) -> list[str]:
    out, i = [], 0
    while len(out) < count:
        q = f"query {i}"
        if is_test_query(q) == test:
            out.append(q)
        i += 1
    return out


def test_eval_subset_follows_protocol():
    test_q, train_q = find_queries(True, 3), find_queries(False, 1)
    rows = []
    rows += [(test_q[0].upper(), f"t{i}", 1.0 + i % 3) for i in range(5)]  # kept (grouped by norm)
    rows += [(test_q[1], f"t{i}", 2.0) for i in range(6)]  # one label value: dropped
    rows += [(test_q[2], f"t{i}", 1.0 + i % 2) for i in range(4)]  # four titles: dropped
    rows += [(train_q[0], f"t{i}", 1.0 + i % 2) for i in range(6)]  # a train query
    es = build_eval_set(judged(rows), "x", "sha")
    assert [q.query for q in es.queries] == [test_q[0].upper()] and es.n_pairs == 5 and es.min_label == 1.0
    assert build_eval_set(judged(rows), "x", "sha", all_queries=True).n_pairs == 11
    with pytest.raises(DssmError, match="no test queries"):
        build_eval_set(judged(rows[5:]), "x", "sha")
    with pytest.raises(DssmError, match="expected 5 scores"):
        evaluate_scores(es, "s", np.zeros(4))


def test_bm25_by_hand():
    titles = ["red drill", "blue drill kit", "red paint"]
    bm25 = BM25.fit(Collection(titles), k1=1.2, b=0.75)
    avgdl = 7 / 3
    idf_red = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    idf_drill = idf_red
    norm_len = 1 - 0.75 + 0.75 * 2 / avgdl
    expected = (idf_red + idf_drill) * 2.2 / (1 + 1.2 * norm_len)
    scores = bm25.score(["Red  DRILL", "red drill"], ["red drill", "blue drill kit"])
    assert scores[0] == pytest.approx(expected)
    norm_len3 = 1 - 0.75 + 0.75 * 3 / avgdl
    assert scores[1] == pytest.approx(idf_drill * 2.2 / (1 + 1.2 * norm_len3))


def test_ulm_and_plsa_prefer_the_matching_title():
    titles = ["red cordless drill", "blue paint gallon", "red paint quart", "cordless drill kit"] * 3
    collection = Collection(titles)
    for scorer in (UnigramLM(collection, mu=10), PLSA(collection, topics=2, iterations=20)):
        scores = scorer.score(["cordless drill"] * 2, ["cordless drill kit", "blue paint gallon"])
        assert scores[0] > scores[1]
    # an unseen query word adds the same amount to every title, so it cannot change an order
    ulm = UnigramLM(collection)
    a = ulm.score(["drill zzz", "drill zzz"], ["red cordless drill", "red paint quart"])
    b = ulm.score(["drill", "drill"], ["red cordless drill", "red paint quart"])
    assert a[0] - a[1] == pytest.approx(b[0] - b[1])


def test_report_table_significance_and_trec_files(tmp_path):
    test_q = find_queries(True, 40)
    rows = [(q, f"{q} title {i}", 1.0 + (i % 3)) for q in test_q for i in range(6)]
    es = build_eval_set(judged(rows), "toy", "sha")
    labels = np.concatenate([q.labels for q in es.queries])
    rng = np.random.default_rng(0)
    results = [
        evaluate_scores(es, "bm25", rng.random(len(labels))),
        evaluate_scores(es, "oracle", labels),
        evaluate_scores(es, "tied", np.zeros(len(labels))),
    ]
    report = summarise(es, results, relevant_at=2.5)
    assert report["eval_queries"] == 40 and report["eval_pairs"] == 240
    assert report["systems"]["oracle"]["ndcg@10"] == pytest.approx(100.0)
    assert report["systems"]["oracle"]["p_vs_bm25"]["ndcg@1"] < 0.05
    assert "p_vs_bm25" not in report["systems"]["bm25"]
    table = markdown(report)
    assert table.splitlines()[4].startswith("| oracle | 100.0† | 100.0† | 100.0† | 100.0 | 100.0 |")
    write_trec(tmp_path, es, results)
    run = (tmp_path / "runs" / "oracle.run").read_text().splitlines()
    qrels = (tmp_path / "qrels.txt").read_text().splitlines()
    assert len(run) == len(qrels) == 240
    qid, _, doc, rank, score, tag = run[0].split()
    assert rank == "1" and float(score) == 3.0 and tag == "oracle"
    assert f"{qid} 0 {doc} 2" in qrels


def test_paired_test_identical_is_one():
    assert paired_test(np.array([0.1, 0.5]), np.array([0.1, 0.5])) == 1.0


def test_two_models_of_one_encoder_get_distinct_names():
    from pathlib import Path

    from scoring.systems import System, unique_names

    def trained(run: str, sha: str) -> System:
        return System("lstm", "trained", None, tags={"checkpoint_sha256": sha}, checkpoint=Path(run) / "last.pt")

    systems = [trained("/a/train/lstm", "1"), trained("/a/train/lstm-para", "2"), trained("/b/train/lstm", "3")]
    unique_names(systems)
    names = [s.name for s in systems]
    assert names[:2] == ["lstm", "lstm-para"] and names[2].startswith("lstm-") and len(set(names)) == 3
    # the first of several is not named after the encoder as if it were the only one
    systems = [trained("/a/train/ablation-x-s1", "1"), trained("/a/train/ablation-x-s2", "2")]
    unique_names(systems)
    assert [s.name for s in systems] == ["ablation-x-s1", "ablation-x-s2"]
    lone = [trained("/a/train/ablation-x-s1", "1")]
    unique_names(lone)
    assert lone[0].name == "lstm"


def test_hybrid_weight_follows_the_dev_split():
    from scoring.hybrid import RATIOS, fit_weights

    rng = np.random.default_rng(0)
    rows = [(f"query {i}", f"title {i} {j}", float(1 + j % 3)) for i in range(30) for j in range(6)]
    dev = build_eval_set(judged(rows), "x", "sha", all_queries=True)
    queries, titles = dev.pairs()
    labels = np.concatenate([q.labels for q in dev.queries])
    noise = rng.normal(size=len(labels))

    class Fixed:
        def __init__(self, values):
            self.values = values

        def score(self, q, t):
            return self.values

    # the model ranks perfectly and BM25 is noise: no BM25; the other way round: BM25 dominates, at
    # the smallest weight that reaches its ranking
    assert fit_weights(dev, Fixed(labels), [Fixed(noise)]).ratios == (0.0,)
    fit = fit_weights(dev, Fixed(noise), [Fixed(labels)])
    (ratio,) = fit.ratios
    assert fit.dev_objective == 100.0 and fit.grid[0.0] < 80 and fit.dev_queries == 30
    assert ratio > 0 and fit.grid[ratio] > max(v for r, v in fit.grid.items() if r < ratio)
    assert fit.grid[RATIOS[-1]] == 100.0


def test_a_hybrid_of_several_scorers_weighs_each_on_the_dev_split_and_the_grid_keeps_even_mixes_first():
    from scoring.fusion import RetrievalFusion, weight_grid
    from scoring.hybrid import fit_weights, fusion_components

    rng = np.random.default_rng(1)
    rows = [(f"query {i}", f"title {i} {j}", float(1 + j % 3)) for i in range(30) for j in range(6)]
    dev = build_eval_set(judged(rows), "x", "sha", all_queries=True)
    labels = np.concatenate([q.labels for q in dev.queries])

    class Fixed:
        def __init__(self, values):
            self.values = values

        def score(self, q, t):
            return self.values

    noise, more_noise = rng.normal(size=len(labels)), rng.normal(size=len(labels))
    fit = fit_weights(dev, Fixed(noise), [Fixed(more_noise), Fixed(labels)])
    assert fit.ratios[0] == 0.0 and fit.ratios[1] > 0 and fit.dev_objective == 100.0 > fit.alone
    # the retrieval grid: simplex weights, the model's above 0, equal thirds first; a hybrid saved before
    # components (model + BM25, one weight, alpha) reads as that
    assert weight_grid(3)[0] == pytest.approx((1 / 3, 1 / 3, 1 / 3)) and len(weight_grid(3)) == 78
    assert all(w[0] > 0 and sum(w) == pytest.approx(1) for w in weight_grid(3))
    assert fusion_components({"weight": 0.3, "bm25": {}}) == (
        [{"name": "model", "kind": "model"}, {"name": "bm25", "kind": "bm25"}],
        [0.3],
    )
    assert RetrievalFusion.from_dict({"method": "rrf", "depth": 40, "alpha": 0.7}).weights == pytest.approx((0.7, 0.3))


def test_fusion_specs_expand_model_once_per_trained_model_and_refuse_what_cannot_fuse():
    from core.errors import DssmError
    from stages.evaluate.config import check_fusions
    from stages.evaluate.job import fusion_names

    assert fusion_names("MODEL+bm25+minilm", "lstm") == ["lstm", "bm25", "minilm"]
    assert fusion_names("MODEL+bm25", None) is None  # a MODEL spec needs a model
    assert fusion_names("minilm+bm25", None) == ["minilm", "bm25"] and fusion_names("minilm+bm25", "lstm") is None
    assert fusion_names("MODEL+bm25+minilm-ft", "minilm-ft") is None  # the model twice: not a fusion
    assert check_fusions(["MODEL+bm25", "MODEL+bm25"]) == ["MODEL+bm25"]
    for bad in ("bm25", "MODEL+", "bm25+bm25"):
        with pytest.raises(DssmError, match="two or more distinct scorers"):
            check_fusions([bad])
