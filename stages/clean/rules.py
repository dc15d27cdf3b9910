"""Clean's rules over the parsed scratch (docs/raw-log-format.md): duplicate events, empty queries,
bots, as three rounds of Python tasks with pyarrow and numpy, the rows bucketed by hand between
rounds instead of through Spark's shuffles.

1. A task per scratch file reads the small columns of its well-formed lines and writes them into
   `buckets` files by a hash of the impression id.
2. A task per impression-id bucket sorts its lines by (impression id, line): every line after the
   first of an id is a `duplicate_event`. Of the first lines, an empty query is an `empty_query`;
   the others go on into `buckets` files by a hash of the user id.
3. A task per user bucket sorts its lines by (user, ts): the impressions in the 60 s from each one
   (a sliding window; equal times all count) and each user's totals make `bot_user` lines.

Each round's tasks write their own files, so a retried task rewrites the same ones. The drops are
the (line, rule) Parquet files of rounds 2 and 3. Equal strings hash alike in every task (the hash
is of the bytes, not Python's per-process `hash`); how well it spreads them decides only balance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DROPS = pa.schema([("line", pa.int64()), ("rule", pa.string())])
_IDS = ["line", "impression_id", "user_id", "ts_ms", "query", "clicks", "shown"]
_P = np.uint64(0x100000001B3)
_MIX = np.uint64(0xFF51AFD7ED558CCD)
BUCKET_ROWS = 2_000_000  # lines per bucket at most, about (~100 MB of a task's memory)


def bucket_of(values: pa.Array, buckets: int) -> np.ndarray:
    """A bucket in [0, buckets) per string of `values` (no nulls), from its bytes alone."""
    values = values.cast(pa.binary())
    _, offset_buffer, buffer = values.buffers()
    offsets = np.frombuffer(offset_buffer, np.int32)[values.offset : values.offset + len(values) + 1].astype(np.int64)
    data = np.frombuffer(buffer, np.uint8)[offsets[0] : offsets[-1]] if buffer is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets - offsets[0], np.diff(offsets)
    local = np.arange(len(data)) - np.repeat(starts[:-1], lengths)  # each byte's place in its string
    with np.errstate(over="ignore"):
        longest = int(lengths.max(initial=0))
        powers = np.concatenate([np.ones(1, np.uint64), np.cumprod(np.full(max(longest - 1, 0), _P, np.uint64))])
        summed = np.concatenate([np.zeros(1, np.uint64), np.cumsum(data.astype(np.uint64) * powers[local])])
        h = summed[starts[1:]] - summed[starts[:-1]] + lengths.astype(np.uint64)
        h ^= h >> np.uint64(33)
        h *= _MIX
        h ^= h >> np.uint64(33)
    return (h % np.uint64(buckets)).astype(np.int64)


def rule_drops(spark: Any, scratch: list[str], work: Path, cfg: Any, lines: int) -> Path:
    """The rules over the parsed scratch files (`lines` rows in all): `work/drops`, Parquet files of
    (line, rule) per dropped line. `cfg`: clean's CleanConfig (the bot thresholds)."""
    from core.spark import python_tasks

    # A bucket is sorted in one task's memory: Spark's shuffle partitions, or more for a large input.
    buckets = max(1, int(spark.conf.get("spark.sql.shuffle.partitions")), -(-lines // BUCKET_ROWS))
    ids, users, drops = work / "ids", work / "users", work / "drops"
    for d in (ids, users, drops):
        d.mkdir(parents=True)
    limits = (cfg.bot_max_per_minute, cfg.bot_min_impressions, cfg.bot_min_click_rate)
    shared = spark.sparkContext.broadcast((scratch, str(ids), str(users), str(drops), buckets, limits))

    def split(task: int) -> int:
        files, ids, _, _, buckets, _ = shared.value
        table = pq.read_table(files[task], columns=["reason", *_IDS]).filter(pc.is_null(pc.field("reason")))
        empty = pc.equal(table.column("query"), "")  # the one thing the rules ask of a query
        table = table.drop_columns(["reason", "query"]).append_column("empty", empty)
        return _write_buckets(table, "impression_id", buckets, ids, task)

    def dedupe(bucket: int) -> int:
        _, ids, users, drops, buckets, _ = shared.value
        return _dedupe(_read_bucket(ids, bucket), users, drops, bucket, buckets)

    def bots(bucket: int) -> int:
        _, _, users, drops, _, limits = shared.value
        return _bots(_read_bucket(users, bucket), drops, bucket, *limits)

    python_tasks(spark, len(scratch), split)
    python_tasks(spark, buckets, dedupe)
    python_tasks(spark, buckets, bots)
    return drops


def _write_buckets(table: pa.Table, key: str, buckets: int, where: str, task: int) -> int:
    """`table`'s rows into `where/bucket=B/part-TASK.parquet` by a hash of column `key`."""
    table = table.combine_chunks()
    of = bucket_of(table.column(key).chunk(0), buckets) if table.num_rows else np.zeros(0, np.int64)
    order = np.argsort(of, kind="stable")
    bounds = np.searchsorted(of[order], np.arange(buckets + 1))
    ordered = table.take(pa.array(order))
    for b in range(buckets):
        part = Path(where) / f"bucket={b}"
        part.mkdir(exist_ok=True)
        pq.write_table(ordered.slice(bounds[b], bounds[b + 1] - bounds[b]), part / f"part-{task:05d}.parquet")
    return table.num_rows


def _read_bucket(where: str, bucket: int) -> pa.Table:
    files = sorted((Path(where) / f"bucket={bucket}").glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).combine_chunks()


def _dedupe(lines: pa.Table, users: str, drops: str, bucket: int, buckets: int) -> int:
    """Duplicates and empty queries of one impression-id bucket; the rest on to the user buckets."""
    order = pc.sort_indices(lines, [("impression_id", "ascending"), ("line", "ascending")])
    lines = lines.take(order)
    ids = lines.column("impression_id").chunk(0) if lines.num_rows else pa.array([], pa.string())
    later = np.zeros(lines.num_rows, bool)
    if lines.num_rows > 1:
        later[1:] = pc.equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)
    empty = lines.column("empty").to_numpy(zero_copy_only=False) & ~later
    line = lines.column("line").to_numpy()
    _write_drops(drops, f"ids-{bucket:05d}", [(line[later], "duplicate_event"), (line[empty], "empty_query")])
    rest = lines.filter(pa.array(~later & ~empty)).select(["line", "user_id", "ts_ms", "clicks", "shown"])
    return _write_buckets(rest, "user_id", buckets, users, bucket)


def _bots(lines: pa.Table, drops: str, bucket: int, max_per_minute: int, min_impressions: int, rate: float) -> int:
    """Every line of each bot of one user bucket: a user with more than `max_per_minute`
    impressions in any 60 s from one of theirs, or with at least `min_impressions` and clicks on at
    least `rate` of all results shown."""
    n = lines.num_rows
    if n == 0:
        _write_drops(drops, f"users-{bucket:05d}", [])
        return 0
    order = pc.sort_indices(lines, [("user_id", "ascending"), ("ts_ms", "ascending")])
    lines = lines.take(order)
    user = pc.dictionary_encode(lines.column("user_id")).chunk(0).indices.to_numpy()
    ts = lines.column("ts_ms").to_numpy()
    new_user = np.ones(n, bool)
    new_user[1:] = user[1:] != user[:-1]
    group = np.cumsum(new_user) - 1
    starts = np.flatnonzero(new_user)
    # Within each user, the impressions at or after ts and up to ts + 59,999 ms: ranks found by one
    # sorted search over (user, time) keys, the user's rank making the keys of users apart.
    rank = _dense_rank(ts)
    base = np.int64(len(rank) + 1)
    keys = group * base + rank
    window_end = group * base + _dense_rank_upto(ts, ts + 59_999)
    in_minute = np.searchsorted(keys, window_end, side="right") - np.searchsorted(keys, keys, side="left")
    peak = np.maximum.reduceat(in_minute, starts)
    impressions = np.diff(np.append(starts, n))
    clicks = np.add.reduceat(lines.column("clicks").to_numpy().astype(np.int64), starts)
    shown = np.add.reduceat(lines.column("shown").to_numpy().astype(np.int64), starts)
    bot = (peak > max_per_minute) | ((impressions >= min_impressions) & (clicks >= rate * shown))
    line = lines.column("line").to_numpy()
    _write_drops(drops, f"users-{bucket:05d}", [(line[bot[group]], "bot_user")])
    return int(bot[group].sum())


def _dense_rank(values: np.ndarray) -> np.ndarray:
    """Each value's rank among the distinct values (0-based)."""
    return np.unique(values, return_inverse=True)[1].astype(np.int64)


def _dense_rank_upto(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """For each bound, the rank of the largest distinct value of `values` at or below it (-1: none)."""
    distinct = np.unique(values)
    return np.searchsorted(distinct, bounds, side="right").astype(np.int64) - 1


def _write_drops(drops: str, name: str, groups: list[tuple[np.ndarray, str]]) -> None:
    lines = np.concatenate([g for g, _ in groups]) if groups else np.zeros(0, np.int64)
    rules = [rule for g, rule in groups for _ in range(len(g))]
    pq.write_table(
        pa.table({"line": lines.astype(np.int64), "rule": pa.array(rules, pa.string())}, schema=DROPS),
        Path(drops) / f"part-{name}.parquet",
    )
