"""Where each id's row is: the index of an embedding table that holds only the rows it has
seen, for ids of any int64 value (issue 17: tables bigger than a worker).

Open addressing with linear probing, every operation vectorised over a batch of ids with
numpy (a minibatch brings thousands at once; a Python dict would cost a bytecode loop per
id). A bucket is an int32: the row number, `EMPTY`, or `REMOVED` (a tombstone, which keeps
the probe chains of the ids after it intact). The ids themselves are not in the index:
they are the rows' own (`row_ids(rows)`, given by the table's row store), so a bucket
costs 4 bytes and an id is stored once.

The capacity is a power of two; it doubles when live buckets and tombstones together
would pass `MAX_LOAD`, and a rebuild at the same capacity clears the tombstones when they
are most of that. Not thread safe: the PS calls it under its store's lock.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

EMPTY, REMOVED = -1, -2
MAX_LOAD = 0.7  # linear probing's chains stay short below this

RowIds = Callable[[np.ndarray], np.ndarray]  # row numbers -> their ids (int64)


def bucket_of(ids: np.ndarray, mask: int) -> np.ndarray:
    """The home bucket of each id: splitmix64's finalizer, so ids that differ in a few
    low bits (or are multiples of the number of PS) spread over the whole table."""
    z = ids.astype(np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z & np.uint64(mask)).astype(np.int64)


class HashIndex:
    def __init__(self, row_ids: RowIds, capacity: int = 1024):
        if capacity < 8 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two, at least 8: {capacity}")
        self._row_ids = row_ids
        self._buckets = np.full(capacity, EMPTY, np.int32)
        self._live = 0
        self._removed = 0

    def __len__(self) -> int:
        return self._live

    @property
    def capacity(self) -> int:
        return len(self._buckets)

    @property
    def nbytes(self) -> int:
        return self._buckets.nbytes

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (int32), or `EMPTY` for an id the index does not hold."""
        rows, _ = self._probe(np.asarray(ids, np.int64))
        return rows

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Index `rows` under `ids`: distinct ids the index does not hold (the caller
        looked them up first)."""
        ids, rows = np.asarray(ids, np.int64), np.asarray(rows, np.int32)
        if len(ids) == 0:
            return
        self._make_room(len(ids))
        self._place(ids, rows)

    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Forget `ids`; returns the rows they had (`EMPTY` for one not held)."""
        rows, buckets = self._probe(np.asarray(ids, np.int64))
        held = rows != EMPTY
        self._buckets[buckets[held]] = REMOVED
        self._live -= int(held.sum())
        self._removed += int(held.sum())
        return rows

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of everything held, in bucket order."""
        rows = self._buckets[self._buckets >= 0]
        return self._row_ids(rows), rows

    # ------------------------------------------------------------------ inside

    def _probe(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each id's row and bucket (`EMPTY` and -1 for an id not held): all ids walk
        their chains together, one bucket per round, until they hit or reach an empty."""
        mask = self.capacity - 1
        rows = np.full(len(ids), EMPTY, np.int32)
        where = np.full(len(ids), -1, np.int64)
        todo = np.arange(len(ids))
        at = bucket_of(ids, mask)
        while len(todo):
            seen = self._buckets[at]
            occupied = seen >= 0
            hit = np.zeros(len(todo), bool)
            if occupied.any():
                hit[occupied] = self._row_ids(seen[occupied]) == ids[todo[occupied]]
            rows[todo[hit]] = seen[hit]
            where[todo[hit]] = at[hit]
            going = ~hit & (seen != EMPTY)  # a tombstone or another id: walk on
            todo, at = todo[going], (at[going] + 1) & mask
        return rows, where

    def _place(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Put each (id, row) in the first free bucket of its chain. Two ids of the batch
        may reach the same free bucket in a round: the first takes it, the other walks on."""
        mask = self.capacity - 1
        todo = np.arange(len(ids))
        at = bucket_of(ids, mask)
        while len(todo):
            free = self._buckets[at] < 0
            candidates = np.flatnonzero(free)
            _, first = np.unique(at[candidates], return_index=True)
            won = candidates[first]
            reused = int((self._buckets[at[won]] == REMOVED).sum())
            self._buckets[at[won]] = rows[todo[won]]
            self._live += len(won)
            self._removed -= reused
            going = np.ones(len(todo), bool)
            going[won] = False
            todo, at = todo[going], (at[going] + 1) & mask

    def _make_room(self, more: int) -> None:
        """Grow (or clear the tombstones) before `more` ids would pass `MAX_LOAD`."""
        if self._live + self._removed + more <= MAX_LOAD * self.capacity:
            return
        capacity = self.capacity
        # At most half full after it: as many changes again before the next rebuild as
        # it cost (amortized constant time per id).
        while self._live + more > MAX_LOAD * capacity / 2:
            capacity *= 2
        ids, rows = self.items()
        self._buckets = np.full(capacity, EMPTY, np.int32)
        self._live = self._removed = 0
        self._place(ids, rows)
