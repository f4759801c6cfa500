"""The PS tables' hash index: every id of the int64 range found where it was put, after
growth, removals and reuse of their buckets, checked against a dict."""

from __future__ import annotations

import numpy as np
import pytest

from elasticdl_nb.runtime.ps.tables.hash_index import EMPTY, MAX_LOAD, HashIndex


class Rows:
    """A stand-in for the row store: row r holds the id `ids[r]`."""

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)

    def add(self, ids: np.ndarray) -> np.ndarray:
        rows = np.arange(len(self.ids), len(self.ids) + len(ids), dtype=np.int32)
        self.ids = np.concatenate([self.ids, ids])
        return rows

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.ids[rows]


def test_ids_from_the_whole_int64_range_are_found_where_they_were_put():
    rng = np.random.default_rng(7)
    rows = Rows()
    index = HashIndex(rows, capacity=8)
    truth: dict[int, int] = {}
    for _ in range(20):
        batch = np.unique(rng.integers(-(2**63), 2**63 - 1, 3000, dtype=np.int64))
        fresh = batch[index.find(batch) == EMPTY]
        placed = rows.add(fresh)
        index.insert(fresh, placed)
        truth.update(zip(fresh.tolist(), placed.tolist(), strict=True))
    assert len(index) == len(truth) > 59_000
    assert len(index) <= MAX_LOAD * index.capacity
    probe = np.array(list(truth), np.int64)
    assert index.find(probe).tolist() == [truth[i] for i in probe.tolist()]
    unknown = rng.integers(-(2**62), 2**62, 1000, dtype=np.int64)
    unknown = unknown[~np.isin(unknown, probe)]
    assert (index.find(unknown) == EMPTY).all()


def test_ids_that_share_a_home_bucket_in_one_batch_each_get_their_own():
    rows = Rows()
    index = HashIndex(rows, capacity=8)
    ids = np.arange(0, 5 * 2**40, 2**40, dtype=np.int64)  # 5 ids, 8 buckets: some share
    index.insert(ids, rows.add(ids))
    assert index.find(ids).tolist() == [0, 1, 2, 3, 4]
    assert sorted(index.items()[1].tolist()) == [0, 1, 2, 3, 4]


def test_removed_ids_are_gone_the_others_still_found_and_their_buckets_reused():
    rng = np.random.default_rng(11)
    rows = Rows()
    index = HashIndex(rows, capacity=1024)
    ids = np.unique(rng.integers(0, 2**62, 600, dtype=np.int64))
    index.insert(ids, rows.add(ids))
    gone, kept = ids[::2], ids[1::2]
    assert (index.remove(gone) >= 0).all()
    assert (index.find(gone) == EMPTY).all()  # a tombstone is not a hit ...
    assert index.find(kept).tolist() == [int(r) for r in np.flatnonzero(np.isin(ids, kept))]
    assert (index.remove(gone) == EMPTY).all()  # ... and not held twice
    capacity = index.capacity
    for _ in range(30):  # churn: as many in as out, the tombstones cleared, no growth
        new = np.unique(rng.integers(2**62, 2**63 - 1, 50, dtype=np.int64))
        index.insert(new, rows.add(new))
        index.remove(new)
    assert index.capacity == capacity and len(index) == len(kept)
    assert index.find(kept).tolist() == [int(r) for r in np.flatnonzero(np.isin(ids, kept))]


def test_a_capacity_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(ValueError, match="power of two"):
        HashIndex(Rows(), capacity=1000)
