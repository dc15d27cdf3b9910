"""The vectorised path of `stages.clean.rawlog.parse_batches`: canonical v2 lines, parsed by Arrow kernels.

`rawlog.parse_line` is the definition of a well-formed line; it costs ~15 µs a line in Python,
most of clean's time. This module takes, per Arrow batch, the lines written the way `dssm simulate`
(and any compact JSON writer with the documented key order) writes a v2 line, and parses them
without a Python object per line: one RE2 match proves a line's exact shape (so it is valid JSON
with every type right), Arrow's JSON reader decodes the matched lines, numpy checks the values.

A line is taken here only when `parse_line` would keep it with the very same values; anything
else (another key order, whitespace, escapes, a v1 line, an unknown doc id, a position out of
order, an odd timestamp) is handed back to `parse_line`, which gives its reason. Parity tests
(tests/test_rawlog.py) hold the two paths to the same rows.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from core.text import norm

# A JSON string without escapes or control characters, in well-formed UTF-8 (RE2 reads binary
# columns byte by byte, so the UTF-8 rules are spelt out: no overlong forms, no surrogates).
_CHAR = (
    r"(?:[\x20\x21\x23-\x5b\x5d-\x7f]|[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]"
    r"|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}"
    r"|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2})"
)
_STR = f'"{_CHAR}*"'
_POS = "[1-9][0-9]{0,8}"  # >= 1 and below 2**31
_RESULT = rf'\{{"position":{_POS},"doc_id":"[\x21\x23-\x5b\x5d-\x7e]+"\}}'
_CLICK = rf'\{{"position":{_POS}(?:,"dwell_ms":[0-9]{{1,9}})?\}}'
_TS = r'"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,3})?(?:Z|[+-][0-9]{2}:[0-9]{2})"'
CANONICAL_V2 = (
    rf'^\{{"v":2,"impression_id":{_STR},"ts":{_TS},"user_id":{_STR},(?:"session_id":{_STR},)?"query":{_STR},'
    rf'"results":\[{_RESULT}(?:,{_RESULT})*\],"clicks":\[(?:{_CLICK}(?:,{_CLICK})*)?\]\}}$'
)
_JSON = pa.schema(
    [
        ("impression_id", pa.string()),
        ("ts", pa.string()),
        ("user_id", pa.string()),
        ("query", pa.string()),
        ("results", pa.list_(pa.struct([("position", pa.int32()), ("doc_id", pa.string())]))),
        ("clicks", pa.list_(pa.struct([("position", pa.int32()), ("dwell_ms", pa.int32())]))),
    ]
)
_MS_PER_DAY = 86_400_000


class DocLookup:
    """Doc id -> title id over numpy arrays: ids of one byte length are hashed to uint64 and
    looked up by binary search, then compared in full, so a hash collision only ever sends a
    line back to `parse_line`. Built once per worker from `Catalogue.ids`."""

    def __init__(self, doc_ids: dict[str, int]):
        keys = [k.encode() for k in doc_ids]
        widths = {len(k) for k in keys}
        self.width = widths.pop() if len(widths) == 1 else 0  # 0: ids of mixed lengths, no fast path
        if not self.width:
            return
        raw = np.frombuffer(b"".join(keys), dtype=f"S{self.width}")
        hashes = self._hash(raw)
        order = np.argsort(hashes, kind="stable")
        self.hashes, self.keys = hashes[order], raw[order]
        self.title_ids = np.fromiter(doc_ids.values(), np.int32, len(doc_ids))[order]

    def _hash(self, raw: np.ndarray) -> np.ndarray:
        padded = -self.width % 8
        matrix = np.frombuffer(raw.tobytes(), np.uint8).reshape(len(raw), self.width)
        if padded:
            matrix = np.pad(matrix, ((0, 0), (0, padded)))
        words = np.ascontiguousarray(matrix).view(np.uint64)
        h = np.zeros(len(raw), np.uint64)
        for column in words.T:
            h = (h ^ column) * np.uint64(0x9E3779B97F4A7C15)
        return h

    def find(self, doc_ids: pa.Array) -> np.ndarray:
        """Title id per doc id, -1 where unknown (or not of the catalogue's id length)."""
        found = np.full(len(doc_ids), -1, np.int32)
        if not self.width or len(doc_ids) == 0:
            return found
        offsets = np.frombuffer(doc_ids.buffers()[1], np.int32, len(doc_ids) + 1, doc_ids.offset * 4)
        fits = np.diff(offsets) == self.width  # an id of another length is unknown
        if not fits.all():
            found[fits] = self.find(doc_ids.filter(pa.array(fits))) if fits.any() else -1
            return found
        raw = np.frombuffer(doc_ids.buffers()[2], f"S{self.width}", len(doc_ids), int(offsets[0]))
        hashes = self._hash(raw)
        at = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        hit = (self.hashes[at] == hashes) & (self.keys[at] == raw)
        found[hit] = self.title_ids[at[hit]]
        return found


def parse_canonical(values: pa.Array, lookup: DocLookup) -> tuple[np.ndarray, dict[str, pa.Array]]:
    """The rows of `values` (binary) taken by the fast path, and their PARSED columns
    (impression_id ... clicks, without source/line/reason/detail/raw)."""
    if not lookup.width:  # ids of mixed lengths: no fast path, so no regex pass either
        return np.zeros(0, np.int64), {}
    taken = np.flatnonzero(pc.match_substring_regex(values, CANONICAL_V2).to_numpy(zero_copy_only=False))
    if len(taken) == 0:
        return taken, {}
    lines = pc.binary_join_element_wise(values.take(taken), pa.scalar(b"", pa.binary()), b"\n")
    table = pj.read_json(
        io.BytesIO(memoryview(lines.buffers()[2])[: int(np.frombuffer(lines.buffers()[1], np.int32)[-1])]),
        read_options=pj.ReadOptions(use_threads=False, block_size=len(lines.buffers()[2]) + 1),
        parse_options=pj.ParseOptions(explicit_schema=_JSON, unexpected_field_behavior="ignore"),
    ).combine_chunks()
    if table.num_rows != len(taken):  # cannot happen for matched lines; parse_line stays the judge
        return taken[:0], {}
    results, clicks = table.column("results").chunk(0), table.column("clicks").chunk(0)
    ok = np.ones(len(taken), bool)

    ts_ms = _epoch_ms(table.column("ts").chunk(0), ok)
    doc_rows = results.values.field("doc_id")
    positions = results.values.field("position").to_numpy()
    shown_of = pc.list_parent_indices(results).to_numpy()
    title_ids = lookup.find(doc_rows)
    ok[shown_of[title_ids < 0]] = False  # unknown doc: parse_line says which
    # Positions in increasing order per line (so unique); any other order is parse_line's to judge.
    same_line = shown_of[1:] == shown_of[:-1]
    ok[shown_of[1:][same_line & (positions[1:] <= positions[:-1])]] = False
    # Every click on a shown position: look (line, position) up among the shown ones, sorted.
    clicked = clicks.values.field("position").to_numpy()
    click_of = pc.list_parent_indices(clicks).to_numpy()
    _, found = shown_index(shown_of, positions, click_of, clicked)
    ok[click_of[~found]] = False

    query = pc.dictionary_encode(table.column("query").chunk(0))
    normed = pa.array(map(norm, query.dictionary.to_pylist()), pa.string()).take(query.indices)
    columns = {
        "impression_id": table.column("impression_id").chunk(0),
        "user_id": table.column("user_id").chunk(0),
        "ts_ms": pa.array(ts_ms, pa.int64()),
        "query": normed,
        "v": pa.array(np.full(len(taken), 2, np.int8)),
        "titles": pa.nulls(len(taken), pa.list_(pa.string())),
        "title_ids": pa.ListArray.from_arrays(results.offsets, pa.array(title_ids)),
        "positions": pa.ListArray.from_arrays(results.offsets, results.values.field("position")),
        "clicked": pa.ListArray.from_arrays(clicks.offsets, clicks.values.field("position")),
        "dwell": pa.ListArray.from_arrays(clicks.offsets, clicks.values.field("dwell_ms").fill_null(0)),
        "shown": pc.list_value_length(results).cast(pa.int32()),
        "clicks": pc.list_value_length(clicks).cast(pa.int32()),
    }
    keep = pa.array(ok)
    return taken[ok], {name: col.filter(keep) for name, col in columns.items()}


def shown_index(
    shown_of: np.ndarray, positions: np.ndarray, click_of: np.ndarray, clicked: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Where each click (row, position) is among the shown results (row, position), which must be
    sorted by row, then position; and whether it is there at all."""
    shown_keys = (shown_of.astype(np.int64) << 32) | positions
    click_keys = (click_of.astype(np.int64) << 32) | clicked
    at = np.minimum(np.searchsorted(shown_keys, click_keys), max(len(shown_keys) - 1, 0))
    return at, shown_keys[at] == click_keys if len(shown_keys) else np.zeros(len(click_keys), bool)


def _epoch_ms(ts: pa.Array, ok: np.ndarray) -> np.ndarray:
    """Milliseconds since the epoch of `YYYY-MM-DDTHH:MM:SS[.f{1,3}](Z|±HH:MM)` strings, exact
    integer arithmetic; a date or time out of range clears `ok` (parse_line then says bad_value)."""
    head = np.frombuffer(pc.utf8_slice_codeunits(ts, 0, 19).buffers()[2], np.uint8)[: 19 * len(ts)]
    d = head.reshape(len(ts), 19).astype(np.int64) - ord("0")

    def num(*cols: int) -> np.ndarray:
        out = np.zeros(len(ts), np.int64)
        for c in cols:
            out = out * 10 + d[:, c]
        return out

    year, month, day = num(0, 1, 2, 3), num(5, 6), num(8, 9)
    hour, minute, second = num(11, 12), num(14, 15), num(17, 18)
    tail = pc.utf8_slice_codeunits(ts, 19).to_pylist()  # ".156Z", "+05:30": short, few distinct
    frac_ms, offset_ms = np.zeros(len(ts), np.int64), np.zeros(len(ts), np.int64)
    cache: dict[str, tuple[int, int] | None] = {}
    for i, rest in enumerate(tail):
        parsed = cache.get(rest, ...)
        if parsed is ...:
            parsed = cache[rest] = _tail(rest)
        if parsed is None:
            ok[i] = False
        else:
            frac_ms[i], offset_ms[i] = parsed
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_days = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[np.clip(month, 0, 12)] + (
        leap & (month == 2)
    )
    valid = (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days)
    valid &= (hour < 24) & (minute < 60) & (second < 60)
    ok &= valid
    # Days from the civil date (H. Hinnant's algorithm), in integers.
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    days = era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468
    return days * _MS_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1000 + frac_ms - offset_ms


def _tail(rest: str) -> tuple[int, int] | None:
    """(milliseconds, zone offset in ms) of a timestamp's tail after the seconds, or None."""
    ms = 0
    if rest.startswith("."):  # the shape is fixed by CANONICAL_V2: .f{1,3} then Z or ±HH:MM
        digits = rest[1 : len(rest) - (1 if rest.endswith("Z") else 6)]
        ms, rest = int(digits.ljust(3, "0")), rest[1 + len(digits) :]
    if rest == "Z":
        return ms, 0
    hours, minutes = int(rest[1:3]), int(rest[4:6])
    if hours > 23 or minutes > 59:
        return None
    sign = 1 if rest[0] == "+" else -1
    return ms, sign * (hours * 60 + minutes) * 60_000
