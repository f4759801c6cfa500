"""Walks the on-disk framing of TFRecord files without TensorFlow.

Each record is stored as: uint64 little-endian data length, uint32 masked CRC of
the length, the data, uint32 masked CRC of the data. Only the lengths are needed
to find record boundaries, so the master can count records (and workers can
index them) by jumping from header to header, on a memory map for local files
and over chunks fetched by ranged reads for remote ones. CRCs are deliberately not
verified: that would mean reading every byte in pure Python; TensorFlow still
checks them if the bytes are later parsed there.
"""

import mmap
import os
import struct
from array import array
from collections.abc import Callable

import numpy as np

from elasticdl_nb.data.errors import DataError

HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of the length.
FOOTER_BYTES = 4  # uint32 masked CRC of the data.
_FRAMING_BYTES = HEADER_BYTES + FOOTER_BYTES
_LENGTH = struct.Struct("<Q")
_GZIP_MAGIC = b"\x1f\x8b"


def count_records(path: str) -> int:
    """Number of records in the TFRecord file at `path`; DataError if the framing is broken."""
    return len(record_offsets(path))


def record_offsets(path: str) -> np.ndarray:
    """Ascending int64 byte offsets at which each record's header starts."""
    offsets = array("q")
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            return np.empty(0, dtype=np.int64)  # mmap refuses zero-length files.
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            position = 0
            while position < size:
                remaining = size - position
                if remaining < _FRAMING_BYTES:
                    raise _truncated(path, view[:2], position, size, None)
                (length,) = _LENGTH.unpack_from(view, position)
                if length > remaining - _FRAMING_BYTES:
                    raise _truncated(path, view[:2], position, size, length)
                offsets.append(position)
                position += _FRAMING_BYTES + length
    return np.frombuffer(offsets, dtype=np.int64).copy()


def sparse_record_offsets(
    read: Callable[[int, int], bytes], size: int, path: str, stride: int, chunk_bytes: int
) -> tuple[int, list[int]]:
    """(number of records, header offsets of records 0, stride, 2·stride, ...) of a
    TFRecord file of `size` bytes whose bytes [start, stop) `read` returns, e.g. one
    ranged request to an object store: it reads `chunk_bytes` at a time and, past a
    record bigger than that, jumps straight to the next header."""
    offsets = []
    count = 0
    position = 0
    head = read(0, min(2, size))
    buffer, buffer_start = b"", 0
    while position < size:
        remaining = size - position
        if remaining < _FRAMING_BYTES:
            raise _truncated(path, head, position, size, None)
        if position + _LENGTH.size > buffer_start + len(buffer):
            buffer_start = position
            buffer = read(position, min(size, position + chunk_bytes))
        (length,) = _LENGTH.unpack_from(buffer, position - buffer_start)
        if length > remaining - _FRAMING_BYTES:
            raise _truncated(path, head, position, size, length)
        if count % stride == 0:
            offsets.append(position)
        count += 1
        position += _FRAMING_BYTES + length
    return count, offsets


def record_ends(buffer: bytes, limit: int) -> list[int]:
    """Offsets just past each of the first `limit` whole records at the start of
    `buffer` (fewer if the buffer ends first)."""
    ends = []
    position = 0
    while len(ends) < limit and position + HEADER_BYTES <= len(buffer):
        (length,) = _LENGTH.unpack_from(buffer, position)
        end = position + _FRAMING_BYTES + length
        if end > len(buffer):
            break
        ends.append(end)
        position = end
    return ends


def split_records(buffer: bytes, path: str) -> list[bytes]:
    """Payloads of the consecutive whole records held in `buffer` (read from `path`)."""
    view = memoryview(buffer)
    records = []
    position = 0
    while position < len(view):
        (length,) = _LENGTH.unpack_from(view, position)
        start = position + HEADER_BYTES
        if start + length + FOOTER_BYTES > len(view):
            raise DataError(
                f"TFRecord file {path!r} changed while it was being read: a record "
                f"that should end inside the requested range runs past it. Fix: do "
                f"not modify input files while a job is using them; restart the job."
            )
        records.append(bytes(view[start : start + length]))
        position = start + length + FOOTER_BYTES
    return records


def _truncated(path: str, head, position: int, size: int, length: int | None) -> DataError:
    if head == _GZIP_MAGIC:
        return DataError(
            f"TFRecord file {path!r} looks GZIP-compressed (it starts with the gzip "
            f"magic bytes); compressed TFRecord files are not supported. Fix: "
            f"decompress it (e.g. `gunzip`) or write it without compression."
        )
    if length is None:
        detail = f"only {size - position} bytes remain after the last whole record"
    else:
        detail = (
            f"the record at byte {position} declares {length} bytes of data but "
            f"only {size - position - _FRAMING_BYTES} remain"
        )
    return DataError(
        f"TFRecord file {path!r} is truncated or not a TFRecord file: {detail} "
        f"(file size {size} bytes). This usually means an interrupted write or "
        f"copy, or a file of another format with a TFRecord extension. Fix: "
        f"re-copy or regenerate the file, remove it from `data`, or pass the "
        f"right data_format=."
    )
