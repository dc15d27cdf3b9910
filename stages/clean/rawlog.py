"""The raw impression-log format (docs/raw-log-format.md): its validation, in plain Python.

`parse_line` is the single definition of a well-formed line and of every malformed-line reason;
`parse_batches` applies it to Arrow batches, so Spark runs it with `mapInArrow` (on executors too)
and normalises text with exactly `core.text.norm`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from core.text import norm
from stages.clean.fastparse import DocLookup, parse_canonical

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
MAX_POSITION = 2**31 - 1  # positions and dwell times are stored as int32

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
        pa.field("v", pa.int8()),  # the line's format version
        pa.field("titles", pa.list_(pa.string())),  # v1: normalised titles, in the results' order
        pa.field("title_ids", pa.list_(pa.int32())),  # v2: rows of the catalogue's `titles`, in that order
        pa.field("positions", pa.list_(pa.int32())),
        pa.field("clicked", pa.list_(pa.int32())),  # clicked positions
        pa.field("dwell", pa.list_(pa.int32())),  # each click's dwell_ms (0 when not logged)
        pa.field("shown", pa.int32()),  # results shown and clicks: what the bot rule reads
        pa.field("clicks", pa.int32()),
    ]
)


class Impression(NamedTuple):
    impression_id: str
    user_id: str
    ts_ms: int
    query: str
    v: int
    titles: list[str] | None  # v1
    title_ids: list[int] | None  # v2: rows of `Catalogue.titles`
    positions: list[int]
    clicked: list[int]
    dwell: list[int]  # per click, in ms (0 when not logged)


class Catalogue(NamedTuple):
    """A v2 log's side table, as clean uses it: titles are carried as small ints until the pairs
    are counted, and named only then."""

    ids: dict[str, int]  # doc id -> row of `titles`
    titles: list[str]  # distinct normalised titles, sorted


class Malformed(ValueError):
    def __init__(self, reason: str, detail: str | None = None):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


# Titles repeat across impressions: a bounded cache saves most of their normalisation.
_title_norms: dict[str, str] = {}
_FIELDS = tuple(_TYPES.items())
_NAMES, _KINDS = tuple(_TYPES), tuple(_TYPES.values())
_POSITION, _TITLE, _DOC_ID = itemgetter("position"), itemgetter("title"), itemgetter("doc_id")
_INT, _STR = {int}, {str}
_EPOCH, _MS = datetime(1970, 1, 1, tzinfo=UTC), timedelta(milliseconds=1)


def parse_line(line: str | bytes, doc_ids: dict[str, int] | None = None) -> Impression:
    """The impression on `line` (text, or the raw bytes of a log line), or `Malformed` with the first
    reason that applies. `doc_ids` maps a v2 line's doc ids to title ids (`Catalogue.ids`).

    This runs once per log line (the bulk of clean's time), so the common, well-formed case takes
    one pass per check: exact `type() is` tests (which also keep a JSON `true` from passing for
    the integer 1), and the full list of what is wrong is built only for a malformed line.
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
    if tuple(map(type, map(record.get, _NAMES))) != _KINDS:
        _field_error(record)
    version = record["v"]
    if version not in FORMAT_VERSIONS:
        raise Malformed("unsupported_version", f"v={version}")
    try:
        at = datetime.fromisoformat(record["ts"])
        # In whole milliseconds, exactly (a float timestamp times 1000 can land a millisecond
        # short); a time without a zone is local time, as datetime.timestamp() reads it.
        ts_ms = ((at if at.tzinfo else at.astimezone()) - _EPOCH) // _MS
    except (ValueError, OverflowError, OSError):
        raise Malformed("bad_value", "ts") from None
    results, clicks = record["results"], record["clicks"]
    named = "title" if version == 1 else "doc_id"
    try:
        positions = list(map(_POSITION, results))
        titles = list(map(_TITLE if version == 1 else _DOC_ID, results))
        clicked = list(map(_POSITION, clicks))
        dwells = [c.get("dwell_ms", 0) for c in clicks]
    except (TypeError, KeyError, AttributeError):
        raise Malformed("wrong_type", f"results[]/clicks[] entries need position and {named}") from None
    if not set(map(type, positions + clicked)) <= _INT or not set(map(type, titles)) <= _STR:
        raise Malformed("wrong_type", f"results[].position/{named} or clicks[].position")
    shown = set(positions)
    if not positions or min(positions) < 1 or len(shown) != len(positions):
        raise Malformed("bad_value", "results: none, a position < 1, or a repeated position")
    if max(positions) > MAX_POSITION:
        raise Malformed("bad_value", f"results: a position above {MAX_POSITION}")
    if not shown.issuperset(clicked) or (
        dwells and (not set(map(type, dwells)) <= _INT or min(dwells) < 0 or max(dwells) > MAX_POSITION)
    ):
        raise Malformed("bad_value", "clicks: a position not shown, or a bad dwell_ms")
    query = norm(record["query"])
    if version == 2:
        try:
            ids = list(map(doc_ids.__getitem__, titles)) if doc_ids else None
        except KeyError as e:
            raise Malformed(UNKNOWN_DOC, f"doc_id {e.args[0]}") from None
        if ids is None:
            raise Malformed(UNKNOWN_DOC, "doc_id any: no catalogue was given")
        return Impression(
            record["impression_id"], record["user_id"], ts_ms, query, 2, None, ids, positions, clicked, dwells
        )
    cache = _title_norms
    if len(cache) > 200_000:
        cache.clear()
    normed = [cache.get(t) or cache.setdefault(t, norm(t)) for t in titles]
    return Impression(
        record["impression_id"], record["user_id"], ts_ms, query, 1, normed, None, positions, clicked, dwells
    )


def _field_error(record: dict) -> None:
    """Raise the missing_field or wrong_type error of a record whose top-level fields do not all
    have their types: every missing field, else every mistyped one."""
    missing = [f for f in REQUIRED if record.get(f) is None]
    if missing:
        raise Malformed("missing_field", ",".join(missing))
    raise Malformed("wrong_type", ",".join(f for f, kind in _FIELDS if type(record[f]) is not kind))


def read_catalogue(path) -> Catalogue:
    """A catalogue side table (Parquet: doc_id, title): doc ids to rows of its distinct normalised titles.

    A catalogue is refused (DssmError naming the file) when a row lacks its doc id or title, or a doc
    id has more than one row: which title such a document has cannot be told, and the catalogue is
    one input, with no reject output of its own (docs/raw-log-format.md)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from core.errors import DssmError

    table = pq.read_table(path, columns=["doc_id", "title"])
    ids, titles = table.column("doc_id"), table.column("title")
    for name, column in (("doc_id", ids), ("title", titles)):
        if column.null_count:
            rows = pc.indices_nonzero(pc.is_null(column)).to_pylist()
            where = [f"row {i}" + (f" (doc id {ids[i]})" if ids[i].is_valid else "") for i in rows[:_SHOWN]]
            raise DssmError(
                f"catalogue {path}: {len(rows)} of {table.num_rows} rows have a null {name}: "
                f"{_listed(where, len(rows))}; every row needs a doc_id and a title"
            )
    counts = pc.value_counts(ids)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1)).to_pylist()
    if repeated:
        named = [f"{r['values']} ({r['counts']} rows)" for r in repeated[:_SHOWN]]
        raise DssmError(
            f"catalogue {path}: {len(repeated)} doc ids have more than one row: "
            f"{_listed(named, len(repeated))}; a catalogue has one row per document"
        )
    normed = list(map(norm, titles.to_pylist()))
    unique = sorted(set(normed))
    row = {t: i for i, t in enumerate(unique)}
    return Catalogue(dict(zip(ids.to_pylist(), (row[t] for t in normed), strict=True)), unique)


_SHOWN = 10  # the rows or doc ids a catalogue error names


def _listed(named: list[str], total: int) -> str:
    return ", ".join(named) + (f" and {total - len(named)} more" if total > len(named) else "")


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_batches(
    batches: Iterator[pa.RecordBatch], doc_ids: dict[str, int] | None = None, vectorised: bool = True
) -> Iterator[pa.RecordBatch]:
    """(source, line, value) batches -> PARSED batches; used with Spark's mapInArrow. `doc_ids`:
    v2 lines' doc id -> title id (`Catalogue.ids`).

    Canonical v2 lines go through `stages.clean.fastparse` (Arrow kernels, no Python object per line;
    `vectorised=False` turns that off), every other line through `parse_line`. Lines are read as
    bytes (a zero-copy view of the text column): a line that is not valid UTF-8 is quarantined as
    invalid_utf8 instead of failing the whole batch when Arrow decodes it. Rows come out in two
    groups per batch (the fast ones first); their `line` numbers say where each came from."""
    lookup = _doc_lookup(doc_ids) if vectorised and doc_ids else None
    for batch in batches:
        values = batch.column(2).cast(pa.binary())
        if lookup is not None:
            taken, columns = parse_canonical(values, lookup)
            if len(taken):
                yield _fast_batch(batch, taken, columns)
                rest = np.ones(len(batch), bool)
                rest[taken] = False
                batch, values = batch.filter(pa.array(rest)), values.filter(pa.array(rest))
        if len(batch):
            yield _parse_each(batch, values.to_pylist(), doc_ids)


def _parse_each(batch: pa.RecordBatch, values: list[bytes | None], doc_ids: dict[str, int] | None) -> pa.RecordBatch:
    malformed_row = (None,) * (len(PARSED) - 5)
    rows = []
    # Parsing allocates many small containers and no cycles: the cyclic GC would only
    # rescan them over and over (measured: a quarter of the time).
    gc.disable()
    try:
        for value in values:
            try:
                imp = parse_line(value or b"", doc_ids)
                rows.append((None, None, None, *imp, len(imp.positions), len(imp.clicked)))
            except Malformed as bad:
                kept = value.decode("utf-8", "backslashreplace") if value is not None else None
                rows.append((bad.reason, bad.detail, kept, *malformed_row))
    finally:
        gc.enable()
    transposed = zip(*rows, strict=True)
    columns = [batch.column(0), batch.column(1)]
    columns += [pa.array(col, type=f.type) for col, f in zip(transposed, list(PARSED)[2:], strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=PARSED)


def _fast_batch(batch: pa.RecordBatch, taken: np.ndarray, columns: dict[str, pa.Array]) -> pa.RecordBatch:
    rows = pa.array(taken)
    head = [batch.column(0).take(rows), batch.column(1).take(rows)]
    head += [pa.nulls(len(taken), pa.string())] * 3  # reason, detail, raw: a well-formed line
    return pa.RecordBatch.from_arrays(head + [columns[f.name] for f in list(PARSED)[5:]], schema=PARSED)


_lookup_of: tuple[dict[str, int], DocLookup] | None = None


def _doc_lookup(doc_ids: dict[str, int]) -> DocLookup:
    """One DocLookup per catalogue and Python worker (a broadcast value lives as long as the worker)."""
    global _lookup_of
    if _lookup_of is None or _lookup_of[0] is not doc_ids:
        _lookup_of = (doc_ids, DocLookup(doc_ids))
    return _lookup_of[1]
