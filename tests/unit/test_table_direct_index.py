"""The PS tables' direct index (bounded ids): ids found where they were put, nothing else
mistaken for them, and a table with a bound uses it (same rows, policy included)."""

from __future__ import annotations

import numpy as np
import pytest

from elasticdl_nb.runtime.ps.tables.direct_index import DIRECT_MAX_SLOTS, DirectIndex
from elasticdl_nb.runtime.ps.tables.hash_index import EMPTY, HashIndex
from elasticdl_nb.runtime.ps.tables.table import EmbeddingTable
from elasticdl_nb.runtime.table_def import TableDef, initial_rows
from tests.unit.test_table_hash_index import Rows

NO_SLOTS = np.zeros((0, 2), np.float32)


def test_a_shards_ids_are_found_where_they_were_put_and_removed_ones_are_gone():
    rng = np.random.default_rng(3)
    rows = Rows()
    index = DirectIndex(rows, input_dim=100_000, num_ps=3)  # this shard: ids 1, 4, 7, ...
    mine = np.arange(1, 100_000, 3)
    truth: dict[int, int] = {}
    for _ in range(10):
        batch = np.unique(rng.choice(mine, 2000))
        fresh = batch[index.find(batch) == EMPTY]
        placed = rows.add(fresh)
        index.insert(fresh, placed)
        truth.update(zip(fresh.tolist(), placed.tolist(), strict=True))
    held = np.array(sorted(truth), np.int64)
    assert len(index) == len(truth) and index.find(held).tolist() == [truth[i] for i in held]
    assert sorted(zip(*[a.tolist() for a in index.items()])) == sorted(truth.items())
    gone = held[::2]
    assert index.remove(gone).tolist() == [truth[i] for i in gone.tolist()]
    assert (index.find(gone) == EMPTY).all() and (index.remove(gone) == EMPTY).all()
    assert index.find(held[1::2]).tolist() == [truth[i] for i in held[1::2].tolist()]
    assert len(index) == len(held) - len(gone)


def test_another_shards_id_and_ids_out_of_range_are_never_found_nor_held():
    rows = Rows()
    index = DirectIndex(rows, input_dim=30, num_ps=2)  # this shard: even ids
    index.insert(np.array([4, 10]), rows.add(np.array([4, 10])))
    # 5 and 11 share slots with 4 and 10; -2 and 30 are outside the table.
    assert index.find(np.array([4, 5, 10, 11, -2, 30, 2**62])).tolist() == [0, -1, 1] + [-1] * 4
    with pytest.raises(IndexError, match="shares its slot"):
        index.insert(np.array([5]), rows.add(np.array([5])))
    with pytest.raises(IndexError, match="outside"):
        index.insert(np.array([30]), rows.add(np.array([30])))


@pytest.mark.parametrize(
    ("input_dim", "kind"),
    [(10_000, DirectIndex), (0, HashIndex), (2 * DIRECT_MAX_SLOTS + 1, HashIndex)],
)
def test_a_table_with_a_bound_uses_the_direct_index_and_keeps_its_policy(input_dim, kind):
    definition = TableDef("t", 2, input_dim=input_dim, max_rows=100, ttl_steps=20)
    table = EmbeddingTable(definition, NO_SLOTS, num_ps=2)
    assert isinstance(table.index, kind)
    for version in range(1, 41):  # this shard's even ids, 10 new ones a push
        ids = 2 * (np.arange(10) + 10 * version)
        rows, states = table.states(ids)
        table.write(ids, rows, states - 1, version)
        table.enforce(version)
    held = np.sort(table.index.items()[0])
    assert len(held) >= table.cap and set(2 * np.arange(360, 410)) <= set(held.tolist())
    assert table.counts.created == 400 and table.counts.evicted == 400 - len(held)
    # Each held id was updated once, from its initial row; an evicted one reads initial.
    start = initial_rows(definition, np.concatenate([held, [20]]))
    np.testing.assert_allclose(table.read(held), start[:-1] - 1)
    np.testing.assert_allclose(table.read(np.array([20])), start[-1:])


def test_with_one_shard_every_id_in_range_is_found_where_it_was_put_and_no_other():
    """One PS owns every id: lookups of ids all in range take the shortcut (no ownership
    check); a batch with an id out of range takes the general path. Both agree."""
    rows = Rows()
    index = DirectIndex(rows, input_dim=50, num_ps=1)
    held = np.array([0, 7, 49, 20], np.int64)
    index.insert(held, rows.add(held))
    in_range = np.array([49, 1, 7, 0, 20, 48], np.int64)
    assert index.find(in_range).tolist() == [2, EMPTY, 1, 0, 3, EMPTY]
    mixed = np.array([49, -1, 7, 50, 0, 2**62, 20], np.int64)
    assert index.find(mixed).tolist() == [2, EMPTY, 1, EMPTY, 0, EMPTY, 3]
    assert index.remove(np.array([7, 8])).tolist() == [1, EMPTY]
    assert index.find(in_range).tolist() == [2, EMPTY, EMPTY, 0, 3, EMPTY]
    assert len(index) == 3 and index.find(np.zeros(0, np.int64)).tolist() == []
