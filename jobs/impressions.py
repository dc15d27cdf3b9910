"""Clean's `impressions/`: one row per kept impression, the shown titles in rank order with their
click flags and dwell times (schema `jobs.schemas.IMPRESSIONS`).

Built per Arrow batch from parsed rows (`jobs.rawlog.PARSED`) with numpy, no Python object per
row: v2 title ids are named from the catalogue's titles by one `take`, each list is put in
position order, and clicks are matched to their shown position by a sorted search. Each Spark
task writes its own Parquet file with pyarrow (`write_partition`): the title strings, the bulk
of the data, never pass through the JVM (at 10M impressions: 105-115 s against 145 s through
Spark's writer; BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.fastparse import shown_index
from jobs.schemas import IMPRESSIONS

PARSED_COLUMNS = ("impression_id", "ts_ms", "query", "v", "titles", "title_ids", "positions", "clicked", "dwell")


def impression_batches(batches: Iterator[pa.RecordBatch], titles: list[str] | None) -> Iterator[pa.RecordBatch]:
    """Parsed rows of kept lines (PARSED_COLUMNS) -> IMPRESSIONS batches; used with mapInArrow.
    `titles`: the catalogue's distinct normalised titles, which v2 title ids index."""
    named = pa.array(titles or [], pa.string())
    for batch in batches:
        for version in (1, 2):
            rows = batch.filter(pc.equal(batch.column("v"), version))
            if len(rows):
                yield _impressions(rows, named, version)


ROW_GROUP = 131_072  # rows per Parquet row group
WRITTEN = "file string, rows long"  # what `write_partition` returns per task, as a Spark schema


def write_partition(
    batches: Iterator[pa.RecordBatch], titles: list[str] | None, out: str, partition: int
) -> Iterator[pa.RecordBatch]:
    """Write one task's impressions to `out/part-PPPPP.parquet` (no file for an empty task) and
    yield (file, rows). The name is the task's partition: a retried task rewrites its own file."""
    path = Path(out) / f"part-{partition:05d}.parquet"
    writer, rows, pending = None, 0, []

    def flush() -> None:
        nonlocal writer
        if writer is None:
            writer = pq.ParquetWriter(path, IMPRESSIONS, compression="zstd")
        writer.write_table(pa.Table.from_batches(pending).cast(IMPRESSIONS))
        pending.clear()

    try:
        for batch in impression_batches(batches, titles):
            pending.append(batch)
            rows += batch.num_rows
            if sum(b.num_rows for b in pending) >= ROW_GROUP:
                flush()
        if pending:
            flush()
    finally:
        if writer is not None:
            writer.close()
    if writer is not None:
        yield pa.RecordBatch.from_pydict({"file": [path.name], "rows": [rows]})


def _impressions(rows: pa.RecordBatch, titles: pa.Array, version: int) -> pa.RecordBatch:
    shown = rows.column("positions")
    parent = pc.list_parent_indices(shown).to_numpy()
    position = pc.list_flatten(shown).to_numpy()
    if version == 1:
        names = pc.list_flatten(rows.column("titles"))
    else:
        names = titles.take(pc.list_flatten(rows.column("title_ids")))
    # Rank order: by position within each impression (a canonical line is in order already).
    order = np.lexsort((position, parent))
    position, names = position[order], names.take(pa.array(order))
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
    return pa.RecordBatch.from_arrays(
        [columns[f.name] for f in IMPRESSIONS], schema=pa.schema([pa.field(f.name, f.type) for f in IMPRESSIONS])
    )


def _offsets(lists: pa.Array) -> pa.Array:
    """0-based offsets of a list array (a batch's slice may start past 0)."""
    offsets = lists.offsets.to_numpy()
    return pa.array(offsets - offsets[0], pa.int32())
