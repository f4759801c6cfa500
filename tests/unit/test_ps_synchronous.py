"""Synchronous PS training (`grads_to_wait`): a version is the average of N accepted
gradients, stale ones are refused, and a checkpoint never holds half a version."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402

from elasticdl_nb.runtime.ps.push import Push  # noqa: E402
from elasticdl_nb.runtime.ps.store import ParameterStore, VariableSpec  # noqa: E402
from elasticdl_nb.runtime.table_def import Initializer, TableDef  # noqa: E402

W0 = np.ones((2, 3), np.float32)


def _store(grads_to_wait=2, optimizer=lambda: keras.optimizers.SGD(0.5)):
    store = ParameterStore(optimizer, 0, 1, record_ledger=True, grads_to_wait=grads_to_wait)
    table = TableDef("emb", 2, input_dim=10, initializer=Initializer("constant", value=0.0))
    store.init([VariableSpec("w", W0.copy())], [table])
    return store


def _push(store, key, grad, version=None, rows=None, known_version=1 << 62):
    push = Push(0, 0, key, {"w": np.full((2, 3), grad, np.float32)}, rows or {}, (key, key + 1))
    push.gradient_version = store.version if version is None else version
    return store.exchange(push, known_version, {})


def test_a_version_is_the_average_of_grads_to_wait_gradients():
    store = _store()
    first = _push(store, 0, 1.0)
    assert (first.accepted, first.updated, store.version) == (True, False, 0)
    np.testing.assert_array_equal(store.read_dense()["w"], W0)  # waits for the second
    second = _push(store, 1, 3.0)
    assert (second.accepted, second.updated, store.version) == (True, True, 1)
    np.testing.assert_allclose(store.read_dense()["w"], W0 - 0.5 * 2.0)  # mean of 1 and 3
    assert second.learning_rate == pytest.approx(0.5)


def test_rows_of_an_id_pushed_by_several_minibatches_are_averaged_over_the_version():
    store = _store()
    ones = np.ones((2, 2), np.float32)
    _push(store, 0, 0.0, rows={"emb": (np.array([3, 5]), ones)})
    _push(store, 1, 0.0, rows={"emb": (np.array([5, 7]), 3 * ones)})
    rows = store.read_rows("emb", np.array([3, 5, 7, 8]))
    # SGD(0.5) on the mean: id 3 got (1 + 0) / 2, id 5 (1 + 3) / 2, id 7 (0 + 3) / 2.
    np.testing.assert_allclose(rows[:, 0], [-0.25, -1.0, -0.75, 0.0])


def test_a_gradient_computed_on_an_older_version_is_refused_and_its_redo_counts():
    store = _store()
    _push(store, 0, 1.0)
    _push(store, 1, 1.0)  # version 1
    stale = _push(store, 2, 5.0, version=0, known_version=0)
    assert (stale.stale, stale.accepted, stale.version, store.stale) == (True, False, 1, 1)
    assert 2 not in store.applied[(0, 0)]  # not taken: the master must not count it
    np.testing.assert_allclose(stale.dense["w"], W0 - 0.5)  # what to compute it on again
    redo = _push(store, 2, 5.0)
    assert redo.accepted and not redo.stale
    assert _push(store, 2, 5.0).accepted is False  # and a repeat of it is a duplicate


def test_a_checkpoint_leaves_out_the_minibatches_still_waiting_for_their_version():
    store = _store(grads_to_wait=3)
    for key in range(4):  # version 1 from keys 0-2; key 3 waits
        _push(store, key, 1.0)
    assert store.version == 1 and store.applied[(0, 0)] == {0, 1, 2, 3}
    state = store.snapshot()
    assert state["applied"][(0, 0)] == [0, 1, 2]
    assert state["ledger"][(0, 0)] == [(0, 1), (1, 2), (2, 3)]
    restored = _store(grads_to_wait=3)
    restored.restore(state)
    assert restored.pending.count == 0 and restored.version == 1
    assert _push(restored, 3, 1.0).accepted  # so it is done again, and counts once


def test_flush_applies_a_partial_version_as_the_average_of_what_came():
    store = _store(grads_to_wait=4)
    _push(store, 0, 2.0)
    _push(store, 1, 4.0)
    assert store.flush() and store.version == 1
    np.testing.assert_allclose(store.read_dense()["w"], W0 - 0.5 * 3.0)
    assert not store.flush()  # nothing waits


def test_a_learning_rate_schedule_is_evaluated_at_the_ps_version():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.4, decay_steps=1, decay_rate=0.5)
    store = _store(grads_to_wait=1, optimizer=lambda: keras.optimizers.SGD(schedule))
    rates = [_push(store, key, 1.0).learning_rate for key in range(4)]
    np.testing.assert_allclose(rates, [float(schedule(step)) for step in range(4)])
    np.testing.assert_allclose(store.read_dense()["w"], W0 - sum(rates), rtol=1e-6)


def test_a_version_schedule_sets_the_rate_of_table_rows_too_through_rebuilds_of_their_proxies():
    # ElasticDL's LearningRateScheduler: schedule(version); the rows' optimizer is rebuilt
    # when a push touches more rows than it was built for.
    store = ParameterStore(
        lambda: keras.optimizers.SGD(0.5),
        0,
        1,
        grads_to_wait=0,
        minibatch_size=2,
        rate_at=lambda version: 0.1 * (version + 1),
    )
    table = TableDef("emb", 2, input_dim=1000, initializer=Initializer("constant", value=0.0))
    store.init([VariableSpec("w", W0.copy())], [table])
    for key, rows in enumerate([2, 8, 64, 300]):  # growing: the proxies are rebuilt
        ids = np.arange(rows)
        push = Push(0, 0, key, {}, {"emb": (ids, np.ones((rows, 2), np.float32))})
        assert store.exchange(push, 1 << 62, {}).learning_rate == pytest.approx(0.1 * (key + 1))
    # Row 0 was in every push: minus the sum of the rates 0.1, 0.2, 0.3, 0.4.
    np.testing.assert_allclose(store.read_rows("emb", np.array([0, 100]))[:, 0], [-1.0, -0.4])
