"""Parquet impression tables as `dssm clean`'s input (docs/raw-log-format.md, "Parquet tables").

Two shapes: **impression rows** (one row per impression, the JSON format's fields with `results`
and `clicks` as lists of structs) and **result rows** (one row per shown result; the rows of one
`impression_id` make one impression). Either becomes rows of `stages.clean.rawlog.PARSED`, as JSON lines do.

A row is taken by the vectorised path here only when `rawlog.parse_line` would keep it with the
very same values (the checks below are its checks, on Arrow columns; queries and titles are
normalised once per distinct string by `core.text.norm`). Every other row is rendered as the JSON
record it stands for and judged by `parse_line` itself, so a bad row gets exactly the reason and
detail a JSON line would get; `raw` keeps the row itself as JSON, under the table's own column names.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from core.errors import DssmError
from core.text import norm
from stages.clean.fastparse import _TS, _epoch_ms
from stages.clean.rawlog import MAX_POSITION, PARSED, Impression, Malformed, parse_line

# Field names of the two shapes (the keys of `clean.columns`); nested ones are struct fields.
IMPRESSION_FIELDS = ("v", "impression_id", "ts", "user_id", "query", "results", "clicks")
RESULT_FIELDS = ("impression_id", "ts", "user_id", "query", "position", "doc_id", "title", "clicked", "dwell_ms")
NESTED_FIELDS = ("results.position", "results.title", "results.doc_id", "clicks.position", "clicks.dwell_ms")
FIELDS = tuple(dict.fromkeys(IMPRESSION_FIELDS + RESULT_FIELDS + NESTED_FIELDS))
GROUP_FIELDS = ("ts", "user_id", "query")  # one value per impression: its result rows must agree
MAGIC = b"PAR1"
_TS_STRING = f"^{_TS[1:-1]}$"  # the timestamps fastparse's integer arithmetic reads
_MIN_MS, _MAX_MS = -62_135_596_800_000, 253_402_300_799_999  # years 1..9999, what parse_line can read


def input_format(spark, source: str, option: str) -> tuple[str, list[str]]:
    """('json' or 'parquet', the paths a Parquet read takes): the format is `option` unless it is
    'auto', else what the files are (a `.parquet` suffix or Parquet's magic bytes), listed once
    through Hadoop's FileSystem as Spark will read them (a local path, `file://`, `hdfs://`,
    `s3a://`); the paths are a directory's data files (a manifest beside them left out), or a file
    or glob as given. An input mixing both formats is an error; a glob is Parquet only when it ends
    in `.parquet` (else name the format with input_format)."""
    if any(ch in source for ch in "*?["):
        found = "parquet" if source.rstrip("/").endswith(".parquet") else "json"
        return (found if option == "auto" else option), [source]
    if option == "json":  # JSON lines are read from `source` itself: nothing to list
        return "json", [source]
    from stages.clean.hadoopfs import HadoopPath

    root = HadoopPath(spark, source)
    single = root.is_file()
    names = [f.name for f in root.files()]
    paths = [source] if single else [(root / n).qualified for n in names]
    if option != "auto":
        return option, paths
    tables = [n for n in names if n.endswith(".parquet") or (root if single else root / n).head(4) == MAGIC]
    if not tables:
        return "json", paths
    if len(tables) < len(names):
        others = sorted(set(names) - set(tables))
        raise DssmError(
            f"{source} mixes Parquet and other files: {len(tables)} Parquet (e.g. {tables[0]}) and "
            f"{len(others)} others (e.g. {others[0]}); an input is JSON lines or Parquet, not both"
        )
    return "parquet", paths


def column_names(columns: dict[str, str]) -> dict[str, str]:
    """field -> the table's name for it: `clean.columns` over the fields' own names."""
    unknown = sorted(set(columns) - set(FIELDS))
    if unknown:
        raise DssmError(f"clean.columns: unknown field(s) {', '.join(unknown)} (fields: {', '.join(FIELDS)})")
    return {f: columns.get(f, f.rsplit(".", 1)[-1]) for f in FIELDS}


class Layout:
    """What a table holds, read from its Spark schema: its shape and which columns it has."""

    def __init__(self, schema, names: dict[str, str], source: str):
        from pyspark.sql import types as T

        self.names, self.source = names, source
        top = {f.name: f.dataType for f in schema.fields}
        self.shape = "impression_rows" if names["results"] in top else "result_rows"
        fields = IMPRESSION_FIELDS if self.shape == "impression_rows" else RESULT_FIELDS
        required = {"impression_id", "ts", "user_id", "query"} | (
            {"results", "clicks"} if self.shape == "impression_rows" else {"position", "clicked"}
        )
        if self.shape == "result_rows" and names["position"] not in top:
            raise self._error(
                f"neither a {names['results']!r} column (impression rows) nor a "
                f"{names['position']!r} column (result rows)",
                top,
            )
        missing = [f for f in fields if f in required and names[f] not in top]
        if self.shape == "result_rows" and names["doc_id"] not in top and names["title"] not in top:
            missing.append("doc_id (or title)")
        if missing:
            shown = ", ".join(f"{f} (column {names[f]!r})" if f in names else f for f in missing)
            raise self._error(f"no column for {shown}", top)
        self.present = [f for f in fields if names[f] in top]
        integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
        kinds = {
            "v": integral,
            "impression_id": (T.StringType,),
            "ts": (T.StringType, T.TimestampType, T.TimestampNTZType),
            "user_id": (T.StringType,),
            "query": (T.StringType,),
            "position": integral,
            "doc_id": (T.StringType,),
            "title": (T.StringType,),
            "clicked": (T.BooleanType, *integral),
            "dwell_ms": integral,
        }
        for f in self.present:
            kind = top[names[f]]
            if f in ("results", "clicks"):
                entry = kind.elementType if isinstance(kind, T.ArrayType) else None
                if not isinstance(entry, T.StructType):
                    raise self._error(f"{f} (column {names[f]!r}) is {kind.simpleString()}, not a list of structs", top)
                inner = {x.name: x.dataType for x in entry.fields}
                wanted = ("position", "dwell_ms") if f == "clicks" else ("position", "title", "doc_id")
                for sub in wanted:
                    name = names[f"{f}.{sub}"]
                    if name in inner and not isinstance(inner[name], kinds[sub]):
                        raise self._error(f"{f}.{sub} ({names[f]}.{name}) is {inner[name].simpleString()}", top)
                if names[f"{f}.position"] not in inner:
                    raise self._error(f"{f} (column {names[f]!r}) has no field {names[f + '.position']!r}", top)
                setattr(self, f"{f}_fields", set(inner))
            elif not isinstance(kind, kinds[f]):
                allowed = " or ".join(k.typeName() for k in kinds[f])
                raise self._error(f"{f} (column {names[f]!r}) is {kind.simpleString()}, not {allowed}", top)
        if self.shape == "impression_rows" and "v" not in self.present:
            results = getattr(self, "results_fields", set())
            if names["results.title"] not in results and names["results.doc_id"] not in results:
                raise self._error("results have neither a title nor a doc_id field", top)
        # Without a v column the version is the results': titles (v1), else doc ids (v2); result
        # rows: doc ids (v2) when the table has them, else titles (v1).
        if self.shape == "impression_rows":
            self.version = 1 if names["results.title"] in getattr(self, "results_fields", ()) else 2
        else:
            self.version = 2 if names["doc_id"] in top else 1

    def context(self) -> _Context:
        """What the parser needs to know of the table on the executors."""
        return _Context(self.names, self.version, self.shape)

    def _error(self, what: str, top: dict) -> DssmError:
        return DssmError(
            f"Parquet input {self.source}: {what}; its columns: {', '.join(top)} (docs/raw-log-format.md: "
            f"the two table shapes; map other column names with clean.columns / --columns)"
        )


def read_layout(spark, source: str, paths: list[str], columns: dict[str, str]) -> tuple[Any, Layout]:
    """The table at `paths` (`input_format`'s listing: a file, or a directory's Parquet files at any
    depth, `dt=` partitions included) as a Spark DataFrame, and its Layout under `clean.columns`."""
    from pyspark.sql.utils import AnalysisException

    try:
        table = spark.read.option("mergeSchema", "true").option("recursiveFileLookup", "true").parquet(*paths)
    except AnalysisException as e:  # e.g. two files disagree on a column's type
        raise DssmError(f"Parquet input {source}: {str(e).splitlines()[0][:300]}") from None
    return table, Layout(table.schema, column_names(columns), source)


def parse_table(spark, table, layout: Layout, doc_ids: dict[str, int] | None) -> tuple[Any, dict]:
    """The rows of `table` (`read_layout`) as PARSED rows, through Spark's reader, and what was
    read: {format, shape, and for result rows rows_read}."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    picked = [F.col(f"`{layout.names[f]}`").alias(f) for f in layout.present]
    numbered = table.select(
        F.col("_metadata.file_path").alias("source"), F.monotonically_increasing_id().alias("line"), *picked
    )
    context = layout.context()
    if doc_ids:
        shared = spark.sparkContext.broadcast(doc_ids)
        ids: Callable[[], dict[str, int] | None] = lambda: shared.value  # noqa: E731
    else:
        ids = lambda: None  # noqa: E731
    if layout.shape == "impression_rows":
        parsed = numbered.mapInArrow(lambda b: impression_batches(b, context, ids()), from_arrow_schema(PARSED))
    else:
        grouped = numbered.repartition("impression_id").sortWithinPartitions("impression_id", "position", "line")
        parsed = grouped.mapInArrow(lambda b: result_batches(b, context, ids()), from_arrow_schema(PARSED))
    info = {"format": "parquet", "shape": layout.shape}
    if layout.shape == "result_rows":
        info["rows_read"] = table.count()  # from the files' footers
    return parsed, info


class _Context:
    """What the executors need to know of the table: names, version without a v column, shape."""

    def __init__(self, names: dict[str, str], version: int, shape: str):
        self.names, self.version, self.shape = names, version, shape
        self.table_name = {f: names[f] for f in FIELDS}  # field -> column, for `raw`


# --- impression rows ---------------------------------------------------------------------------


def impression_batches(
    batches: Iterator[pa.RecordBatch], ctx: _Context, doc_ids: dict[str, int] | None
) -> Iterator[pa.RecordBatch]:
    """(source, line, fields...) batches of impression rows -> PARSED batches (mapInArrow)."""
    for batch in batches:
        yield from _parse(batch, ctx, doc_ids, lambda rows, batch=batch: _impression_raw(batch, rows, ctx))


def _impression_raw(batch: pa.RecordBatch, rows: np.ndarray, ctx: _Context) -> list[Any]:
    """Each row as the table has it (its own column and field names), for `raw`."""
    return [_renamed(r, ctx) for r in _pylist(batch.take(pa.array(rows)))]


def _renamed(record: dict, ctx: _Context) -> dict:
    named = {}
    for f, value in record.items():
        if f in ("source", "line", "conflict"):
            continue
        if f in ("results", "clicks") and isinstance(value, list):
            value = [
                {ctx.names.get(f"{f}.{k}", k): x for k, x in e.items()} if isinstance(e, dict) else e for e in value
            ]
        named[ctx.table_name.get(f, f)] = value
    return named


# --- result rows -------------------------------------------------------------------------------


def result_batches(
    batches: Iterator[pa.RecordBatch], ctx: _Context, doc_ids: dict[str, int] | None
) -> Iterator[pa.RecordBatch]:
    """Result rows, sorted by (impression_id, position, line) within the partition -> PARSED
    batches, one impression per impression id (each row without one is an impression of its own).
    A batch's last impression may go on in the next batch, so it waits for it."""
    pending: pa.Table | None = None
    for batch in batches:
        rows = (
            pa.Table.from_batches([batch])
            if pending is None
            else pa.concat_tables([pending, pa.Table.from_batches([batch])])
        )
        rows = rows.combine_chunks()
        starts = _group_starts(rows.column("impression_id").chunk(0) if rows.num_rows else pa.array([], pa.string()))
        if len(starts) <= 1:
            pending = rows
            continue
        cut = int(starts[-1])
        pending = rows.slice(cut)
        yield from _grouped(rows.slice(0, cut), starts[:-1], ctx, doc_ids)
    if pending is not None and pending.num_rows:
        yield from _grouped(pending, _group_starts(pending.column("impression_id").combine_chunks()), ctx, doc_ids)


def _group_starts(ids: pa.Array) -> np.ndarray:
    """Where each impression starts among rows sorted by impression id (a null id: a row of its own)."""
    n = len(ids)
    if n == 0:
        return np.zeros(0, np.int64)
    null = ids.is_null().to_numpy(zero_copy_only=False)
    new = np.ones(n, bool)
    if n > 1:
        same = pc.equal(ids.slice(1), ids.slice(0, n - 1)).fill_null(False).to_numpy(zero_copy_only=False)
        new[1:] = ~same
    new |= null
    return np.flatnonzero(new)


def _grouped(rows: pa.Table, starts: np.ndarray, ctx: _Context, doc_ids) -> Iterator[pa.RecordBatch]:
    """Complete impressions of result rows (`starts`: their first rows) -> PARSED batches."""
    n = rows.num_rows
    rows = rows.combine_chunks()
    col = {name: rows.column(name).chunk(0) for name in rows.column_names}
    offsets = np.append(starts, n).astype(np.int32)
    sizes = np.diff(offsets)
    group = np.repeat(np.arange(len(starts)), sizes)
    line = col["line"].to_numpy()
    first = np.lexsort((line, group))[starts]  # each impression's earliest row: its line and source
    heads = pa.array(starts)
    conflict = np.full(len(starts), None, object)
    for f in GROUP_FIELDS:  # each row against its impression's first row
        values = col[f]
        head = values.take(pa.array(starts[group]))
        differ = pc.or_kleene(
            pc.not_equal(values, head).fill_null(False), pc.xor(values.is_null(), head.is_null())
        ).to_numpy(zero_copy_only=False)
        bad = np.unique(group[differ])
        conflict[bad] = np.where(conflict[bad] == None, f, conflict[bad])  # noqa: E711 (an object array)
    key = "title" if "title" in col and "doc_id" not in col else "doc_id"
    results = pa.ListArray.from_arrays(
        pa.array(offsets), pa.StructArray.from_arrays([col["position"], col[key]], names=["position", key])
    )
    clicked = col["clicked"]
    clicked = (clicked if pa.types.is_boolean(clicked.type) else pc.not_equal(clicked, 0)).fill_null(False)
    click_rows = np.flatnonzero(clicked.to_numpy(zero_copy_only=False))
    dwell = col["dwell_ms"] if "dwell_ms" in col else pa.nulls(n, pa.int32())
    click_offsets = np.searchsorted(click_rows, offsets).astype(np.int32)
    taken = pa.array(click_rows)
    clicks = pa.ListArray.from_arrays(
        pa.array(click_offsets),
        pa.StructArray.from_arrays([col["position"].take(taken), dwell.take(taken)], names=["position", "dwell_ms"]),
    )
    impressions = pa.RecordBatch.from_pydict(
        {
            "source": col["source"].take(pa.array(first)),
            "line": col["line"].take(pa.array(first)),
            "impression_id": col["impression_id"].take(heads),
            **{f: col[f].take(heads) for f in GROUP_FIELDS},
            "results": results,
            "clicks": clicks,
            "conflict": pa.array(conflict, pa.string()),
        }
    )
    inner = _Context({**ctx.names, "results.position": "position", f"results.{key}": key}, ctx.version, ctx.shape)
    inner.names.update({"clicks.position": "position", "clicks.dwell_ms": "dwell_ms"})

    def raw(groups: np.ndarray) -> list[Any]:
        out = []
        for g in groups:
            members = rows.slice(int(offsets[g]), int(sizes[g])).drop_columns(["source"])
            listed = sorted(_pylist(members), key=lambda r: r["line"])
            out.append([{ctx.table_name.get(f, f): v for f, v in r.items() if f != "line"} for r in listed])
        return out

    yield from _parse(impressions, inner, doc_ids, raw)


# --- both shapes -------------------------------------------------------------------------------

_norms: dict[str, str] = {}  # queries and titles repeat across batches: each is normalised once per worker


def _normed(values: pa.Array) -> pa.Array:
    """`norm` of each string, computed once per distinct one."""
    if len(_norms) > 500_000:
        _norms.clear()
    encoded = pc.dictionary_encode(values)
    cache = _norms
    distinct = [cache.get(t) or cache.setdefault(t, norm(t)) for t in encoded.dictionary.to_pylist()]
    return pa.array(distinct, pa.string()).take(encoded.indices)


def _parse(
    batch: pa.RecordBatch, ctx: _Context, doc_ids: dict[str, int] | None, raw: Callable[[np.ndarray], list[Any]]
) -> Iterator[pa.RecordBatch]:
    """Impression-shaped rows (fields named as the JSON format, results/clicks as lists of
    structs whose fields are named by `ctx.names`) -> PARSED: the rows parse_line would keep with
    the same values, vectorised; every other row through parse_line, rendered as its JSON record."""
    n = batch.num_rows
    if n == 0:
        return
    col = {name: batch.column(name) for name in batch.schema.names}
    ok = np.ones(n, bool)
    for f in ("impression_id", "ts", "user_id", "query", "results", "clicks"):
        if f in col:
            ok &= col[f].is_valid().to_numpy(zero_copy_only=False)
    if "conflict" in col:
        ok &= col["conflict"].is_null().to_numpy(zero_copy_only=False)
    # a null v is a file without the column read beside files with it (mergeSchema): the table's version
    version = col["v"].fill_null(ctx.version).to_numpy().astype(np.int64) if "v" in col else np.full(n, ctx.version)
    ok &= (version == 1) | (version == 2)
    ts_ms = _ts_ms(col["ts"], ok)

    names = ctx.names
    results, clicks = col["results"], col["clicks"]
    r_lens = pc.list_value_length(results).fill_null(0).to_numpy()
    c_lens = pc.list_value_length(clicks).fill_null(0).to_numpy()
    ok &= r_lens > 0
    r_of = np.repeat(np.arange(n), r_lens)
    c_of = np.repeat(np.arange(n), c_lens)
    entries, click_entries = pc.list_flatten(results), pc.list_flatten(clicks)
    positions = _int_field(entries, names["results.position"], r_of, ok, 1)
    clicked = _int_field(click_entries, names["clicks.position"], c_of, ok, 1)
    dwell = _int_field(click_entries, names["clicks.dwell_ms"], c_of, ok, 0, absent=0)
    # Unique positions per impression, and each click on one of them.
    shown_keys = (r_of.astype(np.int64) << 32) | positions
    order = np.sort(shown_keys)
    ok[(order[1:][order[1:] == order[:-1]] >> 32).astype(np.int64)] = False
    at = np.minimum(np.searchsorted(order, (c_of.astype(np.int64) << 32) | clicked), max(len(order) - 1, 0))
    on_shown = order[at] == ((c_of.astype(np.int64) << 32) | clicked) if len(order) else np.zeros(len(c_of), bool)
    ok[c_of[~on_shown]] = False

    entry_type = entries.type
    titles = title_ids = None
    v1, v2 = version == 1, version == 2
    if names["results.title"] in _struct_names(entry_type):
        title_values = pc.struct_field(entries, names["results.title"])
        ok[r_of[np.asarray(title_values.is_null().to_numpy(zero_copy_only=False)) & v1[r_of]]] = False
        titles = pa.ListArray.from_arrays(pa.array(_offsets(r_lens)), _normed(title_values), mask=pa.array(~v1))
    else:
        ok &= ~v1
    if names["results.doc_id"] in _struct_names(entry_type):
        doc_values = pc.struct_field(entries, names["results.doc_id"])
        found = _lookup(doc_values, doc_ids)
        ok[r_of[(found < 0) & v2[r_of]]] = False  # unknown (or null): parse_line says which
        title_ids = pa.ListArray.from_arrays(pa.array(_offsets(r_lens)), pa.array(found), mask=pa.array(~v2))
    else:
        ok &= ~v2

    fast = np.flatnonzero(ok)
    if len(fast):
        keep = pa.array(ok)
        r_off, c_off = pa.array(_offsets(r_lens)), pa.array(_offsets(c_lens))
        columns = {
            "source": col["source"],
            "line": col["line"],
            "reason": pa.nulls(n, pa.string()),
            "detail": pa.nulls(n, pa.string()),
            "raw": pa.nulls(n, pa.string()),
            "impression_id": col["impression_id"],
            "user_id": col["user_id"],
            "ts_ms": pa.array(ts_ms, pa.int64()),
            "query": _normed(col["query"]),
            "v": pa.array(version.astype(np.int8)),
            "titles": titles if titles is not None else pa.nulls(n, pa.list_(pa.string())),
            "title_ids": title_ids if title_ids is not None else pa.nulls(n, pa.list_(pa.int32())),
            "positions": pa.ListArray.from_arrays(r_off, pa.array(positions.astype(np.int32))),
            "clicked": pa.ListArray.from_arrays(c_off, pa.array(clicked.astype(np.int32))),
            "dwell": pa.ListArray.from_arrays(c_off, pa.array(dwell.astype(np.int32))),
            "shown": pa.array(r_lens.astype(np.int32)),
            "clicks": pa.array(c_lens.astype(np.int32)),
        }
        out = pa.RecordBatch.from_arrays([columns[f.name].cast(f.type) for f in PARSED], schema=PARSED)
        yield out.filter(keep)
    slow = np.flatnonzero(~ok)
    if len(slow):
        yield _judged(batch.take(pa.array(slow)), ctx, doc_ids, raw(slow))


def _judged(rows: pa.RecordBatch, ctx: _Context, doc_ids, raws: list[Any]) -> pa.RecordBatch:
    """Rows the vectorised checks did not take, judged one by one by parse_line."""
    malformed_row = (None,) * (len(PARSED) - 5)
    parsed = []
    gc.disable()  # as rawlog._parse_each: many small containers, no cycles
    try:
        for record, kept in zip(_pylist(rows), raws, strict=True):
            try:
                if record.get("conflict"):
                    raise Malformed(
                        "bad_value", f"the rows of impression {record['impression_id']} differ in {record['conflict']}"
                    )
                imp: Impression = parse_line(orjson.dumps(_as_json_record(record, ctx)), doc_ids)
                parsed.append((None, None, None, *imp, len(imp.positions), len(imp.clicked)))
            except Malformed as bad:
                parsed.append((bad.reason, bad.detail, orjson.dumps(kept, default=str).decode(), *malformed_row))
    finally:
        gc.enable()
    columns = [rows.column("source"), rows.column("line")]
    columns += [pa.array(c, type=f.type) for c, f in zip(zip(*parsed, strict=True), list(PARSED)[2:], strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=PARSED)


def _as_json_record(record: dict, ctx: _Context) -> dict:
    """The JSON-format record a row stands for: a null struct field is an absent key (Parquet does
    not tell them apart), so a null dwell_ms means not logged, as an absent one does in JSON."""
    out = {f: record.get(f) for f in ("v", "impression_id", "ts", "user_id", "query")}
    if record.get("v") is None:  # no v column, or a file without it beside files with it
        out["v"] = ctx.version
    if isinstance(out["ts"], int | float):  # out of datetime's range: kept as text, parse_line's bad_value
        out["ts"] = str(out["ts"])
    fields = {
        "results": {ctx.names[f"results.{k}"]: k for k in ("position", "title", "doc_id")},
        "clicks": {ctx.names[f"clicks.{k}"]: k for k in ("position", "dwell_ms")},
    }
    for f, wanted in fields.items():
        value = record.get(f)
        if isinstance(value, list):
            value = [
                {wanted[k]: x for k, x in e.items() if k in wanted and x is not None} if isinstance(e, dict) else e
                for e in value
            ]
        out[f] = value
    return out


def _pylist(rows) -> list[dict]:
    """Rows as Python values, timestamps as ISO 8601 text (out of Python's range: the raw integer)."""
    for i, name in enumerate(rows.schema.names):
        kind = rows.schema.field(name).type
        if pa.types.is_timestamp(kind):
            rows = rows.set_column(i, name, pa.array(_iso(rows.column(name), kind), pa.string()))
    return rows.to_pylist()


def _iso(values, kind: pa.TimestampType) -> list[str | int | None]:
    raw = pc.cast(values, pa.int64()).to_pylist()
    out: list[str | int | None] = []
    for v in raw:
        if v is None:
            out.append(None)
            continue
        us = v // 1000 if kind.unit == "ns" else v * {"s": 1_000_000, "ms": 1000, "us": 1}[kind.unit]
        try:
            at = datetime(1970, 1, 1) + timedelta(microseconds=us)
        except OverflowError:
            out.append(v)
            continue
        out.append((at.replace(tzinfo=UTC) if kind.tz else at).isoformat())
    return out


def _ts_ms(ts: pa.Array, ok: np.ndarray) -> np.ndarray:
    """Milliseconds since the epoch as parse_line reads them; clears `ok` where only parse_line
    can say (a text timestamp of another shape, a time out of range)."""
    n = len(ts)
    if pa.types.is_timestamp(ts.type):
        ticks = pc.cast(ts, pa.int64()).fill_null(0).to_numpy()
        unit = ts.type.unit
        ms = ticks * 1000 if unit == "s" else ticks if unit == "ms" else ticks // (1000 if unit == "us" else 1_000_000)
        if not ts.type.tz:  # a time without a zone is local time, as parse_line reads one
            ms = ms - _local_offsets_ms(ms)
        ok &= (ms >= _MIN_MS) & (ms <= _MAX_MS)
        return ms
    shaped = pc.match_substring_regex(ts, _TS_STRING).fill_null(False).to_numpy(zero_copy_only=False)
    ok &= shaped
    ms = np.zeros(n, np.int64)
    if shaped.any():
        rows = np.flatnonzero(shaped)
        good = np.ones(len(rows), bool)
        ms[rows] = _epoch_ms(ts.take(pa.array(rows)), good)
        ok[rows[~good]] = False
    return ms


def _local_offsets_ms(wall_ms: np.ndarray) -> np.ndarray:
    """The local zone's UTC offset at each wall-clock time, found once per distinct minute."""
    minutes, index = np.unique(wall_ms // 60_000, return_inverse=True)
    offsets = np.zeros(len(minutes), np.int64)
    for i, m in enumerate(minutes):
        try:
            at = datetime(1970, 1, 1) + timedelta(minutes=int(m))
            offsets[i] = at.astimezone().utcoffset() // timedelta(milliseconds=1)
        except (OverflowError, OSError, ValueError):
            offsets[i] = 0  # out of range: the range check sends the row to parse_line
    return offsets[index]


def _int_field(
    entries: pa.Array, name: str, parent: np.ndarray, ok: np.ndarray, low: int, absent: int | None = None
) -> np.ndarray:
    """An integer struct field of list entries as int64, clearing `ok` of the parents of entries
    that are null, lack it, or hold a value out of [low, MAX_POSITION]; `absent`: the value of a
    null field (dwell_ms: not logged) instead."""
    if name not in _struct_names(entries.type):
        if absent is None:
            ok[parent] = False
        return np.full(len(entries), absent or 0, np.int64)
    values = pc.struct_field(entries, name)
    missing = entries.is_null().to_numpy(zero_copy_only=False)
    null = values.is_null().to_numpy(zero_copy_only=False)
    out = values.fill_null(absent if absent is not None else low).to_numpy().astype(np.int64)
    bad = missing | (null if absent is None else False) | (out < low) | (out > MAX_POSITION)
    ok[parent[bad]] = False
    return np.clip(out, 0, MAX_POSITION)


def _struct_names(kind: pa.DataType) -> set[str]:
    return {kind.field(i).name for i in range(kind.num_fields)} if pa.types.is_struct(kind) else set()


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _lookup(doc_values: pa.Array, doc_ids: dict[str, int] | None) -> np.ndarray:
    """Title id per doc id, -1 where null or not in the catalogue; one dict look-up per distinct id."""
    if not doc_ids or len(doc_values) == 0:
        return np.full(len(doc_values), -1, np.int32)
    encoded = pc.dictionary_encode(doc_values)
    found = np.fromiter((doc_ids.get(d, -1) for d in encoded.dictionary.to_pylist()), np.int32)
    found = np.append(found, np.int32(-1))  # the row of a null doc id
    return found[encoded.indices.fill_null(len(found) - 1).to_numpy()]
