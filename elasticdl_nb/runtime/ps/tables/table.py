"""One embedding table on one PS: the rows its ids have been trained into, nothing else.

A row's *state* is its vector and its optimizer slots side by side ([value | slot 1 |
...], `width` = dim × (1 + slots)). An id the table does not hold reads as its initial row
(`table_def.initial_rows`) with fresh slots, and is stored when the first gradient for it
is applied: pulls, evaluation among them, never grow a table. Ids are global (the PS that
owns an id holds it under its own value). Not thread safe: the store calls it under its
lock.

What it keeps follows its definition: `admit` drops the gradients of ids not yet seen
`min_count` times (`admission.py`); `enforce` evicts rows not updated for `ttl_steps`
versions, and, once the table is `EVICTION_SLACK` over its share of `max_rows`, the least
recently updated rows down to that share (evicting in batches, not one row per push).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from elasticdl_nb.runtime.ps.tables.admission import Admission
from elasticdl_nb.runtime.ps.tables.direct_index import DirectIndex, direct_slots
from elasticdl_nb.runtime.ps.tables.hash_index import EMPTY, HashIndex
from elasticdl_nb.runtime.ps.tables.row_store import NEVER, RowStore
from elasticdl_nb.runtime.table_def import TableDef, initial_rows

# The row number `locate` gives an id the table does not hold: what both indexes' `find`
# give one they do not hold, passed on as it is.
ABSENT = EMPTY
EVICTION_SLACK = 0.05  # how far over its cap a table grows before it evicts back to it
TTL_CHECKS = 10  # a table with a TTL looks for expired rows this often per TTL


@dataclass
class TableSnapshot:
    """A table in a checkpoint: whole (`removed` empty), or a delta: the rows updated
    since the checkpoint it follows and the ids evicted since (`fold` applies one)."""

    definition: TableDef
    ids: np.ndarray
    states: np.ndarray  # [len(ids), width]
    updated: np.ndarray  # the version that last updated each row
    removed: np.ndarray
    policy: dict  # admission counts and `TableCounts`, as of the snapshot

    def fold(self, delta: TableSnapshot) -> TableSnapshot:
        """This whole snapshot with `delta` (taken after it) applied: whole again."""
        gone = np.isin(self.ids, np.concatenate([delta.removed, delta.ids]))
        return TableSnapshot(
            self.definition,
            np.concatenate([self.ids[~gone], delta.ids]),
            np.concatenate([self.states[~gone], delta.states]),
            np.concatenate([self.updated[~gone], delta.updated]),
            np.zeros(0, np.int64),
            delta.policy,
        )


@dataclass
class TableCounts:
    """What a table did, since it was created (checkpointed with it)."""

    created: int = 0  # rows added (an evicted id that comes back counts again)
    evicted: int = 0  # rows evicted
    refused: int = 0  # gradients dropped because their id was not admitted yet


class EmbeddingTable:
    def __init__(
        self,
        definition: TableDef,
        fresh_slots: np.ndarray,
        num_ps: int = 1,
        block_rows: int = 2**18,
    ):
        """`fresh_slots`: [slots, dim], what the optimizer's slots of a new row start as;
        `num_ps`: how many PS share the table (each keeps its share of `max_rows`);
        `block_rows`: the row store's block (2^18 rows of 16 floats and one slot: 32 MiB,
        what the smallest table takes; a minibatch's rows spread over more blocks cost a
        numpy call more each)."""
        self.definition = definition
        self.dim = definition.dim
        self.fresh_slots = np.asarray(fresh_slots, definition.dtype).reshape(-1)
        self.width = self.dim + len(self.fresh_slots)
        self.rows = RowStore(self.width, block_rows, definition.dtype)
        # Bounded ids: one slot per id this shard may own; any int64: a hash index.
        self.index = (
            DirectIndex(self.rows.ids_of, definition.input_dim, num_ps)
            if direct_slots(definition.input_dim, num_ps)
            else HashIndex(self.rows.ids_of)
        )
        self.admission = Admission(definition.min_count) if definition.min_count > 1 else None
        self.cap = math.ceil(definition.max_rows / num_ps) if definition.max_rows else 0
        self.counts = TableCounts()
        self._evictions: list[tuple[int, np.ndarray]] = []  # (version, ids), since a save

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.index.nbytes

    def locate(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row number, `ABSENT` for one not held."""
        return self.index.find(ids).astype(np.int64)

    def read(self, ids: np.ndarray) -> np.ndarray:
        """The vectors of `ids`, [len(ids), dim]: held rows as trained, others initial."""
        ids = np.asarray(ids, np.int64)
        rows = self.locate(ids)
        held = rows != ABSENT
        if held.all():  # (the usual case once training has reached the ids)
            return self.rows.gather(rows)[:, : self.dim]
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
        if held.all():
            return rows, self.rows.gather(rows)
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
            self.counts.created += int(new.sum())
        self.rows.scatter(rows, states)
        self.rows.touch(rows, version)

    # ------------------------------------------------------------------ what it keeps

    def admit(self, ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pushed (distinct ids, gradients) to apply: all of them, or, with admission,
        those of ids held already or seen `min_count` times counting this push."""
        if self.admission is None:
            return ids, grads
        ids = np.asarray(ids, np.int64)
        admitted = self.admission.count(ids) | (self.locate(ids) != ABSENT)
        self.counts.refused += int((~admitted).sum())
        return ids[admitted], grads[admitted]

    def enforce(self, version: int) -> None:
        """Evict what the definition says not to keep at model version `version`."""
        ttl = self.definition.ttl_steps
        if ttl and version % max(1, ttl // TTL_CHECKS) == 0:
            ids, rows = self.index.items()
            old = self.rows.last_update(rows.astype(np.int64)) < version - ttl
            self._evict(ids[old], rows[old], version)
        if self.cap and len(self) > self.cap * (1 + EVICTION_SLACK):
            ids, rows = self.index.items()
            updated = self.rows.last_update(rows.astype(np.int64))
            oldest = np.argpartition(updated, len(ids) - self.cap)[: len(ids) - self.cap]
            self._evict(ids[oldest], rows[oldest], version)

    def _evict(self, ids: np.ndarray, rows: np.ndarray, version: int) -> None:
        if len(ids):
            self.index.remove(ids)
            self.rows.free(rows)
            self.counts.evicted += len(ids)
            self._evictions.append((version, ids))

    def stats(self) -> dict:
        """Rows held now, the bytes they hold (each row's vector, optimizer slots, id
        and last update) and the bytes allocated for the table (whole blocks of rows,
        free or not, and the index), and what the table did (`TableCounts`)."""
        return {
            "rows": len(self),
            "bytes": len(self) * self.rows.row_bytes,
            "allocated_bytes": self.nbytes,
            **vars(self.counts),
        }

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self, since: int | None = None) -> TableSnapshot:
        """The whole table, or (`since` a version) the rows updated after that version and
        the ids evicted after it: what changed since a checkpoint of that version. Found
        by a scan of the rows' last updates, not of the index."""
        rows = self.rows.updated_after(NEVER if since is None else since)
        removed = [
            gone for version, gone in self._evictions if since is not None and version > since
        ]
        policy = {
            "counts": vars(self.counts).copy(),
            "admission": None if self.admission is None else self.admission.counts.copy(),
        }
        return TableSnapshot(
            self.definition,
            self.rows.ids_of(rows),
            self.rows.gather(rows),
            self.rows.last_update(rows),
            np.concatenate([np.zeros(0, np.int64), *removed]),
            policy,
        )

    def saved(self, version: int) -> None:
        """A checkpoint of `version` is on disk: the evictions up to it are in it."""
        self._evictions = [(v, ids) for v, ids in self._evictions if v > version]

    def load(self, snapshot: TableSnapshot) -> None:
        """Hold exactly a whole snapshot's rows (an empty table takes a checkpoint's)."""
        if len(self):
            raise RuntimeError("load() is for an empty table")
        rows = self.rows.allocate(snapshot.ids)
        self.index.insert(snapshot.ids, rows.astype(np.int32))
        self.rows.scatter(rows, snapshot.states)
        self.rows.touch(rows, snapshot.updated)
        self.counts = TableCounts(**snapshot.policy["counts"])
        if self.admission is not None and snapshot.policy["admission"] is not None:
            self.admission.counts[...] = snapshot.policy["admission"]
