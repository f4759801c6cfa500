"""A table's initial rows: one draw per (seed, id, column), whatever else is asked with it."""

import numpy as np
import pytest

from elasticdl_nb.runtime.table_def import Initializer, TableDef, initial_rows


def _table(kind="uniform", seed=7, **kwargs):
    return TableDef("emb", 16, initializer=Initializer(kind, **kwargs), seed=seed)


def test_a_row_is_the_same_whatever_ids_come_with_it():
    table = _table()
    ids = np.array([5, -3, 2**62 + 11, 0, 5], np.int64)
    rows = initial_rows(table, ids)
    np.testing.assert_array_equal(rows[0], rows[4])
    alone = initial_rows(table, ids[2:3])
    np.testing.assert_array_equal(alone[0], rows[2])
    assert not np.array_equal(rows[0], rows[1])
    assert rows.dtype == np.float32 and rows.shape == (5, 16)


def test_tables_with_other_seeds_start_differently():
    ids = np.arange(100)
    assert not np.allclose(initial_rows(_table(seed=1), ids), initial_rows(_table(seed=2), ids))
    assert TableDef.seed_for("a") != TableDef.seed_for("b")
    assert TableDef.seed_for("a", 3) != TableDef.seed_for("a")


@pytest.mark.parametrize(
    "kind, kwargs, mean, std, bound",
    [
        ("uniform", {"low": -0.05, "high": 0.05}, 0.0, 0.1 / np.sqrt(12), 0.05),
        ("normal", {"mean": 1.0, "stddev": 2.0}, 1.0, 2.0, None),
        # Keras's truncated normal: cut at two deviations, whose spread is 0.8796 of one.
        ("truncated_normal", {"stddev": 1.0}, 0.0, 0.87962566, 2.0),
    ],
)
def test_rows_follow_their_distribution(kind, kwargs, mean, std, bound):
    rows = initial_rows(_table(kind, **kwargs), np.arange(20_000)).astype(np.float64)
    assert abs(rows.mean() - mean) < 0.01 * max(std, 1)
    assert abs(rows.std() - std) / std < 0.01
    if bound is not None:
        assert np.abs(rows - mean).max() <= bound + 1e-6
    # Neighbouring ids and columns are not correlated.
    assert abs(np.corrcoef(rows[:-1, 0], rows[1:, 0])[0, 1]) < 0.03
    assert abs(np.corrcoef(rows[:, 0], rows[:, 1])[0, 1]) < 0.03


def test_a_constant_table_and_the_json_round_trip():
    table = TableDef("t", 3, "float64", 10, Initializer("constant", value=0.5), seed=9)
    np.testing.assert_array_equal(initial_rows(table, np.array([1, 2])), np.full((2, 3), 0.5))
    assert TableDef.from_json(table.to_json()) == table
    with pytest.raises(ValueError, match="not one of"):
        Initializer("orthogonal")


def test_many_rows_are_drawn_in_chunks_with_the_same_values(monkeypatch):
    import elasticdl_nb.runtime.table_def as table_def

    table = _table("truncated_normal", stddev=0.1)
    ids = np.arange(-500, 500, dtype=np.int64)
    whole = initial_rows(table, ids)
    monkeypatch.setattr(table_def, "CHUNK", 64)
    np.testing.assert_array_equal(initial_rows(table, ids), whole)


def test_why_tables_go_into_no_model_file_names_their_size_or_that_it_is_unknown():
    """A table without input_dim has no size whole: the message says so instead of
    'inf GiB' (issue 38); bounded tables get their size."""
    from elasticdl_nb.runtime.worker.export import too_large_to_export

    bounded = TableDef("ids", 16, input_dim=40_000_000)  # 40M × 16 float32: 2.4 GiB
    unbounded = TableDef("any", 16)
    assert too_large_to_export([bounded]).startswith("take 2.4 GiB whole, more than the 2 GiB")
    message = too_large_to_export([bounded, unbounded])
    assert "any int64 id" in message and "unknown" in message and "inf" not in message
