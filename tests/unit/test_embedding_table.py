"""One PS table: absent ids read as their initial rows, updates store them, checkpoints
carry exactly the rows held."""

import numpy as np

from elasticdl_nb.runtime.ps.tables.table import ABSENT, EmbeddingTable
from elasticdl_nb.runtime.table_def import TableDef, initial_rows

DEF = TableDef("emb", 4, seed=3)
SLOTS = np.full((1, 4), 0.1, np.float32)  # one optimizer slot, as Adagrad's accumulator


def _table(block_rows=8):
    return EmbeddingTable(DEF, SLOTS, block_rows=block_rows)


def test_reads_of_absent_ids_are_their_initial_rows_and_do_not_grow_the_table():
    table = _table()
    ids = np.array([2**62, -7, 12], np.int64)
    np.testing.assert_array_equal(table.read(ids), initial_rows(DEF, ids))
    assert len(table) == 0
    rows, states = table.states(ids)
    assert (rows == ABSENT).all()
    np.testing.assert_array_equal(states[:, :4], initial_rows(DEF, ids))
    np.testing.assert_array_equal(states[:, 4:], np.tile(SLOTS, (3, 1)))
    assert len(table) == 0


def test_written_rows_are_read_back_and_others_stay_initial():
    table = _table()
    ids = np.arange(0, 60, 3, dtype=np.int64)  # 20 rows: more than two blocks of 8
    rows, states = table.states(ids)
    states += 1.0
    table.write(ids, rows, states, version=5)
    assert len(table) == 20
    np.testing.assert_array_equal(table.read(ids), states[:, :4])
    others = np.array([1, 2, 61], np.int64)
    np.testing.assert_array_equal(table.read(others), initial_rows(DEF, others))
    again, held = table.states(ids[:3])
    assert (again != ABSENT).all()
    np.testing.assert_array_equal(held, states[:3])
    # An update of held rows and one new id together.
    mixed = np.array([ids[0], 1000], np.int64)
    rows, states = table.states(mixed)
    table.write(mixed, rows, states * 2, version=6)
    np.testing.assert_array_equal(table.read(mixed), states[:, :4] * 2)
    assert len(table) == 21


def test_a_snapshot_loads_into_an_equal_table_and_a_delta_holds_what_changed():
    table = _table()
    ids = np.array([9, 4, 2**40], np.int64)
    for version, part in enumerate([ids[:2], ids[1:]], start=1):
        rows, states = table.states(part)
        table.write(part, rows, states + version, version)
    whole = table.snapshot()
    assert sorted(whole.ids) == sorted(ids) and len(whole.removed) == 0
    assert dict(zip(whole.ids.tolist(), whole.updated.tolist())) == {9: 1, 4: 2, 2**40: 2}
    copy = _table(block_rows=2)
    copy.load(whole)
    np.testing.assert_array_equal(copy.read(ids), table.read(ids))
    np.testing.assert_array_equal(copy.states(ids)[1], table.states(ids)[1])
    delta = table.snapshot(since=1)
    assert sorted(delta.ids) == [4, 2**40]  # 9 was last updated at version 1


def test_stats_say_the_bytes_the_rows_hold_and_apart_from_them_what_is_allocated():
    """`bytes` is rows × a row's size (4 floats and 1 slot of 4, its id and version: 48
    bytes), not the blocks allocated, which `allocated_bytes` says: 20 rows fill three
    blocks of 8 here (users read `bytes` as memory used: issue 38)."""
    table = _table(block_rows=8)
    ids = np.arange(20, dtype=np.int64)
    rows, states = table.states(ids)
    table.write(ids, rows, states, version=1)
    stats = table.stats()
    assert stats["rows"] == 20
    assert stats["bytes"] == 20 * (8 * 4 + 8 + 8)
    assert stats["allocated_bytes"] == 3 * 8 * 48 + table.index.nbytes
    assert stats["allocated_bytes"] > stats["bytes"]
