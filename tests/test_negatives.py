import math
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from core.errors import DssmError
from stages.negatives.config import NegativesConfig
from stages.negatives.job import sample_negatives, validation_queries


def rows(path):
    return pq.read_table(path).to_pylist()


def test_negatives_are_never_clicked_for_the_query_and_are_distinct(pipeline):
    clicked = defaultdict(set)
    for p in rows(pipeline["clean"] / "pairs"):
        clicked[p["query"]].add(p["title"])
    pool = {t["title"] for t in rows(pipeline["clean"] / "titles")}
    train, valid = rows(pipeline["negatives"] / "train"), rows(pipeline["negatives"] / "valid")
    assert len(train) + len(valid) == len(rows(pipeline["clean"] / "pairs"))
    for r in train + valid:
        assert len(r["negatives"]) == 4 == len(set(r["negatives"]))
        assert not set(r["negatives"]) & clicked[r["query"]]
        assert set(r["negatives"]) <= pool
        assert r["positive"] in clicked[r["query"]]
    assert not {r["query"] for r in train} & {r["query"] for r in valid}
    assert len(list((pipeline["negatives"] / "train").glob("*.parquet"))) == 3


def test_independent_of_partitioning(spark, pipeline):
    cfg = NegativesConfig(n=3, seed=5)
    pairs = spark.read.parquet(str(pipeline["clean"] / "pairs"))
    titles = spark.read.parquet(str(pipeline["clean"] / "titles"))

    def collect(p, t):
        out = validation_queries(sample_negatives(p, t, cfg), cfg)
        return sorted((r["query"], r["positive"], tuple(r["negatives"]), r["valid"]) for r in out.collect())

    one = collect(pairs.coalesce(1), titles.coalesce(1))
    many = collect(pairs.repartition(7, "title"), titles.repartition(5))
    assert one == many
    other_seed = validation_queries(sample_negatives(pairs, titles, NegativesConfig(n=3, seed=6)), cfg)
    assert sorted((r["query"], r["positive"], tuple(r["negatives"])) for r in other_seed.collect()) != [
        o[:3] for o in one
    ]


def test_tiny_pool_needs_more_rounds_but_still_fills(spark):
    pairs = spark.createDataFrame(
        [("q", "t0", 1, 1), ("q", "t1", 1, 1)], "query string, title string, clicks long, impressions long"
    )
    titles = spark.createDataFrame([(f"t{i}",) for i in range(5)], "title string")
    out = sample_negatives(pairs, titles, NegativesConfig(n=3)).collect()
    assert sorted(sorted(r["negatives"]) for r in out) == [["t2", "t3", "t4"]] * 2


def test_pool_too_small_is_a_clear_error(spark):
    pairs = spark.createDataFrame([("q", "t0", 1, 1)], "query string, title string, clicks long, impressions long")
    titles = spark.createDataFrame([("t0",), ("t1",)], "title string")
    with pytest.raises(DssmError, match="title pool too small"):
        sample_negatives(pairs, titles, NegativesConfig(n=4))


@pytest.mark.integration  # more than one process
def test_a_forced_rerun_in_another_jvm_writes_the_same_bytes(pipeline, tmp_path):
    """Spark lists Parquet encodings in hash-set order, which differs between JVMs; the canonical
    footers (core/spark/footer.py) make a forced rerun in a fresh process byte-identical."""
    import subprocess
    import sys

    from core.artifacts import content_sha256, read_manifest

    out = tmp_path / "negatives"
    cmd = [sys.executable, "-m", "dssm.cli", "negatives", "--clean", str(pipeline["clean"]), "--out", str(out)]
    proc = subprocess.run([*cmd, "--shards", "3", "--master", "local[1]", "--force"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert content_sha256(out) == content_sha256(pipeline["negatives"]) == read_manifest(out)["content_sha256"]


def test_canonical_footers_sort_each_encoding_list_in_place(pipeline, tmp_path):
    import shutil

    from core.spark.footer import _ENCODINGS, _Reader, canonicalize

    part = tmp_path / "part.parquet"
    shutil.copy(next((pipeline["clean"] / "pairs").glob("*.parquet")), part)
    original = part.read_bytes()
    assert not canonicalize(part)  # written canonical
    data = bytearray(original)
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length : -8]
    spans: list = []
    _Reader(footer).struct((), spans)
    assert spans and _ENCODINGS == (4, 1, 3, 2)
    for begin, end, _ in spans:  # what another JVM may write: the same encodings in another order
        footer[begin:end] = bytes(reversed(footer[begin:end]))
    data[-8 - length : -8] = footer
    part.write_bytes(bytes(data))
    assert part.read_bytes() != original and canonicalize(part) and part.read_bytes() == original
    assert pq.read_table(part).num_rows > 0


def test_skip_above_negatives_were_shown_above_the_click_and_never_clicked(spark, pipeline, tmp_path):
    from stages.negatives.job import negatives

    cfg = NegativesConfig(shards=3, skip_above=0.5)
    manifest = negatives(spark, pipeline["clean"], tmp_path / "hard", cfg)
    clicked = defaultdict(set)
    for p in rows(pipeline["clean"] / "pairs"):
        clicked[p["query"]].add(p["title"])
    above = defaultdict(set)  # (query, clicked title) -> titles shown above it and skipped there
    for imp in rows(pipeline["clean"] / "impressions"):
        shown = list(zip(imp["titles"], imp["clicked"], strict=True))
        for j, (title, click) in enumerate(shown):
            if click:
                above[imp["query"], title] |= {t for t, c in shown[:j] if not c}
    random_rows = {(r["query"], r["positive"]): r["negatives"] for r in rows(pipeline["negatives"] / "train")}
    hard_rows = rows(tmp_path / "hard" / "train") + rows(tmp_path / "hard" / "valid")
    assert len(hard_rows) == len(rows(pipeline["clean"] / "pairs"))
    taken = 0
    for r in hard_rows:
        skipped = above[r["query"], r["positive"]] - clicked[r["query"]]
        hard = r["negatives"][: min(len(skipped), 2)]  # round(0.5 * 4) first, when there are enough
        assert len(r["negatives"]) == len(set(r["negatives"])) == cfg.n
        assert not set(r["negatives"]) & clicked[r["query"]] and set(hard) <= skipped
        rest = random_rows.get((r["query"], r["positive"]))
        if rest is not None:  # the random draws fill the rest, in their order
            assert r["negatives"][len(hard) :] == [n for n in rest if n not in hard][: cfg.n - len(hard)]
        taken += len(hard)
    assert taken == manifest["counts"]["skip_above_negatives"] > len(hard_rows) // 2


def em_attractiveness(cells, theta, prior_clicks, prior_skips, iterations=200_000):
    """γ by EM under the PBM with θ fixed (Wang et al., WSDM 2018, §4.1) from (rank, shown, clicks)
    cells: a non-click at rank k was unexamined and attractive with probability (1 − θ)γ / (1 − θγ)."""
    g = 0.5
    for _ in range(iterations):
        attractive = prior_clicks
        for rank, n, c in cells:
            t = theta[min(rank, len(theta)) - 1]
            attractive += c + (n - c) * (1 - t) * g / (1 - t * g)
        moved, g = g, attractive / (sum(n for _, n, _ in cells) + prior_clicks + prior_skips)
        if abs(moved - g) < 1e-12:
            return g
    raise AssertionError("EM did not converge")


def test_map_attractiveness_is_the_em_fixed_point(spark):
    from pyspark.sql import functions as F

    from core.spark.clicks import curve_at_rank, map_attractiveness

    theta = [1.0, 0.25, 0.1, 0.05]
    pairs = [  # (rank, shown, clicks) cells
        [(1, 10, 3), (3, 20, 1)],
        [(4, 100, 0)],  # never clicked, rarely examined: near the prior mean 0.5 / 8.5
        [(1, 100, 0)],  # never clicked where always examined: far below it
        [(1, 5, 5)],
        [(2, 3, 1), (9, 40, 2)],  # rank 9, beyond the curve, takes its last θ
    ]
    df = spark.createDataFrame(
        [(i, cells, sum(c for _, _, c in cells)) for i, cells in enumerate(pairs)],
        "i int, cells array<struct<rank:int,shown:long,clicks:long>>, clicks long",
    )
    theta_at = curve_at_rank(theta)

    def modes(theta_at, prior):
        g = map_attractiveness(F.col("cells"), F.col("clicks"), theta_at, *prior)
        return [r["g"] for r in df.select("i", g.alias("g")).orderBy("i").collect()]

    for prior in ((2.0, 1.0), (0.5, 8.0)):
        got = modes(theta_at, prior)
        assert got == pytest.approx([em_attractiveness(cells, theta, *prior) for cells in pairs], abs=1e-9)
    # unclicked titles, which click-through rates tie at 0: the rarely examined one stays nearer the
    # prior mean than the one skipped at rank 1 a hundred times
    assert got[2] < 0.01 < got[1] < 0.5 / 8.5
    # with θ = 1 the mode is the smoothed click-through rate
    expected = [(sum(c for *_, c in cells) + 0.5) / (sum(n for _, n, _ in cells) + 8.5) for cells in pairs]
    assert modes(lambda c: F.lit(1.0), (0.5, 8.0)) == pytest.approx(expected, abs=1e-9)


def test_debiased_clicks_and_listwise_targets_follow_the_examination_curve(spark, pipeline, tmp_path):
    """Σ 1/θ(rank) over each pair's clicks, and per query one list of its most examined shown titles
    with clicks / Σ θ(rank), recomputed here from the impressions; then a model trains on them."""
    from core.spark.clicks import examination_curve
    from modeling.config import load_config
    from modeling.train import train
    from stages.negatives.job import negatives
    from stages.propensity.job import propensity

    propensity(spark, pipeline["clean"], tmp_path / "propensity")
    cfg = NegativesConfig(shards=3, debias=True, list_size=5, min_propensity=0.2)
    with pytest.raises(DssmError, match="debias needs the examination curve"):
        negatives(spark, pipeline["clean"], tmp_path / "none", cfg)
    manifest = negatives(spark, pipeline["clean"], tmp_path / "debiased", cfg, propensity_dir=tmp_path / "propensity")
    theta = examination_curve(tmp_path / "propensity", cfg.min_propensity)
    assert min(theta) == 0.2 and theta[0] == 1.0 and theta == sorted(theta, reverse=True)
    cells = defaultdict(lambda: [0, 0])  # (query, title, rank) -> [shown, clicked]
    for imp in rows(pipeline["clean"] / "impressions"):
        for title, rank, click in zip(imp["titles"], imp["positions"], imp["clicked"], strict=True):
            cells[imp["query"], title, rank][0] += 1
            cells[imp["query"], title, rank][1] += click
    examinations, debiased, clicks, shown = defaultdict(float), defaultdict(float), defaultdict(int), defaultdict(int)
    for (query, title, rank), (n, c) in sorted(cells.items()):  # summed in rank order, as the job does
        t = theta[min(rank, len(theta)) - 1]
        examinations[query, title] += n * t
        debiased[query, title] += c / t
        clicks[query, title] += c
        shown[query, title] += n
    out = rows(tmp_path / "debiased" / "train") + rows(tmp_path / "debiased" / "valid")
    assert len(out) == len(rows(pipeline["clean"] / "pairs"))
    first = {}
    for r in out:
        assert r["debiased_clicks"] == pytest.approx(debiased[r["query"], r["positive"]], rel=1e-9)
        assert r["debiased_clicks"] >= r["clicks"]  # θ <= 1
        first[r["query"]] = min(first.get(r["query"], r["positive"]), r["positive"])
    listed, titles_listed = [r for r in out if r["shown"]], {}
    assert len(listed) == manifest["counts"]["listwise_queries"] == len({r["query"] for r in listed}) > 50
    for r in listed:
        titles = [t for q, t in examinations if q == r["query"]]
        titles.sort(key=lambda t: (-examinations[r["query"], t], t))
        assert r["positive"] == first[r["query"]] and r["shown"] == titles[:5]
        titles_listed[r["query"]] = r["shown"]
        expected = [clicks[r["query"], t] / examinations[r["query"], t] for t in r["shown"]]
        assert r["relevance"] == pytest.approx(expected, rel=1e-9)
    # without debias, θ = 1: the weights are the click counts and the targets click-through rates
    negatives(spark, pipeline["clean"], tmp_path / "biased", NegativesConfig(shards=3, list_size=5))
    for r in rows(tmp_path / "biased" / "train"):
        assert r["debiased_clicks"] == r["clicks"]
        expected = [clicks[r["query"], t] / shown[r["query"], t] for t in r["shown"]]
        assert r["relevance"] == pytest.approx(expected, rel=1e-9)

    # the PBM's attractiveness as targets: the fixed point of EM for each γ with θ held at the curve
    prior = (0.5, 8.0)
    by_pair = defaultdict(list)  # (query, title) -> its (rank, shown, clicks) cells in rank order
    for (query, title, rank), (n, c) in sorted(cells.items()):
        by_pair[query, title].append((rank, n, c))
    cfg_map = NegativesConfig(shards=3, debias=True, list_size=5, min_propensity=0.2, list_targets="map")
    negatives(spark, pipeline["clean"], tmp_path / "map", cfg_map, propensity_dir=tmp_path / "propensity")
    for r in rows(tmp_path / "map" / "train") + rows(tmp_path / "map" / "valid"):
        if r["shown"]:
            assert r["shown"] == titles_listed[r["query"]]
            pair_cells = [by_pair[r["query"], title] for title in r["shown"]]
            expected = [em_attractiveness(pc, theta, *prior) for pc in pair_cells]
            assert r["relevance"] == pytest.approx(expected, abs=1e-6)

    run = load_config(
        None,
        [
            *("data.batch_size=48", "max_steps=40", "eval_every=20", "log_every=10", "model.ncell=16"),
            *("loss.pair_weight=log_ipw", "loss.listwise=0.5", f"out={tmp_path / 'run'}"),
            f"mlflow_uri=sqlite:///{tmp_path}/m.db",
            f"data.negatives={tmp_path / 'debiased'}",
            f"data.vocab={pipeline['vocab']}",
        ],
    )
    summary = train(run)
    assert summary["steps"] == 40 and summary["valid_loss"] < math.log(1 + cfg.n)  # below chance
