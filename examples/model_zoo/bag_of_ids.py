"""An ElasticDL model-zoo module with ElasticDL's own Embedding layer, written as for
ElasticDL: each record is a bag of a few ids (a variable-length `tf.train.Example`
feature, parsed into a `tf.SparseTensor`), embedded and averaged by the layer's combiner.

The ids are spread over a 2^62 range and the clicks generated with a known truth: every id
has a hidden weight, and a click happens with probability sigmoid(2 × the mean weight of
the record's ids). `write_bag_tfrecords` writes the data and returns the true logits of
the test file. Train it with model_zoo='examples/model_zoo/bag_of_ids.py',
model_def='bag_of_ids.custom_model'.
"""

import numpy as np
import tensorflow as tf
from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.layers.embedding import Embedding

VOCAB = 2_000


def custom_model():
    ids = tf.keras.Input(shape=(None,), sparse=True, dtype="int64", name="ids")
    bag = Embedding(16, combiner="mean", name="bag")(ids)
    x = tf.keras.layers.Dense(16, activation="relu")(bag)
    return tf.keras.Model(ids, tf.keras.layers.Dense(1, name="logit")(x), name="bag_of_ids")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    return tf.reduce_mean(
        tf.keras.losses.binary_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer(lr=0.1):
    return tf.keras.optimizers.Adagrad(learning_rate=lr)


def feed(dataset, mode, _):
    def parse(record):
        description = {"ids": tf.io.VarLenFeature(tf.int64)}
        if mode != Mode.PREDICTION:
            description["clicked"] = tf.io.FixedLenFeature([1], tf.int64)
        r = tf.io.parse_single_example(record, description)
        if mode == Mode.PREDICTION:
            return r["ids"]
        return r["ids"], r["clicked"]

    return dataset.map(parse)


def eval_metrics_fn():
    return {"auc": tf.keras.metrics.AUC(from_logits=True, name="auc")}


def write_bag_tfrecords(directory, train_records=40_000, test_records=8_000):
    """`train.tfrecord` and `test.tfrecord` in `directory`; returns (their paths, the test
    file's clicks and true logits)."""
    truth = np.random.default_rng(1234)
    weights = truth.normal(0.0, 1.5, size=VOCAB)
    spread = truth.integers(0, 2**62, size=VOCAB, dtype=np.int64)  # each id's real value
    popularity = 1.0 / np.arange(1, VOCAB + 1) ** 0.8
    popularity /= popularity.sum()

    def write(path, n, seed):
        rng = np.random.default_rng(seed)
        clicks, logits = [], []
        with tf.io.TFRecordWriter(str(path)) as out:
            for _ in range(n):
                bag = rng.choice(VOCAB, size=rng.integers(1, 6), p=popularity)
                logit = 2.0 * weights[bag].mean()
                clicked = int(rng.random() < 1.0 / (1.0 + np.exp(-logit)))
                feature = {
                    "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=spread[bag])),
                    "clicked": tf.train.Feature(int64_list=tf.train.Int64List(value=[clicked])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                out.write(example.SerializeToString())
                clicks.append(clicked)
                logits.append(logit)
        return np.array(clicks), np.array(logits)

    train, test = directory / "train.tfrecord", directory / "test.tfrecord"
    write(train, train_records, seed=1)
    clicks, logits = write(test, test_records, seed=2)
    return (str(train), str(test)), clicks, logits
