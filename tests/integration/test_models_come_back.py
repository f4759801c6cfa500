"""`job.model()` returns a usable model when its layers are classes of the user's own (a
model-zoo module's, a notebook's), not Keras's and not registered with Keras (issue 38):
real jobs, the model loaded here and checked on held-out data."""

from __future__ import annotations

import textwrap

import numpy as np

import elasticdl_nb as edl
from tests.integration.models import DIGITS, digits_split

ZOO_MODULE = """
import keras
import tensorflow as tf


class Scale(keras.layers.Layer):
    \"\"\"x times a learned vector: a custom layer, not registered with Keras.\"\"\"

    def build(self, input_shape):
        self.factor = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.factor


class ScaledDense(keras.layers.Layer):
    \"\"\"A custom layer made of another custom layer.\"\"\"

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.scale = Scale()
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return self.dense(self.scale(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def custom_model():
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(64, activation="relu")(Scale()(inputs))
    return keras.Model(inputs, ScaledDense(10)(hidden))


def loss(labels, predictions):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    return keras.optimizers.Adam(0.005)


def eval_metrics_fn():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy(name="accuracy")}
"""


def _accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))


def test_a_model_zoo_modules_own_layers_come_back_in_the_model(job_home, tmp_path):
    zoo = tmp_path / "custom_layers.py"
    zoo.write_text(textwrap.dedent(ZOO_MODULE))
    (x, y), (xt, yt) = digits_split()
    job = edl.train(
        "custom_layers.custom_model",
        model_zoo=str(zoo),
        data=(x, y),
        validation_data=(xt, yt),
        workers=2,
        epochs=8,
        minibatch_size=32,
    )
    assert job.wait(timeout=300)["state"] == "succeeded"
    model = job.model()
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("Scale") == 1 and kinds.count("ScaledDense") == 1, kinds
    assert type(model.layers[-1].scale).__name__ == "Scale"  # the inner one too
    assert _accuracy(model, xt, yt) >= 0.85
    np.testing.assert_allclose(
        model.predict(xt[:20], verbose=0), job.model().predict(xt[:20], verbose=0), rtol=1e-6
    )


def test_a_notebooks_own_layer_and_a_lambda_come_back_in_the_model(job_home):
    import keras

    class Doubled(keras.layers.Layer):  # defined "in the notebook": captured by value
        def call(self, x):
            return 2.0 * x

    def custom_model():
        return keras.Sequential(
            [
                keras.Input((64,)),
                Doubled(),
                keras.layers.Lambda(lambda t: 0.5 * t),  # (loading it takes safe_mode off)
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    (x, y), (xt, yt) = digits_split()
    job = edl.train(
        custom_model,
        **DIGITS,
        data=(x, y),
        validation_data=(xt, yt),
        workers=1,
        epochs=8,
        minibatch_size=32,
    )
    assert job.wait(timeout=300)["state"] == "succeeded"
    model = job.model()
    assert [type(layer).__name__ for layer in model.layers[:2]] == ["Doubled", "Lambda"]
    assert _accuracy(model, xt, yt) >= 0.85
