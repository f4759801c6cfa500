"""Byte offsets of the non-empty lines of a text file, found with NumPy.

The master counts CSV records with this (it must not import TensorFlow and must
stay fast on files with millions of lines), and the worker's CSV reader uses the
same offsets to seek straight to the first line of a task. Sharing one
implementation keeps "record N" meaning the same line on both sides. Local files
are memory-mapped; remote ones arrive as streamed chunks or ranged reads, and the
same scan runs over those bytes.

A line is empty when it has no bytes besides its terminator ("\\n" or "\\r\\n");
empty lines are not records. Quoted fields that contain newlines are not
supported, because a record must be exactly one line for byte-offset indexing.
"""

import os
from collections.abc import Iterable, Iterator

import numpy as np

# Large enough that the per-chunk Python overhead is negligible, small enough
# that the temporary boolean mask stays modest on multi-gigabyte files.
_CHUNK_BYTES = 64 * 1024 * 1024
_NEWLINE = ord("\n")
_CARRIAGE_RETURN = ord("\r")


def count_nonempty_lines(path: str) -> int:
    """Number of non-empty lines in the local file at `path`."""
    return sum(int(np.count_nonzero(keep)) for _, _, keep in _scan(_local_chunks(path)))


def nonempty_line_starts(path: str) -> np.ndarray:
    """Ascending int64 byte offsets at which each non-empty line of `path` starts."""
    pieces = [starts[keep] for starts, _, keep in _scan(_local_chunks(path))]
    if not pieces:
        return np.empty(0, dtype=np.int64)
    return np.concatenate(pieces).astype(np.int64, copy=False)


def sparse_line_starts(chunks: Iterable[bytes], stride: int) -> tuple[int, np.ndarray]:
    """(number of non-empty lines, start offsets of non-empty lines 0, stride, 2·stride, ...)
    of a file given as consecutive byte chunks, e.g. streamed from an object store."""
    count = 0
    pieces = []
    arrays = (np.frombuffer(chunk, dtype=np.uint8) for chunk in chunks)
    for starts, _, keep in _scan(arrays):
        kept = starts[keep]
        numbers = np.arange(count, count + kept.size)
        pieces.append(kept[numbers % stride == 0])
        count += kept.size
    offsets = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    return count, offsets.astype(np.int64, copy=False)


def nonempty_lines_in(buffer: bytes, at_end: bool) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the non-empty lines held whole in `buffer`, which is a file's
    bytes from some line start on; `ends` are the offsets of their "\n" (or of the
    buffer's end). A last line without "\n" counts only if `at_end` (the file ends there)."""
    array = np.frombuffer(buffer, dtype=np.uint8)
    starts, ends, keep = [], [], []
    for part in _scan([array] if array.size else [], with_tail=at_end):
        starts.append(part[0])
        ends.append(part[1])
        keep.append(part[2])
    if not starts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    kept = np.concatenate(keep)
    return np.concatenate(starts)[kept], np.concatenate(ends)[kept]


def _local_chunks(path: str) -> Iterator[np.ndarray]:
    size = os.path.getsize(path)
    if size == 0:
        return  # np.memmap refuses zero-length files.
    data = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        for base in range(0, size, _CHUNK_BYTES):
            yield data[base : base + _CHUNK_BYTES]
    finally:
        del data  # Drop the mapping promptly instead of waiting for the GC.


def _scan(chunks: Iterable[np.ndarray], with_tail: bool = True):
    """Yield (line_starts, line_ends, is_nonempty) chunk by chunk over consecutive chunks."""
    base = 0
    pending_start = 0  # Start of the line whose terminator is not yet seen.
    last_byte = -1  # The previous chunk's last byte: a line may end right after it.
    for chunk in chunks:
        ends = np.flatnonzero(chunk == _NEWLINE).astype(np.int64) + base
        if ends.size:
            starts = np.empty_like(ends)
            starts[0] = pending_start
            starts[1:] = ends[:-1] + 1
            pending_start = int(ends[-1]) + 1
            yield starts, ends, _is_nonempty(chunk, base, last_byte, starts, ends)
        base += len(chunk)
        if len(chunk):
            last_byte = int(chunk[-1])
            tail = chunk
    if with_tail and pending_start < base:  # The last line has no trailing newline.
        starts = np.array([pending_start], dtype=np.int64)
        ends = np.array([base], dtype=np.int64)
        yield starts, ends, _is_nonempty(tail, base - len(tail), last_byte, starts, ends)


def _is_nonempty(
    chunk: np.ndarray, base: int, last_byte: int, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    lengths = ends - starts
    keep = lengths > 1
    # A one-byte line is empty only if that byte is the "\r" of a "\r\n" ending; that
    # byte sits just before the "\n", which may be the first byte of this chunk.
    single = np.flatnonzero(lengths == 1)
    if single.size:
        positions = ends[single] - 1 - base
        inside = positions >= 0
        values = np.full(single.size, last_byte, dtype=np.int64)
        values[inside] = chunk[positions[inside]]
        keep[single] = values != _CARRIAGE_RETURN
    return keep
