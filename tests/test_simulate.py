import gzip
import tracemalloc
from collections import Counter

import orjson
import pyarrow.parquet as pq

from core.artifacts import content_sha256
from core.text import is_test_query, norm
from stages.simulate import catalogue
from stages.simulate.config import SimulationConfig
from stages.simulate.job import simulate

SOURCE = {"path": "default", "sha256": "default"}


def read_lines(out):
    lines = []
    for part in sorted((out / "logs").glob("part-*")):
        with gzip.open(part, "rt", encoding="utf-8") as handle:
            lines += handle.read().splitlines()
    return lines


def test_shipped_catalogue_is_the_generators_output(tmp_path):
    assert catalogue.write(tmp_path / "c.csv").read_bytes() == catalogue.DEFAULT_CATALOGUE.read_bytes()


def test_catalogue_queries_are_what_users_type_and_labels_follow_the_intent(default_pairs):
    stats = catalogue.stats()
    assert stats["queries"] == 660
    for form in ("colloquial", "misspelled", "reordered"):  # docs/simulator.md's table
        assert abs(stats[form] - catalogue.RATES[form]) < 0.06, form
    assert stats["no_word_in_any_judged_title"] > 0.08  # BM25 scores every title of these 0
    # a colloquial query names no title word, yet the raters grade the product it means relevant
    best: dict[str, float] = {}
    for p in default_pairs:
        best[p.query] = max(best.get(p.query, 0.0), p.label)
    for query in ("weed whacker", "sawzall", "commode"):
        matches = [q for q in best if query in q]
        assert matches and max(best[q] for q in matches) >= 2.33, query


def test_seeded_output_is_byte_identical(default_pairs, tmp_path):
    cfg = SimulationConfig(impressions=3_000, shards=2, workers=1)
    simulate(default_pairs, tmp_path / "a", cfg, SOURCE)
    simulate(default_pairs, tmp_path / "b", cfg, SOURCE)
    assert content_sha256(tmp_path / "a") == content_sha256(tmp_path / "b")
    simulate(default_pairs, tmp_path / "c", SimulationConfig(impressions=3_000, shards=2, workers=1, seed=1), SOURCE)
    assert content_sha256(tmp_path / "a") != content_sha256(tmp_path / "c")


def test_no_test_query_leaks_and_test_pairs_are_complete(pipeline, default_pairs):
    out = pipeline["simulate"]
    queries = set()
    for text in read_lines(out):
        try:
            queries.add(norm(orjson.loads(text)["query"]))
        except (orjson.JSONDecodeError, KeyError, AttributeError):
            continue
    queries.discard("")
    assert queries and not any(is_test_query(q) for q in queries)
    test = pq.read_table(out / "test_pairs.parquet").to_pylist()
    expected = [p for p in default_pairs if is_test_query(p.query)]
    assert [(r["row"], r["title"], r["label"]) for r in test] == [(p.row, p.title, p.label) for p in expected]


def test_dirt_and_clicks_appear_at_documented_rates(pipeline):
    lines = read_lines(pipeline["simulate"])
    records = []
    for text in lines:
        try:
            records.append(orjson.loads(text))
        except orjson.JSONDecodeError:
            pass
    impressions = {r["impression_id"] for r in records if isinstance(r, dict) and "impression_id" in r}
    duplicates = len(lines) - 20_000
    assert 0.01 < duplicates / 20_000 < 0.03  # DirtRates.duplicate = 0.02
    assert len(impressions) > 19_500
    good = [
        r
        for r in records
        if isinstance(r.get("results"), list)
        and isinstance(r.get("clicks"), list)
        and isinstance(r.get("query"), str)
        and r.get("user_id", "").startswith("u")
    ]
    ctr_at = Counter()
    shown_at = Counter()
    for r in good:
        for res in r["results"]:
            if isinstance(res.get("position"), int):
                shown_at[res["position"]] += 1
        for c in r["clicks"]:
            ctr_at[c["position"]] += 1
    # Examination decays with rank: position 1 is clicked far more often than position 8.
    assert ctr_at[1] / shown_at[1] > 2 * ctr_at[8] / shown_at[8]
    mixed = sum(1 for r in good if r["query"] != r["query"].lower())
    assert 0.15 < mixed / len(good) < 0.40  # DirtRates.mixed_case = 0.30 (some bots/queries have no letters)


def test_simulation_streams_in_bounded_memory(default_pairs, tmp_path):
    tracemalloc.start()
    simulate(default_pairs, tmp_path / "s", SimulationConfig(impressions=30_000, workers=1, shards=1), SOURCE)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # 30k lines are ~30 MB of text; the simulator holds one chunk at a time.
    assert peak < 20 * 2**20


def test_a_day_is_simulated_into_its_partition_deterministically_with_its_own_ids(tmp_path):
    from dataclasses import replace
    from datetime import UTC, datetime

    import pytest

    from core.errors import DssmError
    from core.judgments import DEFAULT_CATALOGUE, read_judgments

    pairs = read_judgments(DEFAULT_CATALOGUE)
    cfg = SimulationConfig(impressions=2_000, shards=2, workers=1, day="2026-01-02")
    for name, day_cfg in (("a", cfg), ("b", cfg), ("c", replace(cfg, day="2026-01-03"))):
        simulate(pairs, tmp_path / name, day_cfg, SOURCE)
    a, c = read_lines(tmp_path / "a"), read_lines(tmp_path / "c")
    assert a == read_lines(tmp_path / "b")  # deterministic
    records, records_c = well_formed(a), well_formed(c)
    assert records and all(r["impression_id"].startswith("20260102-") for r in records)
    days = {datetime.fromisoformat(r["ts"]).astimezone(UTC).date().isoformat() for r in records}
    assert days == {"2026-01-02"}
    # days appended to one root never share an impression id
    assert not {r["impression_id"] for r in records_c} & {r["impression_id"] for r in records}
    with pytest.raises(DssmError, match="day must be a date YYYY-MM-DD"):
        simulate(pairs, tmp_path / "bad", replace(cfg, day="2026-13-01"), SOURCE)


def test_a_drifting_query_mix_moves_the_head_queries_day_by_day(tmp_path):
    """model.drift (issue 63's study): each day the popularity ranking rotates by drift·n queries, so a
    later day's most frequent queries are others; without drift every day sends the same mix."""
    from dataclasses import replace

    from core.judgments import DEFAULT_CATALOGUE, read_judgments
    from stages.simulate.config import ClickModel

    pairs = read_judgments(DEFAULT_CATALOGUE)
    cfg = SimulationConfig(impressions=3_000, shards=1, workers=1, day="2026-01-01", model=ClickModel(drift=0.2))

    def head(name: str, day_cfg: SimulationConfig) -> set[str]:
        simulate(pairs, tmp_path / name, day_cfg, SOURCE)
        queries = Counter(norm(r["query"]) for r in well_formed(read_lines(tmp_path / name)) if r.get("query"))
        return {q for q, _ in queries.most_common(20)}

    first = head("d1", cfg)
    assert len(first & head("d3", replace(cfg, day="2026-01-03"))) <= 4  # 40% of the ranking on: another head
    still = replace(cfg, model=ClickModel())
    assert len(head("s1", still) & head("s3", replace(still, day="2026-01-03"))) >= 14


def well_formed(lines: list[str]) -> list[dict]:
    """The lines that parse to objects with a string impression_id and ts (the simulator's dirt aside)."""
    records = []
    for line in lines:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict) and all(isinstance(record.get(f), str) for f in ("impression_id", "ts")):
            records.append(record)
    return records


def test_a_biased_ranker_makes_the_same_mistakes_on_every_impression(default_pairs):
    """`ranker_bias`: a persistent error per (query, judged title), so without per-impression noise
    a query's judged titles come in the same order every time, and not in order of relevance."""
    import numpy as np

    from stages.simulate.config import ClickModel
    from stages.simulate.job import _rank_and_click, build_catalogue, ranker_errors, split_judgments

    cat = build_catalogue(split_judgments(default_pairs)[0], seed=13)
    queries = np.arange(len(cat.queries))
    model = ClickModel(ranker_noise=0.0, ranker_bias=1.0, filler=0)
    errors = ranker_errors(cat, model, seed=13)
    assert np.array_equal(errors, ranker_errors(cat, model, seed=13)) and errors.std() > 0.5
    first, _, _ = _rank_and_click(cat, model, np.random.default_rng(1), queries, errors=errors)
    again, _, _ = _rank_and_click(cat, model, np.random.default_rng(2), queries, errors=errors)
    assert np.array_equal(first, again)
    fair, _, _ = _rank_and_click(cat, ClickModel(ranker_noise=0.0, filler=0), np.random.default_rng(1), queries)
    assert (first != fair).any(axis=1).mean() > 0.5  # most queries shown in another order than relevance's
    assert not ranker_errors(cat, ClickModel(), seed=13).any()


def test_a_promoting_ranker_puts_promoted_brands_first_for_every_query(default_pairs):
    """`promotion`: the ranker's error follows a title feature (its brand), the same for every query,
    so a model trained on uncorrected clicks would learn it as relevance."""
    import numpy as np

    from stages.simulate.config import ClickModel
    from stages.simulate.job import _rank_and_click, build_catalogue, promoted_brand, split_judgments

    cat = build_catalogue(split_judgments(default_pairs)[0], seed=13)
    assert 0.1 < cat.promoted.mean() < 0.4  # about a quarter of the brands
    assert promoted_brand("Acme 2 in. hinge") == promoted_brand("ACME  brass hinge") and not promoted_brand("  ")
    queries = np.arange(len(cat.queries))
    # a promotion above the whole relevance range: every promoted title ranks above every other one
    shown, _, _ = _rank_and_click(
        cat, ClickModel(ranker_noise=0.0, promotion=2.0, filler=0), np.random.default_rng(1), queries
    )
    promoted = np.where(shown >= 0, cat.promoted[shown], False)
    mixed = promoted.any(axis=1) & ((shown >= 0) & ~promoted).any(axis=1)
    assert mixed.sum() > 50  # queries that show both kinds of brand
    assert (np.diff(promoted.astype(int), axis=1) <= 0).all()  # no promoted title below an unpromoted one
    fair, _, _ = _rank_and_click(cat, ClickModel(ranker_noise=0.0, filler=0), np.random.default_rng(1), queries)
    assert (fair != shown).any(axis=1).mean() > 0.2


def test_the_weakest_brands_are_a_quarter_of_the_titles_and_less_relevant(default_pairs):
    """`promoted_brands="weakest"`: the ranker lifts the brands of lowest mean label, so a model that
    learns the promotion from uncorrected clicks ranks less relevant titles up."""
    import numpy as np
    import pytest

    from core.errors import DssmError
    from stages.simulate.job import brand, build_catalogue, promotion_rule, split_judgments, weakest_brands

    train = split_judgments(default_pairs)[0]
    cat = build_catalogue(train, seed=13, promoted_brands="weakest")
    assert 0.25 <= cat.promoted.mean() < 0.35  # whole brands until a quarter of the titles
    assert {brand(t) for t, p in zip(cat.titles, cat.promoted, strict=True) if p} == weakest_brands(train)
    rows, cols = np.nonzero(cat.judged >= 0)
    promoted = cat.promoted[cat.judged[rows, cols]]
    relevance = cat.relevance[rows, cols]
    assert relevance[promoted].mean() < relevance[~promoted].mean() - 0.02  # Home Depot: 0.15 apart
    hashed = build_catalogue(train, seed=13).promoted  # the default: independent of relevance
    assert abs(relevance[hashed[cat.judged[rows, cols]]].mean() - relevance.mean()) < 0.1
    with pytest.raises(DssmError, match="promoted brands must be one of"):
        promotion_rule(train, "strongest")  # a typo is not taken for "weakest"
