"""The PS tables' row store: rows over several blocks written and read back, freed rows
handed out again first, and, with the hash index, an id's row found and read."""

from __future__ import annotations

import numpy as np

from elasticdl_nb.runtime.ps.tables.hash_index import EMPTY, HashIndex
from elasticdl_nb.runtime.ps.tables.row_store import NEVER, RowStore


def test_rows_over_several_blocks_are_written_and_read_back():
    store = RowStore(width=3, block_rows=4)
    ids = np.array([10, -7, 2**62, 5, 6, 7, 8, 9, 11, 12], np.int64)
    rows = store.allocate(ids)
    assert rows.tolist() == list(range(10)) and len(store) == 10
    values = np.arange(30, dtype=np.float32).reshape(10, 3)
    order = np.array([9, 0, 4, 5, 1, 8, 2, 3, 6, 7])  # the blocks interleaved
    store.scatter(rows[order], values[order])
    assert store.gather(rows[::-1]).tolist() == values[::-1].tolist()
    assert store.ids_of(rows[[2, 1, 9]]).tolist() == [2**62, -7, 12]
    assert store.nbytes == 3 * 4 * (3 * 4 + 8 + 8)  # three blocks of four 20-byte rows


def test_freed_rows_are_handed_out_first_and_new_ones_after():
    store = RowStore(width=2, block_rows=4)
    rows = store.allocate(np.arange(6))
    store.touch(rows[:3], version=5)
    assert store.last_update(rows).tolist() == [5, 5, 5, NEVER, NEVER, NEVER]
    store.free(rows[[1, 4]])
    assert len(store) == 4
    again = store.allocate(np.array([100, 101, 102]))
    assert again.tolist() == [1, 4, 6]
    assert store.ids_of(again).tolist() == [100, 101, 102]
    assert store.last_update(again).tolist() == [NEVER] * 3  # a reused row starts afresh
    assert len(store) == 7


def test_with_the_hash_index_an_ids_row_is_found_and_read():
    rng = np.random.default_rng(3)
    store = RowStore(width=4, block_rows=256)
    index = HashIndex(store.ids_of, capacity=8)
    ids = np.unique(rng.integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64))
    rows = store.allocate(ids)
    index.insert(ids, rows)
    store.scatter(rows, np.repeat(ids[:, None] % 1000, 4, axis=1))
    asked = rng.permutation(ids)[:700]
    found = index.find(asked)
    assert (found != EMPTY).all()
    assert store.gather(found)[:, 0].tolist() == (asked % 1000).astype(np.float32).tolist()
    # evicting: the index forgets the ids, the store takes the rows back for new ids
    evicted = index.remove(asked[:100])
    store.free(evicted)
    new = np.array([1, 2, 3], np.int64)
    reused = store.allocate(new)
    index.insert(new, reused)
    assert set(reused.tolist()) <= set(evicted.tolist())
    assert index.find(new).tolist() == reused.tolist()
    assert (index.find(asked[:100]) == EMPTY).all()
    assert len(index) == len(store) == len(ids) - 100 + 3


def test_one_block_and_several_give_the_same_rows():
    """A store within its first block takes a shortcut (one gather, no split by block);
    the same operations over many small blocks give the same contents."""
    rng = np.random.default_rng(5)
    one, many = RowStore(width=3, block_rows=1024), RowStore(width=3, block_rows=8)
    for version in range(1, 6):
        ids = rng.choice(1000, 40, replace=False)
        rows = [store.allocate(ids) for store in (one, many)]
        assert rows[0].tolist() == rows[1].tolist()
        values = rng.normal(size=(40, 3)).astype(np.float32)
        for store in (one, many):
            store.scatter(rows[0], values)
            store.touch(rows[0][::2], version)
        if version == 3:
            for store in (one, many):
                store.free(rows[0][:10])
    assert len(one._values) == 1 and len(many._values) > 1
    look = rng.permutation(one._used)
    assert one.gather(look).tolist() == many.gather(look).tolist()
    assert one.ids_of(look).tolist() == many.ids_of(look).tolist()
    assert one.last_update(look).tolist() == many.last_update(look).tolist()
    assert one.updated_after(2).tolist() == many.updated_after(2).tolist()
