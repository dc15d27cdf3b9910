"""The Parquet twin of a JSON-lines log: the same impressions as a Parquet table of impression rows or
result rows, for the tests and benchmarks of `dssm clean --input-format parquet` (not product code)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import orjson
import pyarrow as pa

_RESULT = pa.struct([("position", pa.int64()), ("doc_id", pa.string()), ("title", pa.string())])
_CLICK = pa.struct([("position", pa.int64()), ("dwell_ms", pa.int64())])


def twin_schema(shape: str, ts: str = "timestamp") -> pa.Schema:
    """The schema `twin` writes: the format's fields, `ts` as a UTC timestamp or as text."""
    ts_type = pa.timestamp("ms", tz="UTC") if ts == "timestamp" else pa.string()
    head = [("impression_id", pa.string()), ("ts", ts_type), ("user_id", pa.string()), ("query", pa.string())]
    if shape == "impression_rows":
        return pa.schema([("v", pa.int64()), *head, ("results", pa.list_(_RESULT)), ("clicks", pa.list_(_CLICK))])
    tail = [("position", pa.int64()), ("doc_id", pa.string()), ("title", pa.string())]
    return pa.schema([*head, *tail, ("clicked", pa.bool_()), ("dwell_ms", pa.int64())])


def twin(lines: Iterator[bytes], shape: str, ts: str = "timestamp") -> tuple[pa.Table, list[bytes]]:
    """A JSON-lines log as a Parquet table of `shape`, and the lines the table holds: a line that
    a table cannot hold (not a JSON object, a value of another type, a ts that is not a time;
    for result rows also no results, a click on no shown result, an impression id seen before)
    is left out of both."""
    rows: list[dict] = []
    kept: list[bytes] = []
    seen: set[str] = set()
    for line in lines:
        record = _representable(line, shape, ts, seen)
        if record is None:
            continue
        kept.append(line)
        if shape == "impression_rows":
            rows.append(record)
            continue
        clicks = {}
        for c in record["clicks"]:
            clicks.setdefault(c["position"], c.get("dwell_ms"))
        head = {f: record.get(f) for f in ("impression_id", "ts", "user_id", "query")}
        named = "title" if record["v"] == 1 else "doc_id"  # a v1 result's doc id is not read
        for r in record["results"]:
            position = r.get("position")
            rows.append(
                head
                | {"position": position, named: r.get(named)}
                | {"clicked": position in clicks, "dwell_ms": clicks.get(position)}
            )
    table = pa.Table.from_pylist(rows, schema=twin_schema(shape, ts))
    if shape == "result_rows":  # one version per table: doc ids (v2) or titles (v1)
        for name in ("title", "doc_id"):
            if table.num_rows and table.column(name).null_count == table.num_rows:
                table = table.drop_columns([name])
    return table, kept


def _representable(line: bytes, shape: str, ts: str, seen: set[str]) -> dict | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(record) is not dict:
        return None
    kinds = {"v": int, "impression_id": str, "ts": str, "user_id": str, "query": str, "results": list, "clicks": list}
    if any(record.get(f) is not None and type(record[f]) is not k for f, k in kinds.items()):
        return None
    entries = {"results": {"position": int, "doc_id": str, "title": str}, "clicks": {"position": int, "dwell_ms": int}}
    for f, fields in entries.items():
        for e in record.get(f) or []:
            if e is not None and (
                type(e) is not dict or any(e.get(k) is not None and type(e[k]) is not t for k, t in fields.items())
            ):
                return None
            if e is not None and any(abs(e.get(k) or 0) >= 2**63 for k in ("position", "dwell_ms")):
                return None
    if ts == "timestamp" and record.get("ts") is not None:
        try:
            at = datetime.fromisoformat(record["ts"])
        except ValueError:
            return None
        if at.tzinfo is None or at.microsecond % 1000:
            return None
        record["ts"] = at
    if shape == "result_rows":
        results, clicks = record.get("results"), record.get("clicks")
        if not results or clicks is None or None in results or None in clicks or record.get("v") not in (1, 2):
            return None
        shown = [r.get("position") for r in results]
        if not set(c.get("position") for c in clicks) <= set(shown) or record.get("impression_id") in seen:
            return None
        if len({c.get("position") for c in clicks}) != len(clicks):  # one click per result row
            return None
        seen.add(record.get("impression_id"))
    return record


def write_twin(logs: Path, out: Path, shape: str, ts: str = "timestamp") -> dict[str, int]:
    """Each JSON-lines file under `logs` as a Parquet file under `out` (same relative name, .parquet);
    {lines, rows, left_out}."""
    import gzip

    import pyarrow.parquet as pq

    from core.artifacts import data_files

    counts = {"lines": 0, "rows": 0, "left_out": 0}
    for path in data_files(logs):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as handle:
            lines = handle.read().splitlines()
        table, kept = twin(iter(lines), shape, ts)
        target = out / path.relative_to(logs).parent / (path.name.split(".")[0] + ".parquet")
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target, compression="zstd")
        counts["lines"] += len(lines)
        counts["rows"] += table.num_rows
        counts["left_out"] += len(lines) - len(kept)
    return counts
