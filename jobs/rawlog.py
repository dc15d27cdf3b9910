"""The raw impression-log format (docs/raw-log-format.md): its validation, in plain Python.

`parse_line` is the single definition of a well-formed line and of every malformed-line reason;
`parse_batches` applies it to Arrow batches, so Spark runs it with `mapInArrow` (on executors too)
and normalises text with exactly `dssm.text.norm`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import orjson
import pyarrow as pa

from dssm.text import norm

FORMAT_VERSION = 1
REQUIRED = ("v", "impression_id", "ts", "user_id", "query", "results", "clicks")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "v": int,
    "impression_id": str,
    "ts": str,
    "user_id": str,
    "query": str,
    "results": list,
    "clicks": list,
}
MALFORMED_REASONS = (
    "empty_line",
    "invalid_json",
    "not_an_object",
    "missing_field",
    "wrong_type",
    "unsupported_version",
    "bad_value",
)

PARSED = pa.schema(
    [
        pa.field("source", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("reason", pa.string()),  # null for a well-formed line
        pa.field("detail", pa.string()),
        pa.field("raw", pa.string()),  # the line, kept for malformed ones only
        pa.field("impression_id", pa.string()),
        pa.field("user_id", pa.string()),
        pa.field("ts_ms", pa.int64()),
        pa.field("query", pa.string()),  # normalised
        pa.field("titles", pa.list_(pa.string())),  # normalised, in position order
        pa.field("positions", pa.list_(pa.int32())),
        pa.field("clicked", pa.list_(pa.int32())),  # clicked positions
    ]
)


@dataclass(frozen=True)
class Impression:
    impression_id: str
    user_id: str
    ts_ms: int
    query: str
    titles: list[str]
    positions: list[int]
    clicked: list[int]


class Malformed(ValueError):
    def __init__(self, reason: str, detail: str | None = None):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


_title_norms: dict[str, str] = {}


def _norm_title(title: str) -> str:
    # Titles repeat across impressions; a bounded cache saves most of the normalisation.
    cached = _title_norms.get(title)
    if cached is None:
        if len(_title_norms) > 200_000:
            _title_norms.clear()
        cached = _title_norms[title] = norm(title)
    return cached


def parse_line(line: str) -> Impression:
    """The impression on `line`, or `Malformed` with the first reason that applies."""
    if not line.strip():
        raise Malformed("empty_line")
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise Malformed("invalid_json", str(e)[:120]) from None
    if not isinstance(record, dict):
        raise Malformed("not_an_object", type(record).__name__)
    missing = [f for f in REQUIRED if record.get(f) is None]
    if missing:
        raise Malformed("missing_field", ",".join(missing))
    wrong = [f for f, kind in _TYPES.items() if not _is(record[f], kind)]
    if wrong:
        raise Malformed("wrong_type", ",".join(wrong))
    if record["v"] != FORMAT_VERSION:
        raise Malformed("unsupported_version", f"v={record['v']}")
    try:
        ts_ms = int(datetime.fromisoformat(record["ts"]).timestamp() * 1000)
    except ValueError:
        raise Malformed("bad_value", "ts") from None
    titles, positions = [], []
    for result in record["results"]:
        if not (isinstance(result, dict) and _is(result.get("position"), int) and _is(result.get("title"), str)):
            raise Malformed("wrong_type", "results[].position/title")
        titles.append(_norm_title(result["title"]))
        positions.append(result["position"])
    if not positions or min(positions) < 1 or len(set(positions)) != len(positions):
        raise Malformed("bad_value", "results: none, a position < 1, or a repeated position")
    clicked = []
    for click in record["clicks"]:
        if not (isinstance(click, dict) and _is(click.get("position"), int)):
            raise Malformed("wrong_type", "clicks[].position")
        dwell = click.get("dwell_ms", 0)
        if click["position"] not in positions or not _is(dwell, int) or dwell < 0:
            raise Malformed("bad_value", "clicks: a position not shown, or a bad dwell_ms")
        clicked.append(click["position"])
    return Impression(
        record["impression_id"], record["user_id"], ts_ms, norm(record["query"]), titles, positions, clicked
    )


def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """(source, line, value) batches -> PARSED batches; used with Spark's mapInArrow."""
    for batch in batches:
        sources, lines, values = (batch.column(i).to_pylist() for i in range(3))
        cols: dict[str, list] = {f.name: [] for f in PARSED}
        for source, line_no, value in zip(sources, lines, values, strict=True):
            try:
                imp = parse_line(value or "")
                row = (
                    None,
                    None,
                    None,
                    imp.impression_id,
                    imp.user_id,
                    imp.ts_ms,
                    imp.query,
                    imp.titles,
                    imp.positions,
                    imp.clicked,
                )
            except Malformed as bad:
                row = (bad.reason, bad.detail, value, None, None, None, None, None, None, None)
            cols["source"].append(source)
            cols["line"].append(line_no)
            for name, v in zip(PARSED.names[2:], row, strict=True):
                cols[name].append(v)
        yield pa.RecordBatch.from_pydict(cols, schema=PARSED)
