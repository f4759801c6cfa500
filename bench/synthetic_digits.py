"""The model-zoo module of `many_workers.py`'s job: ElasticDL's contract, as a user writes it.

The model is the benchmarks' digits MLP (64 → Dense 64 relu → Dense 10, Adam 1e-3,
bench/workloads.py): a small dense model, ~19 KB of parameters, so each step's push and
pull are what a small job's are. Its data comes from a `custom_data_reader` that makes
digits-shaped records (64 floats in [0, 1), a label 0-9) from each record's number, so an
epoch of millions of records is described, not written to disk: the master cuts any
number of tasks from it, and a real worker of this job could read any range of it.
`data_reader_params` sets how many records (`records=N`).

Simulated workers (simulated_workers.py) never import this module: they only push
gradients of its variables' shapes. The PS loads it for the optimizer, and the benchmark
once to build the model and offer its initial values to the PS, as a worker would.
"""

import numpy as np
import tensorflow as tf

FEATURES = 64


def custom_model():
    inputs = tf.keras.Input(shape=(FEATURES,), name="pixels")
    hidden = tf.keras.layers.Dense(64, activation="relu")(inputs)
    logits = tf.keras.layers.Dense(10, name="logits")(hidden)
    return tf.keras.Model(inputs, logits, name="digits_mlp")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    return tf.keras.optimizers.Adam(learning_rate=0.001)


def feed(dataset, mode, metadata):
    """The reader's (pixels, label) records, with their shapes."""
    return dataset.map(lambda x, y: (tf.reshape(x, [FEATURES]), tf.reshape(y, [])))


class SyntheticDigits:
    """ElasticDL's reader contract over `records` generated records, in one shard."""

    records_output_types = (tf.float32, tf.int64)

    def __init__(self, data_origin, records_per_task=None, records=1_000_000):
        self.data_origin, self.records = data_origin, int(records)

    def create_shards(self):
        return {"synthetic": (0, self.records)}

    def read_records(self, task):
        for number in range(task.start, task.end):
            pixels = np.random.default_rng(number).random(FEATURES, dtype=np.float32)
            yield pixels, np.int64(number % 10)


def custom_data_reader(data_origin, records_per_task=None, **kwargs):
    return SyntheticDigits(data_origin, records_per_task, **kwargs)
