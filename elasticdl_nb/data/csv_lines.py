"""Byte offsets of the non-empty lines of a text file, found with NumPy.

The master counts CSV records with this (it must not import TensorFlow and must
stay fast on files with millions of lines), and the worker's CSV reader uses the
same offsets to seek straight to the first line of a task. Sharing one
implementation keeps "record N" meaning the same line on both sides.

A line is empty when it has no bytes besides its terminator ("\\n" or "\\r\\n");
empty lines are not records. Quoted fields that contain newlines are not
supported, because a record must be exactly one line for byte-offset indexing.
"""

import os

import numpy as np

# Large enough that the per-chunk Python overhead is negligible, small enough
# that the temporary boolean mask stays modest on multi-gigabyte files.
_CHUNK_BYTES = 64 * 1024 * 1024
_NEWLINE = ord("\n")
_CARRIAGE_RETURN = ord("\r")


def count_nonempty_lines(path: str) -> int:
    """Number of non-empty lines in the file at `path`."""
    return sum(int(np.count_nonzero(keep)) for _, keep in _scan_lines(path))


def nonempty_line_starts(path: str) -> np.ndarray:
    """Ascending int64 byte offsets at which each non-empty line of `path` starts."""
    pieces = [starts[keep] for starts, keep in _scan_lines(path)]
    if not pieces:
        return np.empty(0, dtype=np.int64)
    return np.concatenate(pieces).astype(np.int64, copy=False)


def _scan_lines(path: str):
    """Yield (line_starts, is_nonempty) arrays chunk by chunk over the file."""
    size = os.path.getsize(path)
    if size == 0:
        return  # np.memmap refuses zero-length files.
    data = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        pending_start = 0  # Start of the line whose terminator is not yet seen.
        for base in range(0, size, _CHUNK_BYTES):
            chunk = data[base : base + _CHUNK_BYTES]
            ends = np.flatnonzero(chunk == _NEWLINE).astype(np.int64) + base
            if ends.size == 0:
                continue
            starts = np.empty_like(ends)
            starts[0] = pending_start
            starts[1:] = ends[:-1] + 1
            pending_start = int(ends[-1]) + 1
            yield starts, _is_nonempty(data, starts, ends)
        if pending_start < size:  # The last line has no trailing newline.
            starts = np.array([pending_start], dtype=np.int64)
            ends = np.array([size], dtype=np.int64)
            yield starts, _is_nonempty(data, starts, ends)
    finally:
        del data  # Drop the mapping promptly instead of waiting for the GC.


def _is_nonempty(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    lengths = ends - starts
    keep = lengths > 1
    # A one-byte line is empty only if that byte is the "\r" of a "\r\n" ending.
    single = np.flatnonzero(lengths == 1)
    if single.size:
        keep[single] = data[starts[single]] != _CARRIAGE_RETURN
    return keep
