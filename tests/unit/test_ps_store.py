"""A PS shard's state: Keras optimizer updates, idempotent pushes, exact checkpoints."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402

from elasticdl_nb.runtime.ps.checkpoints import CheckpointDir  # noqa: E402
from elasticdl_nb.runtime.ps.store import ParameterStore, VariableSpec  # noqa: E402
from elasticdl_nb.runtime.table_def import Initializer, TableDef  # noqa: E402

ZEROS = Initializer("constant", value=0.0)


def _table(rows, dim=4):
    return TableDef("emb", dim, input_dim=rows, initializer=ZEROS)


def _store(num_ps=1, ps_id=0, table_rows=10):
    store = ParameterStore(lambda: keras.optimizers.Adagrad(0.5), ps_id, num_ps, record_ledger=True)
    store.init([VariableSpec("w", np.ones((2, 3), np.float32))], [_table(table_rows)])
    return store


def test_first_init_wins():
    store = _store()
    assert not store.init([VariableSpec("w", np.zeros((2, 3), np.float32))])
    np.testing.assert_array_equal(store.read_dense()["w"], np.ones((2, 3)))


def test_updates_match_the_keras_optimizer_applied_densely():
    store = _store()
    grad_w = np.full((2, 3), 0.3, np.float32)
    ids, rows = np.array([1, 7]), np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    assert store.push(0, 0, 0, {"w": grad_w}, {"emb": (ids, rows)}, (0, 8))

    ref_w = keras.Variable(np.ones((2, 3), np.float32))
    ref_emb = keras.Variable(np.zeros((10, 4), np.float32))
    dense_grad = np.zeros((10, 4), np.float32)
    dense_grad[ids] = rows
    reference = keras.optimizers.Adagrad(0.5)
    reference.apply_gradients([(grad_w, ref_w), (dense_grad, ref_emb)])
    np.testing.assert_allclose(store.read_dense()["w"], ref_w.numpy(), rtol=1e-6)
    np.testing.assert_allclose(store.read_rows("emb", np.arange(10)), ref_emb.numpy(), rtol=1e-6)


def test_a_minibatch_pushed_twice_is_applied_once():
    store = _store()
    grads = {"w": np.ones((2, 3), np.float32)}
    assert store.push(3, 0, 640, grads, {}, (640, 704))
    once = store.read_dense()["w"]
    assert not store.push(3, 0, 640, grads, {}, (640, 704))
    np.testing.assert_array_equal(store.read_dense()["w"], once)
    assert (store.version, store.duplicates) == (1, 1)
    assert store.push(4, 0, 640, grads, {}, (640, 704))  # the next epoch is new work


def test_a_shard_holds_and_serves_its_rows_by_global_id():
    store = _store(num_ps=3, ps_id=1)
    store.push(0, 0, 0, {}, {"emb": (np.array([4, 7]), np.ones((2, 4), np.float32))}, None)
    changed = store.read_rows("emb", np.array([1, 4, 7]))
    assert (changed[0] == 0).all() and (changed[1:] != 0).all()


def test_a_checkpoint_restores_the_exact_shard(tmp_path):
    store = _store()
    for step in range(3):
        store.push(
            0,
            0,
            step * 8,
            {"w": np.full((2, 3), step, np.float32)},
            {"emb": (np.array([step]), np.ones((1, 4), np.float32))},
            (step * 8, step * 8 + 8),
        )
    directory = CheckpointDir(tmp_path, 0, keep=2)
    directory.save(store.snapshot())
    store.push(0, 0, 99, {"w": np.ones((2, 3), np.float32)}, {}, None)
    directory.save(store.snapshot())
    (directory.paths()[-1]).write_bytes(b"torn")  # the newest is damaged: use the one before

    restored = ParameterStore(lambda: keras.optimizers.Adagrad(0.5), 0, 1, True)
    state, path = directory.load_newest()
    restored.restore(state)
    assert restored.version == 3 and restored.applied[(0, 0)] == {0, 8, 16}
    assert restored.ledger[(0, 0)] == [(0, 8), (8, 16), (16, 24)]
    before = store.snapshot()
    # Same future: the restored shard and a fresh replay agree on the next update.
    grads = {"w": np.full((2, 3), 0.7, np.float32)}
    rows = {"emb": (np.array([1, 2]), np.full((2, 4), 0.3, np.float32))}
    restored.push(1, 0, 0, grads, rows, None)
    replay = _store()
    for step in range(3):
        replay.push(
            0,
            0,
            step * 8,
            {"w": np.full((2, 3), step, np.float32)},
            {"emb": (np.array([step]), np.ones((1, 4), np.float32))},
            None,
        )
    replay.push(1, 0, 0, grads, rows, None)
    np.testing.assert_allclose(restored.read_dense()["w"], replay.read_dense()["w"], rtol=1e-6)
    # The table's optimizer slots came back too: the same rows after the same update.
    np.testing.assert_allclose(
        restored.read_rows("emb", np.arange(10)), replay.read_rows("emb", np.arange(10)), rtol=1e-6
    )
    assert len(before["optimizer"]) == len(restored.snapshot()["optimizer"])


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    store = _store()
    directory = CheckpointDir(tmp_path, 0, keep=2)
    for step in range(4):
        store.push(0, 0, step, {"w": np.ones((2, 3), np.float32)}, {}, None)
        directory.save(store.snapshot())
    assert [p.name for p in directory.paths()] == ["ckpt-000000000003.npz", "ckpt-000000000004.npz"]


def test_tables_follow_the_optimizer_lazily_row_by_row():
    store = ParameterStore(lambda: keras.optimizers.Adam(0.1), 0, 1)
    store.init([], [_table(300, dim=2)])
    ones = np.ones((1, 2), np.float32)
    store.push(0, 0, 0, {}, {"emb": (np.array([5]), ones)}, None)
    after_first = store.read_rows("emb", np.array([5, 6]))
    assert (after_first[0] != 0).all() and (after_first[1] == 0).all()
    # 200 distinct rows in one push: more than the proxies hold, so they grow.
    many = np.arange(100, 300)
    store.push(0, 0, 1, {}, {"emb": (many, np.ones((200, 2), np.float32))}, None)
    np.testing.assert_array_equal(store.read_rows("emb", np.array([5])), after_first[:1])
    moved = store.read_rows("emb", many)
    # Adam's rule at the optimizer's global step t=2 (bias correction as TF's lazy Adam).
    m_hat, v_hat = 0.1 / (1 - 0.9**2), 0.001 / (1 - 0.999**2)
    np.testing.assert_allclose(moved, np.full((200, 2), -0.1 * m_hat / np.sqrt(v_hat)), rtol=1e-3)
    assert store.rows.optimizer.iterations.numpy() == 2


def test_checkpoints_are_written_once_per_interval_even_while_updates_race_the_writer(
    tmp_path,
):
    import time

    from elasticdl_nb.runtime.ps.process import Checkpointer

    store = _store()
    directory = CheckpointDir(tmp_path, 0, keep=100)
    slow_save, saved = directory.save, []

    def save(state):  # a slow disk: updates keep arriving while a checkpoint is written
        saved.append(state["version"])
        time.sleep(0.05)
        return slow_save(state)

    directory.save = save
    checkpointer = Checkpointer(store, directory, every=10)
    grads = {"w": np.ones((2, 3), np.float32)}
    for key in range(45):
        store.push(0, 0, key, grads, {}, None)
        checkpointer.note_update()
        time.sleep(0.005)
    time.sleep(0.3)
    assert len(saved) >= 3
    gaps = [b - a for a, b in zip(saved, saved[1:])]
    assert min(gaps) >= 10, saved  # before the fix: 100, 103, 203, 205, ...


def test_a_restored_shard_has_its_row_proxies_grown_already(tmp_path):
    # A push touching 300 rows grows the proxies (a rebuild and retrace); a PS restored
    # from a checkpoint of that store starts with proxies that size, so its first push
    # after a restart does not pay for the rebuild on the request path.
    store = _store(table_rows=1000)
    ids = np.arange(300)
    store.push(0, 0, 0, {}, {"emb": (ids, np.ones((300, 4), np.float32))}, None)
    grown = store.rows.generation
    directory = CheckpointDir(tmp_path, 0, keep=1)
    directory.save(store.snapshot())

    restored = ParameterStore(lambda: keras.optimizers.Adagrad(0.5), 0, 1, True)
    restored.restore(directory.load_newest()[0])
    assert restored.rows.capacities == store.rows.capacities
    np.testing.assert_array_equal(restored.read_rows("emb", ids), store.read_rows("emb", ids))
    generation = restored.rows.generation
    restored.push(0, 0, 8, {}, {"emb": (ids, np.ones((300, 4), np.float32))}, None)
    assert restored.rows.generation == generation  # no rebuild on the first push
    assert grown > 1


def test_row_proxies_start_as_large_as_a_minibatch():
    store = ParameterStore(lambda: keras.optimizers.Adagrad(0.5), 0, 1, minibatch_size=256)
    store.init([], [_table(1000)])
    generation = store.rows.generation
    ids = np.arange(256)
    store.push(0, 0, 0, {}, {"emb": (ids, np.ones((256, 4), np.float32))}, None)
    assert store.rows.generation == generation  # the first full minibatch fits
    # Adagrad: lr * g / sqrt(initial accumulator 0.1 + g^2)
    np.testing.assert_allclose(store.read_rows("emb", ids), -0.5 / np.sqrt(1.1), rtol=1e-5)
