"""elasticdl_nb.layers.Embedding: ElasticDL's layer with no input_dim, run by a worker as
any Keras Embedding; importable where ElasticDL model-zoo files import it."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticdl_nb.layers import Embedding  # noqa: E402
from elasticdl_nb.model.contract import ModelContract  # noqa: E402
from elasticdl_nb.runtime.table_def import initial_rows  # noqa: E402
from elasticdl_nb.runtime.worker.model_runner import ModelRunner  # noqa: E402


def _runner(model_fn) -> ModelRunner:
    loss = keras.losses.MeanSquaredError()
    return ModelRunner(ModelContract(model_fn, loss, lambda: keras.optimizers.SGD(0.1)))


def _model(dtype="int64", **layer_args):
    ids = keras.Input((2,), dtype=dtype)
    x = keras.layers.Flatten()(Embedding(4, **layer_args)(ids))
    return keras.Model(ids, keras.layers.Dense(1, kernel_initializer="ones")(x))


def test_ids_of_any_int64_value_are_looked_up_and_trained():
    runner = _runner(_model)
    features = np.array([[2**62 - 1, -(2**61)], [7, 2**62 - 1]], np.int64)
    runner.build(features)
    (table,) = runner.table_defs
    assert table.input_dim == 0  # no range: any id
    ids = runner.probe_ids(features)[table.name]
    assert sorted(ids) == sorted({2**62 - 1, -(2**61), 7})
    rows = runner.initial_rows({table.name: ids})
    grads = runner.train_step(features, np.zeros((2, 1), np.float32), rows=rows)
    got_ids, summed = grads.tables[table.name]
    # d(loss)/d(row) = 2/N * prediction * kernel (ones) per lookup; the id looked up twice
    # gets both examples' gradients.
    start = dict(zip(rows[table.name][0].tolist(), rows[table.name][1]))
    predictions = [start[a].sum() + start[b].sum() for a, b in features.tolist()]
    expected = {
        2**62 - 1: predictions[0] + predictions[1],
        -(2**61): predictions[0],
        7: predictions[1],
    }
    for i, grad in zip(got_ids.tolist(), summed):
        np.testing.assert_allclose(grad, np.full(4, expected[i]), rtol=1e-5)


def test_strings_are_hashed_to_ids_the_same_way_everywhere():
    runner = _runner(lambda: _model("string"))
    features = np.array([["user:1", "ad:9"], ["user:1", "ad:3"]], dtype=object)
    runner.build(features)
    (table,) = runner.table_defs
    ids = runner.probe_ids(features)[table.name]
    expected = tf.strings.to_hash_bucket_fast(["user:1", "ad:9", "ad:3"], 2**63 - 1).numpy()
    assert sorted(ids) == sorted(expected)
    rows = runner.initial_rows({table.name: ids})
    out = runner.forward(features, rows).numpy()
    by_id = dict(zip(ids.tolist(), initial_rows(table, ids).sum(axis=1)))
    np.testing.assert_allclose(out[0, 0], by_id[expected[0]] + by_id[expected[1]], rtol=1e-5)


@pytest.mark.parametrize(
    "combiner, scale", [("sum", [1, 1]), ("mean", [1, 2]), ("sqrtn", [1, 2**0.5])]
)
def test_a_combiner_gives_one_vector_per_example_of_a_sparse_input(combiner, scale):
    layer = Embedding(4, combiner=combiner)
    sparse = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([5, 6, 7], tf.int64), [3, 2])
    ids = layer.lookup_ids(sparse)
    found = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    out = layer.assemble(sparse, found).numpy()
    np.testing.assert_allclose(out[0], found[0] / scale[0])
    np.testing.assert_allclose(out[1], (found[1] + found[2]) / scale[1], rtol=1e-6)
    np.testing.assert_array_equal(out[2], 0)  # an example with no ids
    assert ids.numpy().tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="give it a combiner"):
        Embedding(4).assemble(sparse, found)


def test_outside_a_job_the_layer_says_where_its_rows_are():
    layer = Embedding(4)
    with pytest.raises(RuntimeError, match="parameter servers"):
        layer(np.array([[1, 2]]))
    assert layer.weights[0].shape == (1, 4)  # no table here either
    with pytest.raises(ValueError, match="combiner"):
        Embedding(4, combiner="max")


def test_model_zoo_files_import_it_from_elasticdl():
    from elasticdl.python.elasticdl.layers.embedding import Embedding as FromElasticDL

    assert FromElasticDL is Embedding
    layer = FromElasticDL(8, input_length=3, mask_zero=True, embedding_service_endpoint=None)
    assert (layer.output_dim, layer.input_dim, layer.input_length) == (8, None, 3)
    assert Embedding.from_config(layer.get_config()).get_config() == layer.get_config()


def test_a_step_takes_sparse_features_through_the_combiner():
    def model():
        ids = keras.Input((None,), sparse=True, dtype="int64")
        vector = Embedding(4, combiner="mean")(ids)
        return keras.Model(ids, keras.layers.Dense(1, kernel_initializer="ones")(vector))

    runner = _runner(model)
    features = tf.SparseTensor(
        [[0, 0], [0, 1], [1, 0]], tf.constant([5, 2**40, 5], tf.int64), [2, 3]
    )
    runner.build(features)
    (table,) = runner.table_defs
    ids = runner.probe_ids(features)[table.name]
    assert sorted(ids) == [5, 2**40]
    rows = runner.initial_rows({table.name: ids})
    start = dict(zip(ids.tolist(), rows[table.name][1]))
    out = runner.forward(features, rows).numpy()[:, 0]
    np.testing.assert_allclose(
        out, [(start[5] + start[2**40]).sum() / 2, start[5].sum()], rtol=1e-5
    )
    # Two steps with other shapes of sparse input: one compiled step serves them.
    for batch in (features, tf.SparseTensor([[0, 2]], tf.constant([9], tf.int64), [1, 3])):
        batch_ids = runner.probe_ids(batch)[table.name]
        grads = runner.train_step(
            batch,
            np.zeros((batch.dense_shape[0], 1), np.float32),
            rows=runner.initial_rows({table.name: batch_ids}),
        )
        assert sorted(grads.tables[table.name][0]) == sorted(batch_ids)


def test_a_feed_may_key_a_single_input_models_features_by_any_name():
    """ElasticDL's feeds return {"feature": ids} for a model whose one Input has another
    name: Keras 2's model.call took it, Keras 3 refuses it; call_model takes the dict's
    one value then. Named inputs and a subclassed model's dict are left as they are."""
    from elasticdl_nb.model.contract import call_model

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    unnamed_input = keras.Input((3,))
    unnamed = keras.Model(unnamed_input, keras.layers.Dense(1)(unnamed_input))
    with pytest.raises(ValueError, match="Missing data for input"):
        unnamed({"feature": x})
    np.testing.assert_allclose(call_model(unnamed, {"feature": x}, False), unnamed(x))
    sequential = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    np.testing.assert_allclose(call_model(sequential, {"feature": x}, False), sequential(x))

    named_input = keras.Input((3,), name="ids")
    named = keras.Model(named_input, keras.layers.Dense(1)(named_input))
    np.testing.assert_allclose(call_model(named, {"ids": x}, False), named(x))

    class TakesADict(keras.Model):
        def call(self, features):
            return features["feature"] * 2.0

    np.testing.assert_allclose(call_model(TakesADict(), {"feature": x}, False), 2 * x)


def test_a_layer_made_for_export_holds_its_whole_table_and_comes_back_whole():
    """The model a job exports is built inside whole_tables(): ElasticDL's Embedding then
    holds input_dim rows and looks them up as Keras's does, and its config says so, so the
    saved model loads and runs anywhere (issue 38: export failed on such a layer)."""
    from elasticdl_nb.layers.embedding import whole_tables

    with whole_tables():
        layer = Embedding(3, input_dim=5, combiner="sum")
    assert not Embedding(3, input_dim=5).whole_table  # outside: rows on the PS
    ids = np.array([[0, 4], [2, 2]])
    out = layer(ids)
    table = layer.embeddings.numpy()
    assert table.shape == (5, 3)
    np.testing.assert_allclose(out, table[ids])
    bags = tf.sparse.from_dense(tf.constant([[1, 3], [0, 0]], tf.int64))
    np.testing.assert_allclose(layer(bags)[0], table[1] + table[3], rtol=1e-6)
    again = Embedding.from_config(layer.get_config())
    assert again.whole_table and again(ids).shape == (2, 2, 3)
    with pytest.raises(ValueError, match="no input_dim"), whole_tables():
        Embedding(3)
