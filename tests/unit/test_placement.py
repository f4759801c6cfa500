"""Placement: the same deterministic, balanced answer on every worker and PS."""

import numpy as np

from elasticdl_nb.runtime.placement import place_dense, rows_on_shard, split_ids


def test_dense_variables_are_balanced_by_bytes_and_order_independent():
    sizes = [("a", 100), ("b", 60), ("c", 50), ("d", 10)]
    placement = place_dense(sizes, 2)
    assert placement == place_dense(list(reversed(sizes)), 2)
    load = [sum(s for n, s in sizes if placement[n] == ps) for ps in range(2)]
    assert sorted(load) == [110, 110]


def test_table_rows_split_by_modulo_and_shard_sizes_add_up():
    ids = np.array([7, 2, 9, 4, 3])
    assert [p.tolist() for p in split_ids(ids, 3)] == [[9, 3], [7, 4], [2]]
    assert sum(rows_on_shard(10, ps, 3) for ps in range(3)) == 10
    assert [rows_on_shard(10, ps, 3) for ps in range(3)] == [4, 3, 3]
