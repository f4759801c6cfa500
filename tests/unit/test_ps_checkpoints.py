"""Incremental PS checkpoints: deltas of what changed, folded back into whole tables on
restore, equal to the shard that wrote them; damaged links skipped; chains kept whole."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402

from elasticdl_nb.runtime.ps.checkpoints import CheckpointDir  # noqa: E402
from elasticdl_nb.runtime.ps.process import DELTAS_PER_BASE, Checkpointer  # noqa: E402
from elasticdl_nb.runtime.ps.store import ParameterStore, VariableSpec  # noqa: E402
from elasticdl_nb.runtime.table_def import TableDef  # noqa: E402

TABLE = TableDef("emb", 4, min_count=2, max_rows=60, seed=5)


def _store():
    store = ParameterStore(lambda: keras.optimizers.Adam(0.1), 0, 1, record_ledger=True)
    store.init([VariableSpec("w", np.ones((2, 3), np.float32))], [TABLE])
    return store


def _train(store, keys, rng):
    """Push minibatches of ids drawn from 0..99: some admitted, rows evicted past 63."""
    for key in keys:
        ids = np.unique(rng.integers(0, 100, size=20))
        grads = {"emb": (ids, rng.normal(size=(len(ids), 4)).astype(np.float32))}
        w = {"w": rng.normal(size=(2, 3)).astype(np.float32)}
        store.push(0, 0, key, w, grads, (key, key + 1))


def _same_shard(a: ParameterStore, b: ParameterStore):
    assert a.version == b.version and a.applied == b.applied and a.ledger == b.ledger
    ta, tb = a.tables["emb"], b.tables["emb"]
    sa, sb = ta.snapshot(), tb.snapshot()
    order_a, order_b = np.argsort(sa.ids), np.argsort(sb.ids)
    np.testing.assert_array_equal(sa.ids[order_a], sb.ids[order_b])
    np.testing.assert_array_equal(sa.states[order_a], sb.states[order_b])
    np.testing.assert_array_equal(sa.updated[order_a], sb.updated[order_b])
    assert ta.counts == tb.counts
    np.testing.assert_array_equal(ta.admission.counts, tb.admission.counts)
    np.testing.assert_array_equal(a.read_dense()["w"], b.read_dense()["w"])


def test_a_chain_of_deltas_restores_the_exact_shard_evictions_included(tmp_path):
    rng = np.random.default_rng(1)
    store = _store()
    directory = CheckpointDir(tmp_path, 0, keep=1)
    checkpointer = Checkpointer(store, directory, every=10**9)  # saves only when asked
    sizes = []
    for chunk in range(4):
        _train(store, range(chunk * 10, chunk * 10 + 10), rng)
        _, path = checkpointer.save_now()
        sizes.append((path.name, path.stat().st_size))
    assert [name.split("-")[0] for name, _ in sizes] == ["ckpt", "delta", "delta", "delta"]
    assert store.tables["emb"].counts.evicted > 0  # deltas had ids to remove
    restored = ParameterStore(lambda: keras.optimizers.Adam(0.1), 0, 1, True)
    restored.restore(directory.load_newest()[0])
    _same_shard(restored, store)
    # The same future from here: one more push each, the same shard.
    _train(store, [99], np.random.default_rng(7))
    _train(restored, [99], np.random.default_rng(7))
    _same_shard(restored, store)


def test_a_damaged_link_falls_back_to_the_newest_whole_chain(tmp_path):
    rng = np.random.default_rng(2)
    store = _store()
    directory = CheckpointDir(tmp_path, 0, keep=2)
    checkpointer = Checkpointer(store, directory, every=10**9)
    versions = []
    for chunk in range(3):
        _train(store, range(chunk * 5, chunk * 5 + 5), rng)
        versions.append(checkpointer.save_now()[0])
    paths = directory.paths()
    paths[-1].write_bytes(b"torn")  # the newest delta: use the one before
    state, path = directory.load_newest()
    assert state["version"] == versions[1] and path == paths[1]
    paths[0].write_bytes(b"torn")  # the base: no chain is whole now
    assert directory.load_newest() is None


def test_every_tenth_checkpoint_is_whole_and_old_chains_go_whole(tmp_path):
    rng = np.random.default_rng(3)
    store = _store()
    directory = CheckpointDir(tmp_path, 0, keep=1)
    checkpointer = Checkpointer(store, directory, every=10**9)
    kinds = []
    for key in range(2 * (DELTAS_PER_BASE + 1) + 1):
        _train(store, [key], rng)
        kinds.append(checkpointer.save_now()[1].name.split("-")[0])
    assert kinds[0] == kinds[DELTAS_PER_BASE + 1] == kinds[-1] == "ckpt"
    assert kinds.count("ckpt") == 3
    # keep=1: only the newest base is left, with nothing older.
    assert [p.name.split("-")[0] for p in directory.paths()] == ["ckpt"]
    restored = ParameterStore(lambda: keras.optimizers.Adam(0.1), 0, 1, True)
    restored.restore(directory.load_newest()[0])
    _same_shard(restored, store)
