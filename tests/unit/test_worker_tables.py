"""A worker's Embedding layers hold no table, yet its steps compute what Keras computes on
the whole table."""

import math

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticdl_nb.model.contract import ContractError, ModelContract  # noqa: E402
from elasticdl_nb.runtime.worker.model_runner import ModelRunner  # noqa: E402


def _model(input_dim, initializer="uniform", **layer_args):
    ids = keras.Input((3,), dtype="int64")
    x = keras.layers.Embedding(input_dim, 8, embeddings_initializer=initializer, **layer_args)(ids)
    x = keras.layers.Flatten()(x)
    return keras.Model(ids, keras.layers.Dense(1)(x))


def _runner(model_fn) -> ModelRunner:
    loss = keras.losses.MeanSquaredError()
    return ModelRunner(ModelContract(model_fn, loss, lambda: keras.optimizers.SGD(0.1)))


FEATURES = np.array([[3, 9_999_999, 3], [42, 7, 9_999_999]], np.int64)
LABELS = np.array([[1.0], [-1.0]], np.float32)


def test_a_ten_million_row_embedding_holds_one_row_in_the_worker():
    runner = _runner(lambda: _model(10_000_000))
    runner.build(FEATURES)
    biggest = max(int(np.prod(v.shape)) for v in runner.model.weights)
    assert biggest < 1000  # the table would be 80M floats
    (table,) = runner.table_defs
    assert (table.dim, table.input_dim, table.initializer.kind) == (8, 10_000_000, "uniform")
    ids = runner.probe_ids(FEATURES)[table.name]
    assert sorted(ids) == [3, 7, 42, 9_999_999]


def test_the_step_gradients_equal_keras_on_the_whole_table():
    runner = _runner(lambda: _model(50))
    features = FEATURES % 50
    runner.build(features)
    rows = runner.initial_rows(runner.probe_ids(features))
    (name,) = rows
    grads = runner.train_step(features, LABELS, rows=rows)

    # The same model with its whole table: the pulled rows where they were, dense weights
    # as the runner's.
    reference = _model(50)
    table = np.zeros((50, 8), np.float32)
    table[rows[name][0]] = rows[name][1]
    reference.layers[1].embeddings.assign(table)
    for mine, theirs in zip(runner.dense_vars, reference.layers[3].weights):
        theirs.assign(mine)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(LABELS, reference(features))
    expected = tape.gradient(loss, reference.trainable_variables)
    assert grads.loss == pytest.approx(float(loss), rel=1e-6)
    ids, summed = grads.tables[name]
    np.testing.assert_allclose(summed, tf.convert_to_tensor(expected[0]).numpy()[ids], atol=1e-6)
    assert sorted(ids) == sorted(set(features.ravel()))
    for got, want in zip(grads.dense.values(), expected[1:]):
        np.testing.assert_allclose(got, want, atol=1e-6)
    # And the exported model, with its whole table, predicts as the runner does.
    full = runner.full_model(
        features,
        {n: v.numpy() for n, v in zip(runner.dense_names, runner.dense_vars)},
        {name: table},
    )
    np.testing.assert_allclose(full(features), runner.forward(features, rows), atol=1e-6)


@pytest.mark.parametrize(
    "initializer, kind, spread",
    [
        (keras.initializers.GlorotUniform(), "uniform", math.sqrt(6 / (1000 + 8))),
        (keras.initializers.HeNormal(), "truncated_normal", math.sqrt(2 / 1000) / 0.8796256610),
        (keras.initializers.RandomNormal(stddev=0.3), "normal", 0.3),
        (keras.initializers.Constant(2.5), "constant", 2.5),
    ],
)
def test_keras_initializers_become_row_distributions(initializer, kind, spread):
    runner = _runner(lambda: _model(1000, initializer))
    runner.build(FEATURES % 1000)
    init = runner.table_defs[0].initializer
    assert init.kind == kind
    got = {"uniform": init.high, "normal": init.stddev, "truncated_normal": init.stddev}
    assert got.get(kind, init.value) == pytest.approx(spread)


def test_what_a_table_on_the_ps_cannot_do_is_refused_with_the_fix():
    runner = _runner(lambda: _model(100, keras.initializers.Orthogonal()))
    with pytest.raises(ContractError, match="cannot start a table one row at a time"):
        runner.build(FEATURES % 100)
    runner = _runner(lambda: _model(100, embeddings_regularizer="l2"))
    with pytest.raises(ContractError, match="activity_regularizer"):
        runner.build(FEATURES % 100)


def test_ids_outside_input_dim_are_refused_with_the_fix():
    runner = _runner(lambda: _model(100))
    runner.build(FEATURES % 100)
    with pytest.raises(ContractError, match="outside its 100 rows"):
        runner.probe_ids(FEATURES)
