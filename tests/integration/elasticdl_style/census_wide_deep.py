"""A census-like wide & deep model in ElasticDL's model-zoo style, written for Keras 2:
string features looked up in vocabularies (`StringLookup`), a wide one-hot part and a
deep embedded part joined with `tf.concat` on symbolic tensors (Keras 3 refuses that), and
ElasticDL's LearningRateScheduler by model version. The records are people with three
categorical and two numeric features, whose label is drawn from a known logistic truth
(`write_tfrecords`)."""

import numpy as np
import tensorflow as tf
from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.callbacks import LearningRateScheduler

VOCABS = {
    "workclass": [f"work-{i}" for i in range(6)],
    "education": [f"edu-{i}" for i in range(12)],
    "occupation": [f"job-{i}" for i in range(10)],
}
NUMERIC = ["age", "hours"]


def custom_model():
    inputs = {name: tf.keras.Input(shape=(1,), dtype=tf.string, name=name) for name in VOCABS}
    inputs.update({name: tf.keras.Input(shape=(1,), name=name) for name in NUMERIC})
    wide, deep = [], []
    for name, vocabulary in VOCABS.items():
        ids = tf.keras.layers.StringLookup(vocabulary=vocabulary)(inputs[name])
        size = len(vocabulary) + 1
        wide.append(tf.keras.layers.CategoryEncoding(size, output_mode="one_hot")(ids))
        deep.append(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(size, 4)(ids)))
    numeric = tf.concat([inputs[name] for name in NUMERIC], axis=1) / 50.0
    wide_logit = tf.keras.layers.Dense(1)(tf.concat(wide, axis=1))
    hidden = tf.keras.layers.Dense(16, activation="relu")(tf.concat(deep + [numeric], axis=1))
    logits = wide_logit + tf.keras.layers.Dense(1)(hidden)
    return tf.keras.Model(inputs, {"logits": logits, "probs": tf.sigmoid(logits)})


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    return tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=predictions["logits"])
    )


def optimizer(lr=0.02):
    return tf.keras.optimizers.Adam(learning_rate=lr)


def callbacks():
    return [LearningRateScheduler(lambda version: 0.02 if version < 300 else 0.005)]


def eval_metrics_fn():
    return {
        "probs": {
            "accuracy": tf.keras.metrics.BinaryAccuracy(),
            "auc": tf.keras.metrics.AUC(),
        }
    }


def feed(dataset, mode, _):
    def parse(record):
        description = {name: tf.io.FixedLenFeature([1], tf.string) for name in VOCABS}
        description.update({name: tf.io.FixedLenFeature([1], tf.float32) for name in NUMERIC})
        if mode != Mode.PREDICTION:
            description["label"] = tf.io.FixedLenFeature([1], tf.int64)
        r = tf.io.parse_single_example(record, description)
        label = r.pop("label", None)
        return r if mode == Mode.PREDICTION else (r, label)

    return dataset.map(parse)


def write_tfrecords(directory, train_records=20_000, test_records=8_000):
    """`train.tfrecord` and `test.tfrecord`; returns their paths and the test labels and
    true logits."""
    truth = np.random.default_rng(7)
    effects = {name: truth.normal(0.0, 1.0, size=len(v)) for name, v in VOCABS.items()}

    def write(path, n, seed):
        rng = np.random.default_rng(seed)
        labels, logits = [], []
        with tf.io.TFRecordWriter(str(path)) as out:
            for _ in range(n):
                picks = {name: rng.integers(len(v)) for name, v in VOCABS.items()}
                age, hours = rng.uniform(18, 70), rng.uniform(10, 60)
                logit = sum(effects[k][i] for k, i in picks.items()) + (age - 44) / 15.0
                logit += 0.8 * np.tanh((hours - 40) / 10.0) - 0.3
                label = int(rng.random() < 1.0 / (1.0 + np.exp(-logit)))
                feature = {
                    name: tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[VOCABS[name][i].encode()])
                    )
                    for name, i in picks.items()
                }
                for name, value in (("age", age), ("hours", hours)):
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
                feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
                out.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=feature)
                    ).SerializeToString()
                )
                labels.append(label)
                logits.append(logit)
        return np.array(labels), np.array(logits)

    train, test = directory / "train.tfrecord", directory / "test.tfrecord"
    write(train, train_records, seed=1)
    labels, logits = write(test, test_records, seed=2)
    return (str(train), str(test)), labels, logits
