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
        (line(v=2), "unsupported_version"),
        (line(ts="yesterday"), "bad_value"),
        (line(results=[]), "bad_value"),
        (line(clicks=[{"position": 7, "dwell_ms": 5}]), "bad_value"),
        (line(clicks=[{"position": 1, "dwell_ms": -5}]), "bad_value"),
    ],
)
def test_each_malformed_kind_has_its_reason(text, reason):
    with pytest.raises(Malformed) as err:
        parse_line(text)
    assert err.value.reason == reason


def test_empty_query_is_well_formed_and_left_to_the_rules():
    assert parse_line(line(query="   ")).query == ""
