"""The raw impression-log format (docs/raw-log-format.md): its validation, in plain Python.

`parse_line` is the single definition of a well-formed line and of every malformed-line reason;
`parse_batches` applies it to Arrow batches, so Spark runs it with `mapInArrow` (on executors too)
and normalises text with exactly `core.text.norm`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import datetime
from typing import NamedTuple

import orjson
import pyarrow as pa

from core.text import norm

FORMAT_VERSION = 1  # results carry their titles
FORMAT_VERSIONS = (1, 2)  # 2: results carry doc ids only; titles come from the catalogue side table
REQUIRED = ("v", "impression_id", "ts", "user_id", "query", "results", "clicks")
_TYPES: dict[str, type] = {
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
    "invalid_utf8",
    "invalid_json",
    "not_an_object",
    "missing_field",
    "wrong_type",
    "unsupported_version",
    "bad_value",
)
UNKNOWN_DOC = "unknown_doc"  # a v2 result whose doc id the catalogue lacks (or no catalogue was given)
MAX_POSITION = 2**31 - 1  # positions are stored as int32

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
        pa.field("shown", pa.int32()),  # results shown and clicks: what the bot rule reads
        pa.field("clicks", pa.int32()),
    ]
)


class Impression(NamedTuple):
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


# Titles repeat across impressions: a bounded cache saves most of their normalisation.
_title_norms: dict[str, str] = {}


def parse_line(line: str | bytes, catalogue: dict[str, str] | None = None) -> Impression:
    """The impression on `line` (text, or the raw bytes of a log line), or `Malformed` with the first
    reason that applies. `catalogue` maps doc ids to normalised titles for v2 lines.

    This runs once per log line, so checks are list comprehensions and exact `type() is`
    tests (which also keep a JSON `true` from passing for the integer 1).
    """
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        if not line.strip():
            raise Malformed("empty_line") from None
        if isinstance(line, bytes) and not _is_utf8(line):
            raise Malformed("invalid_utf8", str(e)[:120]) from None
        raise Malformed("invalid_json", str(e)[:120]) from None
    if type(record) is not dict:
        raise Malformed("not_an_object", type(record).__name__)
    missing = [f for f in REQUIRED if record.get(f) is None]
    if missing:
        raise Malformed("missing_field", ",".join(missing))
    wrong = [f for f, kind in _TYPES.items() if type(record[f]) is not kind]
    if wrong:
        raise Malformed("wrong_type", ",".join(wrong))
    if record["v"] not in FORMAT_VERSIONS:
        raise Malformed("unsupported_version", f"v={record['v']}")
    try:
        ts_ms = int(datetime.fromisoformat(record["ts"]).timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        raise Malformed("bad_value", "ts") from None
    results, clicks = record["results"], record["clicks"]
    named = "title" if record["v"] == 1 else "doc_id"
    try:
        positions = [r["position"] for r in results]
        titles = [r[named] for r in results]
        clicked = [c["position"] for c in clicks]
        dwells = [c.get("dwell_ms", 0) for c in clicks]
    except (TypeError, KeyError, AttributeError):
        raise Malformed("wrong_type", f"results[]/clicks[] entries need position and {named}") from None
    if any(type(p) is not int for p in positions + clicked) or any(type(t) is not str for t in titles):
        raise Malformed("wrong_type", f"results[].position/{named} or clicks[].position")
    if not positions or min(positions) < 1 or len(set(positions)) != len(positions):
        raise Malformed("bad_value", "results: none, a position < 1, or a repeated position")
    if max(positions) > MAX_POSITION:
        raise Malformed("bad_value", f"results: a position above {MAX_POSITION}")
    if not set(clicked) <= set(positions) or any(type(d) is not int or d < 0 for d in dwells):
        raise Malformed("bad_value", "clicks: a position not shown, or a bad dwell_ms")
    if named == "doc_id":
        normed = [catalogue.get(d) for d in titles] if catalogue else [None]
        if None in normed:
            unknown = titles[normed.index(None)] if catalogue else "any: no catalogue was given"
            raise Malformed(UNKNOWN_DOC, f"doc_id {unknown}")
    else:
        cache = _title_norms
        if len(cache) > 200_000:
            cache.clear()
        normed = [cache.get(t) or cache.setdefault(t, norm(t)) for t in titles]
    return Impression(
        record["impression_id"], record["user_id"], ts_ms, norm(record["query"]), normed, positions, clicked
    )


def read_catalogue(path) -> dict[str, str]:
    """A catalogue side table (Parquet: doc_id, title) as doc id -> normalised title."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["doc_id", "title"])
    return dict(zip(table.column("doc_id").to_pylist(), map(norm, table.column("title").to_pylist()), strict=True))


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_batches(
    batches: Iterator[pa.RecordBatch], catalogue: dict[str, str] | None = None
) -> Iterator[pa.RecordBatch]:
    """(source, line, value) batches -> PARSED batches; used with Spark's mapInArrow. `catalogue`:
    doc id -> normalised title, for v2 lines.

    Lines are read as bytes (a zero-copy view of the text column): a line that is not valid UTF-8
    is quarantined as invalid_utf8 instead of failing the whole batch when Arrow decodes it."""
    malformed_row = (None,) * 9
    for batch in batches:
        values = batch.column(2).cast(pa.binary()).to_pylist()
        rows = []
        # Parsing allocates many small containers and no cycles: the cyclic GC would only
        # rescan them over and over (measured: a quarter of the time).
        gc.disable()
        try:
            for value in values:
                try:
                    imp = parse_line(value or b"", catalogue)
                    rows.append((None, None, None, *imp, len(imp.titles), len(imp.clicked)))
                except Malformed as bad:
                    kept = value.decode("utf-8", "backslashreplace") if value is not None else None
                    rows.append((bad.reason, bad.detail, kept, *malformed_row))
        finally:
            gc.enable()
        if not rows:
            continue
        transposed = zip(*rows, strict=True)
        columns = [batch.column(0), batch.column(1)]
        columns += [pa.array(col, type=f.type) for col, f in zip(transposed, list(PARSED)[2:], strict=True)]
        yield pa.RecordBatch.from_arrays(columns, schema=PARSED)
