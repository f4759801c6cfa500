"""What a PS table keeps: ids admitted after `min_count` sightings, at most its share of
`max_rows` (least recently updated evicted first), no row older than `ttl_steps`."""

import numpy as np
import pytest

from elasticdl_nb.runtime.ps.tables.admission import Admission
from elasticdl_nb.runtime.ps.tables.table import EVICTION_SLACK, EmbeddingTable
from elasticdl_nb.runtime.table_def import TableDef, initial_rows

NO_SLOTS = np.zeros((0, 2), np.float32)


def _push(table: EmbeddingTable, ids, version: int) -> np.ndarray:
    """Apply a gradient of ones for `ids` as the store does; returns the ids admitted."""
    ids = np.asarray(ids, np.int64)
    admitted, grads = table.admit(ids, np.ones((len(ids), 2), np.float32))
    rows, states = table.states(admitted)
    table.write(admitted, rows, states - grads, version)
    table.enforce(version)
    return admitted


def test_the_sketch_counts_each_id_and_never_under_counts():
    admission = Admission(3, width=64)  # a tiny sketch: collisions are certain
    rng = np.random.default_rng(0)
    ids = rng.integers(-(2**62), 2**62, size=500)
    times = rng.integers(1, 6, size=500)
    for round_ in range(5):
        admission.count(ids[times > round_])
    assert (admission.seen(ids) >= times).all()
    exact = Admission(3)  # the default width: no collisions among 500 ids
    for round_ in range(5):
        admitted = exact.count(ids[times > round_])  # each counted round_ + 1 times now
        assert admitted.all() if round_ + 1 >= 3 else not admitted.any()
    np.testing.assert_array_equal(exact.seen(ids), times)
    with pytest.raises(ValueError, match="min_count"):
        Admission(0)


def test_an_id_gets_a_row_on_its_min_count_th_push_and_its_earlier_gradients_are_dropped():
    table = EmbeddingTable(TableDef("t", 2, min_count=3), NO_SLOTS)
    rare, frequent = 2**61 + 5, -17
    assert len(_push(table, [frequent, rare], 1)) == 0
    assert len(_push(table, [frequent], 2)) == 0
    assert _push(table, [frequent], 3).tolist() == [frequent]  # seen 3 times: admitted
    assert table.counts.refused == 3 and table.counts.created == 1
    # It read its initial row until then, and only the third gradient moved it.
    start = initial_rows(table.definition, np.array([frequent, rare]))
    np.testing.assert_allclose(table.read(np.array([frequent])), start[:1] - 1)
    np.testing.assert_array_equal(table.read(np.array([rare])), start[1:])
    assert _push(table, [frequent], 4).tolist() == [frequent]  # held: always applied
    assert len(table) == 1


def test_max_rows_keeps_the_most_recently_updated_rows_of_this_ps_share():
    table = EmbeddingTable(TableDef("t", 2, max_rows=200), NO_SLOTS, num_ps=2)
    assert table.cap == 100
    for version in range(1, 31):  # 10 new ids a push: 300 ids in all
        _push(table, np.arange(10) + 10 * version, version)
        assert len(table) <= table.cap * (1 + EVICTION_SLACK)
    held = np.sort(table.index.items()[0])
    assert len(held) <= table.cap * (1 + EVICTION_SLACK) and len(held) >= table.cap
    # The newest pushes' ids are all held; evicted ones are the oldest.
    assert set(range(210, 310)) <= set(held.tolist())
    assert table.counts.evicted == 300 - len(held) and table.counts.created == 300
    # An evicted id that comes back starts from its initial row again.
    _push(table, [10], 31)
    np.testing.assert_allclose(
        table.read(np.array([10])), initial_rows(table.definition, np.array([10])) - 1
    )


def test_rows_not_updated_for_ttl_steps_are_evicted():
    table = EmbeddingTable(TableDef("t", 2, ttl_steps=20), NO_SLOTS)
    _push(table, [1, 2], 1)
    for version in range(2, 41):
        _push(table, [2], version)  # id 1 is never updated again
    assert table.index.items()[0].tolist() == [2]
    assert table.counts.evicted == 1
    stats = table.stats()
    assert (stats["rows"], stats["created"], stats["evicted"], stats["refused"]) == (1, 2, 1, 0)
