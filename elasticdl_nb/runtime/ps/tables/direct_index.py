"""Where each id's row is, for a table whose ids are bounded (`input_dim`): one int32 slot
per id this PS can own, read with a single numpy gather.

A PS owns the ids `ps_id`, `ps_id + num_ps`, ... of a table, so `id // num_ps` numbers its
ids densely: the slot holds the id's row number or `EMPTY`. That costs 4 bytes per id the
shard could hold (`DIRECT_MAX_SLOTS` caps it), held rows or not, and makes a lookup one
gather instead of `HashIndex`'s rounds of probing (~3 µs against ~100 µs for a CTR
minibatch's 256 ids: the PS's request path did eight of those per step, bench/profiles.md).
A slot is trusted only if its row still belongs to the id (`row_ids`), so an id of
another shard, which shares a slot with one of ours, is never mistaken for it; ids
outside [0, input_dim) are simply not held.

The same interface as `HashIndex`; not thread safe (the store's lock covers it).
"""

from __future__ import annotations

import numpy as np

from elasticdl_nb.runtime.ps.tables.hash_index import EMPTY, RowIds

DIRECT_MAX_SLOTS = 1 << 24  # 64 MiB of slots: larger id spaces use the hash index


def direct_slots(input_dim: int, num_ps: int) -> int:
    """The slots a direct index of this table needs on one PS (0: the table has no
    bound, or too large a one, for a direct index)."""
    slots = -(-input_dim // num_ps) if input_dim > 0 else 0
    return slots if 0 < slots <= DIRECT_MAX_SLOTS else 0


class DirectIndex:
    def __init__(self, row_ids: RowIds, input_dim: int, num_ps: int):
        self._row_ids = row_ids
        self._input_dim, self._num_ps = input_dim, num_ps
        self._slots = np.full(direct_slots(input_dim, num_ps), EMPTY, np.int32)
        self._live = 0

    def __len__(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        return self._slots.nbytes

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (int32), or `EMPTY` for an id the index does not hold."""
        return self._lookup(np.asarray(ids, np.int64))[0]

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Index `rows` under `ids`: distinct ids of [0, input_dim) the index does not
        hold."""
        ids = np.asarray(ids, np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self._input_dim):
            raise IndexError(f"ids outside [0, {self._input_dim}) cannot be held")
        slots = ids // self._num_ps
        if (taken := self._slots[slots] >= 0).any():  # an id of another shard's share
            raise IndexError(
                f"id {ids[taken][0]} shares its slot with an id this table holds: a PS "
                "holds only the ids it owns (id % num_ps == its number)"
            )
        self._slots[slots] = rows
        self._live += len(ids)

    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Forget `ids`; returns the rows they had (`EMPTY` for one not held)."""
        rows, slots = self._lookup(np.asarray(ids, np.int64))
        held = rows != EMPTY
        self._slots[slots[held]] = EMPTY
        self._live -= int(held.sum())
        return rows

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of everything held, in slot order."""
        slots = np.flatnonzero(self._slots >= 0)
        rows = self._slots[slots]
        return self._row_ids(rows), rows

    def _lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each id's row and slot (`EMPTY` for an id not held)."""
        if self._num_ps == 1 and len(ids) and ids.min() >= 0 and ids.max() < self._input_dim:
            # The request path's case: one shard owns every id, so each slot is one id's
            # alone and holds that id's row or nothing; no ownership check to make. (A
            # fraction of the general path's numpy calls; with the row store's one-block
            # gather, a table's read + states + write of a CTR minibatch 105 -> 45 µs,
            # `bench/profile_tables.py`; a CTR step makes that for four tables.)
            return self._slots[ids], ids
        inside = (ids >= 0) & (ids < self._input_dim)
        slots = np.where(inside, ids, 0) // self._num_ps
        rows = np.where(inside, self._slots[slots], EMPTY)
        held = np.flatnonzero(rows >= 0)
        if len(held):  # (another shard's id shares a slot with one of ours)
            theirs = held[self._row_ids(rows[held]) != ids[held]]
            rows[theirs] = EMPTY
        return rows, slots
