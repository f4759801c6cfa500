"""An ElasticDL model-zoo module, written exactly as for ElasticDL: scikit-learn's 8x8
digits stored as TFRecord `tf.train.Example`s ('image': 64 floats, 'label': int64).

Train it with model_zoo='examples/model_zoo/digits_tfrecord.py',
model_def='digits_tfrecord.custom_model'. `write_digits_tfrecords` makes the data.
"""

import numpy as np
import tensorflow as tf
from elasticdl.python.common.constants import Mode


def custom_model():
    inputs = tf.keras.Input(shape=(64,), name="image")
    x = tf.keras.layers.Dense(64, activation="relu")(inputs)
    x = tf.keras.layers.Dense(32, activation="relu")(x)
    outputs = tf.keras.layers.Dense(10, name="logits")(x)
    return tf.keras.Model(inputs=inputs, outputs=outputs, name="digits_mlp")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer(lr=0.01):
    return tf.keras.optimizers.Adam(learning_rate=lr)


def feed(dataset, mode, _):
    def _parse_data(record):
        feature_description = {"image": tf.io.FixedLenFeature([64], tf.float32)}
        if mode != Mode.PREDICTION:
            feature_description["label"] = tf.io.FixedLenFeature([1], tf.int64)
        r = tf.io.parse_single_example(record, feature_description)
        features = r["image"] / 16.0
        if mode == Mode.PREDICTION:
            return features
        return features, tf.cast(r["label"], tf.int32)

    dataset = dataset.map(_parse_data)
    if mode == Mode.TRAINING:
        dataset = dataset.shuffle(buffer_size=1024)
    return dataset


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: tf.equal(
            tf.argmax(predictions, 1, output_type=tf.int32),
            tf.cast(tf.reshape(labels, [-1]), tf.int32),
        )
    }


def write_digits_tfrecords(directory, train_files=2, seed=0):
    """Write the digits as `train-*.tfrecord` (split over files) and `test.tfrecord`."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(len(order) * 0.8)

    def write(path, rows):
        with tf.io.TFRecordWriter(str(path)) as writer:
            for i in rows:
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(
                                float_list=tf.train.FloatList(value=images[i])
                            ),
                            "label": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=[labels[i]])
                            ),
                        }
                    )
                )
                writer.write(example.SerializeToString())

    for k, part in enumerate(np.array_split(order[:split], train_files)):
        write(f"{directory}/train-{k}.tfrecord", part)
    write(f"{directory}/test.tfrecord", order[split:])
    return f"{directory}/train-*.tfrecord", f"{directory}/test.tfrecord"
