"""The PS's dense update: XLA-fused for large variables, plain ops for small ones, and in
either form the Keras optimizer's own update (to the last bit XLA may round differently)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from elasticdl_nb.runtime.ps.dense_update import XLA_MIN_DENSE_BYTES, DenseUpdate  # noqa: E402
from elasticdl_nb.runtime.ps.store import ParameterStore, VariableSpec  # noqa: E402


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "Adagrad", "RMSprop"])
def test_a_large_shard_is_updated_by_xla_as_keras_would(optimizer):
    n = XLA_MIN_DENSE_BYTES // 4  # float32: exactly the threshold
    make = lambda: getattr(keras.optimizers, optimizer)(0.01)  # noqa: E731
    store = ParameterStore(make, 0, 1)
    start = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    store.init([VariableSpec("w", start)])
    reference = keras.Variable(start)
    keras_optimizer = make()
    rng = np.random.default_rng(1)
    for key in range(3):
        grad = rng.standard_normal(n).astype(np.float32)
        assert store.push(0, 0, key, {"w": grad}, {}, None)
        keras_optimizer.apply_gradients([(grad, reference)])
    assert DenseUpdate(store.optimizer, list(store.dense.values())).fused
    np.testing.assert_allclose(store.read_dense()["w"], reference.numpy(), rtol=1e-5, atol=1e-6)


def test_small_variables_keep_the_plain_ops():
    variables = [tf.Variable(np.zeros(XLA_MIN_DENSE_BYTES // 4 - 1, np.float32))]
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(variables)
    update = DenseUpdate(optimizer, variables)
    assert not update.fused
    tf.function(update)([tf.ones_like(variables[0])])
    np.testing.assert_allclose(variables[0].numpy(), -0.1)
