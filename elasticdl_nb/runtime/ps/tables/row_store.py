"""The rows of one embedding table on one PS: each row's vector and its optimizer slots
side by side, the id it belongs to and the model version that last updated it (for
least-recently-updated eviction and incremental checkpoints).

Rows live in blocks of `block_rows` (2^20 by default: 64 MiB for a 16-float row with
one slot), added as the table grows, so growing never copies what is there. A row number
`r` is block `r // block_rows`, line `r % block_rows`; rows freed by eviction are handed
out again before new ones. `HashIndex` finds an id's row; this holds what is in it. Not
thread safe: the PS calls it under its store's lock.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import DTypeLike

NEVER = -1  # `last_update` of a row no update has reached


class RowStore:
    def __init__(self, width: int, block_rows: int = 2**20, dtype: DTypeLike = np.float32):
        if width < 1 or block_rows < 1:
            raise ValueError(f"width and block_rows must be positive: {width}, {block_rows}")
        self.width, self.block_rows, self.dtype = width, block_rows, np.dtype(dtype)
        self._values: list[np.ndarray] = []  # (block_rows, width) each
        self._ids: list[np.ndarray] = []  # int64 (block_rows,) each
        self._updated: list[np.ndarray] = []  # int64 (block_rows,) each: a version
        self._used = 0  # rows ever handed out (the next new row's number)
        self._free = np.zeros(0, np.int64)  # freed rows, handed out first

    def __len__(self) -> int:
        """Rows in use."""
        return self._used - len(self._free)

    @property
    def row_bytes(self) -> int:
        """What one row takes: its vector and slots, its id and its last update."""
        return self.width * self.dtype.itemsize + 8 + 8

    @property
    def nbytes(self) -> int:
        """What the blocks take (allocated, in use or not)."""
        return len(self._values) * self.block_rows * self.row_bytes + self._free.nbytes

    def allocate(self, ids: np.ndarray) -> np.ndarray:
        """Rows for `ids` (their vectors and slots to be written by the caller): freed
        rows first, then new ones. Returns the row numbers, in the ids' order."""
        ids = np.asarray(ids, np.int64)
        reused, self._free = self._free[: len(ids)], self._free[len(ids) :]
        fresh = np.arange(self._used, self._used + len(ids) - len(reused), dtype=np.int64)
        self._used += len(fresh)
        while len(self._values) * self.block_rows < self._used:
            self._add_block()
        rows = np.concatenate([reused, fresh])
        self._put(self._ids, rows, ids)
        self._put(self._updated, rows, np.full(len(rows), NEVER, np.int64))
        return rows

    def free(self, rows: np.ndarray) -> None:
        """Give rows back (their ids were evicted); their contents are left as they are,
        but no update reached them (so `updated_after` passes them over)."""
        rows = np.asarray(rows, np.int64)
        self._put(self._updated, rows, np.full(len(rows), NEVER, np.int64))
        self._free = np.concatenate([self._free, rows])

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """The rows' contents, (len(rows), width)."""
        return self._take(self._values, rows, (self.width,), self.dtype)

    def scatter(self, rows: np.ndarray, values: np.ndarray) -> None:
        self._put(self._values, rows, np.asarray(values, self.dtype))

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The id each row belongs to (what `HashIndex` compares against)."""
        return self._take(self._ids, rows, (), np.int64)

    def touch(self, rows: np.ndarray, version: int | np.ndarray) -> None:
        """The rows were updated at model version `version` (one for all, or one each)."""
        self._put(self._updated, rows, np.broadcast_to(np.asarray(version, np.int64), len(rows)))

    def last_update(self, rows: np.ndarray) -> np.ndarray:
        return self._take(self._updated, rows, (), np.int64)

    def updated_after(self, version: int) -> np.ndarray:
        """The rows (ascending) an update reached after `version`: with `NEVER`, every row
        in use that has been written. A scan of 8 bytes a row, block by block."""
        found = []
        for block, updated in enumerate(self._updated):
            lines = min(self.block_rows, self._used - block * self.block_rows)
            found.append(np.flatnonzero(updated[:lines] > version) + block * self.block_rows)
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    # ------------------------------------------------------------------ inside

    def _add_block(self) -> None:
        self._values.append(np.zeros((self.block_rows, self.width), self.dtype))
        self._ids.append(np.zeros(self.block_rows, np.int64))
        self._updated.append(np.full(self.block_rows, NEVER, np.int64))

    def _split(self, rows: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(block, the positions in `rows` that are in it, their lines), per block used."""
        rows = np.asarray(rows, np.int64)
        blocks, lines = np.divmod(rows, self.block_rows)
        for block in np.unique(blocks):
            at = np.flatnonzero(blocks == block)
            yield int(block), at, lines[at]

    def _take(self, arrays: list[np.ndarray], rows, shape: tuple, dtype) -> np.ndarray:
        if len(arrays) == 1:  # (every table's first 2^18 rows: one gather, no split)
            return arrays[0].take(rows, axis=0)
        out = np.empty((len(rows), *shape), dtype)
        for block, at, lines in self._split(rows):
            out[at] = arrays[block][lines]
        return out

    def _put(self, arrays: list[np.ndarray], rows, values: np.ndarray) -> None:
        if len(arrays) == 1:
            arrays[0][rows] = values
            return
        for block, at, lines in self._split(rows):
            arrays[block][lines] = values[at]
