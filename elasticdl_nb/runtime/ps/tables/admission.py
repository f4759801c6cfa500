"""Frequency admission for a table: an id gets a trained row only once it has been seen
`min_count` times (TFRA's and Monolith's filter for the long tail of ids seen once).

The counts are a count-min sketch: `DEPTH` rows of `width` saturating 8-bit counters, an
id counted in one counter per row (each row its own hash of the id), its count the
smallest of them. Memory is fixed whatever the number of distinct ids (4 MiB at the
default width); a collision can only make a count too high, so the error is to admit an
id a little early, never to refuse one that was seen enough. Counted per minibatch a
gradient for the id is applied in (a worker pushes each id of a minibatch once).
"""

from __future__ import annotations

import numpy as np

from elasticdl_nb.runtime.ps.tables.hash_index import bucket_of

DEPTH = 4
DEFAULT_WIDTH = 2**20
_SALTS = np.array(
    [0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89], np.uint64
)


class Admission:
    def __init__(self, min_count: int, width: int = DEFAULT_WIDTH):
        if not 1 <= min_count <= 255:
            raise ValueError(f"min_count must be from 1 to 255, not {min_count}")
        if width < 8 or width & (width - 1):
            raise ValueError(f"width must be a power of two, at least 8: {width}")
        self.min_count = min_count
        self.counts = np.zeros((DEPTH, width), np.uint8)

    def _cells(self, ids: np.ndarray) -> np.ndarray:
        """[DEPTH, len(ids)] counter positions."""
        ids = np.asarray(ids, np.int64).view(np.uint64)
        mask = self.counts.shape[1] - 1
        return np.stack([bucket_of((ids ^ salt).view(np.int64), mask) for salt in _SALTS])

    def count(self, ids: np.ndarray) -> np.ndarray:
        """Count distinct `ids` once more; returns which of them are admitted now."""
        cells = self._cells(ids)
        for row, row_cells in zip(self.counts, cells):
            # Distinct ids can share a cell: each of them counts.
            at, times = np.unique(row_cells, return_counts=True)
            row[at] = np.minimum(row[at].astype(np.int64) + times, 255)
        return self.seen_at(cells) >= self.min_count

    def seen(self, ids: np.ndarray) -> np.ndarray:
        """How many times each id has been counted (at least; at most 255)."""
        return self.seen_at(self._cells(ids))

    def seen_at(self, cells: np.ndarray) -> np.ndarray:
        return self.counts[np.arange(DEPTH)[:, None], cells].min(axis=0)
