"""Clean's parse step as Python tasks over the input files (small files share a task: `file_groups`):
each file read with Python and pyarrow, parsed (`stages.clean.rawlog.parse_batches`,
`stages.clean.parquetlog.impression_batches`) and written to the parsed scratch with pyarrow,
so the rows never pass through the JVM.

Through Spark's readers each row went JVM -> Arrow -> Python and back, and the JVM wrote the
nested list columns to Parquet: at 1M impressions that was ~9x the CPU of the parsing itself
(docs/studies/clean-throughput.md, issue 42). Spark still schedules the tasks on whatever master it
has; the files must be readable where the tasks run, as for any `file:` input. A task reads a run of
files in name order of at most TASK_BYTES (a larger file alone): a thousand small files are one task
and one scratch and impressions/ file, not a thousand (issue 51). The runs depend on the files' sizes
only, never on the cores, so a rerun anywhere writes the same files.

Taken for files on the local file system (`file:` after Hadoop qualifies them), JSON lines plain,
`.gz` or `.bz2`, and Parquet tables of impression rows. Anything else (an `hdfs://` or `s3a://`
root, a glob, another Hadoop codec, result rows, which are grouped by a shuffle) is read by
Spark's readers as before; `clean.reader=spark` asks for them always.

Lines read as Spark's text reader reads them: split at `\\n`, `\\r` or `\\r\\n`, a UTF-8 byte-order
mark at the start of a file dropped, no line after a final terminator. A line is numbered
`(file index << 33) + its row in the file`, files in name order, so "an earlier line" (the
duplicate rule) means an earlier file by name, or earlier in the same file.
"""

from __future__ import annotations

import bz2
import gzip
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BATCH = 65_536  # lines or rows per Arrow batch handed to the parser
TASK_BYTES = 16 << 20  # input bytes a parse task reads at most, unless one file is larger
ROW_GROUP = 262_144  # parsed rows per row group of the scratch
_CHUNK = 8 << 20  # bytes read from a file at a time
_BOM = b"\xef\xbb\xbf"
_OPENERS: dict[str, Callable[..., Any]] = {".gz": gzip.open, ".bz2": bz2.open}
OTHER_CODECS = (".deflate", ".lz4", ".snappy", ".zst", ".zstd", ".br", ".lzo")  # Hadoop reads these; not taken here


def local_files(spark: Any, paths: list[str]) -> list[tuple[str, str]] | None:
    """(the name Spark's `_metadata.file_path` gives it, its local path) of each data file of
    `paths` (files, or directories read at any depth), in name order; None where a file task
    cannot read them: a glob, a path on another file system, a file of another Hadoop codec."""
    from stages.clean.hadoopfs import HadoopPath

    if any(ch in p for p in paths for ch in "*?["):
        return None
    found = []
    for given in paths:
        path = HadoopPath(spark, given)
        if path.local_path is None or not path.exists():  # Spark's reader says what is missing
            return None
        for file in [path] if not path.is_dir() else [path / f.name for f in path.files()]:
            local = file.local_path
            if local is None or local.endswith(OTHER_CODECS):
                return None
            found.append((file.qualified, local))
    return sorted(found)


def parse_files(
    spark: Any,
    files: list[tuple[str, str]],
    scratch: Path,
    parse: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    read: Callable[[str, str, int], Iterator[pa.RecordBatch]],
) -> int:
    """Each group of `files` (`local_files`, grouped by `file_groups`) as `scratch/part-GGGGG.parquet`:
    its files' batches from `read(source, path, index)` through `parse` (PARSED batches), in name
    order, written by the task that read them. Returns the rows written. A retried task rewrites its
    own file."""
    from core.spark import python_tasks
    from stages.clean.rawlog import PARSED

    scratch.mkdir(parents=True)
    groups = file_groups([os.path.getsize(path) for _, path in files])
    shared = spark.sparkContext.broadcast((files, groups, str(scratch)))

    def task(g: int) -> int:
        files, groups, out = shared.value
        rows, pending = 0, []
        with pq.ParquetWriter(Path(out) / f"part-{g:05d}.parquet", PARSED, compression="snappy") as writer:
            for i in groups[g]:
                source, path = files[i]
                for parsed in parse(_named(read(source, path, i), source)):
                    pending.append(parsed)
                    rows += parsed.num_rows
                    if sum(b.num_rows for b in pending) >= ROW_GROUP:  # few, large row groups, as Spark writes
                        writer.write_table(pa.Table.from_batches(pending))
                        pending.clear()
            if pending:
                writer.write_table(pa.Table.from_batches(pending))
        return rows

    return python_tasks(spark, len(groups), task)


def file_groups(sizes: list[int], task_bytes: int = TASK_BYTES) -> list[list[int]]:
    """The files (their sizes, in name order) as runs of consecutive indices, one parse task each: a
    run closes before it would pass `task_bytes`; every file in exactly one run."""
    groups: list[list[int]] = [[]]
    filled = 0
    for i, size in enumerate(sizes):
        if groups[-1] and filled + size > task_bytes:
            groups.append([])
            filled = 0
        groups[-1].append(i)
        filled += size
    return [g for g in groups if g]


UNREADABLE = "dssm: an unreadable input file"  # what clean finds in the error Spark raises for a task


def _named(batches: Iterator[pa.RecordBatch], source: str) -> Iterator[pa.RecordBatch]:
    """`batches` of one file; a file that cannot be read to its end (a truncated .bz2 or .gz, a damaged
    Parquet page) fails naming itself: Spark's error for the task names none."""
    try:
        yield from batches
    except (OSError, EOFError, zlib.error, pa.ArrowException) as e:
        raise RuntimeError(f"{UNREADABLE} {source}: a damaged or truncated file ({type(e).__name__}: {e})") from None


def first_line(index: int) -> int:
    """The number of a file's first line; its rows follow on."""
    return index << 33


def json_lines(source: str, path: str, index: int) -> Iterator[pa.RecordBatch]:
    """(source, line, value) batches of a JSON-lines file, `parse_batches`'s input."""
    opener = _OPENERS.get(Path(path).suffix, open)
    line = first_line(index)
    with opener(path, "rb") as handle:
        for lines in _split_lines(handle):
            yield pa.RecordBatch.from_arrays(
                [_repeated(source, len(lines)), _numbers(line, len(lines)), pa.array(lines, pa.binary())],
                names=["source", "line", "value"],
            )
            line += len(lines)


def _split_lines(handle: Any) -> Iterator[list[bytes]]:
    """The file's lines in lists of about BATCH, as Hadoop's line reader splits them."""
    pending, lines, first = b"", [], True
    while True:
        chunk = handle.read(_CHUNK)
        if first:
            chunk, first = (chunk[len(_BOM) :] if chunk.startswith(_BOM) else chunk), False
        if not chunk:
            lines += pending.splitlines()
            if lines:
                yield lines
            return
        data = pending + chunk
        # A `\r` at the very end may be the first half of `\r\n`: it waits for the next chunk.
        cut = max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1
        lines += data[:cut].splitlines()
        pending = data[cut:]
        while len(lines) >= BATCH:
            yield lines[:BATCH]
            lines = lines[BATCH:]


def parquet_rows(columns: dict[str, str], schema: pa.Schema) -> Callable[[str, str, int], Iterator[pa.RecordBatch]]:
    """A reader of a Parquet file's impression rows: (source, line, fields...) batches with the
    fields `columns` names (field -> the table's column), in that order, `impression_batches`'s input.
    A column a file lacks (another file of the table has it) is all nulls of its type in `schema`,
    the table's merged schema."""

    def read(source: str, path: str, index: int) -> Iterator[pa.RecordBatch]:
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        int96 = {c.name for c in table.schema if c.physical_type == "INT96"}  # UTC by convention, as Spark reads it
        wanted = [c for c in columns.values() if c in names]
        line = first_line(index)
        for batch in table.iter_batches(BATCH, columns=wanted, use_threads=False):
            n = batch.num_rows
            arrays = [_repeated(source, n), _numbers(line, n)]
            for column in columns.values():
                if column not in names:
                    arrays.append(pa.nulls(n, schema.field(column).type))
                    continue
                values = batch.column(column)
                if column in int96:
                    values = values.cast(pa.timestamp("ns", tz="UTC"))
                arrays.append(values)
            yield pa.RecordBatch.from_arrays(arrays, names=["source", "line", *columns])
            line += n

    return read


def _repeated(value: str, n: int) -> pa.Array:
    return pa.array([value], pa.string()).take(pa.array(np.zeros(n, np.int64)))


def _numbers(first: int, n: int) -> pa.Array:
    return pa.array(np.arange(first, first + n, dtype=np.int64))
