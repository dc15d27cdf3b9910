import orjson
import pytest

from stages.clean.rawlog import Malformed, parse_line

GOOD = {
    "v": 1,
    "impression_id": "i1",
    "ts": "2026-01-01T00:00:01.500Z",
    "user_id": "u1",
    "session_id": "s1",
    "query": "  Deck\u00a0SCREWS ",
    "results": [
        {"position": 1, "doc_id": "d1", "title": "Star  Drive Deck Screws"},
        {"position": 2, "doc_id": "d2", "title": "Wood Glue"},
    ],
    "clicks": [{"position": 2, "dwell_ms": 1200}],
}


def line(**changes):
    record = {**GOOD, **changes}
    return orjson.dumps({k: v for k, v in record.items() if v is not ...}).decode()


def test_a_good_line_is_normalised():
    imp = parse_line(line())
    assert (imp.query, imp.titles, imp.positions, imp.clicked) == (
        "deck screws",
        ["star drive deck screws", "wood glue"],
        [1, 2],
        [2],
    )
    assert imp.ts_ms == 1_767_225_601_500


@pytest.mark.parametrize(
    "text,reason",
    [
        ("   ", "empty_line"),
        (line()[:40], "invalid_json"),
        ("[1, 2]", "not_an_object"),
        (line(query=...), "missing_field"),
        (line(results="d1,d2"), "wrong_type"),
        (line(v="1"), "wrong_type"),
        (line(v=True), "wrong_type"),
        (line(results=[{"position": "1", "title": "x"}]), "wrong_type"),
        (line(clicks={"position": 1}), "wrong_type"),
        (line(v=3), "unsupported_version"),
        (line(ts="yesterday"), "bad_value"),
        (line(results=[]), "bad_value"),
        (line(clicks=[{"position": 7, "dwell_ms": 5}]), "bad_value"),
        (line(clicks=[{"position": 1, "dwell_ms": -5}]), "bad_value"),
        (line(results=[{"position": 2**31, "title": "x"}]), "bad_value"),  # beyond int32
        (line().encode().replace(b"Wood", b"W\xf6od"), "invalid_utf8"),  # a latin-1 byte
        (b"\xff\xfe{", "invalid_utf8"),
    ],
)
def test_each_malformed_kind_has_its_reason(text, reason):
    with pytest.raises(Malformed) as err:
        parse_line(text)
    assert err.value.reason == reason


def test_empty_query_is_well_formed_and_left_to_the_rules():
    assert parse_line(line(query="   ")).query == ""


def test_random_byte_flips_never_fail_a_batch_and_every_line_is_accounted_for():
    """Fuzz: flip bytes of good lines; every line comes out parsed or quarantined with a known reason."""
    import random

    import pyarrow as pa

    from stages.clean.rawlog import MALFORMED_REASONS, parse_batches

    rng = random.Random(7)
    lines = []
    for i in range(400):
        raw = bytearray(line(impression_id=f"i{i}").encode())
        for _ in range(rng.randint(0, 3)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        lines.append(bytes(raw))
    # as Spark's text source hands them over: a string column that may hold invalid UTF-8
    values = pa.array(lines, pa.binary()).view(pa.string())
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["f"] * len(lines)), pa.array(range(len(lines)), pa.int64()), values],
        names=["source", "line", "value"],
    )
    out = pa.Table.from_batches(list(parse_batches(iter([batch]))))
    assert out.num_rows == len(lines)
    reasons = out.column("reason").to_pylist()
    assert set(reasons) - {None} <= set(MALFORMED_REASONS)
    assert reasons.count("invalid_utf8") > 0 and reasons.count(None) > 0
    raws = out.column("raw").to_pylist()
    assert all((r is None) == (reason is None) for r, reason in zip(raws, reasons, strict=True))


def test_a_v2_line_takes_its_titles_from_the_catalogue_and_an_unknown_doc_is_quarantined(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stages.clean.rawlog import read_catalogue

    docs = {"d1": "Star  Drive Deck Screws", "d2": "Wood Glue", "d3": "wood  glue"}  # d2, d3: one title
    pq.write_table(pa.table({"doc_id": list(docs), "title": list(docs.values())}), tmp_path / "catalogue.parquet")
    catalogue = read_catalogue(tmp_path / "catalogue.parquet")
    assert catalogue.titles == ["star drive deck screws", "wood glue"]
    assert catalogue.ids == {"d1": 0, "d2": 1, "d3": 1}
    v2 = {"v": 2, "results": [{"position": 1, "doc_id": "d1"}, {"position": 2, "doc_id": "d2"}]}
    imp = parse_line(line(**v2), catalogue.ids)
    assert (imp.v, imp.titles, imp.title_ids, imp.positions, imp.clicked) == (2, None, [0, 1], [1, 2], [2])
    v1 = parse_line(line(), catalogue.ids)  # the same impression as v1
    assert [catalogue.titles[i] for i in imp.title_ids] == v1.titles
    assert imp._replace(v=1, titles=v1.titles, title_ids=None) == v1
    catalogue = catalogue.ids

    unknown = {"v": 2, "results": [{"position": 1, "doc_id": "d1"}, {"position": 2, "doc_id": "d9"}]}
    with pytest.raises(Malformed) as bad:
        parse_line(line(**unknown), catalogue)
    assert (bad.value.reason, bad.value.detail) == ("unknown_doc", "doc_id d9")
    with pytest.raises(Malformed) as bad:
        parse_line(line(**v2))  # a v2 line read without a catalogue
    assert bad.value.reason == "unknown_doc" and "no catalogue" in bad.value.detail
    with pytest.raises(Malformed) as bad:
        parse_line(line(v=2, results=[{"position": 1, "title": "wood glue"}]), catalogue)  # v2 names doc ids
    assert bad.value.reason == "wrong_type" and "doc_id" in bad.value.detail


# The vectorised path (stages.clean.fastparse) must give parse_line's rows, line for line.
CATALOGUE = {"d1": 0, "d2": 1, "d3": 1}
V2 = {
    **GOOD,
    "v": 2,
    "results": [{"position": 1, "doc_id": "d1"}, {"position": 2, "doc_id": "d2"}],
    "clicks": [{"position": 2, "dwell_ms": 1200}],
}


def v2(**changes) -> bytes:
    return orjson.dumps({k: v for k, v in {**V2, **changes}.items() if v is not ...})


def both_paths(lines: list[bytes], catalogue: dict[str, int] = CATALOGUE):
    """parse_batches' rows with and without the vectorised path, in line order; and which lines
    the vectorised path took."""
    import pyarrow as pa

    from stages.clean.fastparse import DocLookup, parse_canonical
    from stages.clean.rawlog import parse_batches

    values = pa.array(lines, pa.binary())
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["f"] * len(lines)), pa.array(range(len(lines)), pa.int64()), values.view(pa.string())],
        names=["source", "line", "value"],
    )
    python, vectorised = (
        pa.Table.from_batches(list(parse_batches(iter([batch]), catalogue, fast))).sort_by("line")
        for fast in (False, True)
    )
    taken, _ = parse_canonical(values, DocLookup(catalogue))
    return python, vectorised, set(taken.tolist())


FAST = {
    "canonical": v2(),
    "no session_id": v2(session_id=...),
    "no clicks": v2(clicks=[]),
    "a click without dwell": v2(clicks=[{"position": 1}]),
    "a zone offset": v2(ts="2026-03-01T05:30:00.250+05:30"),
    "a negative offset": v2(ts="2026-02-28T16:00:00-08:00"),
    "one fraction digit": v2(ts="2026-01-01T00:00:00.5Z"),
    "a leap day": v2(ts="2024-02-29T12:00:00Z"),
    "before the epoch": v2(ts="1969-12-31T23:59:59.999Z"),
    "unicode spaces": v2(query="Deck\u00a0SCREWS\u3000 é"),
    "an empty query": v2(query=""),
    "a blank query": v2(query="   "),
    "positions with a gap": v2(
        results=[{"position": 1, "doc_id": "d1"}, {"position": 5, "doc_id": "d3"}], clicks=[{"position": 5}]
    ),
}
SLOW = {
    "v1": orjson.dumps(GOOD),
    "no leap day": v2(ts="2026-02-29T00:00:00Z"),
    "hour 24": v2(ts="2026-01-01T24:00:00Z"),
    "an offset of a day": v2(ts="2026-01-01T00:00:00+24:00"),
    "no zone (local time)": v2(ts="2026-01-01T00:00:00"),
    "microseconds": v2(ts="2026-01-01T00:00:00.123456Z"),
    "an unknown doc": v2(results=[{"position": 1, "doc_id": "d9"}]),
    "a doc id of another length": v2(results=[{"position": 1, "doc_id": "d10"}]),
    "positions out of order": v2(results=[{"position": 2, "doc_id": "d1"}, {"position": 1, "doc_id": "d2"}]),
    "a repeated position": v2(results=[{"position": 1, "doc_id": "d1"}, {"position": 1, "doc_id": "d2"}]),
    "position 0": v2(results=[{"position": 0, "doc_id": "d1"}]),
    "a position past int32": v2(results=[{"position": 2**31, "doc_id": "d1"}]),
    "a click not shown": v2(clicks=[{"position": 3, "dwell_ms": 5}]),
    "a negative dwell": v2(clicks=[{"position": 1, "dwell_ms": -5}]),
    "an escaped quote": v2(query='6" deck screws'),
    "an escaped character": v2().replace(b"Deck", b"D\\u00e9ck"),
    "an extra field": v2(device="mobile"),
    "another key order": orjson.dumps({"impression_id": "i1", **{k: v for k, v in V2.items() if k != "impression_id"}}),
    "spaces between tokens": v2().replace(b'"v":2', b'"v": 2'),
    "a repeated key": v2().replace(b'{"v":2,', b'{"v":2,"v":2,'),
    "a latin-1 byte": v2().replace(b"Deck", b"D\xe9ck"),
    "an overlong encoding": v2().replace(b"Deck", b"D\xc0\xafck"),
    "a control character": v2().replace(b"Deck", b"D\x01ck"),
    "no results": v2(results=[]),
    "version 3": v2(v=3),
    "a result as a list": v2().replace(b'{"position":1,"doc_id":"d1"}', b'[1,"d1"]'),
}


def test_the_vectorised_path_takes_canonical_v2_lines_and_leaves_every_other_line_to_parse_line():
    lines = list(FAST.values()) + list(SLOW.values())
    python, vectorised, taken = both_paths(lines)
    assert vectorised.equals(python)
    assert taken == set(range(len(FAST))), [
        name for i, name in enumerate([*FAST, *SLOW]) if (i in taken) != (i < len(FAST))
    ]
    by_name = dict(zip([*FAST, *SLOW], python.to_pylist(), strict=True))
    assert by_name["before the epoch"]["ts_ms"] == -1
    assert by_name["a zone offset"]["ts_ms"] == 1_772_323_200_250  # 2026-03-01T00:00:00.250Z
    assert by_name["unicode spaces"]["query"] == "deck screws é"
    assert by_name["positions out of order"]["reason"] is None  # unique positions in any order are fine
    assert by_name["an escaped character"]["query"] == "déck screws"


def test_the_vectorised_path_matches_parse_line_on_a_dirty_simulated_log_and_on_byte_flips(tmp_path):
    import gzip
    import random

    from core.judgments import DEFAULT_CATALOGUE, read_judgments
    from stages.clean.rawlog import read_catalogue
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate

    cfg = SimulationConfig(impressions=4_000, shards=1, workers=1, log_format=2)
    simulate(read_judgments(DEFAULT_CATALOGUE), tmp_path, cfg, {"path": "default", "sha256": "default"})
    catalogue = read_catalogue(tmp_path / "catalogue.parquet").ids
    lines = gzip.open(next((tmp_path / "logs").glob("part-*")), "rb").read().splitlines()
    python, vectorised, taken = both_paths(lines, catalogue)
    assert vectorised.equals(python)
    assert len(taken) > 0.9 * len(lines)  # the simulator writes canonical lines; its dirt goes to parse_line
    assert python.column("reason").null_count < len(lines)  # and the dirt is there

    rng = random.Random(11)
    flipped = []
    for raw in lines[:1500]:
        raw = bytearray(raw)
        for _ in range(rng.randint(0, 2)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        flipped.append(bytes(raw))
    python, vectorised, taken = both_paths(flipped, catalogue)
    assert vectorised.equals(python) and 0 < len(taken) < len(flipped)


def test_a_catalogue_with_doc_ids_of_mixed_lengths_is_parsed_by_parse_line_alone():
    catalogue = {"d1": 0, "doc22": 1}
    lines = [
        v2(results=[{"position": 1, "doc_id": "d1"}, {"position": 2, "doc_id": "doc22"}]),
        v2(results=[{"position": 2, "doc_id": "doc22"}]),
    ]
    python, vectorised, taken = both_paths(lines, catalogue)
    assert vectorised.equals(python) and not taken and python.column("reason").null_count == 2


def test_result_rows_that_disagree_on_the_query_are_one_bad_impression_with_its_rows_as_raw():
    """Result rows of one impression id are one impression: rows that differ in ts, user_id or query
    cannot be one, so it is quarantined as bad_value with every row in `raw`; the rest are parsed
    exactly as their JSON lines are (no Spark: the Arrow batches of mapInArrow, batch boundaries
    inside an impression included)."""
    import json

    import pyarrow as pa

    from benchmarks._parquet_twin import twin
    from stages.clean.parquetlog import _Context, column_names, result_batches

    lines = [
        json.dumps(
            {
                "v": 1,
                "impression_id": f"i{n}",
                "ts": f"2026-01-01T00:00:0{n}Z",
                "user_id": "u",
                "query": f"Q {n}",
                "results": [{"position": p, "title": f"T {p}"} for p in (1, 2, 3)],
                "clicks": [{"position": 2}],
            }
        ).encode()
        for n in range(3)
    ]
    table, _ = twin(iter(lines), "result_rows")
    rows = table.to_pylist()
    rows[4]["query"] = "another"  # i1's second row
    table = pa.Table.from_pylist(rows, schema=table.schema)
    table = table.add_column(0, "line", pa.array(range(len(rows)), pa.int64()))
    table = table.add_column(0, "source", pa.array(["f"] * len(rows)))
    batches = table.to_batches(max_chunksize=4)  # an impression split across two batches
    ctx = _Context(column_names({}), 1, "result_rows")
    parsed = pa.Table.from_batches(list(result_batches(iter(batches), ctx, None))).to_pylist()
    assert sorted(r["line"] for r in parsed) == [0, 3, 6]
    kept = {r["impression_id"]: r for r in parsed if r["reason"] is None}
    assert sorted(kept) == ["i0", "i2"]
    assert (
        kept["i2"]["query"] == "q 2" and kept["i2"]["titles"] == ["t 1", "t 2", "t 3"] and kept["i2"]["clicked"] == [2]
    )
    assert kept["i2"]["dwell"] == [0]  # a null dwell_ms: not logged, as an absent one in JSON
    (bad,) = [r for r in parsed if r["reason"]]
    assert (bad["reason"], bad["detail"]) == ("bad_value", "the rows of impression i1 differ in query")
    assert [r["query"] for r in json.loads(bad["raw"])] == ["Q 1", "another", "Q 1"]
