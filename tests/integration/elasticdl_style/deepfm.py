"""A DeepFM in ElasticDL's model-zoo style (after its deepfm_functional_api), written for
Keras 2: its functional model applies `K.sum` and `K.square` to symbolic tensors, which
Keras 3 refuses, and looks ids up with ElasticDL's Embedding. Each record is 10 ids of a
500-id vocabulary; clicks are drawn from a known truth with first- and second-order
effects (`write_tfrecords` returns the test file's true logits)."""

import numpy as np
import tensorflow as tf
from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.layers.embedding import Embedding
from tensorflow.keras import backend as K

VOCAB, LENGTH = 500, 10


def custom_model(input_dim=VOCAB, embedding_dim=4, input_length=LENGTH, fc_unit=16):
    inputs = tf.keras.Input(shape=(input_length,), dtype=tf.int64, name="feature")
    embeddings = Embedding(output_dim=embedding_dim, input_dim=input_dim, name="emb")(inputs)
    # FM: the second-order term 0.5 ((sum v)^2 - sum v^2), and the first order.
    emb_sum = K.sum(embeddings, axis=1)
    emb_square_sum = K.sum(K.square(embeddings), axis=1)
    second_order = 0.5 * K.sum(K.square(emb_sum) - emb_square_sum, axis=1, keepdims=True)
    first_order = K.sum(Embedding(output_dim=1, input_dim=input_dim, name="bias")(inputs), axis=1)
    # Deep.
    flat = tf.keras.layers.Flatten()(embeddings)
    deep = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(fc_unit, activation="relu")(flat))
    logits = first_order + second_order + deep
    probs = tf.reshape(tf.sigmoid(logits), [-1])
    return tf.keras.Model(inputs, {"logits": logits, "probs": probs}, name="deepfm")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    return tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=predictions["logits"])
    )


def optimizer(lr=0.003):
    return tf.keras.optimizers.Adam(learning_rate=lr)


def eval_metrics_fn():
    return {
        "logits": {
            "accuracy": lambda labels, predictions: tf.cast(
                tf.equal(
                    tf.cast(tf.reshape(predictions, [-1]) > 0.0, tf.int64),
                    tf.reshape(labels, [-1]),
                ),
                tf.float32,
            )
        },
        "probs": {"auc": tf.keras.metrics.AUC()},
    }


def feed(dataset, mode, _):
    def parse(record):
        description = {"feature": tf.io.FixedLenFeature([LENGTH], tf.int64)}
        if mode != Mode.PREDICTION:
            description["label"] = tf.io.FixedLenFeature([1], tf.int64)
        r = tf.io.parse_single_example(record, description)
        return r["feature"] if mode == Mode.PREDICTION else (r["feature"], r["label"])

    return dataset.map(parse)


def write_tfrecords(directory, train_records=30_000, test_records=8_000):
    """`train.tfrecord` and `test.tfrecord`; returns their paths and the test clicks and
    true logits."""
    truth = np.random.default_rng(38)
    weights = truth.normal(0.0, 0.4, size=VOCAB)
    factors = truth.normal(0.0, 0.25, size=(VOCAB, 4))
    popularity = 1.0 / np.arange(1, VOCAB + 1) ** 0.6
    popularity /= popularity.sum()

    def write(path, n, seed):
        rng = np.random.default_rng(seed)
        clicks, logits = [], []
        with tf.io.TFRecordWriter(str(path)) as out:
            for _ in range(n):
                ids = rng.choice(VOCAB, size=LENGTH, p=popularity)
                v = factors[ids]
                pairs = 0.5 * ((v.sum(0) ** 2).sum() - (v**2).sum())
                logit = weights[ids].sum() + pairs - 0.5
                clicked = int(rng.random() < 1.0 / (1.0 + np.exp(-logit)))
                feature = {
                    "feature": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[clicked])),
                }
                out.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=feature)
                    ).SerializeToString()
                )
                clicks.append(clicked)
                logits.append(logit)
        return np.array(clicks), np.array(logits)

    train, test = directory / "train.tfrecord", directory / "test.tfrecord"
    write(train, train_records, seed=1)
    clicks, logits = write(test, test_records, seed=2)
    return (str(train), str(test)), clicks, logits
