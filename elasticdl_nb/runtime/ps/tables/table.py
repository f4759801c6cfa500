"""One embedding table on one PS: the rows its ids have been trained into, nothing else.

A row's *state* is its vector and its optimizer slots side by side ([value | slot 1 |
...], `width` = dim × (1 + slots)). An id the table does not hold reads as its initial row
(`table_def.initial_rows`) with fresh slots, and is stored when the first gradient for it
is applied: pulls, evaluation among them, never grow a table. Ids are global (the PS that
owns an id holds it under its own value). Not thread safe: the store calls it under its
lock.
"""

from __future__ import annotations

import numpy as np

from elasticdl_nb.runtime.ps.tables.hash_index import HashIndex
from elasticdl_nb.runtime.ps.tables.row_store import RowStore
from elasticdl_nb.runtime.table_def import TableDef, initial_rows

ABSENT = -1  # the row number `locate` gives an id the table does not hold


class EmbeddingTable:
    def __init__(self, definition: TableDef, fresh_slots: np.ndarray, block_rows: int = 2**20):
        """`fresh_slots`: [slots, dim], what the optimizer's slots of a new row start as."""
        self.definition = definition
        self.dim = definition.dim
        self.fresh_slots = np.asarray(fresh_slots, definition.dtype).reshape(-1)
        self.width = self.dim + len(self.fresh_slots)
        self.rows = RowStore(self.width, block_rows, definition.dtype)
        self.index = HashIndex(self.rows.ids_of)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.index.nbytes

    def locate(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row number, `ABSENT` for one not held."""
        found = self.index.find(ids).astype(np.int64)
        found[found < 0] = ABSENT
        return found

    def read(self, ids: np.ndarray) -> np.ndarray:
        """The vectors of `ids`, [len(ids), dim]: held rows as trained, others initial."""
        ids = np.asarray(ids, np.int64)
        rows = self.locate(ids)
        held = rows != ABSENT
        out = np.empty((len(ids), self.dim), self.definition.dtype)
        if held.any():
            out[held] = self.rows.gather(rows[held])[:, : self.dim]
        if not held.all():
            out[~held] = initial_rows(self.definition, ids[~held])
        return out

    def states(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row numbers, states [len(ids), width]) of distinct `ids`, absent ones as they
        would start: what an update reads."""
        ids = np.asarray(ids, np.int64)
        rows = self.locate(ids)
        held = rows != ABSENT
        states = np.empty((len(ids), self.width), self.definition.dtype)
        if held.any():
            states[held] = self.rows.gather(rows[held])
        if not held.all():
            states[~held, : self.dim] = initial_rows(self.definition, ids[~held])
            states[~held, self.dim :] = self.fresh_slots
        return rows, states

    def write(self, ids: np.ndarray, rows: np.ndarray, states: np.ndarray, version: int) -> None:
        """Store updated states of distinct `ids` (rows as `states` gave them), adding the
        absent ones; they were updated at model version `version`."""
        ids, rows = np.asarray(ids, np.int64), np.array(rows, np.int64)
        new = rows == ABSENT
        if new.any():
            rows[new] = self.rows.allocate(ids[new])
            self.index.insert(ids[new], rows[new])
        self.rows.scatter(rows, states)
        self.rows.touch(rows, version)

    # ------------------------------------------------------------------ checkpoints

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, states, last update) of every row held."""
        ids, rows = self.index.items()
        rows = rows.astype(np.int64)
        return ids, self.rows.gather(rows), self.rows.last_update(rows)

    def load(self, ids: np.ndarray, states: np.ndarray, updated: np.ndarray) -> None:
        """Hold exactly these rows (an empty table takes a checkpoint's)."""
        if len(self):
            raise RuntimeError("load() is for an empty table")
        ids = np.asarray(ids, np.int64)
        rows = self.rows.allocate(ids)
        self.index.insert(ids, rows.astype(np.int32))
        self.rows.scatter(rows, states)
        self.rows.touch(rows, updated)
