"""Clean's one pass over the kept lines: `impressions/` (one row per kept impression, the shown
titles in rank order with their click flags and dwell times, schema `core.schemas.IMPRESSIONS`)
and the clicks and impressions per (query, title) that `pairs/` and `titles/` are summed from.

`scan_file` runs as a Spark task per file of clean's parsed scratch, each read with
pyarrow: the list columns never pass through the JVM, and dropped lines are a sorted array of
line numbers, not a join. Built per Arrow batch with numpy, no Python object per row: v2 title
ids are named from the catalogue's titles by one `take`, each list is put in position order,
clicks are matched to their shown position by a sorted search, and the pairs are counted on
integer codes with numpy (`PairCounts`). Each task writes its own Parquet files with pyarrow
(docs/studies/clean-throughput.md has what this bought).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.schemas import IMPRESSIONS
from stages.clean.fastparse import shown_index

PARSED_COLUMNS = ("impression_id", "ts_ms", "query", "v", "titles", "title_ids", "positions", "clicked", "dwell")
ROW_GROUP = 131_072  # rows per Parquet row group
# Room for a catalogue's distinct titles in one dictionary page (Home Depot's: ~2.2 MB), so the
# titles column stays dictionary-encoded (past pyarrow's default 1 MB it falls back to plain
# strings): at 1M impressions a third of the bytes, writes ~35% and reads ~2x cheaper.
DICTIONARY = 8 << 20
COUNTED = pa.schema(
    [("query", pa.string()), ("title", pa.string()), ("clicks", pa.int64()), ("impressions", pa.int64())]
)
_BATCH = 65_536  # rows read from the scratch at a time
_MERGE = 32  # per-batch pair keys are summed every this many batches (bounds a task's memory)


def scan_file(file: str, dropped: np.ndarray, pairs: PairCounts, impressions: Path | None) -> int:
    """One file of the parsed scratch, read with pyarrow (in a Spark task): its kept lines (no
    `reason`, `line` not in the sorted array `dropped`) written as impressions to `impressions`
    (None: not written; no file for a file without kept lines), and their shown results added to
    `pairs`. Returns the kept lines. A retried task rewrites its files."""

    def rows() -> Iterator[pa.RecordBatch]:
        for kept in _kept_batches(file, dropped):
            for version in (1, 2):
                lines = kept.filter(pc.equal(kept.column("v"), version))
                if len(lines):
                    yield _impressions(lines, pairs.catalogue, version, pairs)

    return _write(rows(), impressions) if impressions is not None else sum(b.num_rows for b in rows())


class PairCounts:
    """Clicks and impressions per (query, title) of one task's shown results, counted on integer
    codes: a query's code is its place in the order first seen, a title's its catalogue row (v2)
    or, past the catalogue's rows, its place among the v1 titles first seen. Strings are looked up
    once per distinct value of a batch and named once per pair, at the end."""

    def __init__(self, titles: pa.Array):
        self.catalogue = titles
        self.queries: dict[str, int] = {}
        self.v1_titles: dict[str, int] = {}
        self.keys: list[np.ndarray] = []  # (query code << 32) | title code, per shown result or summed pair
        self.clicks: list[np.ndarray] = []
        self.shown: list[np.ndarray] = []

    def add(self, query: pa.Array, parent: np.ndarray, keys: pa.Array, clicked: np.ndarray, version: int) -> None:
        """Shown results: `parent` their row of `query`, `keys` their titles (v1) or title ids (v2)."""
        q = _codes(query, self.queries, 0)[parent]
        t = keys.to_numpy().astype(np.int64) if version == 2 else _codes(keys, self.v1_titles, len(self.catalogue))
        self.keys.append((q << 32) | t)
        self.clicks.append(clicked.astype(np.int64))
        self.shown.append(np.ones(len(t), np.int64))
        if len(self.keys) >= _MERGE:
            self._sum()

    def _sum(self) -> None:
        """The lists summed per key (bounds a task's memory); a hash group-by, faster than a sort."""
        columns = {"key": self.keys, "clicks": self.clicks, "shown": self.shown}
        table = pa.table({name: np.concatenate(parts) for name, parts in columns.items()})
        summed = table.group_by("key", use_threads=False).aggregate([("clicks", "sum"), ("shown", "sum")])
        self.keys = [summed.column("key").to_numpy()]
        self.clicks = [summed.column("clicks_sum").to_numpy()]
        self.shown = [summed.column("shown_sum").to_numpy()]

    def table(self) -> pa.Table:
        """COUNTED: the sums per (query, title) of everything added."""
        if not self.keys:
            return COUNTED.empty_table()
        self._sum()
        (keys,), (clicks,), (shown,) = self.keys, self.clicks, self.shown
        queries = pa.array(list(self.queries), pa.string()).take(pa.array(keys >> 32))
        titles = pa.concat_arrays([self.catalogue, pa.array(list(self.v1_titles), pa.string())])
        names = titles.take(pa.array(keys & 0xFFFFFFFF))
        return pa.Table.from_arrays([queries, names, pa.array(clicks), pa.array(shown)], schema=COUNTED)


def _codes(values: pa.Array, seen: dict[str, int], start: int) -> np.ndarray:
    """Each string's code: `start` + its place in `seen` (the order strings were first seen; new
    ones are added), looked up once per distinct value."""
    encoded = pc.dictionary_encode(values)
    distinct = [seen.setdefault(v, len(seen)) for v in encoded.dictionary.to_pylist()]
    return np.asarray(distinct, np.int64)[encoded.indices.to_numpy()] + start


def _write(batches: Iterator[pa.RecordBatch], path: Path) -> int:
    """Write IMPRESSIONS batches to `path` in row groups of about ROW_GROUP rows (no file for
    none); returns the rows written."""
    writer, rows, pending = None, 0, []

    def flush() -> None:
        nonlocal writer
        if writer is None:
            writer = pq.ParquetWriter(path, IMPRESSIONS, compression="zstd", dictionary_pagesize_limit=DICTIONARY)
        writer.write_table(pa.Table.from_batches(pending).cast(IMPRESSIONS))
        pending.clear()

    try:
        for batch in batches:
            pending.append(batch)
            rows += batch.num_rows
            if sum(b.num_rows for b in pending) >= ROW_GROUP:
                flush()
        if pending:
            flush()
    finally:
        if writer is not None:
            writer.close()
    return rows


def _kept_batches(path: str, dropped: np.ndarray) -> Iterator[pa.RecordBatch]:
    """The scratch file's rows of well-formed lines not dropped by a rule, PARSED_COLUMNS only."""
    source = pq.ParquetFile(path)
    for batch in source.iter_batches(_BATCH, columns=["line", "reason", *PARSED_COLUMNS], use_threads=False):
        keep = pc.is_null(batch.column("reason")).to_numpy(zero_copy_only=False)
        if len(dropped):
            lines = batch.column("line").to_numpy()
            at = np.minimum(np.searchsorted(dropped, lines), len(dropped) - 1)
            keep &= dropped[at] != lines
        if keep.any():
            yield batch.filter(pa.array(keep)).select(list(PARSED_COLUMNS))


def _impressions(rows: pa.RecordBatch, titles: pa.Array, version: int, pairs: PairCounts) -> pa.RecordBatch:
    """The IMPRESSIONS batch of parsed rows of one format version; their shown results, each with
    its query, title (v1) or title id (v2) and whether it was clicked, added to `pairs`."""
    shown = rows.column("positions")
    parent = pc.list_parent_indices(shown).to_numpy()
    position = pc.list_flatten(shown).to_numpy()
    keys = pc.list_flatten(rows.column("titles" if version == 1 else "title_ids"))
    # Rank order: by position within each impression (a canonical line is in order already).
    order = np.lexsort((position, parent))  # parent is sorted already, and stays so
    if not (np.diff(order) == 1).all():
        position, keys = position[order], keys.take(pa.array(order))
    names = keys if version == 1 else titles.take(keys)
    clicks = rows.column("clicked")
    click_of = pc.list_parent_indices(clicks).to_numpy()
    # every click is on a shown position (parsing checked)
    at, _ = shown_index(parent, position, click_of, pc.list_flatten(clicks).to_numpy())
    clicked = np.zeros(len(position), bool)
    clicked[at] = True
    dwell = np.zeros(len(position), np.int64)
    np.add.at(dwell, at, pc.list_flatten(rows.column("dwell")).to_numpy())  # a result clicked twice: both dwells
    offsets = _offsets(shown)

    def listed(values: np.ndarray | pa.Array, dtype: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values, dtype))

    columns = {
        "impression_id": rows.column("impression_id"),
        "ts_ms": rows.column("ts_ms"),
        "query": rows.column("query"),
        "titles": listed(names, pa.string()),
        "positions": listed(position, pa.int32()),
        "clicked": listed(clicked, pa.bool_()),
        "dwell_ms": listed(np.minimum(dwell, 2**31 - 1), pa.int32()),
    }
    pairs.add(rows.column("query"), parent, keys, clicked, version)
    return pa.RecordBatch.from_arrays(
        [columns[f.name] for f in IMPRESSIONS], schema=pa.schema([pa.field(f.name, f.type) for f in IMPRESSIONS])
    )


def _offsets(lists: pa.Array) -> pa.Array:
    """0-based offsets of a list array (a batch's slice may start past 0)."""
    offsets = lists.offsets.to_numpy()
    return pa.array(offsets - offsets[0], pa.int32())
