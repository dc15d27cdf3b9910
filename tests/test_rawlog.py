import orjson
import pytest

from jobs.rawlog import Malformed, parse_line

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

    from jobs.rawlog import MALFORMED_REASONS, parse_batches

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

    from jobs.rawlog import read_catalogue

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
