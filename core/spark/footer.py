"""Canonical Parquet footers: Spark's writer lists each column chunk's encodings in hash-set order,
which differs from one JVM to the next, so two runs on the same data wrote different bytes (and
content hashes) although every data page was identical. `canonicalize` sorts those lists in place.

The footer is Thrift compact protocol (parquet.thrift). Sorting a list's elements keeps its byte
length, so the file is patched where it lies: FileMetaData.row_groups[].columns[].meta_data.encodings.
"""

from __future__ import annotations

import struct
from pathlib import Path

_MAGIC = b"PAR1"
# Thrift compact type ids
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
# (struct path of field ids) -> the list to sort: FileMetaData.4 row_groups / RowGroup.1 columns /
# ColumnChunk.3 meta_data / ColumnMetaData.2 encodings
_ENCODINGS = (4, 1, 3, 2)


class _Reader:
    def __init__(self, data: bytearray):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def skip(self, kind: int, path: tuple[int, ...], spans: list[tuple[int, int, int]]) -> None:
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            return
        if kind == _BYTE:
            self.pos += 1
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.pos += 8
        elif kind == _BINARY:
            length = self.varint()  # read first: `self.pos += self.varint()` would add to the old pos
            self.pos += length
        elif kind in (_LIST, _SET):
            head = self.byte()
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            start = self.pos
            if element in (_BOOL_TRUE, _BOOL_FALSE):  # in collections a bool is one byte
                self.pos += size
            for _ in range(size if element not in (_BOOL_TRUE, _BOOL_FALSE) else 0):
                self.skip(element, path, spans)
            if path == _ENCODINGS and element == _I32:
                spans.append((start, self.pos, size))
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    for kind in (types >> 4, types & 0x0F):
                        if kind in (_BOOL_TRUE, _BOOL_FALSE):
                            self.pos += 1
                        else:
                            self.skip(kind, path, spans)
        elif kind == _STRUCT:
            self.struct(path, spans)
        else:
            raise ValueError(f"unknown Thrift compact type {kind}")

    def struct(self, path: tuple[int, ...], spans: list[tuple[int, int, int]]) -> None:
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            if delta:
                field += delta
            else:
                field = self.varint()
                field = (field >> 1) ^ -(field & 1)  # zigzag i16
            self.skip(kind, (*path, field), spans)


def canonicalize(path: Path) -> bool:
    """Sort every column chunk's encoding list in the footer of the Parquet file at `path`, in place.
    Returns whether any byte changed."""
    with open(path, "r+b") as handle:
        handle.seek(-8, 2)
        tail = handle.read(8)
        if tail[4:] != _MAGIC:
            raise ValueError(f"{path}: not a Parquet file")
        (length,) = struct.unpack("<I", tail[:4])
        handle.seek(-8 - length, 2)
        start = handle.tell()
        footer = bytearray(handle.read(length))
        spans: list[tuple[int, int, int]] = []
        reader = _Reader(footer)
        reader.struct((), spans)
        changed = False
        for begin, end, size in spans:
            items = []
            reader.pos = begin
            for _ in range(size):
                at = reader.pos
                value = reader.varint()
                items.append((value, bytes(footer[at : reader.pos])))
            canonical = b"".join(raw for _, raw in sorted(items))
            if canonical != footer[begin:end]:
                footer[begin:end] = canonical
                changed = True
        if changed:
            handle.seek(start)
            handle.write(footer)
    return changed
