"""Models and data the integration tests train: small, with answers known in advance."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def digits_split(seed: int = 0):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    train, test = order[:1400], order[1400:]
    return (x[train], y[train].astype(np.int32)), (x[test], y[test].astype(np.int32))


def custom_model():
    import keras

    return keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )


def loss(labels, predictions):
    import tensorflow as tf

    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    import keras

    return keras.optimizers.Adam(0.002)


def eval_metrics_fn():
    import keras

    return {"accuracy": keras.metrics.SparseCategoricalAccuracy(name="accuracy")}


DIGITS = dict(loss=loss, optimizer=optimizer, eval_metrics_fn=eval_metrics_fn)


def paced_loss(labels, predictions):
    """The digits loss, each step taking at least 50 ms: a job that must still be running
    when a relaunched or added worker has started (~6 s, more under load) and joins."""
    import time

    import tensorflow as tf

    pause = tf.py_function(lambda: (time.sleep(0.05), 0.0)[1], [], tf.float32)
    return loss(labels, predictions) + 0.0 * tf.reshape(pause, [])


# The digits model as a notebook cell defines it for `%%elasticdl train`: compiled Keras.
COMPILED_MODEL = """
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(0.002),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def eval_metrics_fn():
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy(name="accuracy")}
"""


def digits_job(**options):
    """Start a digits job (minibatches of 32, ledger on); options override (and
    evaluate=False leaves out the validation data). Returns (job, train arrays, test
    arrays)."""
    import elasticdl_nb as edl

    (x, y), (xt, yt) = digits_split()
    functions = {
        **DIGITS,
        "loss": options.pop("loss", DIGITS["loss"]),
        "optimizer": options.pop("optimizer", DIGITS["optimizer"]),
    }
    validation = (xt, yt) if options.pop("evaluate", True) else None
    options = {"minibatch_size": 32, "minibatches_per_task": 4, "record_ledger": True, **options}
    job = edl.train(custom_model, **functions, data=(x, y), validation_data=validation, **options)
    return job, (x, y), (xt, yt)


def model_zoo_module(name: str):
    """Import a file of examples/model_zoo by path (as a user's notebook would)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / "model_zoo" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # (ElasticDL's imports: elasticdl_nb is imported)
    return module


def accuracy(model, x, y) -> float:
    return float((model.predict(x, verbose=0).argmax(1) == y).mean())
