"""A click-through-rate model with embeddings, in the model-zoo form, and generated data
whose ground truth is known.

Each record has `num_fields` categorical ids; every id has a hidden weight, and a click
happens with probability sigmoid(sum of the weights of the record's ids + bias). The best
possible AUC is that of the true logits, which `make_ctr_data` returns for comparison.
"""

import numpy as np
import tensorflow as tf

NUM_FIELDS = 4
VOCAB = 10_000
EMBEDDING_DIM = 16


def custom_model(vocab=VOCAB, fields=NUM_FIELDS, dim=EMBEDDING_DIM):
    ids = tf.keras.Input(shape=(fields,), dtype="int32", name="ids")
    embedded = [
        tf.keras.layers.Embedding(vocab, dim, name=f"field_{f}")(ids[:, f]) for f in range(fields)
    ]
    x = tf.keras.layers.Concatenate()(embedded)
    x = tf.keras.layers.Dense(64, activation="relu")(x)
    x = tf.keras.layers.Dense(32, activation="relu")(x)
    logit = tf.keras.layers.Dense(1, name="logit")(x)
    return tf.keras.Model(ids, logit, name="ctr")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    return tf.reduce_mean(
        tf.keras.losses.binary_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    return tf.keras.optimizers.Adagrad(learning_rate=0.1)


def eval_metrics_fn():
    return {"auc": tf.keras.metrics.AUC(from_logits=True, name="auc")}


def make_ctr_data(n, vocab=VOCAB, fields=NUM_FIELDS, seed=0, weight_scale=1.5):
    """(ids [n, fields] int32, clicks [n] float32, true_logits [n]) with a fixed truth."""
    truth = np.random.default_rng(1234)  # the same hidden weights for every split
    weights = truth.normal(0.0, weight_scale, size=(fields, vocab)).astype(np.float32)
    rng = np.random.default_rng(seed)
    # Zipf-like id popularity, as in real click logs.
    popularity = 1.0 / np.arange(1, vocab + 1) ** 0.8
    popularity /= popularity.sum()
    ids = np.stack([rng.choice(vocab, size=n, p=popularity) for _ in range(fields)], axis=1)
    logits = weights[np.arange(fields), ids].sum(axis=1) - 0.5
    clicks = (rng.random(n) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    return ids.astype(np.int32), clicks, logits
